"""MLA decode inputs captured from a trained DeepSeek-V3-architecture checkpoint (real activations).

`capture_decode_inputs(model_dir, windows)` runs the Hugging Face model over token windows and, for every layer,
rebuilds what an absorbed-MLA decode kernel sees when the last token of each window is decoded against the
window: the latent cache c_kv = kv_a_layernorm(kv_a) [S, 512] and the rotated RoPE key [S, 64], the absorbed query
q_nope @ W_UK [B, 1, H, 512] (in bf16, as SGLang's absorbed path computes it), the rotated RoPE query [B, 1, H, 64],
a page table (page size 64) and the layer's softmax scale (YaRN mscale included). The tensors are computed from
the attention module's own weights and rotary function, captured by a forward pre-hook, so they match the model's
prefill exactly. The output is in `numerics`' decode argument order, ready for `ablations.decode_with_config` and the golden.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from sglang_snapmla.layout import KV_LORA_RANK, PAGE_SIZE, ROPE_DIM


def _rotary(attn):
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as m

    return m.apply_rotary_pos_emb_interleave if attn.config.rope_interleave else m.apply_rotary_pos_emb


@torch.no_grad()
def _layer_inputs(attn, hidden: torch.Tensor, position_embeddings) -> tuple:
    """Decode inputs of one layer for the last position of each row of `hidden` [B, T, hidden]."""
    cfg = attn.config
    B, T, _ = hidden.shape
    H, nope = cfg.num_attention_heads, cfg.qk_nope_head_dim
    if cfg.kv_lora_rank != KV_LORA_RANK or cfg.qk_rope_head_dim != ROPE_DIM:
        raise ValueError(f"checkpoint has kv_lora_rank {cfg.kv_lora_rank}, rope {cfg.qk_rope_head_dim}: SnapMLA needs "
                         f"{KV_LORA_RANK} / {ROPE_DIM}")
    q = attn.q_b_proj(attn.q_a_layernorm(attn.q_a_proj(hidden))) if attn.q_lora_rank else attn.q_proj(hidden)
    q = q.view(B, T, H, -1).transpose(1, 2)
    q_pass, q_rot = torch.split(q, [nope, ROPE_DIM], dim=-1)
    k_pass, k_rot = torch.split(attn.kv_a_proj_with_mqa(hidden), [KV_LORA_RANK, ROPE_DIM], dim=-1)
    c_kv = attn.kv_a_layernorm(k_pass)  # [B, T, 512]
    cos, sin = position_embeddings
    q_rot, k_rot = _rotary(attn)(q_rot, k_rot.view(B, 1, T, ROPE_DIM), cos, sin)
    w_uk = attn.kv_b_proj.weight.view(H, nope + cfg.v_head_dim, KV_LORA_RANK)[:, :nope]  # [H, nope, 512]
    q_abs = torch.einsum("bhn,hnc->bhc", q_pass[:, :, -1], w_uk).to(torch.bfloat16)  # bf16 bmm, as in SGLang

    pages = math.ceil(T / PAGE_SIZE)
    slots = B * pages * PAGE_SIZE
    cache_c = torch.zeros(slots, KV_LORA_RANK, dtype=torch.bfloat16)
    cache_r = torch.zeros(slots, ROPE_DIM, dtype=torch.bfloat16)
    for b in range(B):  # window b owns pages [b * pages, (b + 1) * pages)
        base = b * pages * PAGE_SIZE
        cache_c[base:base + T] = c_kv[b].to(torch.bfloat16).cpu()
        cache_r[base:base + T] = k_rot[b, 0].to(torch.bfloat16).cpu()
    block_table = torch.arange(B * pages, dtype=torch.int32).view(B, pages)
    seq_lens = torch.full((B,), T, dtype=torch.int32)
    q_nope = q_abs.cpu().view(B, 1, H, KV_LORA_RANK)
    q_rope = q_rot[:, :, -1].to(torch.bfloat16).cpu().view(B, 1, H, ROPE_DIM)
    return q_nope, q_rope, cache_c, cache_r, block_table, seq_lens, float(attn.scaling)


@torch.no_grad()
def capture_decode_inputs(model_dir: str | Path, windows: list[list[int]], device: str = "cpu",
                          dtype: torch.dtype = torch.bfloat16) -> list[tuple]:
    """One tuple per layer: (q_nope [B,1,H,512], q_rope [B,1,H,64], c_kv [S,512], k_rope [S,64] (bf16),
    block_table [B,P] int32, seq_lens [B] int32, softmax_scale) for windows [B][T] of token ids. The model runs in
    `dtype` (bf16 as served); the captured tensors are bf16 either way, as a serving KV cache holds them."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to(device).eval()
    captured: dict[int, tuple] = {}

    def grab(index):
        def hook(module, args, kwargs):
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            captured[index] = _layer_inputs(module, hidden, kwargs["position_embeddings"])
        return hook

    handles = [layer.self_attn.register_forward_pre_hook(grab(i), with_kwargs=True)
               for i, layer in enumerate(model.model.layers)]
    try:
        model(input_ids=torch.tensor(windows, device=device))
    finally:
        for h in handles:
            h.remove()
    return [captured[i] for i in range(len(model.model.layers))]
