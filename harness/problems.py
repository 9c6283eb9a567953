"""Paged MLA decode problems for tests, benchmarks and tools: random problems on shuffled page pools, the hard cases,
and what a serving pool holds besides the keys (stale bytes, garbage table tails). Plain torch, CPU or GPU."""

from __future__ import annotations

import math

import torch

from sglang_snapmla.layout import KV_LORA_RANK, PAGE_SIZE, ROPE_DIM
from sglang_snapmla.numerics import gather_sequence


def paged_problem(gen: torch.Generator, seq_lens, heads: int, s_q: int = 1, zero_rows: int = 0,
                  rope_outlier: float | None = None, spare_pages: int = 3):
    """Unit-scale random MLA decode problem on a shuffled page pool.

    Returns dict(q_nope [B,s_q,H,512], q_rope [B,s_q,H,64], c_kv [S,512], k_rope [S,64], block_table [B,P] int32,
    seq_lens [B] int32, softmax_scale). Logits are O(1) (N(0,1) entries, scale 1/sqrt(576)).
    `zero_rows` tokens per sequence get all-zero c_kv (their RoPE stays random), `rope_outlier` plants values of
    that magnitude in a few RoPE channels."""
    B = len(seq_lens)
    pages = max(math.ceil(n / PAGE_SIZE) for n in seq_lens)
    num_pages = B * pages + spare_pages + 1
    S = num_pages * PAGE_SIZE
    c_kv = torch.randn(S, KV_LORA_RANK, generator=gen)
    k_rope = torch.randn(S, ROPE_DIM, generator=gen)
    perm = torch.randperm(num_pages - 1, generator=gen)[: B * pages] + 1  # page 0 = dummy, never used
    block_table = perm.reshape(B, pages).to(torch.int32)
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32)
    for b, n in enumerate(seq_lens):
        if zero_rows:
            pos = torch.randperm(n, generator=gen)[:zero_rows]
            c_kv[block_table[b, pos // PAGE_SIZE].long() * PAGE_SIZE + pos % PAGE_SIZE] = 0
    if rope_outlier is not None:
        chans = torch.randperm(ROPE_DIM, generator=gen)[:4]
        rows = torch.randperm(S, generator=gen)[: S // 8]
        k_rope[rows[:, None], chans[None, :]] = rope_outlier * torch.sign(torch.randn(len(rows), 4, generator=gen))
    q_nope = torch.randn(B, s_q, heads, KV_LORA_RANK, generator=gen)
    q_rope = torch.randn(B, s_q, heads, ROPE_DIM, generator=gen)
    return dict(q_nope=q_nope, q_rope=q_rope, c_kv=c_kv, k_rope=k_rope, block_table=block_table,
                seq_lens=seq_lens_t, softmax_scale=1.0 / math.sqrt(KV_LORA_RANK + ROPE_DIM))


EXTREME_SCALE_CASES = ("dominant_first_page", "token_scales_over_six_decades")


def apply_extreme_scales(p, case: str, gen: torch.Generator):
    """Make a `paged_problem` (in place) one of the cases that exercise the CUDA decode's log-domain softmax:
    dominant_first_page -- every sequence's page 0 holds 8 x head 0's query (that row's logits ~+170 over the rest,
    past the kernel's 2^64 reference gap); token_scales_over_six_decades -- each key's content times 10^U(-3, 3)
    (sigma_k spread over ~2^20 inside a page), the query's content / 1e3 so the logits stay O(1)."""
    if case == "dominant_first_page":
        for b in range(p["block_table"].shape[0]):
            slots = p["block_table"][b, 0].long() * PAGE_SIZE + torch.arange(PAGE_SIZE)
            p["c_kv"][slots] = 8 * p["q_nope"][b, 0, 0]
    elif case == "token_scales_over_six_decades":
        p["c_kv"] *= 10.0 ** (6 * torch.rand(p["c_kv"].shape[0], 1, generator=gen) - 3)
        p["q_nope"] /= 1000
    else:
        raise ValueError(f"unknown case {case!r}; one of {EXTREME_SCALE_CASES}")


def pool_arrays(cache):
    """The (content, scale, rope) pool arrays of a `numerics.quantize_kv` cache, contiguous, as the kernels take them
    (`ops.quantize_and_decode(q_nope, q_rope, *pool_arrays(cache), ...)`)."""
    return cache.content.contiguous(), cache.scale.contiguous(), cache.rope.contiguous()


def golden_args(p):
    return (p["q_nope"], p["q_rope"], p["c_kv"], p["k_rope"], p["block_table"], p["seq_lens"], p["softmax_scale"])


# Small decode problems with the hard cases (length 1, lengths not a multiple of 64, RoPE outliers ~1e3, few heads
# as under tensor parallelism); `paged_problem` adds zero rows and scattered pages. (seq_lens, heads, s_q, outlier)
HARD_DECODE_CASES = [
    ([1, 64, 100], 16, 1, None),
    ([130, 2, 65], 8, 2, None),
    ([200, 37], 64, 1, 1000.0),
    ([63, 129], 128, 2, None),
    ([256], 32, 1, 1000.0),
    ([70, 1, 333, 129], 2, 1, None),  # tensor parallelism leaves few heads per GPU (16 heads / TP 8)
    ([129], 4, 2, 1000.0),
]
# the small cases of the CUDA decode's test against the spec (tests/product/test_gpu_kernels.py, which adds two large ones),
# also what tools/kernel_dev/decode_seed_sweep.py sweeps over seeds to set that test's bound
CUDA_DECODE_SMALL_CASES = [
    ([1, 64, 100, 4097], 128, 1, None),
    ([130, 2, 65], 16, 2, None),
    ([200, 37], 64, 1, 1000.0),
    *HARD_DECODE_CASES,
]


# ----------------------------------------------------------------------------------------------------------------
# What a serving pool holds besides the sequences' keys: reused pages keep a previous request's bytes (NaN and
# infinities included) in the slots past a sequence's end, and a block table's entries past a sequence's pages hold
# whatever an earlier, longer batch left there.
# ----------------------------------------------------------------------------------------------------------------
def unwritten_slot_mask(num_slots: int, block_table: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    """[num_slots] bool: True for every slot that is not among some sequence's first seq_len keys."""
    written = torch.zeros(num_slots, dtype=torch.bool)
    for b, n in enumerate(seq_lens.tolist()):
        written[gather_sequence(block_table[b].cpu(), n)] = True
    return ~written


def poison_unwritten(kv_content: torch.Tensor, kv_scale: torch.Tensor, kv_rope: torch.Tensor, block_table: torch.Tensor,
                     seq_lens: torch.Tensor, gen: torch.Generator) -> None:
    """Fill every unwritten slot of the pool arrays (in place) with stale, mostly non-finite bytes: FP8 NaN (0x7F /
    0xFF) and random codes, scales NaN / +-inf / 1e30 / random, RoPE NaN / inf / random."""
    bad = unwritten_slot_mask(kv_content.shape[0], block_table, seq_lens).to(kv_content.device)
    n = int(bad.sum())
    content = torch.randint(0, 256, (n, KV_LORA_RANK), generator=gen, dtype=torch.uint8)
    content[torch.rand(n, KV_LORA_RANK, generator=gen) < 0.5] = 0x7F
    scale_choices = torch.tensor([math.nan, math.inf, -math.inf, 1e30, -1e30])
    scale = scale_choices[torch.randint(0, 5, (n,), generator=gen)]
    rope_choices = torch.tensor([math.nan, math.inf, -math.inf, 3e38], dtype=torch.float32).to(torch.bfloat16)
    rope = rope_choices[torch.randint(0, 4, (n, ROPE_DIM), generator=gen)]
    kv_content.view(torch.uint8)[bad] = content.to(kv_content.device)
    kv_scale[bad] = scale.to(kv_scale.device)
    kv_rope[bad] = rope.to(kv_rope.device)


def garbage_table_tail(block_table: torch.Tensor, seq_lens: torch.Tensor, gen: torch.Generator,
                       extra_columns: int = 2) -> torch.Tensor:
    """A copy of the block table, `extra_columns` wider, whose entries past each sequence's pages are random int32
    page ids (negative, huge, or a page of another sequence)."""
    B, P = block_table.shape
    out = torch.randint(-2**31, 2**31 - 1, (B, P + extra_columns), generator=gen, dtype=torch.int64).to(torch.int32)
    out[:, :P][torch.rand(B, P, generator=gen) < 0.3] = int(block_table.max())  # a live page of someone else
    for b, n in enumerate(seq_lens.tolist()):
        used = math.ceil(n / PAGE_SIZE)
        out[b, :used] = block_table[b, :used].cpu()
    return out.to(block_table.device)
