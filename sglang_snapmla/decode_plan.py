"""The decode's plan: what a decode launch chain (Q-quant, split decode, combine) needs that depends on the step's
shapes only -- which implementation runs (SNAPMLA_DECODE_IMPL, the sm_90a library where it loads), the split count
(the sm_90a decode's cost model, the Triton decode's wave fill), the fp32 partial slots, the Triton tiling and
programmatic dependent launch. Built once per step (`plan_decode`: the backend in its forward-metadata hooks) and
run by `ops.decode_planned` in every layer; shapes only, never device data, so a plan recorded into a CUDA graph
holds at every replay."""

from __future__ import annotations

import dataclasses
import functools
import math

import torch

from .errors import SnapMLAInputError
from .layout import KV_LORA_RANK, PAGE_SIZE
from .settings import (DECODE_IMPL_ENV, VALUES, interpreter_mode, pdl_allowed, q_in_decode_requested,
                       requested_decode_impl)

MAX_SPLITS = 64
# Decode implementation: "auto" (default: the sm_90a CUDA kernel where it builds and runs, else Triton, the reason
# logged once), "cuda" (an error if the CUDA kernel is unavailable) or "triton".
DECODE_IMPLS = VALUES[DECODE_IMPL_ENV]
CUDA_ROWS = 64  # the sm_90a kernel's row tile (one WGMMA M)
# the most query rows per sequence the sm_90a narrow kernel takes (snapmla_decode_sm90.cu, narrow_rows); more run on
# the 64-row kernel, which can quantize Q itself
CUDA_NARROW_MAX_ROWS = 32


def q_rows_fit_the_kernel(q_nope: torch.Tensor, q_rope: torch.Tensor) -> bool:
    """Whether the 64-row kernel can read these bf16 Q rows itself: 16-byte loads of q_nope's rows and 4-byte loads
    of q_rope's pairs, i.e. 16-byte aligned q_nope rows (pointer and strides) and 4-byte aligned q_rope rows."""
    return (q_nope.data_ptr() % 16 == 0 and q_nope.stride(0) % 8 == 0 and q_nope.stride(1) % 8 == 0
            and q_rope.data_ptr() % 4 == 0 and q_rope.stride(0) % 2 == 0 and q_rope.stride(1) % 2 == 0
            and q_nope.stride(2) == 1 and q_rope.stride(2) == 1)


@functools.lru_cache(maxsize=8)
def _num_sms(device_index: int) -> int:
    if not torch.cuda.is_available():
        return 8  # interpreter: small, but still exercises several splits
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def decode_tiling(rows: int) -> tuple[int, int, int]:
    """(BLOCK_M, num_warps, num_stages) for `rows` = s_q * H query rows per sequence.

    Measured on the H100 (docs/BENCHMARKS.md, benchmarks/tune_decode.py): 16-row tiles with 3 stages stream the cache
    fastest for <= 16 rows; 32-row tiles halve the K/V re-reads for more heads. Both fit two CTAs per SM."""
    return (16, 4, 3) if rows <= 16 else (32, 4, 2)


CTAS_PER_SM = 2  # both tilings above: ~240 registers x 128 threads and <= 112 KB shared memory per CTA


def choose_num_splits(batch: int, row_tiles: int, max_pages: int, device: torch.device,
                      ctas_per_sm: int = CTAS_PER_SM, sms: int | None = None) -> int:
    """Splits over the KV length so that batch * row_tiles * splits fills one wave of resident CTAs.

    A partial second wave costs as much as a full one (b128 h16: 3 splits ran 30 % slower than 2), so we round
    down. Depends only on shapes (batch, heads, the page table's width), never on device data: CUDA-graph safe.
    Each split keeps at least one page. `sms` stands for the device's SM count (plans for another GPU)."""
    slots = ctas_per_sm * (sms or _num_sms(device.index or 0))
    want = slots // max(1, batch * row_tiles)
    return max(1, min(want, MAX_SPLITS, max_pages))


# Cost model of the sm_90a decode + combine, fitted to benchmarks/gpu/split_sweep.py (docs/KERNEL.md, "Batches
# between waves"): a split's page loop costs ~1.56 us per page (one CTA, latency-bound), every split adds 2 KB of fp32
# partials per query row to write and combine (~0.42 us per MB) and up to ~0.1 us to the combine (alone at h128 b1:
# 1.6 us at 2 splits, 2.4 at 16, whose partial rows it reads in one round trip), and each wave of CTAs ~6 us of
# prologue and epilogue (first page and Q in flight, partials out). Below one wave, more splits are not free: h128
# b1 s_k 4096 took 21.3 us with 64 splits (one page each) and 16.2 with 16.
CUDA_PAGE_US, CUDA_PARTIAL_US_PER_MB, CUDA_COMBINE_US_PER_SPLIT, CUDA_WAVE_US = 1.56, 0.42, 0.1, 6.0
# Counts over several waves are weighed with at most this many bytes of fp32 partials: the measured gains need 32-50
# MB, and unbounded the cost model trades hundreds of MB of partials, allocated in every captured graph, for a wave's
# rounding (h128 s_q 3 b42 over 2k pages: 11 splits, 346 MiB, ~0 % predicted; h128 s_q 4 b512: 3 splits, 1.5 GiB).
SEVERAL_WAVES_PARTIAL_BYTES = 64 << 20


def cuda_num_splits(batch: int, rows: int, max_pages: int, device: torch.device, sms: int | None = None) -> int:
    """Split count for the sm_90a decode: the cheapest under the cost model above. Sequences of two or more 64-row
    tiles (s_q x H > 64, e.g. 128 heads) weigh counts over several waves of CTAs (one per SM and tile): every page is
    read by several CTAs, so a CTA's page time is its own tensor and softmax work, and a batch between waves that
    leaves SMs idle at one split runs faster over more, shorter waves (h128 b40 s_k 16k: 371 us at 1 split, 284 at 3
    in 2 waves), within a budget of partials (SEVERAL_WAVES_PARTIAL_BYTES). One tile per sequence keeps the counts
    of one wave: its CTAs read a page each, bound by DRAM (H100, 16 heads), which fewer SMs still saturate. Shapes
    only: CUDA-graph safe. `sms` stands for the device's SM count (plans for another GPU)."""
    tiles = math.ceil(rows / CUDA_ROWS)
    if tiles == 1:
        most = choose_num_splits(batch, tiles, max_pages, device, ctas_per_sm=1, sms=sms)
        return _cheapest_split_count(batch, rows, max_pages, most, 0)
    within_budget = SEVERAL_WAVES_PARTIAL_BYTES // (max(1, batch) * rows * KV_LORA_RANK * 4)  # batch 0: no partials
    return _cheapest_split_count(batch, rows, max_pages, max(1, min(MAX_SPLITS, max_pages, within_budget)),
                                 sms or _num_sms(device.index or 0))


def predicted_decode_us(batch: int, rows: int, max_pages: int, splits: int, sms: int) -> float:
    """The cost model's time of the sm_90a decode and its combine, in us, for `batch` sequences of `rows` query rows
    and `max_pages` pages in `splits` splits; `sms` > 0 counts the waves of batch x tiles x splits CTAs on that many
    SMs, 0 prices every count as one wave."""
    waves = math.ceil(batch * math.ceil(rows / CUDA_ROWS) * splits / sms) if sms else 1
    partial_mb = batch * rows * splits * KV_LORA_RANK * 4 / 1e6
    return (waves * (CUDA_PAGE_US * math.ceil(max_pages / splits) + CUDA_WAVE_US)
            + CUDA_PARTIAL_US_PER_MB * partial_mb + CUDA_COMBINE_US_PER_SPLIT * splits)


# Memoized (~30 us of Python per ask for 64 candidates): the backend asks once per step and per absorbed-extend
# launch of a batch, and the same shapes recur step after step; the answer depends on these shapes only.
@functools.lru_cache(maxsize=4096)
def _cheapest_split_count(batch: int, rows: int, max_pages: int, most: int, sms: int) -> int:
    """The cheapest count in 1..most under `predicted_decode_us` (`sms` as there); the fewest splits on a tie."""
    return min(range(1, most + 1), key=lambda s: predicted_decode_us(batch, rows, max_pages, s, sms))


# The sm_90a decode stores a CTA's fp32 partial rows from the accumulator layout (a warp store covers 32 B of 8 rows),
# and that store is slower when the rows are closer (split slots x 2 KB apart): on the H100, h128 b1 s_k 640 at 10
# splits takes 9.8-9.9 us per call with rows 32 KB apart against 10.9-11.1 with 20 KB (docs/KERNEL.md, "Batch 1").
# So where the partials are small each row gets PARTIAL_MIN_SLOTS slots, whatever the split count. With fewer than
# 64 rows per sequence (16 heads, one partial tile) the distance made no difference: those keep `splits` slots.
PARTIAL_MIN_SLOTS = 16
PARTIAL_PAD_MAX_BYTES = 16 << 20  # the padded partials' allocation (no traffic: unused slots are never touched)


def partial_slots(batch: int, rows: int, splits: int, impl: str) -> int:
    """Slots per query row in the fp32 split partials o_part [B, R, slots, 512] / lse_part [B, R, slots] (split s in
    slot s, later slots never written nor read): 0 with one split (the decode writes the outputs itself), else
    `splits`, or PARTIAL_MIN_SLOTS for the sm_90a decode with full 64-row tiles (`rows` = s_q x H >= 64) where that
    costs at most PARTIAL_PAD_MAX_BYTES. Shapes only: CUDA-graph safe."""
    if splits == 1:
        return 0
    padded = batch * rows * PARTIAL_MIN_SLOTS * KV_LORA_RANK * 4
    if (impl != "cuda" or splits >= PARTIAL_MIN_SLOTS or rows < CUDA_ROWS
            or padded > PARTIAL_PAD_MAX_BYTES):
        return splits
    return PARTIAL_MIN_SLOTS


def static_max_pages(context_len: int) -> int:
    """The page bound a server plans every decode step with (the backend: its context length): the same at CUDA-graph
    capture and at every replay, so it covers the longest sequence the server admits, plus one page for a window of
    draft tokens. The split count is chosen for this bound; the kernel divides each sequence's own pages among the
    splits (`split_pages`), so sequences far shorter than the bound leave later splits without pages."""
    return math.ceil(context_len / PAGE_SIZE) + 1


@dataclasses.dataclass(frozen=True)
class DecodePlan:
    """What a decode launch chain (Q-quant, split decode, combine) needs that depends on the step's shapes only:
    built once per step (`plan_decode`; the backend in its forward-metadata hooks) and run by `decode_planned` in
    every layer. Shapes only, never device data: a plan recorded into a CUDA graph holds at every replay.

    batch, s_q, heads: the query shape [batch, s_q, heads] it was planned for; impl: "triton" or "cuda"; splits: the
    split count; slots: fp32 partial slots per query row (0 with one split: the decode writes the outputs itself);
    pdl: programmatic dependent launch; tiling: the Triton decode's (BLOCK_M, num_warps, num_stages) or None;
    q_in_decode: the sm_90a 64-row decode quantizes Q from its bf16 rows itself, with no Q-quant launch before it
    (`ops.quantize_and_decode_planned`)."""
    batch: int
    s_q: int
    heads: int
    impl: str
    splits: int
    slots: int
    pdl: bool
    tiling: tuple[int, int, int] | None = None
    q_in_decode: bool = False


def plan_decode(batch: int, s_q: int, heads: int, max_pages: int, device: torch.device, impl: str | None = None,
                num_splits: int | None = None, tiling: tuple[int, int, int] | None = None,
                q_in_decode: bool | None = None) -> DecodePlan:
    """The decode plan for [batch, s_q, heads] queries over sequences of at most `max_pages` pages; the project's one
    split policy (`cuda_num_splits` for the sm_90a decode, `choose_num_splits` for the Triton one). Callers that
    capture CUDA graphs pass a static page bound (the backend: its context length), so that capture and replay agree.
    `impl` overrides SNAPMLA_DECODE_IMPL; `num_splits` and `tiling` override the heuristics (benchmarks, tests).
    `q_in_decode` (default: SNAPMLA_Q_IN_DECODE=1, wherever the 64-row kernel runs) lets that kernel quantize Q
    itself: Q's rows are read once, in bf16, instead of being quantized to DRAM by one kernel and read back by the
    next (docs/KERNEL.md, "Q inside the decode")."""
    impl = decode_impl(impl)
    rows = s_q * heads
    wide = impl == "cuda" and rows > CUDA_NARROW_MAX_ROWS
    if q_in_decode is None:
        q_in_decode = wide and q_in_decode_requested()
    elif q_in_decode and not wide:
        raise SnapMLAInputError(f"Q is quantized inside the decode only by the sm_90a 64-row kernel (more than "
                                f"{CUDA_NARROW_MAX_ROWS} query rows a sequence); this is {impl} with {rows}")
    if num_splits:
        splits = num_splits
    elif impl == "cuda":
        splits = cuda_num_splits(batch, rows, max_pages, device)
    else:
        splits = choose_num_splits(batch, math.ceil(rows / decode_tiling(rows)[0]), max_pages, device)
    return DecodePlan(batch, s_q, heads, impl, splits, partial_slots(batch, rows, splits, impl), pdl_enabled(device),
                      tiling, q_in_decode)


Q_QUANT_MAX_ROWS = 8  # sm_90, 4 warps: 32 / 32 / 42 / 72 / 153 registers at 1 / 2 / 4 / 8 / 16 rows
Q_QUANT_MIN_PROGRAMS = 1024  # about one wave of 128-thread programs on 132 SMs; fewer leaves SMs idle


def q_quant_rows(tokens: int, heads: int) -> int:
    """Heads of one token each Q-quant program takes: the most (a power of two, at most Q_QUANT_MAX_ROWS and at most
    `heads`) that still leave Q_QUANT_MIN_PROGRAMS programs; 1 where even one row a program leaves fewer.

    One 128-thread program per 1.1 KB row is bound by its issue overhead, not by bytes (h128 b128: 16 384 programs,
    1.3 TB/s); a block of rows shares it. Shapes only, so a captured graph replays the same grid."""
    rows = 1
    while (rows * 2 <= min(heads, Q_QUANT_MAX_ROWS)
           and tokens * math.ceil(heads / (rows * 2)) >= Q_QUANT_MIN_PROGRAMS):
        rows *= 2
    return rows


@functools.lru_cache(maxsize=8)
def _pdl_capable(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def pdl_enabled(device: torch.device) -> bool:
    """Launch Q-quant, decode and combine with programmatic dependent launch (sm_90+; SNAPMLA_PDL=0 turns it off).

    Each kernel's launch and prologue then overlap the previous kernel's tail (Q-quant also triggers the decode
    early): -1.1 to -1.6 us per call at batch 1 on the H100, which is what separates a 3-kernel decode from
    FlashMLA's 2 kernels there (docs/KERNEL.md). Safe for any neighbour: each of the three waits
    (griddepcontrol.wait) for the previous kernel's completion before it reads anything that kernel may write (the
    CUDA decode reads the metadata and pool before it only behind our Q-quant:
    `decode_quantized(follows_q_quant=True)`), and the kernel after the combine is launched normally (the combine
    does not trigger early), so it sees all of our writes."""
    if device.type != "cuda" or interpreter_mode() or not pdl_allowed():
        return False
    return _pdl_capable(device.index if device.index is not None else torch.cuda.current_device())


def decode_impl(requested: str | None = None) -> str:
    """"triton" or "cuda": the decode implementation to run, from `requested` or SNAPMLA_DECODE_IMPL."""
    want = requested or requested_decode_impl()
    if want not in DECODE_IMPLS:
        raise SnapMLAInputError(f"decode implementation must be one of {DECODE_IMPLS}, got {want!r} "
                                "(SNAPMLA_DECODE_IMPL)")
    if want == "triton" or (want == "auto" and interpreter_mode()):
        return "triton"
    if interpreter_mode():
        raise SnapMLAInputError("SNAPMLA_DECODE_IMPL=cuda needs a GPU; Triton's CPU interpreter runs only 'triton'")
    from . import cuda_ext

    if cuda_ext.load() is not None:
        return "cuda"
    if want == "cuda":
        why = cuda_ext.unavailable_reason() or "neither the prebuilt library nor a build here (see the log)"
        raise SnapMLAInputError(f"SNAPMLA_DECODE_IMPL=cuda but the sm90 kernel is unavailable: {why}")
    return "triton"  # auto: cuda_ext.load() logged why
