"""Localize sm_90a CUDA decode errors (GPU host): per case, LSE error (QK + softmax) and output error (PV), by
row and by output half. Usage: python -m tools.kernel_dev.debug_cuda"""


import torch

from harness.problems import paged_problem, pool_arrays

from sglang_snapmla import numerics as nx
from sglang_snapmla import ops

CASES = [  # (name, seq_lens, heads, s_q, splits, zero_rope)
    # the narrow kernel (<= 32 query rows per sequence)
    ("1 page h16", [64], 16, 1, 1, True),
    ("1 page h16 rope", [64], 16, 1, 1, False),
    ("5 pages h16", [300], 16, 1, 1, False),
    ("splits h32", [1000, 77], 32, 1, 3, False),
    ("3 pages h16 sq2", [150], 16, 2, 1, False),
    ("partial h8 sq2", [37, 130], 8, 2, 1, False),
    # the wide kernel
    ("1 page h64", [64], 64, 1, 1, True),
    ("1 page h64 rope", [64], 64, 1, 1, False),
    ("2 pages h64", [128], 64, 1, 1, False),
    ("partial h16", [37], 16, 1, 1, False),
    ("splits h64", [1000, 77], 64, 1, 3, False),
    ("partial h16 sq3", [37, 130], 16, 3, 1, False),
    ("3 pages h128 sq2", [150], 64, 2, 1, False),
    ("splits h128", [300, 1000], 128, 1, 3, False),
]


def main():
    gen = torch.Generator().manual_seed(0)
    for name, lens, heads, s_q, splits, zero_rope in CASES:
        p = paged_problem(gen, lens, heads, s_q=s_q)
        if zero_rope:
            p["q_rope"].zero_()
            p["k_rope"].zero_()
        p = {k: v.cuda() if torch.is_tensor(v) else v for k, v in p.items()}
        cache = nx.quantize_kv(p["c_kv"], p["k_rope"])
        kv = pool_arrays(cache)
        qn, qr = p["q_nope"].to(torch.bfloat16), p["q_rope"].to(torch.bfloat16)
        q = nx.quantize_q(qn, qr)
        ref, ref_lse = nx.snapmla_decode_reference(q, cache, p["block_table"], p["seq_lens"], p["softmax_scale"])
        try:
            out, lse = ops.quantize_and_decode(qn, qr, *kv, p["block_table"], p["seq_lens"], p["softmax_scale"],
                                          num_splits=splits, impl="cuda")
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            print(f"{name}: raised {e!r}")
            continue
        out = out.float()
        d_lse = (lse - ref_lse).abs()
        err = (out - ref).float()
        rel = err.norm() / ref.norm()
        row_err = (err.norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-6)).flatten()
        bad_rows = (row_err > 0.05).nonzero().flatten().tolist()
        halves = [(err[..., h * 256:(h + 1) * 256].norm() / ref[..., h * 256:(h + 1) * 256].norm()).item()
                  for h in range(2)]
        ratio = (out * ref).sum() / (ref * ref).sum()
        print(f"{name}: lse max|d| {d_lse.max().item():.3e} (nan {torch.isnan(lse).sum().item()}), out rel-L2 "
              f"{rel.item():.3e}, halves {halves[0]:.3e}/{halves[1]:.3e}, <out,ref>/<ref,ref> {ratio.item():.4f}, "
              f"bad rows {len(bad_rows)}/{row_err.numel()} first {bad_rows[:12]}")
        if d_lse.max() > 1e-2:
            print("   lse ref", ref_lse.flatten()[:6].tolist(), "\n   lse got", lse.flatten()[:6].tolist())
        if rel > 1e-2:
            print("   out ref", ref.flatten()[:6].tolist(), "\n   out got", out.flatten()[:6].tolist())


if __name__ == "__main__":
    main()
