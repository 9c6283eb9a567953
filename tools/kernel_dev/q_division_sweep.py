"""The Q-quant's and K-append's content division (kernels/triton/quant.py, `_div_rn`: x * RN(1/s) and one Markstein
correction) against IEEE division, over every input a bf16 row can give it: each positive bf16 value as the row's
amax (its scale s = numerics.amax_scale, the floor included), each bf16 value x with |x| <= amax. numpy models
of the kernel's fp32 operations (harness.exact_fp32: single roundings, as the GPU's FMUL and FFMA).

    python -m tools.kernel_dev.q_division_sweep [--stride N] [--jobs J] [--out DIR]

--stride N takes every N-th amax (the tests run a stride; the whole sweep takes a few minutes on two cores). Prints
the counts and writes DIR/q_division_sweep.json: the (value, scale) pairs, and for x * r alone and with the
correction the values whose fp8 byte differs from the division's, and those whose fp32 quotient differs where the
quotient is at least 2^-12 (below that the fp8 byte is 0 either way)."""

from __future__ import annotations

import argparse
import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch

from harness.exact_fp32 import div_rn_f32, fma_f32
from sglang_snapmla import numerics as nx

SMALL = 2.0 ** -12  # quotients below this are fp8 zeros (fp8's smallest subnormal is 2^-9)
KINDS = ("reciprocal", "corrected")


def finite_bf16() -> np.ndarray:
    """Every finite bf16 value (-0 included) as float32, ascending."""
    every = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    return np.sort(every[every.isfinite()].numpy())


def quotients(x: np.ndarray, s: np.float32) -> dict:
    """The kernel's content quotients of x by s: x * r alone, and with the correction (the kernel's)."""
    r = div_rn_f32(np.float32(1.0), s)
    q = (x.astype(np.float64) * np.float64(r)).astype(np.float32)  # the product is exact in float64: one rounding
    return {"reciprocal": q, "corrected": fma_f32(-fma_f32(s, q, -x), r, q)}


def fp8_bytes(q: np.ndarray) -> np.ndarray:
    return nx.to_fp8(torch.from_numpy(q)).view(torch.uint8).numpy()


def sweep_amaxes(amaxes: np.ndarray) -> dict:
    every = finite_bf16()
    out = {"pairs": 0, **{k: {"fp8": 0, "fp32": 0, "examples": []} for k in KINDS}}
    for amax in amaxes:
        s = np.float32(nx.amax_scale(torch.tensor([amax], dtype=torch.float32)).item())
        x = every[np.abs(every) <= amax]
        want = div_rn_f32(x, s)
        want8, large = fp8_bytes(want), np.abs(want) >= SMALL
        out["pairs"] += int(x.size)
        for kind, q in quotients(x, s).items():
            bad8 = fp8_bytes(q) != want8
            o = out[kind]
            o["fp8"] += int(bad8.sum())
            o["fp32"] += int(((q.view(np.int32) != want.view(np.int32)) & large).sum())
            if bad8.any() and len(o["examples"]) < 5:
                o["examples"].append({"amax": float(amax), "x": float(x[bad8][0])})
    return out


def sweep(stride: int = 1, jobs: int = 2) -> dict:
    """Every stride-th positive bf16 amax, split over jobs processes."""
    pos = finite_bf16()
    amaxes = np.unique(np.abs(pos[pos > 0]))[::stride]
    # spawned, not forked: a fork of a process whose torch has started its threads can hang in them
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as ex:
        parts = list(ex.map(sweep_amaxes, [amaxes[i::jobs] for i in range(jobs)]))
    total = {"stride": stride, "amaxes": int(amaxes.size), "pairs": sum(p["pairs"] for p in parts)}
    for k in KINDS:
        total[k] = {"fp8": sum(p[k]["fp8"] for p in parts), "fp32": sum(p[k]["fp32"] for p in parts),
                    "examples": [e for p in parts for e in p[k]["examples"]][:5]}
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stride", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("."))
    a = ap.parse_args()
    res = sweep(a.stride, a.jobs)
    print(f"{res['amaxes']} amaxes, {res['pairs']} (value, scale) pairs")
    print("| quotient | fp8 bytes unlike the division's | fp32 quotients unlike it (>= 2^-12) |\n|---|---:|---:|")
    for k in KINDS:
        print(f"| {k} | {res[k]['fp8']} | {res[k]['fp32']} |")
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "q_division_sweep.json").write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
