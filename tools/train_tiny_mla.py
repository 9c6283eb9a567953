"""Train a small DeepSeek-V3-architecture model (MLA with kv_lora 512 / RoPE 64 + YaRN, MoE) on text available
offline -- the running Python's standard-library sources -- and save a Hugging Face checkpoint SGLang loads.

    python -m tools.train_tiny_mla --out /tmp/tiny-mla --minutes 8        # H100 host, runtime active
    python -m tools.train_tiny_mla --out /tmp/t --max-steps 2 --layers 2 --hidden 128 --device cpu   # smoke

The model is transformers' own DeepseekV3ForCausalLM (no model code here), so `save_pretrained` writes the same
tensor names as the released DeepSeek checkpoints. Fixed seed; the run stops at --max-steps or --minutes.
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
from tokenizers import Tokenizer
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

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
        num_nextn_predict_layers=0)  # no MTP layer is trained


def windows(ids: torch.Tensor, n: int, length: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, ids.numel() - length - 1, (n,), generator=gen)
    return torch.stack([ids[s:s + length] for s in starts.tolist()])


@torch.no_grad()
def held_out_loss(model, data: torch.Tensor, device, batch: int) -> float:
    model.eval()
    losses = []
    for i in range(0, data.shape[0], batch):
        x = data[i:i + batch].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            losses.append(model(input_ids=x, labels=x).loss.float().item())
    model.train()
    return sum(losses) / len(losses)


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
    args = ap.parse_args(argv)
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
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters", flush=True)
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
            loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens += x.numel()
        if step % 50 == 0 or step == 1:
            log.append({"step": step, "loss": round(loss.item(), 4), "lr": lr, "s": round(time.time() - train_t0, 1)})
            print(json.dumps(log[-1]), flush=True)
    heldout = held_out_loss(model, eval_data, device, max(1, args.batch // 2))
    print(f"trained {step} steps, {tokens:,} tokens in {time.time() - train_t0:.0f} s; held-out loss {heldout:.3f} "
          f"(ppl {math.exp(heldout):.2f})", flush=True)

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
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__}, indent=1))
    print(f"saved to {args.out}", flush=True)


if __name__ == "__main__":
    main()
