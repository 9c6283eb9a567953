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
for _ in range(a.calls):
    ops.quantize_and_decode(x["q"][..., :512], x["q"][..., 512:], x["kv8"], x["ks"], x["kr"], x["bt"], seqlens,
                       1 / math.sqrt(576), impl=a.impl)
torch.cuda.synchronize()
print("done", a)
