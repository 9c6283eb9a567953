"""Convert a BF16 DeepSeek-V3-architecture checkpoint to block-FP8 weights as DeepSeek-V3/R1 and Kimi-K2 ship them:
every linear layer's weight as e4m3 in 128 x 128 blocks with an fp32 `weight_scale_inv` per block (amax / 448,
`sglang_snapmla.block_fp8`), and `quantization_config: {quant_method: fp8, fmt: e4m3, activation_scheme: dynamic,
weight_block_size: [128, 128]}` in config.json. SGLang then serves it with its W8A8 block-FP8 GEMMs and, for the
absorbed MLA path, dequantizes kv_b_proj at load -- what a served FP8 checkpoint runs, so that accuracy can be
measured on the weights users serve (the trained small checkpoints of tools/train_tiny_mla.py, for instance).

    python -m tools.convert_block_fp8 --src CKPT --out CKPT-fp8

Quantized, as in the released checkpoints: the attention projections (q_a_proj, q_b_proj, q_proj,
kv_a_proj_with_mqa, kv_b_proj, o_proj) and every MLP's gate_proj / up_proj / down_proj (dense layers, routed and
shared experts). Kept as they are: the embedding, the LM head, the norms, the MoE router (mlp.gate) and its
correction bias. A dimension that is not a multiple of 128 ends in a partial block, as kv_a_proj_with_mqa's 576
outputs do in the released checkpoints (scales [5, 56] for its [576, 7168] weight). Every other file of the checkpoint (tokenizer, held-out data) is copied. Prints each quantized
tensor's round-trip error against its BF16 source, largest first, and writes it to OUT/fp8_conversion.json.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from sglang_snapmla.block_fp8 import BLOCK, dequantize_block_fp8, quantize_block_fp8

QUANTIZATION_CONFIG = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                       "weight_block_size": list(BLOCK)}
QUANTIZED = re.compile(r"\.(self_attn\.(q_a_proj|q_b_proj|q_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj)"
                       r"|mlp\.((experts\.\d+|shared_experts)\.)?(gate_proj|up_proj|down_proj))\.weight$")


def quantized_name(name: str) -> bool:
    """Whether the released block-FP8 checkpoints store tensor `name` in FP8 (see the module docstring)."""
    return QUANTIZED.search(name) is not None


def convert_tensors(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """name -> tensor (a BF16 checkpoint's) -> (the block-FP8 checkpoint's tensors, name -> round-trip rel-L2 of each
    quantized weight against its source)."""
    out, errors = {}, {}
    for name, t in tensors.items():
        if not quantized_name(name):
            out[name] = t
            continue
        if t.dim() != 2 or not t.is_floating_point():
            raise ValueError(f"{name}: a linear weight should be a 2-dim float tensor, got {t.dtype} "
                             f"{tuple(t.shape)}")
        q, scale_inv = quantize_block_fp8(t)
        out[name], out[f"{name}_scale_inv"] = q, scale_inv
        ref = t.float()
        errors[name] = float((dequantize_block_fp8(q, scale_inv) - ref).norm() / ref.norm().clamp_min(1e-30))
    return out, errors


def convert(src: Path, out: Path) -> dict[str, float]:
    """The checkpoint in `src` (config.json, *.safetensors) written to `out` as block FP8; returns the errors."""
    config = json.loads((src / "config.json").read_text())
    if config.get("quantization_config"):
        raise ValueError(f"{src} already has a quantization_config ({config['quantization_config']}); convert the "
                         "BF16 checkpoint it came from")
    out.mkdir(parents=True, exist_ok=True)
    errors: dict[str, float] = {}
    for path in sorted(src.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            tensors = {name: f.get_tensor(name) for name in f.keys()}
            metadata = f.metadata()
        converted, errs = convert_tensors(tensors)
        save_file(converted, str(out / path.name), metadata=metadata)
        errors.update(errs)
    if not errors:
        raise ValueError(f"{src} holds no linear weight to quantize (no *.safetensors with DeepSeek's tensor names)")
    index = src / "model.safetensors.index.json"
    if index.exists():  # the scales live in the shard of their weight
        data = json.loads(index.read_text())
        data["weight_map"].update({f"{n}_scale_inv": data["weight_map"][n] for n in errors})
        (out / index.name).write_text(json.dumps(data, indent=1))
    config["quantization_config"] = QUANTIZATION_CONFIG
    (out / "config.json").write_text(json.dumps(config, indent=1))
    for path in src.iterdir():
        if path.is_file() and path.suffix != ".safetensors" and path.name not in ("config.json", index.name):
            shutil.copy(path, out / path.name)
    (out / "fp8_conversion.json").write_text(json.dumps(dict(sorted(errors.items(), key=lambda kv: -kv[1])),
                                                        indent=1))
    return errors


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", type=Path, required=True, help="BF16 checkpoint folder")
    ap.add_argument("--out", type=Path, required=True, help="where the block-FP8 checkpoint goes")
    args = ap.parse_args(argv)
    errors = convert(args.src, args.out)
    worst = sorted(errors.items(), key=lambda kv: -kv[1])
    print(f"{len(errors)} weights quantized to block FP8 -> {args.out}; round-trip rel-L2 against BF16: "
          f"max {worst[0][1]:.4f} ({worst[0][0]}), median {worst[len(worst) // 2][1]:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
