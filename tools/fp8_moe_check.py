"""SGLang's block-FP8 fused MoE (the Triton runner a block-FP8 DeepSeek/Kimi server uses on Hopper) against a
dequantized float32 reference, at a model config's per-GPU expert shape, with the deployment draw of
`sglang_snapmla.dummy_weights` (GPU host).

    python -m tools.fp8_moe_check --model configs/models/deepseek-v3-fp8-dp-attention [--tokens 1 9 64 512]

Top-1 routing (the per-GPU configs' share of top-8). Per routed scaling factor (default: the config's; several with
--routed-scaling-factor 1.0 2.5), out of place and in place (as the model calls it), per token count: the largest
|output| of SGLang's kernel and of the reference, the relative error (FP8 activation quantization alone gives a few
%), and how many 128-row blocks of the hidden output are off by more than 50 % (weights, scales or a buffer read from
the wrong place). Writes JSON with --out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from sglang_snapmla.block_fp8 import dequantize_block_fp8
from sglang_snapmla.dummy_weights import redraw_block_fp8


def reference(x: torch.Tensor, ids: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """Top-1 routing, router weight 1: silu(gate) * up, then the down projection, per token in float32."""
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    for e in ids.unique().tolist():
        rows = (ids == e).nonzero().flatten()
        h = x[rows].float() @ w13[e].T
        gate, up = h.chunk(2, dim=-1)
        out[rows] = (F.silu(gate) * up) @ w2[e].T
    return out


def check(model: str, tokens: list[int], scaling: float | None = None, inplace: bool = False,
          seed: int = 0) -> list[dict]:
    from sglang.srt.layers.moe.moe_runner.base import MoeRunnerConfig
    from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe import fused_experts
    from sglang.srt.layers.moe.topk import StandardTopKOutput
    from sglang.srt.runtime_context import publish
    from sglang.srt.server_args import ServerArgs

    from sglang.srt.distributed import parallel_state

    publish(ServerArgs(model_path=model, load_format="dummy"), role="test")  # the kernel config reads the server's
    if not parallel_state.model_parallel_is_initialized():  # the kernel asks its TP group (one GPU: a group of 1)
        parallel_state.init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                                    distributed_init_method="tcp://127.0.0.1:29517")
        parallel_state.initialize_model_parallel(1)

    cfg = json.loads((Path(model) / "config.json").read_text())
    experts, hidden, inter = cfg["n_routed_experts"], cfg["hidden_size"], cfg["moe_intermediate_size"]
    scaling = cfg.get("routed_scaling_factor", 1.0) if scaling is None else scaling
    dev = torch.device("cuda")
    g = torch.Generator(device=dev)
    g.manual_seed(seed)
    w13 = torch.empty(experts, 2 * inter, hidden, dtype=torch.float8_e4m3fn, device=dev)
    s13 = torch.empty(experts, 2 * inter // 128, hidden // 128, dtype=torch.float32, device=dev)
    w2 = torch.empty(experts, hidden, inter, dtype=torch.float8_e4m3fn, device=dev)
    s2 = torch.empty(experts, hidden // 128, inter // 128, dtype=torch.float32, device=dev)
    redraw_block_fp8(w13, s13, g)
    redraw_block_fp8(w2, s2, g)
    d13, d2 = dequantize_block_fp8(w13, s13), dequantize_block_fp8(w2, s2)
    runner = MoeRunnerConfig(num_experts=experts, num_local_experts=experts, hidden_size=hidden,
                             intermediate_size_per_partition=inter, top_k=1, inplace=inplace,
                             routed_scaling_factor=scaling)
    rows = []
    for m in tokens:
        x = torch.randn(m, hidden, generator=g, device=dev).to(torch.bfloat16)
        ids = (torch.arange(m, device=dev, dtype=torch.int32) + 15).remainder(experts).view(m, 1)
        weights = torch.ones(m, 1, device=dev)
        got = fused_experts(x.clone(), w13, w2, StandardTopKOutput(weights, ids, None), runner, use_fp8_w8a8=True,
                            w1_scale=s13, w2_scale=s2, block_shape=[128, 128]).float()
        want = reference(x, ids.view(-1), d13, d2) * scaling
        err = (got - want).view(m, -1, 128)
        off = (err.norm(dim=-1) > 0.5 * want.view(m, -1, 128).norm(dim=-1)) | ~torch.isfinite(err).all(dim=-1)
        finite = torch.isfinite(got)
        rows.append({"tokens": m, "routed_scaling_factor": scaling, "inplace": inplace, "experts": experts,
                     "hidden": hidden, "intermediate": inter,
                     "max_abs_sglang": got[finite].abs().max().item(), "non_finite": int((~finite).sum()),
                     "max_abs_reference": want.abs().max().item(),
                     "rel_err": ((got - want).nan_to_num(posinf=1e30, neginf=-1e30).norm() / want.norm()).item(),
                     "blocks_off": int(off.sum()), "blocks": off.numel(),
                     "first_block_off": [int(i) for i in off.nonzero()[0]] if off.any() else None})
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 9, 64, 512])
    ap.add_argument("--routed-scaling-factor", type=float, nargs="+", default=[None],
                    help="the factors to run (default: the config's)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    rows = [r for f in args.routed_scaling_factor for inplace in (False, True)
            for r in check(args.model, args.tokens, f, inplace)]
    print("| routed scaling | in place | tokens | max abs SGLang | max abs reference | non-finite | rel err | "
          "128-row blocks off | first off (token, block) |\n|---:|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['routed_scaling_factor']} | {r['inplace']} | {r['tokens']} | {r['max_abs_sglang']:.4g} | "
              f"{r['max_abs_reference']:.4g} | {r['non_finite']} | "
              f"{r['rel_err']:.4f} | {r['blocks_off']}/{r['blocks']} | {r['first_block_off']} |")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
