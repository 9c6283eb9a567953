"""Function-preserving reparameterization of an MLA checkpoint: the same model, with the activation magnitudes that
decide whether an FP8 KV cache works.

    python -m tools.reparameterize --model CKPT --out CKPT-a128 --alpha 128 --latent-spread 16
    python -m tools.reparameterize --model CKPT --out CKPT-b1-64 --latent-scale 0.015625
    (the command line; the edit, here, is also what tools/fp8_outlier_sweep.py sweeps)

Two changes per attention layer, each undone exactly by the next weight the activation meets:
  RoPE key x alpha  : the RoPE rows of `kv_a_proj_with_mqa` (its last 64 outputs, the shared k_pe) are multiplied by
                      alpha and every head's RoPE rows of `q_b_proj` (or `q_proj`) by 1 / alpha, so q_pe . k_pe, and
                      with it every logit, is unchanged. RoPE rotates pairs of these rows, and a common factor
                      commutes with a rotation.
  latent spread     : `kv_a_layernorm`'s weight (the per-channel gain of the cached latent c_KV) is multiplied by one
                      gain per channel g_c and `kv_b_proj`'s column c (W_UK and W_UV both read channel c) by 1 / g_c,
                      so both the absorbed query . c_KV and the value projection are unchanged.
  latent scale beta : the same edit with one gain for every channel: c_KV x beta, kv_b_proj / beta. The absorbed
                      query (q_nope W_UK) grows by 1 / beta as the latent shrinks, so a cache or query cast with one
                      fixed scale meets both sides of its range: at small beta the latent falls under FP8's normal
                      range (2^-6) and the query grows; at large beta the reverse.
Every factor is a power of two, so a bf16 (or fp32) weight times its factor is exact and the reparameterized model
computes the same numbers as the original in any precision with enough exponent range: a BF16 server gives the
same tokens, and only a cache format with a fixed range (per-tensor FP8 with scale 1.0: NaN above 448, subnormal
below 2^-6) sees a different model. The gains are 2^k for integers k spread evenly over
[-log2(spread) / 2, log2(spread) / 2] and assigned to channels by a seeded permutation.

The output folder is a complete checkpoint (config, tokenizer, heldout.json copied) plus reparameterization.json.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

ROPE_DIM, KV_LORA_RANK = 64, 512
WEIGHTS = "model.safetensors"
RECORD = "reparameterization.json"


def power_of_two(x: float, what: str) -> int:
    """log2(x) for a positive power of two x; anything else is refused (it would not be exact in bf16)."""
    k = math.log2(x) if x > 0 else math.nan
    if not math.isfinite(k) or k != round(k):
        raise ValueError(f"{what} must be a power of two (exact in bf16, so the model stays the same), got {x}")
    return int(round(k))


def latent_gains(spread: float, seed: int = 0) -> torch.Tensor:
    """[512] float32 powers of two: per-channel gains whose largest / smallest ratio is `spread` (a power of four,
    so the exponents are symmetric integers; 1 = no spread)."""
    half = power_of_two(spread, "--latent-spread")
    if half % 2:
        raise ValueError(f"--latent-spread must be a power of four (gains 2^-k .. 2^k), got {spread}")
    half //= 2
    exps = torch.linspace(-half, half, KV_LORA_RANK).round()
    perm = torch.randperm(KV_LORA_RANK, generator=torch.Generator().manual_seed(seed))
    return torch.exp2(exps[perm])


def reparameterize(state: dict[str, torch.Tensor], config: dict, alpha: float = 1.0,
                   gains: torch.Tensor | None = None, latent_scale: float = 1.0) -> dict[str, torch.Tensor]:
    """A new state dict (DeepSeek-V2/V3 tensor names) with the RoPE key x alpha (query RoPE / alpha) and the latent's
    channel c x gains[c] x latent_scale (kv_b_proj column c divided by the same) in every layer. Tensors keep their
    dtype."""
    power_of_two(alpha, "--alpha")
    power_of_two(latent_scale, "--latent-scale")
    if latent_scale != 1.0:
        gains = (torch.ones(KV_LORA_RANK) if gains is None else gains.float()) * latent_scale
    if config.get("kv_lora_rank") != KV_LORA_RANK or config.get("qk_rope_head_dim") != ROPE_DIM:
        raise ValueError(f"needs kv_lora_rank {KV_LORA_RANK} and qk_rope_head_dim {ROPE_DIM}; the config has "
                         f"{config.get('kv_lora_rank')} / {config.get('qk_rope_head_dim')}")
    heads, nope = config["num_attention_heads"], config["qk_nope_head_dim"]
    out = dict(state)
    layers = sorted({int(k.split(".")[2]) for k in state if k.startswith("model.layers.") and ".self_attn." in k})
    if not layers:
        raise ValueError("no model.layers.N.self_attn.* tensors: not a DeepSeek-V2/V3 checkpoint")

    def scaled(name: str, factor: torch.Tensor | float, select) -> torch.Tensor:
        w = state[name]
        new = w.float().clone()
        select(new).mul_(factor)
        return new.to(w.dtype)

    for i in layers:
        p = f"model.layers.{i}.self_attn."
        # k_pe: the last 64 outputs of kv_a_proj_with_mqa
        out[p + "kv_a_proj_with_mqa.weight"] = scaled(p + "kv_a_proj_with_mqa.weight", alpha,
                                                      lambda w: w[KV_LORA_RANK:])
        q_name = p + ("q_b_proj.weight" if p + "q_b_proj.weight" in state else "q_proj.weight")
        # per head [nope | rope] output rows
        out[q_name] = scaled(q_name, 1.0 / alpha, lambda w: w.view(heads, nope + ROPE_DIM, -1)[:, nope:])
        if gains is not None:
            g = gains.float()
            out[p + "kv_a_layernorm.weight"] = scaled(p + "kv_a_layernorm.weight", g, lambda w: w)
            out[p + "kv_b_proj.weight"] = scaled(p + "kv_b_proj.weight", 1.0 / g[None, :], lambda w: w)
    return out


def uncompensated_query(original: dict, state: dict) -> dict:
    """`write_checkpoint` edit: the query's RoPE rows left as they were, so alpha scales the logits' RoPE part (a
    different model, on purpose)."""
    return {k: original[k] if k.endswith(("q_b_proj.weight", "q_proj.weight")) else v for k, v in state.items()}


def uncompensated_latent(original: dict, state: dict) -> dict:
    """`write_checkpoint` edit: kv_b_proj left as it was, so the latent gains change the model (on purpose)."""
    return {k: original[k] if k.endswith("kv_b_proj.weight") else v for k, v in state.items()}


def write_checkpoint(model_dir: Path, out: Path, alpha: float = 1.0, latent_spread: float = 1.0,
                     seed: int = 0, edit=None, latent_scale: float = 1.0) -> Path:
    """Write the reparameterized copy of `model_dir` (a single-file safetensors checkpoint) to `out`.

    edit(original state, reparameterized state) -> state: a change on top (tests and the sweep's control checkpoint
    build deliberately different models this way)."""
    model_dir, out = Path(model_dir), Path(out)
    config = json.loads((model_dir / "config.json").read_text())
    gains = latent_gains(latent_spread, seed) if latent_spread != 1 else None
    original = load_file(str(model_dir / WEIGHTS))
    state = reparameterize(original, config, alpha, gains, latent_scale)
    if edit is not None:
        state = edit(original, state)
    out.mkdir(parents=True, exist_ok=True)
    for f in model_dir.iterdir():
        if f.is_file() and f.name not in (WEIGHTS, RECORD):
            shutil.copy(f, out / f.name)
    save_file(state, str(out / WEIGHTS), metadata={"format": "pt"})
    (out / RECORD).write_text(json.dumps({"source": str(model_dir), "alpha": alpha, "latent_spread": latent_spread,
                                          "latent_scale": latent_scale, "seed": seed}))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True, help="checkpoint dir (tools/train_tiny_mla.py)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--alpha", type=float, default=1.0, help="RoPE key factor (power of two)")
    ap.add_argument("--latent-spread", type=float, default=1.0,
                    help="largest / smallest latent channel gain (power of four; 1 = none)")
    ap.add_argument("--latent-scale", type=float, default=1.0,
                    help="one gain beta for every latent channel (power of two; kv_b_proj / beta)")
    ap.add_argument("--seed", type=int, default=0, help="which channel gets which gain")
    args = ap.parse_args(argv)
    print(write_checkpoint(args.model, args.out, args.alpha, args.latent_spread, args.seed,
                           latent_scale=args.latent_scale))


if __name__ == "__main__":
    main()
