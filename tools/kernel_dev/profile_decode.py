"""One decode shape, run `--decodes` times, for `ncu` (GPU host): python -m tools.kernel_dev.profile_decode B S_K H [S_Q]
[--impl cuda|triton|flashmla|flashmla-fp8] [--context-len N]. Inputs are built like benchmarks/bench_kernels.py
(shuffled pages, unit-scale bf16). snapmla runs the split count the backend plans: from the table width, or with
--context-len from the static page bound a CUDA-graph server plans with. flashmla / flashmla-fp8 run FlashMLA's BF16
and per-tensor FP8 kernels on the same pages (their scheduler metadata made outside the profiled range)."""

import argparse
import math

import torch

from harness.kernel_timing import PAGE, make_inputs

from sglang_snapmla import decode_plan, ops

ap = argparse.ArgumentParser()
ap.add_argument("b", type=int)
ap.add_argument("sk", type=int)
ap.add_argument("h", type=int)
ap.add_argument("sq", type=int, nargs="?", default=1)
ap.add_argument("--impl", default="cuda", choices=("cuda", "triton", "flashmla", "flashmla-fp8"))
ap.add_argument("--context-len", type=int, default=0, help="plan from the static bound of this context length")
ap.add_argument("--decodes", type=int, default=3)
a = ap.parse_args()
dev = torch.device("cuda")
x = make_inputs(a.b, a.sk, a.h, a.sq, 1, dev)[0]
seqlens = torch.full((a.b,), a.sk, device=dev, dtype=torch.int32)
scale = 1 / math.sqrt(576)

if a.impl.startswith("flashmla"):
    from sgl_kernel.flash_mla import flash_mla_with_kvcache, get_mla_metadata

    fp8 = a.impl == "flashmla-fp8"
    md, ns = get_mla_metadata(seqlens, a.sq * a.h, 1, **({"is_fp8_kvcache": True} if fp8 else {}))
    q, kv = x["q"], x["ckv"].view(-1, PAGE, 1, 576)
    extra = {}
    if fp8:
        one = torch.ones(1, device=dev, dtype=torch.float32)
        q, kv, extra = q.to(torch.float8_e4m3fn), kv.to(torch.float8_e4m3fn), {"descale_q": one, "descale_k": one}

    def decode():
        flash_mla_with_kvcache(q, kv, x["bt"], seqlens, 512, md, ns, softmax_scale=scale, causal=True, **extra)
else:
    bound = decode_plan.static_max_pages(a.context_len) if a.context_len else x["bt"].shape[1]
    splits = decode_plan.plan_decode(a.b, a.sq, a.h, bound, dev, a.impl).splits
    print("plan: page bound", bound, "splits", splits)

    def decode():
        ops.quantize_and_decode(x["q"][..., :512], x["q"][..., 512:], x["kv8"], x["ks"], x["kr"], x["bt"], seqlens,
                                scale, num_splits=splits, impl=a.impl)


decode()  # loads the kernel (the prebuilt library's self-check launches it on a small problem first)
torch.cuda.synchronize()
# profile.sh reports only launches inside this range (ncu --nvtx-include "profile/")
torch.cuda.nvtx.range_push("profile")
for _ in range(a.decodes):
    decode()
torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
print("done", a)
