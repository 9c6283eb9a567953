"""Train a small DeepSeek-V3-architecture model (MLA with kv_lora 512 / RoPE 64 + YaRN, MoE) on text available
offline -- the running Python's standard-library sources -- and save a Hugging Face checkpoint SGLang loads.

    python -m tools.train_tiny_mla --out /tmp/tiny-mla --minutes 8        # H100 host, runtime active
    python -m tools.train_tiny_mla --out /tmp/t --max-steps 2 --layers 2 --hidden 128 --device cpu   # smoke

The model is transformers' own DeepseekV3ForCausalLM (no model code here), so `save_pretrained` writes the same
tensor names as the released DeepSeek checkpoints. Fixed seed; the run stops at --max-steps or --minutes.
With `--mtp` it also trains DeepSeek-V3's multi-token-prediction layer (one, as the released checkpoints have) and
saves it as `model.layers.{num_hidden_layers}.*` with `num_nextn_predict_layers: 1`: what SGLang's NEXTN / EAGLE
speculative decoding loads as its draft (`DeepseekV3ForCausalLMNextN`). The layer learns from the main model's
final hidden states with its embedding and LM head held fixed, so the main model trains as it does without it.
Files written to --out: config.json + model.safetensors (bf16), the project's tokenizer, train_log.json (loss
curve, held-out loss, tokens, seconds), and heldout.json (token ids of held-out windows for perplexity and prompts
for greedy-agreement and drift checks; files are held out by a hash of their path, never trained on).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sysconfig
import time
import zlib
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch import nn
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
from transformers.masking_utils import create_causal_mask
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer, DeepseekV3RMSNorm

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER_DIR = ROOT / "configs" / "tokenizer"
HELD_OUT_EVERY = 10  # one file in ten (by crc32 of its relative path) is held out


def stdlib_files(max_files: int | None = None) -> list[tuple[str, str]]:
    """(relative path, text) of the standard library's .py files, sorted: the same list on every run."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for p in sorted(root.rglob("*.py")):
        if "site-packages" in p.parts:
            continue
        if max_files is not None and len(out) >= max_files:
            break
        try:
            out.append((str(p.relative_to(root)), p.read_text(encoding="utf-8")))
        except (UnicodeDecodeError, OSError):
            continue
    return out


def is_held_out(rel_path: str) -> bool:
    return zlib.crc32(rel_path.encode()) % HELD_OUT_EVERY == 0


def tokenize(tok: Tokenizer, texts: list[str], eos: int) -> torch.Tensor:
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.int64)


def model_config(args, vocab: int, bos: int, eos: int) -> DeepseekV3Config:
    return DeepseekV3Config(
        vocab_size=vocab, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
        moe_intermediate_size=args.hidden // 2, num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.heads, n_routed_experts=args.experts, n_shared_experts=1, num_experts_per_tok=2,
        n_group=1, topk_group=1, first_k_dense_replace=1, routed_scaling_factor=1.0,
        q_lora_rank=args.hidden // 2, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
        # YaRN as in DeepSeek-V3: trained at seq_len, served up to 4x longer
        max_position_embeddings=4 * args.seq_len,
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": args.seq_len,
                         "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "rope_theta": 10000.0},
        bos_token_id=bos, eos_token_id=eos, tie_word_embeddings=False, architectures=["DeepseekV3ForCausalLM"],
        # keys of the released DeepSeek-V3 config.json that transformers' class does not define but SGLang's
        # DeepSeek model reads (the values are what transformers' router computes: sigmoid scores, bias-corrected
        # group top-k, renormalized)
        moe_layer_freq=1, topk_method="noaux_tc", scoring_func="sigmoid", norm_topk_prob=True, seq_aux=True,
        num_nextn_predict_layers=1 if getattr(args, "mtp", False) else 0)


def add_mtp_layer(model: DeepseekV3ForCausalLM) -> nn.Module:
    """Append DeepSeek-V3's MTP layer to `model.model.layers` (the model's forward runs only the first
    num_hidden_layers of them, so it stays out of the main model) and return it. Its tensors are those SGLang's
    DeepseekV3ForCausalLMNextN loads from `model.layers.{num_hidden_layers}`: a decoder layer like the MoE ones, plus
    `enorm`, `hnorm`, `eh_proj` [hidden, 2 x hidden] and `shared_head.norm`. The embedding and the LM head are the
    main model's (SGLang takes them from the target model, and skips the copies the released checkpoints carry)."""
    cfg = model.config
    layer = DeepseekV3DecoderLayer(cfg, cfg.num_hidden_layers)
    layer.enorm = DeepseekV3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
    layer.hnorm = DeepseekV3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
    layer.eh_proj = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
    layer.shared_head = nn.Module()
    layer.shared_head.norm = DeepseekV3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
    layer.apply(model._init_weights)
    model.model.layers.append(layer.to(next(model.parameters()).device))
    return layer


def mtp_pairs(ids: torch.Tensor, hidden: torch.Tensor):
    """The MTP layer's inputs as SGLang's draft extend forms them, from a window `ids` [B, T] and the main model's
    final (normed) hidden states `hidden` [B, T, D]: at position i the pair (hidden_i, token i + 1), whose target is
    token i + 2. -> (token ids [B, T-1], hidden [B, T-1, D], positions [1, T-1], targets [B, T-2] of positions
    0..T-3)."""
    positions = torch.arange(ids.shape[1] - 1, device=ids.device)[None]
    return ids[:, 1:], hidden[:, :-1], positions, ids[:, 2:]


def mtp_logits(model: DeepseekV3ForCausalLM, layer: nn.Module, ids: torch.Tensor, hidden: torch.Tensor):
    """The MTP layer's logits [B, T-1, vocab] for `mtp_pairs(ids, hidden)`, as DeepseekModelNextN computes them:
    eh_proj([enorm(embed(token)); hnorm(hidden)]), the decoder layer (causal, RoPE at the pair's position),
    shared_head.norm, the LM head. The embedding and the head enter as constants (`detach`)."""
    tokens, h, positions, _ = mtp_pairs(ids, hidden)
    emb = F.embedding(tokens, model.model.embed_tokens.weight.detach())
    x = layer.eh_proj(torch.cat([layer.enorm(emb), layer.hnorm(h)], dim=-1))
    mask = create_causal_mask(config=model.config, inputs_embeds=x, attention_mask=None, past_key_values=None,
                              position_ids=positions)
    x = layer(x, attention_mask=mask, position_embeddings=model.model.rotary_emb(x, position_ids=positions),
              position_ids=positions)
    return F.linear(layer.shared_head.norm(x), model.lm_head.weight.detach())


def losses(model: DeepseekV3ForCausalLM, mtp: nn.Module | None, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(next-token loss, MTP loss or None, MTP logits or None, main logits) on a window `ids` [B, T]. The MTP layer
    sees the main model's hidden states detached: its loss does not train the main model."""
    hidden = model.model(input_ids=ids).last_hidden_state
    logits = model.lm_head(hidden)
    main = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), ids[:, 1:].flatten())
    if mtp is None:
        return main, None, None, logits
    draft = mtp_logits(model, mtp, ids, hidden.detach())
    targets = mtp_pairs(ids, hidden)[3]
    return main, F.cross_entropy(draft[:, :-1].float().flatten(0, 1), targets.flatten()), draft, logits


def windows(ids: torch.Tensor, n: int, length: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, ids.numel() - length - 1, (n,), generator=gen)
    return torch.stack([ids[s:s + length] for s in starts.tolist()])


@torch.no_grad()
def held_out(model, mtp: nn.Module | None, data: torch.Tensor, device, batch: int) -> dict:
    """Mean next-token loss on held-out windows; with an MTP layer also its loss and how often its top token is
    the main model's top token one position later (what greedy speculative decoding accepts, on a given prefix)."""
    model.eval()
    sums = {"loss": 0.0, "mtp_loss": 0.0, "mtp_agreement": 0.0}
    n = 0
    for i in range(0, data.shape[0], batch):
        x = data[i:i + batch].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            main, mtp_loss, draft, logits = losses(model, mtp, x)
        sums["loss"] += main.item()
        if mtp is not None:
            sums["mtp_loss"] += mtp_loss.item()
            # the draft at position i proposes token i + 2; the main model chooses it at position i + 1
            sums["mtp_agreement"] += (draft[:, :-1].argmax(-1) == logits[:, 1:-1].argmax(-1)).float().mean().item()
        n += 1
    model.train()
    return {k: v / n for k, v in sums.items() if mtp is not None or k == "loss"}


def main(argv: list[str] | None = None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--minutes", type=float, default=8.0)
    ap.add_argument("--max-steps", type=int, default=100_000)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--eval-windows", type=int, default=64)
    ap.add_argument("--max-files", type=int, default=None, help="use only the first N files (smoke tests)")
    ap.add_argument("--mtp", action="store_true", help="also train and save the MTP layer (SGLang's NEXTN draft)")
    args = ap.parse_args(argv)
    if args.mtp and args.layers == 1:
        # SGLang's DeepSeek loader reads the NextN layer from model.layers.0 when the model has one layer
        ap.error("--mtp needs --layers >= 2: with one layer SGLang takes layer 0 for the MTP layer")
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    t0 = time.time()

    tok = Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json"))
    bos, eos = tok.token_to_id("<|begin_of_text|>"), tok.token_to_id("<|end_of_text|>")
    files = stdlib_files(args.max_files)
    train_ids = tokenize(tok, [t for p, t in files if not is_held_out(p)], eos)
    held_ids = tokenize(tok, [t for p, t in files if is_held_out(p)], eos)
    print(f"corpus: {len(files)} files, train {train_ids.numel():,} tokens, held out {held_ids.numel():,} "
          f"({time.time() - t0:.0f} s)", flush=True)

    cfg = model_config(args, tok.get_vocab_size(), bos, eos)
    model = DeepseekV3ForCausalLM(cfg).to(device)
    mtp = add_mtp_layer(model) if args.mtp else None
    in_mtp = f" ({sum(p.numel() for p in mtp.parameters()) / 1e6:.1f} M in the MTP layer)" if mtp is not None else ""
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters{in_mtp}", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=device.type == "cuda")
    gen = torch.Generator().manual_seed(args.seed)
    eval_gen = torch.Generator().manual_seed(args.seed + 1)
    eval_data = windows(held_ids, args.eval_windows, args.seq_len, eval_gen)
    budget_s, warmup = args.minutes * 60, 100
    log, step, tokens = [], 0, 0
    train_t0 = time.time()
    while step < args.max_steps and time.time() - train_t0 < budget_s:
        # cosine schedule over the time budget (the step count is not known in advance)
        frac = min(1.0, (time.time() - train_t0) / budget_s)
        lr = args.lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        x = windows(train_ids, args.batch, args.seq_len, gen).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss, mtp_loss, _, _ = losses(model, mtp, x)
        opt.zero_grad(set_to_none=True)
        (loss if mtp_loss is None else loss + mtp_loss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens += x.numel()
        if step % 50 == 0 or step == 1:
            log.append({"step": step, "loss": round(loss.item(), 4), "lr": lr, "s": round(time.time() - train_t0, 1),
                        **({"mtp_loss": round(mtp_loss.item(), 4)} if mtp is not None else {})})
            print(json.dumps(log[-1]), flush=True)
    evals = held_out(model, mtp, eval_data, device, max(1, args.batch // 2))
    heldout = evals["loss"]
    print(f"trained {step} steps, {tokens:,} tokens in {time.time() - train_t0:.0f} s; held-out loss {heldout:.3f} "
          f"(ppl {math.exp(heldout):.2f})" + (f"; MTP loss {evals['mtp_loss']:.3f}, its top token the model's next "
                                              f"{evals['mtp_agreement']:.1%}" if mtp is not None else ""), flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(args.out, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER_DIR / name, args.out / name)
    prompt_gen = torch.Generator().manual_seed(args.seed + 2)
    (args.out / "heldout.json").write_text(json.dumps({
        "ppl_windows": eval_data.tolist(),
        "prompts": windows(held_ids, 64, 256, prompt_gen).tolist(),
    }))
    (args.out / "train_log.json").write_text(json.dumps({
        "args": {k: str(v) for k, v in vars(args).items()}, "steps": step, "tokens": tokens,
        "train_seconds": round(time.time() - train_t0, 1), "heldout_loss": heldout, "log": log,
        **({"heldout_mtp_loss": evals["mtp_loss"], "heldout_mtp_agreement": evals["mtp_agreement"]}
           if mtp is not None else {}),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__}, indent=1))
    print(f"saved to {args.out}", flush=True)


if __name__ == "__main__":
    main()
