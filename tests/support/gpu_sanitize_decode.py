"""One small decode for `compute-sanitizer --tool memcheck python tests/support/gpu_sanitize_decode.py` (GPU host)."""

import torch

from helpers import garbage_table_tail, poison_unwritten
from sglang_snapmla import numerics as nx
from sglang_snapmla import ops

g = torch.Generator().manual_seed(0)
B, H, s_q, lens = 3, 16, 2, [2, 65, 190]
pages = 3
S = (B * pages + 1) * 64
c = torch.randn(S, 512, generator=g).to(torch.bfloat16).cuda()
r = torch.randn(S, 64, generator=g).to(torch.bfloat16).cuda()
kv8, ks, kr = ops.pool_from_rows(c, r)
bt = (torch.randperm(B * pages, generator=g) + 1).view(B, pages).to(torch.int32).cuda()
q = torch.randn(B, s_q, H, 576, generator=g).to(torch.bfloat16).cuda()
out, lse = ops.quantize_and_decode(q[..., :512], q[..., 512:], kv8, ks, kr, bt, torch.tensor(lens, dtype=torch.int32,
                              device="cuda"), 576**-0.5)
# one split: the CUDA decode writes the final outputs itself (no partials, no combine)
out1, lse1 = ops.quantize_and_decode(q[..., :512], q[..., 512:], kv8, ks, kr, bt, torch.tensor(lens, dtype=torch.int32,
                                device="cuda"), 576**-0.5, num_splits=1)
# more CTAs than SMs (160 sequences of one 64-row tile each; with two splits some splits have no page)
B2 = 160
lens2 = torch.randint(1, 130, (B2,), generator=g).to(torch.int32).cuda()
bt2 = torch.randint(1, B * pages + 1, (B2, 3), generator=g).to(torch.int32).cuda()
q2 = torch.randn(B2, 1, H, 576, generator=g).to(torch.bfloat16).cuda()
out2, lse2 = ops.quantize_and_decode(q2[..., :512], q2[..., 512:], kv8, ks, kr, bt2, lens2, 576**-0.5, num_splits=1)
out3, lse3 = ops.quantize_and_decode(q2[..., :512], q2[..., 512:], kv8, ks, kr, bt2, lens2, 576**-0.5, num_splits=2)
ops.fetch_dequant(torch.arange(100, device="cuda"), kv8, ks, kr)
# a reused pool: stale NaN / inf bytes past every sequence's end and random page ids past its pages (never read)
bt4 = garbage_table_tail(bt, torch.tensor(lens), g, extra_columns=4)
poison_unwritten(kv8, ks, kr, bt, torch.tensor(lens, dtype=torch.int32), g)
for splits in (1, 3):
    out4, _ = ops.quantize_and_decode(q[..., :512], q[..., 512:], kv8, ks, kr, bt4,
                                      torch.tensor(lens, dtype=torch.int32, device="cuda"), 576**-0.5, num_splits=splits)
    assert torch.isfinite(out4.float()).all()
# the wide kernel (more than 32 query rows per sequence: one row tile at 64 heads, two at 128; the decodes above run
# the narrow one) over the same stale pool
for heads in (64, 128):
    q5 = torch.randn(B, 1, heads, 576, generator=g).to(torch.bfloat16).cuda()
    for splits in (1, 3):
        out5, _ = ops.quantize_and_decode(q5[..., :512], q5[..., 512:], kv8, ks, kr, bt4,
                                          torch.tensor(lens, dtype=torch.int32, device="cuda"), 576**-0.5,
                                          num_splits=splits)
        assert torch.isfinite(out5.float()).all()
torch.cuda.synchronize()
assert torch.isfinite(out.float()).all() and torch.isfinite(lse).all()
assert torch.isfinite(out1.float()).all() and torch.isfinite(lse1).all()
assert torch.isfinite(out2.float()).all() and torch.isfinite(out3.float()).all()
print("sanitize run ok", out.shape, lse.shape)
