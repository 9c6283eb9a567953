"""SnapMLA numerics: the executable specification every kernel is tested against.

Everything here is plain PyTorch (fp32 arithmetic, FP8/BF16 rounding emulated with torch's dtypes), written to
be read, not to be fast. It runs on CPU or GPU.

MLA decode is multi-query attention over a shared latent. Per token and layer the cache holds the compressed
content ``c_kv`` (512) and the RoPE key ``k_rope`` (64); the key is ``[c_kv; k_rope]`` and the value is ``c_kv``.

SnapMLA cache layout (per token, per layer; structure of arrays, see docs/DESIGN.md):

* ``content``  float8_e4m3fn [512]  -- ``c_kv / scale`` rounded to FP8 (RNE, saturating)
* ``scale``    float32              -- ``max(amax(|c_kv|) / 448, SCALE_FLOOR)``
* ``rope``     bfloat16 [64]        -- ``k_rope / scale`` rounded to BF16 ("scale-domain alignment")

644 bytes against 1152 for a BF16 cache. Because RoPE is stored pre-divided by the same scale as the content,
``q8 . k8 + q_rope' . k_rope'`` is one accumulation in the scaled domain, multiplied once by ``sigma_q * sigma_k``.

Decode (``snapmla_decode_reference``): content QK in FP8, RoPE QK in BF16, online softmax over 64-token blocks,
``P' = P * sigma_k`` (the V scale fused into P), ``P'`` quantized to FP8 per (row, block) with a dynamic scale that
multiplies the block's PV product before it joins the running accumulator, blocks in strictly increasing order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from .layout import FP8_DTYPE, FP8_MAX, KV_LORA_RANK, PAGE_SIZE, ROPE_DIM

# A zero content row must quantize to finite values: its scale is floored. 2**-20 sits far below any real
# latent's amax/448 (~1e-2), and keeps RoPE / scale (<= 6.6e4 * 2**20) far from BF16/fp32 overflow even when
# the Q and K floors multiply in the aligned RoPE dot product.
SCALE_FLOOR = 2.0**-20
# P' = P * sigma_k can be legitimately tiny; its floor only has to keep 0 / 0 out of an all-zero block.
P_SCALE_FLOOR = torch.finfo(torch.float32).tiny


# ----------------------------------------------------------------------------------------------------------
# Containers
# ----------------------------------------------------------------------------------------------------------
@dataclass
class LatentCache:
    """A flat pool of token slots (slot = page * PAGE_SIZE + offset) in SnapMLA's structure-of-arrays layout.

    content: [S, 512] float8_e4m3fn (bfloat16 for the BF16 baseline)
    scale:   [S] float32, one per token (per-tensor / per-block ablations broadcast theirs to tokens)
    rope:    [S, 64] bfloat16, already divided by ``scale``
    """

    content: torch.Tensor
    scale: torch.Tensor
    rope: torch.Tensor


@dataclass
class QuantizedQuery:
    """Queries in the decode kernel's input layout.

    content: [..., H, 512] float8_e4m3fn (bfloat16 for the BF16 baseline)
    scale:   [..., H] float32, one per (token, head)
    rope:    [..., H, 64] bfloat16, already divided by ``scale``
    """

    content: torch.Tensor
    scale: torch.Tensor
    rope: torch.Tensor


# ----------------------------------------------------------------------------------------------------------
# Quantizers
# ----------------------------------------------------------------------------------------------------------
def to_fp8(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> float8_e4m3fn with round-to-nearest-even and saturation to +-448 (the GPU's cvt.rn.satfinite).

    torch 2.11's own cast (the GPU hosts' release) turns out-of-range values into NaN (2.14's saturates), hence
    the clamp (NaN stays NaN)."""
    return x.float().clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def nonfinite_rows(content: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """[...] bool: rows (tokens, or (token, head) query rows) holding a NaN or an infinity in content or RoPE."""
    return ~(torch.isfinite(content).all(-1) & torch.isfinite(rope).all(-1))


def quantize_with_scale(content: torch.Tensor, rope: torch.Tensor, scale: torch.Tensor,
                        rope_to_fp8: bool = False):
    """Quantize ``content`` to FP8 and align ``rope`` with a given scale broadcast over the last dim.

    Returns (content_fp8, scale fp32, rope_aligned bf16). ``rope_to_fp8`` models RoPE-unaware quantization
    (config A): RoPE shares the FP8 grid; the FP8 codes are stored in the bf16 array exactly (FP8 is a subset).

    Non-finite policy: a row with a NaN or an infinity anywhere in its content or RoPE is stored as content 0,
    RoPE 0 and scale NaN. Every attention row that sees such a key, or whose query is such a row, then comes out
    NaN (as a BF16 cache would give), and only those: nothing else reads the row, and the NaN cannot hide behind
    a saturating cast or an infinite scale.
    """
    bad = nonfinite_rows(content, rope)
    scale = scale.float().masked_fill(bad, math.nan)
    s = scale.unsqueeze(-1)
    content_q = to_fp8((content.float() / s).masked_fill(bad.unsqueeze(-1), 0.0))
    rope_scaled = (rope.float() / s).masked_fill(bad.unsqueeze(-1), 0.0)
    rope_q = to_fp8(rope_scaled).to(torch.bfloat16) if rope_to_fp8 else rope_scaled.to(torch.bfloat16)
    return content_q, scale, rope_q


def amax_scale(amax: torch.Tensor, floor: float = SCALE_FLOOR) -> torch.Tensor:
    """scale = max(amax / 448, floor), in fp32, correctly rounded on every device (K/Q scales; P's per block).

    The division runs in fp64 and rounds once to fp32 (exact for a quotient of fp32 values): PyTorch's CUDA
    `tensor / python_scalar` multiplies by the rounded reciprocal instead, which is 1 ulp off for some amax and
    then flips FP8 roundings (seen on the H100 against the kernels, which divide with div.rn)."""
    return torch.clamp_min((amax.double() / FP8_MAX).float(), floor)


def quantize_kv(c_kv: torch.Tensor, k_rope: torch.Tensor) -> LatentCache:
    """SnapMLA K/V quantization, one scale per token.

    c_kv [T, 512], k_rope [T, 64] (any float dtype; bf16 in serving) -> LatentCache of T slots."""
    _check_last_dims(c_kv, k_rope, "c_kv", "k_rope")
    scale = amax_scale(c_kv.float().abs().amax(-1))
    return LatentCache(*quantize_with_scale(c_kv, k_rope, scale))


def quantize_q(q_nope: torch.Tensor, q_rope: torch.Tensor) -> QuantizedQuery:
    """SnapMLA Q quantization, one scale per (token, head).

    q_nope [..., H, 512] (already absorbed into the latent space), q_rope [..., H, 64] -> QuantizedQuery."""
    _check_last_dims(q_nope, q_rope, "q_nope", "q_rope")
    scale = amax_scale(q_nope.float().abs().amax(-1))
    return QuantizedQuery(*quantize_with_scale(q_nope, q_rope, scale))


def dequantize_kv(cache: LatentCache, slots: torch.Tensor | None = None):
    """True (de-aligned) values of the cache at ``slots`` as bf16: (c_kv [N, 512], k_rope [N, 64]).

    This is what fetch-dequant returns: fp32 products rounded once to bf16."""
    content, scale, rope = cache.content, cache.scale, cache.rope
    if slots is not None:
        content, scale, rope = content[slots], scale[slots], rope[slots]
    s = scale.float().unsqueeze(-1)
    return (content.float() * s).to(torch.bfloat16), (rope.float() * s).to(torch.bfloat16)


def _check_last_dims(content, rope, cname, rname):
    if content.shape[-1] != KV_LORA_RANK or rope.shape[-1] != ROPE_DIM:
        raise ValueError(f"SnapMLA needs {cname}[..., {KV_LORA_RANK}] and {rname}[..., {ROPE_DIM}] "
                         f"(kv_lora_rank=512, qk_rope_head_dim=64); got {tuple(content.shape)} and "
                         f"{tuple(rope.shape)}")
    if content.shape[:-1] != rope.shape[:-1]:
        raise ValueError(f"{cname} and {rname} disagree on leading dims: {tuple(content.shape)} vs {tuple(rope.shape)}")


# ----------------------------------------------------------------------------------------------------------
# Paged decode: reference and golden
# ----------------------------------------------------------------------------------------------------------
def check_paged_inputs(batch: int, s_q: int, block_table: torch.Tensor, seq_lens: torch.Tensor):
    """Validate page table and lengths (host-side; the reference is allowed to sync).

    A length below s_q is allowed: query rows whose last visible key would be negative see no key (padding rows;
    out 0, LSE -inf)."""
    if block_table.dim() != 2 or block_table.shape[0] != batch:
        raise ValueError(f"block_table must be [B={batch}, max_pages], got {tuple(block_table.shape)}")
    if seq_lens.shape != (batch,):
        raise ValueError(f"seq_lens must be [B={batch}], got {tuple(seq_lens.shape)}")
    lens = seq_lens.tolist()
    if batch and min(lens) < 0:
        raise ValueError(f"seq_lens must be >= 0, got {lens}")
    if batch and max(lens) > block_table.shape[1] * PAGE_SIZE:
        raise ValueError(f"seq_lens up to {max(lens)} need {math.ceil(max(lens) / PAGE_SIZE)} pages per row; "
                         f"block_table has {block_table.shape[1]}")


def _block_slots(block_table_row: torch.Tensor, block: int, device) -> torch.Tensor:
    return block_table_row[block].long() * PAGE_SIZE + torch.arange(PAGE_SIZE, device=device)


def amax_p_scale(p_v: torch.Tensor, p: torch.Tensor, ks_visible: torch.Tensor) -> torch.Tensor:
    """SnapMLA's P' scale per (row, block): amax(P') / 448, so that the block's largest weight lands on 448 exactly.

    p_v = P x sigma_k [rows, 64] (0 for invisible keys), p = P [rows, 64], ks_visible = sigma_k of the visible keys
    (0 elsewhere) [rows, 64]; returns [rows] fp32. Other rules (docs/ACCURACY.md) take the same arguments."""
    return amax_scale(p_v.amax(1), P_SCALE_FLOOR)


def snapmla_decode_reference(q: QuantizedQuery, cache: LatentCache, block_table: torch.Tensor,
                             seq_lens: torch.Tensor, softmax_scale: float,
                             p_scale: Callable[..., torch.Tensor] | None = amax_p_scale):
    """SnapMLA decode over a paged latent cache, step by step as the kernels do it.

    q:           QuantizedQuery with content [B, s_q, H, 512], scale [B, s_q, H], rope [B, s_q, H, 64]
    cache:       LatentCache over S slots (page p owns slots [p*64, p*64+64))
    block_table: [B, max_pages] int32 physical page ids
    seq_lens:    [B] int32 tokens per sequence, including the s_q query tokens (which are already in the cache)
    p_scale:     how P' = P * sigma_k is rounded for the PV product: a rule giving the FP8 scale per (row, 64-token
                 block) (`amax_p_scale`, SnapMLA's; the accuracy study's alternatives are in `ablations`), or None:
                 P' rounded to bf16, as a BF16 kernel (FlashMLA) does
    Query token i of s_q sees keys [0, seq_len - s_q + i] (causal among the draft tokens); a row for which that
    range is empty (seq_len < s_q: padding) gets out 0 and LSE -inf. Slots at or past seq_len and table entries
    past ceil(seq_len / 64) are never read into the arithmetic: a reused page's stale bytes cannot leak in.
    Returns out [B, s_q, H, 512] fp32 and lse [B, H, s_q] fp32 (natural log of the softmax denominator).
    """
    B, s_q, H, _ = q.content.shape
    check_paged_inputs(B, s_q, block_table, seq_lens)
    dev = q.content.device
    out = torch.empty(B, s_q, H, KV_LORA_RANK, dtype=torch.float32, device=dev)
    lse = torch.empty(B, H, s_q, dtype=torch.float32, device=dev)
    rows = s_q * H
    for b in range(B):
        seq_len = int(seq_lens[b])
        qc = q.content[b].float().reshape(rows, KV_LORA_RANK)
        qr = q.rope[b].float().reshape(rows, ROPE_DIM)
        qs = q.scale[b].float().reshape(rows)
        # last key position each row may attend to (rows are ordered (query token, head)); negative: no key
        last_key = (seq_len - s_q + torch.arange(s_q, device=dev)).repeat_interleave(H)
        m = torch.full((rows,), -math.inf, device=dev)
        l = torch.zeros(rows, device=dev)
        acc = torch.zeros(rows, KV_LORA_RANK, device=dev)
        for blk in range(math.ceil(seq_len / PAGE_SIZE)):  # strictly increasing block order
            slots = _block_slots(block_table[b], blk, dev)
            key_pos = blk * PAGE_SIZE + torch.arange(PAGE_SIZE, device=dev)
            # Slots at or past seq_len are unwritten (or a reused page's stale bytes, NaN included): no byte of
            # them enters the arithmetic.
            written = (key_pos < seq_len)[:, None]
            kc = torch.where(written, cache.content[slots].float(), 0.0)
            ks = torch.where(written[:, 0], cache.scale[slots].float(), 0.0)
            kr = torch.where(written, cache.rope[slots].float(), 0.0)
            visible = key_pos[None, :] <= last_key[:, None]
            # one accumulation in the scaled domain, then the two scales and the softmax scale
            scores = (qc @ kc.T + qr @ kr.T) * (qs[:, None] * ks[None, :]) * softmax_scale
            scores = scores.masked_fill(~visible, -math.inf)
            m_new = torch.maximum(m, scores.amax(1))
            m_safe = m_new.masked_fill(m_new == -math.inf, 0.0)  # a row without a visible key yet keeps p = 0
            alpha = torch.exp(m - m_safe)
            p = torch.exp(scores - m_safe[:, None])
            l = l * alpha + p.sum(1)
            # V's per-token scale fused into P; an invisible key weighs exactly 0 whatever its scale holds
            p_v = torch.where(visible, p * ks[None, :], 0.0)
            if p_scale is not None:
                sp = p_scale(p_v, p, ks[None, :].masked_fill(~visible, 0.0))
                pv = (to_fp8(p_v / sp[:, None]).float() @ kc) * sp[:, None]
            else:
                pv = p_v.to(torch.bfloat16).float() @ kc
            acc = acc * alpha[:, None] + pv
            m = m_new
        # rows without a visible key: out 0, LSE -inf (l = 0); a NaN denominator (a non-finite key or query the
        # row sees) stays NaN
        empty = l == 0
        out[b] = (acc / l.masked_fill(empty, 1.0)[:, None]).reshape(s_q, H, KV_LORA_RANK)
        lse[b] = (m + torch.log(l)).masked_fill(empty, -math.inf).reshape(s_q, H).T
    return out, lse


def merge_splits(o_part: torch.Tensor, lse_part: torch.Tensor, splits: int) -> torch.Tensor:
    """The combine of a split decode: each split's output o_part [B, R, slots, 512] (normalized by its own l) and
    its LSE lse_part [B, R, slots] (base 2; -inf where the split saw no key, whose output row is then never read),
    splits 0..splits-1 in the first slots -> out [B, R, 512] fp32, each split weighted by 2^(its LSE - the row's
    largest). A row that no split saw a key for is 0; a NaN LSE makes its row NaN."""
    lse = lse_part[..., :splits].float()
    keyed = lse > -math.inf
    m = lse.masked_fill(~keyed, -math.inf).amax(-1, keepdim=True)
    m = m.masked_fill(m == -math.inf, 0.0)
    w = torch.where(keyed, torch.exp2(lse - m), 0.0)
    o = torch.where(keyed[..., None], o_part[..., :splits, :].float(), 0.0)
    out = (w[..., None] * o).sum(-2) / w.sum(-1, keepdim=True).masked_fill(~keyed.any(-1, keepdim=True), 1.0)
    return out.masked_fill(lse.isnan().any(-1, keepdim=True), math.nan)


def gather_sequence(block_table_row: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Slot ids [seq_len] of one sequence in token order."""
    pages = block_table_row[: math.ceil(seq_len / PAGE_SIZE)].long()
    slots = (pages[:, None] * PAGE_SIZE + torch.arange(PAGE_SIZE, device=pages.device)[None, :]).reshape(-1)
    return slots[:seq_len]


def mla_decode_golden(q_nope: torch.Tensor, q_rope: torch.Tensor, c_kv: torch.Tensor, k_rope: torch.Tensor,
                      block_table: torch.Tensor, seq_lens: torch.Tensor, softmax_scale: float):
    """Exact attention in float64 on unquantized inputs (same paging and causal rule as the reference).

    q_nope [B, s_q, H, 512], q_rope [B, s_q, H, 64], c_kv [S, 512], k_rope [S, 64] (pools of S slots).
    Returns out [B, s_q, H, 512] float64 and lse [B, H, s_q] float64."""
    B, s_q, H, _ = q_nope.shape
    check_paged_inputs(B, s_q, block_table, seq_lens)
    dev = q_nope.device
    out = torch.empty(B, s_q, H, KV_LORA_RANK, dtype=torch.float64, device=dev)
    lse = torch.empty(B, H, s_q, dtype=torch.float64, device=dev)
    for b in range(B):
        seq_len = int(seq_lens[b])
        slots = gather_sequence(block_table[b], seq_len)
        kc, kr = c_kv[slots].double(), k_rope[slots].double()
        scores = (torch.einsum("qhd,kd->qhk", q_nope[b].double(), kc)
                  + torch.einsum("qhd,kd->qhk", q_rope[b].double(), kr)) * softmax_scale
        last_key = seq_len - s_q + torch.arange(s_q, device=dev)
        mask = torch.arange(seq_len, device=dev)[None, :] > last_key[:, None]  # [s_q, seq_len]
        scores = scores.masked_fill(mask[:, None, :], -math.inf)
        lse[b] = torch.logsumexp(scores, -1).T
        out[b] = torch.einsum("qhk,kd->qhd", torch.softmax(scores, -1), kc)
    return out, lse


# ----------------------------------------------------------------------------------------------------------
# Error metrics
# ----------------------------------------------------------------------------------------------------------
def error_metrics(out: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """RMSE, 1 - cosine and relative L2 of ``out`` against ``ref`` (flattened, in float64). NaN propagates."""
    o, r = out.double().flatten(), ref.double().flatten()
    d = o - r
    cos = (o @ r) / (o.norm() * r.norm())
    return {"rmse": float(d.pow(2).mean().sqrt()), "one_minus_cos": float(1 - cos),
            "rel_l2": float(d.norm() / r.norm())}
