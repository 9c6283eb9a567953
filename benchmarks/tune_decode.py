"""Sweep the Triton decode's tiling on one shape: prints us, GB/s, registers and spills per variant (H100 host).

    python -m benchmarks.tune_decode --h 128 --b 32 --sk 8192
"""

import argparse
import itertools
import math

import torch
import triton

from sglang_snapmla import ops
from sglang_snapmla.kernels.triton import decode as tdecode


def resources() -> str:
    """Registers / spills / shared memory of the most recently compiled decode variant."""
    try:
        k = list(tdecode.decode_split_kernel.device_caches[0][0].values())[-1]
        return f"regs {k.n_regs} spills {k.n_spills} smem {k.metadata.shared}"
    except Exception as e:  # triton internals moved: report, keep timing
        return f"(resources unavailable: {e!r:.60})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--h", type=int, default=128)
    ap.add_argument("--b", type=int, default=32)
    ap.add_argument("--sk", type=int, default=8192)
    ap.add_argument("--sq", type=int, default=1)
    ap.add_argument("--splits", type=int, nargs="*", default=[0])
    ap.add_argument("--variant", default=None, help="path of an alternative decode kernel module to time instead")
    ap.add_argument("--configs", nargs="*", default=None, help="BLOCK_M:warps:stages list")
    args = ap.parse_args()
    b, sk, h, s_q = args.b, args.sk, args.h, args.sq
    pages = math.ceil(sk / 64)
    n = b * pages * 64
    kv8 = torch.randn(n, 512, device="cuda").to(torch.float8_e4m3fn)
    ks = torch.rand(n, device="cuda") * 0.01 + 0.01
    kr = torch.randn(n, 64, device="cuda", dtype=torch.bfloat16)
    bt = torch.randperm(b * pages, device="cuda", dtype=torch.int32).view(b, pages)
    lens = torch.full((b,), sk, device="cuda", dtype=torch.int32)
    q8 = torch.randn(b, s_q, h, 512, device="cuda").to(torch.float8_e4m3fn)
    qs = torch.rand(b, s_q, h, device="cuda") * 0.01 + 0.01
    qr = torch.randn(b, s_q, h, 64, device="cuda", dtype=torch.bfloat16)
    if args.variant:  # swap in an experimental kernel module with the same kernel signature
        import importlib.util

        spec = importlib.util.spec_from_file_location("decode_variant", args.variant)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        ops.tdecode = mod
        global tdecode
        tdecode = mod
    configs = [tuple(int(v) for v in c.split(":")) for c in args.configs] if args.configs else [
        (bm, w, st) for bm in (16, 32, 64) for w in (4, 8) for st in (1, 2, 3)]
    ref = None
    print(f"h{h} b{b} sk{sk} s_q{s_q}: bytes {b * sk * 644 / 1e6:.1f} MB")
    for (block_m, warps, stages), splits in itertools.product(configs, args.splits):
        name = f"BLOCK_M={block_m:3d} warps={warps} stages={stages} splits={splits or 'auto'}"
        try:
            fn = lambda: ops.decode_quantized(q8, qs, qr, kv8, ks, kr, bt, lens, 0.04, splits or None,  # noqa: E731
                                              (block_m, warps, stages))
            out, _ = fn()
            if ref is None:
                ref = out.float()
            err = ((out.float() - ref).norm() / ref.norm()).item()
            us = triton.testing.do_bench(fn, warmup=20, rep=100, return_mode="median") * 1e3
            print(f"{name}: {us:8.1f} us {b * sk * 644 / us / 1e3:7.0f} GB/s {resources()}  err {err:.1e}", flush=True)
        except Exception as e:  # a variant that fails to compile or launch is reported, the sweep goes on
            print(f"{name}: failed {e!r:.150}", flush=True)


if __name__ == "__main__":
    main()
