"""One decode shape, called a few times, for `ncu` (GPU host): python -m tools.kernel_dev.profile_decode B S_K H [S_Q]
[--impl cuda|triton]. Inputs are built like benchmarks/bench_kernels.py (shuffled pages, unit-scale bf16)."""

import argparse
import math

import torch

from harness.kernel_timing import make_inputs

from sglang_snapmla import ops

ap = argparse.ArgumentParser()
ap.add_argument("b", type=int)
ap.add_argument("sk", type=int)
ap.add_argument("h", type=int)
ap.add_argument("sq", type=int, nargs="?", default=1)
ap.add_argument("--impl", default="cuda")
ap.add_argument("--calls", type=int, default=3)
a = ap.parse_args()
x = make_inputs(a.b, a.sk, a.h, a.sq, 1, torch.device("cuda"))[0]
seqlens = torch.full((a.b,), a.sk, device="cuda", dtype=torch.int32)


def decode():
    ops.quantize_and_decode(x["q"][..., :512], x["q"][..., 512:], x["kv8"], x["ks"], x["kr"], x["bt"], seqlens,
                            1 / math.sqrt(576), impl=a.impl)


decode()  # loads the kernel (the prebuilt library's self-check launches it on a small problem first)
torch.cuda.synchronize()
# profile.sh reports only launches inside this range (ncu --nvtx-include "profile/")
torch.cuda.nvtx.range_push("profile")
for _ in range(a.calls):
    decode()
torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
print("done", a)
