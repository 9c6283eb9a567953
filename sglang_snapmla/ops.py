"""SnapMLA ops: one function per op, each validating its inputs and dispatching to a kernel.

Every op runs the Triton kernels in `sglang_snapmla.kernels.triton`, except the decode, which on sm_90 GPUs runs the
CUDA split kernel (`sglang_snapmla.cuda_ext`, faster than the Triton one at every benchmarked shape, docs/KERNEL.md)
behind the same signature, followed by the same combine (SNAPMLA_DECODE_IMPL=triton|cuda|auto, default auto).
On sm_90+ Q-quant, decode and combine are chained by programmatic dependent launch (`decode_plan.pdl_enabled`;
SNAPMLA_PDL=0 off). From bf16 Q (`quantize_and_decode*`) the sm_90a 64-row kernel can quantize Q itself, with no
Q-quant launch (`DecodePlan.q_in_decode`; opt-in: SNAPMLA_Q_IN_DECODE=1). Which implementation, how many splits and
the rest of a decode's launch shape: `decode_plan`.
Shapes and dtypes:

| op | inputs | outputs |
|---|---|---|
| quantize_q | q_nope [T, H, 512], q_rope [T, H, 64] bf16 | q8 [T, H, 512] fp8, q_scale [T, H] fp32, q_rope' [T, H, 64] bf16 |
| append_kv | c_kv [T, 512], k_rope [T, 64] bf16, loc [T] int32 or int64, pool arrays (in place) | - |
| fetch_dequant | loc [N] int32 or int64, pool arrays | c_kv [N, 512], k_rope [N, 64] bf16 |
| decode_quantized | q8 [B, s_q, H, 512], q_scale [B, s_q, H], q_rope' [B, s_q, H, 64] (quantize_q's output), pool arrays, block_table [B, P] int32, seq_lens [B] int32 | out [B, s_q, H, 512] bf16, lse [B, H, s_q] fp32 |
| decode_planned | as decode_quantized, unchecked: a `DecodePlan` and the step's `check_decode_step` run once for all layers | as decode_quantized |
| quantize_and_decode | q_nope [B, s_q, H, 512], q_rope [B, s_q, H, 64] bf16, then as decode_quantized | as decode_quantized |
| quantize_and_decode_planned | q_nope [B * s_q, H, 512], q_rope [B * s_q, H, 64] bf16 (any strides on the first two dims), then as decode_planned | as decode_quantized |
| records_to_pool | host_words [W] int32 (the HiCache host pool, page-locked on a GPU), record_words [n] int64, loc [n] int32 or int64, pool arrays (in place) | - |
| pool_to_records | as records_to_pool; the host pool written in place | - |

Pool arrays of one layer: kv_content [N, 512] float8_e4m3fn, kv_scale [N] float32, kv_rope [N, 64] bfloat16, where slot
= page * 64 + offset. Nothing here synchronises with the host, so every op can be captured in a CUDA graph.
"""

from __future__ import annotations

import logging
import math

import torch

from . import numerics as nx
from . import decode_plan
from .decode_plan import DecodePlan
from .errors import SnapMLAInputError
from .kernels.triton import decode as tdecode
from .kernels.triton import quant as tquant
from .kernels.triton import records as trecords
from .settings import CHECK_INDICES_ENV, index_checks_enabled, interpreter_mode

log = logging.getLogger(__name__)

# The ops a caller (the backend, the pool, a benchmark) builds on (the step's plan: `decode_plan`); the other
# module-level names are the dispatch's parts (launch flags, the combine's chunk) that tests reach in on purpose.
__all__ = ["SnapMLAInputError", "quantize_q", "append_kv", "pool_from_rows", "fetch_dequant", "decode_quantized",
           "quantize_and_decode", "combine", "check_pool", "check_decode_step", "decode_planned",
           "quantize_and_decode_planned", "records_to_pool", "pool_to_records"]

# ----------------------------------------------------------------------------------------------------------
# validation helpers
# ----------------------------------------------------------------------------------------------------------
def _check_device(*tensors: torch.Tensor) -> None:
    dev = tensors[0].device
    if dev.type != "cuda" and not interpreter_mode():
        raise SnapMLAInputError(f"SnapMLA kernels need CUDA tensors (got {dev}); on CPU only Triton's interpreter "
                                "(TRITON_INTERPRET=1, for tests) can run them")
    for t in tensors:
        if t.device != dev:
            raise SnapMLAInputError(f"all tensors must be on one device: {t.device} vs {dev}")


def _check(t: torch.Tensor, name: str, dtype: torch.dtype, last: int | None = None, dims: int | None = None):
    if t.dtype != dtype:
        raise SnapMLAInputError(f"{name} must be {dtype}, got {t.dtype}")
    if last is not None and t.shape[-1] != last:
        raise SnapMLAInputError(f"{name} last dim must be {last} (kv_lora_rank=512, qk_rope_head_dim=64), "
                                f"got shape {tuple(t.shape)}")
    if dims is not None and t.dim() != dims:
        raise SnapMLAInputError(f"{name} must have {dims} dims, got shape {tuple(t.shape)}")
    if last is not None and t.stride(-1) != 1:
        raise SnapMLAInputError(f"{name} must be contiguous in its last dim")


def check_pool(kv_content: torch.Tensor, kv_scale: torch.Tensor, kv_rope: torch.Tensor) -> None:
    """The three per-layer arrays of a SnapMLA pool: [N, 512] fp8, [N] fp32, [N, 64] bf16, contiguous."""
    _check(kv_content, "kv_content", nx.FP8_DTYPE, nx.KV_LORA_RANK, 2)
    _check(kv_scale, "kv_scale", torch.float32, None, 1)
    _check(kv_rope, "kv_rope", torch.bfloat16, nx.ROPE_DIM, 2)
    n = kv_content.shape[0]
    if kv_scale.shape[0] != n or kv_rope.shape[0] != n:
        raise SnapMLAInputError(f"pool arrays disagree on slots: {n}, {kv_scale.shape[0]}, {kv_rope.shape[0]}")
    if not (kv_content.is_contiguous() and kv_scale.is_contiguous() and kv_rope.is_contiguous()):
        raise SnapMLAInputError("pool arrays must be contiguous")


def _check_loc(loc: torch.Tensor, n: int, name: str = "loc") -> None:
    if loc.dtype not in (torch.int64, torch.int32) or loc.dim() != 1 or loc.shape[0] != n:
        raise SnapMLAInputError(f"{name} must be [{n}] int32 or int64 slot ids, got {tuple(loc.shape)} {loc.dtype}")


# Opt-in index checks (SNAPMLA_CHECK_INDICES=1): slot ids, page ids and lengths are compared against the pool and
# the block table before a launch, so a caller's bad index is a SnapMLAInputError instead of a fault or garbage.
# They read device values on the host (a synchronisation, and not capturable in a CUDA graph): off in serving.
def _check_slot_ids(loc: torch.Tensor, num_slots: int, name: str = "loc") -> None:
    if loc.numel() and (int(loc.min()) < 0 or int(loc.max()) >= num_slots):
        raise SnapMLAInputError(f"{name} holds slot ids in [{int(loc.min())}, {int(loc.max())}], outside the pool's "
                                f"[0, {num_slots}) ({CHECK_INDICES_ENV}=1)")


def _check_paging(block_table: torch.Tensor, seq_lens: torch.Tensor, num_slots: int) -> None:
    """Every sequence's pages exist in the block table's storage and name pages of the pool."""
    lens = seq_lens.tolist()
    if lens and min(lens) < 0:
        raise SnapMLAInputError(f"seq_lens must be >= 0, got {lens} ({CHECK_INDICES_ENV}=1)")
    entries, stride = block_table_entries(block_table), block_table.stride(0)
    storage = block_table.new_empty(0).set_(block_table.untyped_storage(), block_table.storage_offset(),
                                            (entries,), (1,))
    num_pages = num_slots // nx.PAGE_SIZE
    for b, n in enumerate(lens):
        pages = math.ceil(n / nx.PAGE_SIZE)
        if b * stride + pages > entries:
            raise SnapMLAInputError(f"sequence {b} of length {n} needs {pages} block-table entries; the table's "
                                    f"storage holds {max(0, entries - b * stride)} from its row ({CHECK_INDICES_ENV}=1)")
        ids = storage[b * stride: b * stride + pages]
        if pages and (int(ids.min()) < 0 or int(ids.max()) >= num_pages):
            raise SnapMLAInputError(f"sequence {b} uses page ids in [{int(ids.min())}, {int(ids.max())}], outside the "
                                    f"pool's [0, {num_pages}) ({CHECK_INDICES_ENV}=1)")


# ----------------------------------------------------------------------------------------------------------
# ops
# ----------------------------------------------------------------------------------------------------------
def quantize_q(q_nope: torch.Tensor, q_rope: torch.Tensor, rows: int | None = None):
    """Fused Q-quant (one launch): q_nope [T, H, 512] + q_rope [T, H, 64] bf16 ->
    (q8 [T, H, 512] fp8, q_scale [T, H] fp32, q_rope' [T, H, 64] bf16), all contiguous.

    `rows`: heads per program, a power of two (default `decode_plan.q_quant_rows`; benchmarks and tests set it)."""
    _check(q_nope, "q_nope", torch.bfloat16, nx.KV_LORA_RANK, 3)
    _check(q_rope, "q_rope", torch.bfloat16, nx.ROPE_DIM, 3)
    if q_nope.shape[:2] != q_rope.shape[:2]:
        raise SnapMLAInputError(f"q_nope {tuple(q_nope.shape)} and q_rope {tuple(q_rope.shape)} disagree on [T, H]")
    _check_device(q_nope, q_rope)
    T, H, _ = q_nope.shape
    rows = rows or decode_plan.q_quant_rows(T, H)
    if rows & (rows - 1):
        raise SnapMLAInputError(f"Q-quant rows per program must be a power of two, got {rows}")
    q8 = torch.empty(T, H, nx.KV_LORA_RANK, dtype=nx.FP8_DTYPE, device=q_nope.device)
    q_scale = torch.empty(T, H, dtype=torch.float32, device=q_nope.device)
    q_rope_al = torch.empty(T, H, nx.ROPE_DIM, dtype=torch.bfloat16, device=q_nope.device)
    if T:
        pdl = decode_plan.pdl_enabled(q_nope.device)
        tquant.quantize_q_kernel[(T, math.ceil(H / rows))](
            q_nope, q_rope, q8, q_scale, q_rope_al,
            q_nope.stride(0), q_nope.stride(1), q_rope.stride(0), q_rope.stride(1), H, ROWS=rows,
            FP8_MAX=nx.FP8_MAX, SCALE_FLOOR=nx.SCALE_FLOOR, PDL=pdl, launch_pdl=pdl, num_warps=4)
    return q8, q_scale, q_rope_al


def append_kv(c_kv: torch.Tensor, k_rope: torch.Tensor, loc: torch.Tensor, kv_content: torch.Tensor,
              kv_scale: torch.Tensor, kv_rope: torch.Tensor) -> None:
    """Fused K-append (one launch): quantize c_kv [T, 512] + k_rope [T, 64] (bf16; a middle singleton dim as in
    SGLang's [T, 1, D] is accepted) and write the three pool arrays at slots `loc` [T]."""
    c_kv = c_kv.reshape(c_kv.shape[0], -1) if c_kv.dim() == 3 else c_kv
    k_rope = k_rope.reshape(k_rope.shape[0], -1) if k_rope.dim() == 3 else k_rope
    _check(c_kv, "c_kv", torch.bfloat16, nx.KV_LORA_RANK, 2)
    _check(k_rope, "k_rope", torch.bfloat16, nx.ROPE_DIM, 2)
    check_pool(kv_content, kv_scale, kv_rope)
    T = c_kv.shape[0]
    _check_loc(loc, T)
    if k_rope.shape[0] != T:
        raise SnapMLAInputError(f"c_kv has {T} rows, k_rope {k_rope.shape[0]}")
    _check_device(c_kv, k_rope, loc, kv_content, kv_scale, kv_rope)
    if index_checks_enabled():
        _check_slot_ids(loc, kv_content.shape[0])
    if T:
        tquant.append_kv_kernel[(T,)](c_kv, k_rope, loc, kv_content, kv_scale, kv_rope, c_kv.stride(0),
                                      k_rope.stride(0), FP8_MAX=nx.FP8_MAX, SCALE_FLOOR=nx.SCALE_FLOOR, num_warps=4)


def pool_from_rows(c_kv: torch.Tensor, k_rope: torch.Tensor):
    """A new pool holding row i of c_kv [N, 512] / k_rope [N, 64] (bf16) at slot i, written by `append_kv`
    -> (kv_content [N, 512], kv_scale [N], kv_rope [N, 64]). For benchmarks, tests and reports that need the
    kernel-written cache of whole tensors (the serving pool is `pool.SnapMLATokenToKVPool`)."""
    n, dev = c_kv.shape[0], c_kv.device
    kv_content = torch.empty(n, nx.KV_LORA_RANK, dtype=nx.FP8_DTYPE, device=dev)
    kv_scale = torch.empty(n, dtype=torch.float32, device=dev)
    kv_rope = torch.empty(n, nx.ROPE_DIM, dtype=torch.bfloat16, device=dev)
    append_kv(c_kv, k_rope, torch.arange(n, device=dev), kv_content, kv_scale, kv_rope)
    return kv_content, kv_scale, kv_rope


def fetch_dequant(loc: torch.Tensor, kv_content: torch.Tensor, kv_scale: torch.Tensor, kv_rope: torch.Tensor,
                  out_c_kv: torch.Tensor | None = None, out_k_rope: torch.Tensor | None = None):
    """Fetch-dequant (one launch): true bf16 values (scale re-applied) of slots `loc` [N] ->
    (c_kv [N, 512], k_rope [N, 64]). Reads only the N requested rows, never the whole pool."""
    check_pool(kv_content, kv_scale, kv_rope)
    N = loc.shape[0]
    _check_loc(loc, N)
    _check_device(loc, kv_content, kv_scale, kv_rope)
    dev = kv_content.device
    c = out_c_kv if out_c_kv is not None else torch.empty(N, nx.KV_LORA_RANK, dtype=torch.bfloat16, device=dev)
    r = out_k_rope if out_k_rope is not None else torch.empty(N, nx.ROPE_DIM, dtype=torch.bfloat16, device=dev)
    _check(c, "out_c_kv", torch.bfloat16, nx.KV_LORA_RANK, 2)
    _check(r, "out_k_rope", torch.bfloat16, nx.ROPE_DIM, 2)
    if index_checks_enabled():
        _check_slot_ids(loc, kv_content.shape[0])
    if N:
        tquant.fetch_dequant_kernel[(N,)](loc, kv_content, kv_scale, kv_rope, c, r, c.stride(0), r.stride(0),
                                          num_warps=4)
    return c, r


def _record_args(host_words: torch.Tensor, record_words: torch.Tensor, loc: torch.Tensor, kv_content: torch.Tensor,
                 kv_scale: torch.Tensor, kv_rope: torch.Tensor) -> tuple:
    """Checks shared by the two record moves -> the kernels' arguments (the arrays as int32 words)."""
    check_pool(kv_content, kv_scale, kv_rope)
    if host_words.dtype != torch.int32 or host_words.dim() != 1:
        raise SnapMLAInputError(f"host_words must be a flat int32 view of the host pool, got {host_words.dtype} "
                                f"{tuple(host_words.shape)}")
    if record_words.dtype != torch.int64 or record_words.shape != loc.shape:
        raise SnapMLAInputError(f"record_words must be int64 and as long as loc ({tuple(loc.shape)}), got "
                                f"{record_words.dtype} {tuple(record_words.shape)}")
    _check_loc(loc, loc.shape[0])
    _check_device(record_words, loc, kv_content, kv_scale, kv_rope)
    if index_checks_enabled():
        _check_slot_ids(loc, kv_content.shape[0])
    content, rope = kv_content.view(torch.int32), kv_rope.view(torch.int32)
    return (host_words, record_words, loc, content, kv_scale.view(torch.int32), rope, content.stride(0),
            rope.stride(0))


def records_to_pool(host_words: torch.Tensor, record_words: torch.Tensor, loc: torch.Tensor,
                    kv_content: torch.Tensor, kv_scale: torch.Tensor, kv_rope: torch.Tensor) -> None:
    """Host records -> one layer's three arrays (one launch): the 644-byte record at int32 word offset
    record_words[i] [n] int64 of host_words (a flat int32 view of the host pool; page-locked memory where the pool is
    on a GPU, read in place) into slot loc[i] [n] int64, every bit as stored. The spec: host_pool.unpack_into."""
    args = _record_args(host_words, record_words, loc, kv_content, kv_scale, kv_rope)
    if loc.shape[0]:
        trecords.records_to_pool_kernel[(loc.shape[0],)](*args, num_warps=4)


def pool_to_records(host_words: torch.Tensor, record_words: torch.Tensor, loc: torch.Tensor,
                    kv_content: torch.Tensor, kv_scale: torch.Tensor, kv_rope: torch.Tensor) -> None:
    """One layer's three arrays at slots loc [n] int64 -> the 644-byte records at int32 word offsets record_words
    [n] int64 of host_words (written in place; see records_to_pool). The spec: host_pool.pack."""
    args = _record_args(host_words, record_words, loc, kv_content, kv_scale, kv_rope)
    if loc.shape[0]:
        trecords.pool_to_records_kernel[(loc.shape[0],)](*args, num_warps=4)


# launch-flag bits of the CUDA decode, by their names in kernels/cuda/snapmla_decode_sm90.h (a test compares the two)
CUDA_LAUNCH_FLAGS = {"kLaunchPdl": 1, "kLaunchKvBeforeWait": 2}


def block_table_entries(block_table: torch.Tensor) -> int:
    """int32 entries from the block table's first element to the end of its storage: the bound of the CUDA decode's
    block-table reads. It depends on the allocation only, never on the view's width, so a CUDA graph captured with
    SGLang's width-1 view of its full-stride table reads the right pages when replayed with longer sequences."""
    return block_table.untyped_storage().nbytes() // block_table.element_size() - block_table.storage_offset()


def launch_cuda_decode(q8, q_scale, q_rope, kv_content, kv_scale, kv_rope, block_table, seq_lens, o_part, lse_part, out,
                       lse, softmax_scale: float, splits: int, pdl: bool = False, follows_q_quant: bool = False):
    """The sm_90a split kernel alone, on buffers the caller allocated and checked (`decode_planned` allocates them,
    after `decode_quantized` or the backend's `check_decode_step` checked; a benchmark that times the kernel without
    the combine calls this): with splits > 1 it writes o_part
    [B, s_q * H, slots, 512] fp32 and lse_part [B, s_q * H, slots] (base 2; slots >= splits, `partial_slots`; split s
    in slot s), and out / lse are empty views; with
    one split it writes out [B, s_q, H, 512] bf16 and lse [B, H, s_q] (natural log), and the partials are empty
    views."""
    from . import cuda_ext

    _, s_q, H, _ = q8.shape
    cuda_ext.load().decode_split(q8, q_scale, q_rope, kv_content, kv_scale, kv_rope, block_table, seq_lens, o_part,
                                 lse_part, out, lse, s_q * H, H, s_q, softmax_scale * math.log2(math.e), splits,
                                 block_table_entries(block_table),
                                 CUDA_LAUNCH_FLAGS["kLaunchPdl"] * pdl
                                 | CUDA_LAUNCH_FLAGS["kLaunchKvBeforeWait"] * follows_q_quant)


def launch_cuda_decode_q_bf16(q_nope, q_rope, kv_content, kv_scale, kv_rope, block_table, seq_lens, o_part, lse_part,
                              out, lse, softmax_scale: float, splits: int, s_q: int, pdl: bool = False):
    """`launch_cuda_decode` from bf16 Q, which the 64-row kernel quantizes itself: q_nope [B * s_q, H, 512], q_rope
    [B * s_q, H, 64] (any strides on the first two dims, last dim contiguous; rows as
    `decode_plan.q_rows_fit_the_kernel` says), s_q * H > 32. Never behind the Q-quant (no kv_before_wait): the kernel
    before it may be one that writes the pool."""
    from . import cuda_ext

    H = q_nope.shape[1]
    cuda_ext.load().decode_split_q_bf16(q_nope, q_rope, kv_content, kv_scale, kv_rope, block_table, seq_lens, o_part,
                                        lse_part, out, lse, s_q * H, H, s_q, softmax_scale * math.log2(math.e), splits,
                                        block_table_entries(block_table), CUDA_LAUNCH_FLAGS["kLaunchPdl"] * pdl)


def launch_triton_decode(q8, q_scale, q_rope, kv_content, kv_scale, kv_rope, block_table, seq_lens, o_part, lse_part,
                         out, lse, softmax_scale: float, splits: int, tiling: tuple[int, int, int] | None = None):
    """The Triton split kernel alone, on buffers the caller allocated and checked (`decode_planned`; tests that
    look at the partials): with partials (o_part [B, s_q * H, slots, 512] fp32, lse_part [B, s_q * H, slots], slots
    >= splits, split s in slot s) it writes them; with empty partials (one split only) it writes out
    [B, s_q, H, 512] bf16 and lse [B, H, s_q] (natural log) itself. `tiling` = (BLOCK_M, num_warps, num_stages)."""
    B, s_q, H, _ = q8.shape
    R = s_q * H
    final = o_part.numel() == 0
    if final and splits != 1:
        raise SnapMLAInputError("the Triton decode writes final outputs only with one split")
    block_m, warps, stages = tiling or decode_plan.decode_tiling(R)
    tdecode.decode_split_kernel[(B, splits, math.ceil(R / block_m))](
        q8, q_scale, q_rope, kv_content, kv_scale, kv_rope, block_table, seq_lens, o_part, lse_part, out, lse,
        block_table.stride(0), R, H, s_q, softmax_scale * math.log2(math.e),
        splits, 1 if final else o_part.shape[2], BLOCK_M=block_m, FP8_MAX=nx.FP8_MAX,
        P_SCALE_FLOOR=nx.P_SCALE_FLOOR, FINAL=final, num_warps=warps, num_stages=stages)


def check_decode_step(block_table: torch.Tensor, seq_lens: torch.Tensor, plan: DecodePlan, num_slots: int) -> None:
    """The checks of a decode that depend on the step only (the block table, the lengths, the plan's batch): the
    backend runs them once per step and every layer then calls `decode_planned`. block_table [B, P] int32 page ids
    (unit stride in its last dim), seq_lens [B] int32; `num_slots`: the pool's slots, for SNAPMLA_CHECK_INDICES=1."""
    B = plan.batch
    if block_table.dtype != torch.int32 or block_table.dim() != 2 or block_table.shape[0] != B:
        raise SnapMLAInputError(f"block_table must be [B={B}, max_pages] int32 page ids (page size 64), got "
                                f"{tuple(block_table.shape)} {block_table.dtype}")
    if seq_lens.dtype != torch.int32 or seq_lens.shape != (B,):
        raise SnapMLAInputError(f"seq_lens must be [B={B}] int32, got {tuple(seq_lens.shape)} {seq_lens.dtype}")
    _check_device(block_table, seq_lens)
    if block_table.stride(1) != 1:
        raise SnapMLAInputError("block_table must have unit stride in its last dim (a row-major table or a view of "
                                "one, e.g. table[:, :n])")
    if index_checks_enabled():
        _check_paging(block_table, seq_lens, num_slots)


def decode_quantized(q8: torch.Tensor, q_scale: torch.Tensor, q_rope: torch.Tensor, kv_content: torch.Tensor,
                     kv_scale: torch.Tensor, kv_rope: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                     softmax_scale: float, num_splits: int | None = None,
                     tiling: tuple[int, int, int] | None = None, impl: str | None = None,
                     follows_q_quant: bool = False, plan: DecodePlan | None = None):
    """SnapMLA split-KV decode + combine over a paged cache (page size 64), every input checked.

    q8 [B, s_q, H, 512] fp8, q_scale [B, s_q, H] fp32, q_rope [B, s_q, H, 64] bf16 (from `quantize_q`),
    block_table [B, max_pages] int32 page ids, seq_lens [B] int32 (including the s_q new tokens, which must
    already be in the cache; query token i sees keys [0, seq_len - s_q + i]; a row for which that range is empty
    gets out 0 and LSE -inf). Sequence b reads table entries [0, ceil(seq_len / 64)) of its row, which may run past
    the view's width into the table's storage (SGLang's CUDA-graph capture passes a narrowed view of a full-stride
    table); nothing is read from slots at or past seq_len or from entries past the sequence's pages.
    Returns out [B, s_q, H, 512] bf16 and lse [B, H, s_q] fp32 (natural log).
    `plan`: a `plan_decode` for these shapes. Without it the call plans for itself from the block table's width, with
    `num_splits`, `tiling` = (BLOCK_M, num_warps, num_stages) and `impl` ("triton", "cuda", "auto"; default
    SNAPMLA_DECODE_IMPL) as overrides (benchmarks, tests); with it those three must be left unset.
    `follows_q_quant`: see `decode_planned`. The backend checks a step once (`check_decode_step`) and calls
    `decode_planned` in each layer.
    """
    _check(q8, "q8", nx.FP8_DTYPE, nx.KV_LORA_RANK, 4)
    _check(q_rope, "q_rope", torch.bfloat16, nx.ROPE_DIM, 4)
    _check(q_scale, "q_scale", torch.float32, None, 3)
    check_pool(kv_content, kv_scale, kv_rope)
    B, s_q, H, _ = q8.shape
    if q_rope.shape[:3] != (B, s_q, H) or q_scale.shape != (B, s_q, H):
        raise SnapMLAInputError(f"q8 {tuple(q8.shape)}, q_scale {tuple(q_scale.shape)}, q_rope "
                                f"{tuple(q_rope.shape)} must agree on [B, s_q, H]")
    if plan is None:
        if block_table.dim() != 2:
            raise SnapMLAInputError(f"block_table must be [B={B}, max_pages] int32 page ids, got "
                                    f"{tuple(block_table.shape)}")
        plan = decode_plan.plan_decode(B, s_q, H, block_table.shape[1], q8.device, impl, num_splits, tiling)
    elif num_splits or tiling or impl:
        raise SnapMLAInputError("decode_quantized: pass either a plan or num_splits / tiling / impl, not both")
    elif (plan.batch, plan.s_q, plan.heads) != (B, s_q, H):
        raise SnapMLAInputError(f"the decode plan is for [batch, s_q, heads] = {[plan.batch, plan.s_q, plan.heads]}, "
                                f"the queries are {[B, s_q, H]}")
    check_decode_step(block_table, seq_lens, plan, kv_content.shape[0])
    _check_device(q8, q_scale, q_rope, kv_content, kv_scale, kv_rope, block_table, seq_lens)
    return decode_planned(q8.contiguous(), q_scale.contiguous(), q_rope.contiguous(), kv_content, kv_scale, kv_rope,
                          block_table, seq_lens, softmax_scale, plan, follows_q_quant)


def _decode_chain(plan: DecodePlan, device: torch.device, launch):
    """The split decode `launch(o_part, lse_part, out, lse)` on outputs allocated for `plan`, then the combine where
    there are partials -> (out [B, s_q, H, 512] bf16, lse [B, H, s_q] fp32).

    With one split (large batches) the decode writes the final outputs itself: no fp32 partials, no combine
    (docs/KERNEL.md). Otherwise the partials go through the combine. Unused outputs are passed as empty views (no
    allocation): the partials at one split, out / lse otherwise. The partials are allocated per call from the
    caching allocator, not held by the plan: inside a CUDA-graph capture they then come from the graph's pool,
    whereas a buffer held by the plan would be recorded by address and must outlive every graph that used it."""
    B, s_q, H, splits = plan.batch, plan.s_q, plan.heads, plan.splits
    out = torch.empty(B, s_q, H, nx.KV_LORA_RANK, dtype=torch.bfloat16, device=device)
    lse = torch.empty(B, H, s_q, dtype=torch.float32, device=device)
    if B == 0:
        return out, lse
    if splits == 1:
        launch(lse[:0], lse[:0], out, lse)
        return out, lse
    o_part = torch.empty(B, s_q * H, plan.slots, nx.KV_LORA_RANK, dtype=torch.float32, device=device)
    lse_part = torch.empty(B, s_q * H, plan.slots, dtype=torch.float32, device=device)
    launch(o_part, lse_part, out[:0], lse[:0])
    combine(o_part, lse_part, out, lse, H, s_q, plan.pdl, splits)
    return out, lse


def decode_planned(q8: torch.Tensor, q_scale: torch.Tensor, q_rope: torch.Tensor, kv_content: torch.Tensor,
                   kv_scale: torch.Tensor, kv_rope: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                   softmax_scale: float, plan: DecodePlan, follows_q_quant: bool = False):
    """The decode chain of a checked step, no checks here: `plan`'s split decode, then its combine. Shapes as
    `decode_quantized`, q8 / q_scale / q_rope contiguous (`quantize_q`'s outputs, viewed as [plan.batch, plan.s_q,
    plan.heads, ...]), the pool arrays one layer of a pool that `check_pool` accepts, block_table and seq_lens those
    `check_decode_step` accepted for this plan.
    `follows_q_quant`: the kernel launched just before this call on the stream is `quantize_q` (nothing else is
    launched in between except normally launched kernels). The CUDA decode then reads the lengths, the block table
    and its first pages while the Q-quant still runs (safe because the Q-quant lets it start only after waiting for
    its own predecessors, and writes none of those)."""
    splits = plan.splits

    def launch(o_part, lse_part, out, lse):
        if plan.impl == "cuda":
            launch_cuda_decode(q8, q_scale, q_rope, kv_content, kv_scale, kv_rope, block_table, seq_lens, o_part,
                               lse_part, out, lse, softmax_scale, splits, pdl=plan.pdl,
                               follows_q_quant=follows_q_quant)
        else:
            launch_triton_decode(q8, q_scale, q_rope, kv_content, kv_scale, kv_rope, block_table, seq_lens, o_part,
                                 lse_part, out, lse, softmax_scale, splits, plan.tiling)

    return _decode_chain(plan, q8.device, launch)


_q_layouts_refused: set = set()  # the q_nope / q_rope strides `quantize_and_decode_planned` has logged


def quantize_and_decode_planned(q_nope: torch.Tensor, q_rope: torch.Tensor, kv_content: torch.Tensor,
                                kv_scale: torch.Tensor, kv_rope: torch.Tensor, block_table: torch.Tensor,
                                seq_lens: torch.Tensor, softmax_scale: float, plan: DecodePlan):
    """Q-quant + decode chain of a checked step from bf16 Q, no checks here: q_nope [B * s_q, H, 512], q_rope
    [B * s_q, H, 64] bf16 (any strides on the first two dims; the last one contiguous), the rest as `decode_planned`.
    With `plan.q_in_decode` the 64-row sm_90a kernel quantizes Q itself (one launch fewer, and Q's quantized copy
    never goes through DRAM); Q rows it cannot load (`decode_plan.q_rows_fit_the_kernel`: misaligned) take the
    Q-quant kernel instead, logged once per layout. Otherwise `quantize_q`, then `decode_planned` behind it."""
    if plan.q_in_decode:
        if decode_plan.q_rows_fit_the_kernel(q_nope, q_rope):
            def launch(o_part, lse_part, out, lse):
                launch_cuda_decode_q_bf16(q_nope, q_rope, kv_content, kv_scale, kv_rope, block_table, seq_lens, o_part,
                                          lse_part, out, lse, softmax_scale, plan.splits, plan.s_q, pdl=plan.pdl)

            return _decode_chain(plan, q_nope.device, launch)
        layout = (q_nope.stride(), q_rope.stride(), q_nope.data_ptr() % 16, q_rope.data_ptr() % 4)
        if layout not in _q_layouts_refused:
            _q_layouts_refused.add(layout)
            log.warning("snapmla: Q rows with strides %s / %s (offsets %d / %d mod 16 / 4) are not aligned for the "
                        "decode's own Q loads; this layout runs the Q-quant kernel first", *layout)
    B, s_q, H = plan.batch, plan.s_q, plan.heads
    q8, q_scale, q_rope_al = quantize_q(q_nope, q_rope)
    return decode_planned(q8.view(B, s_q, H, -1), q_scale.view(B, s_q, H), q_rope_al.view(B, s_q, H, -1), kv_content,
                          kv_scale, kv_rope, block_table, seq_lens, softmax_scale, plan, True)  # follows_q_quant


# partial rows per load in the combine: 16 x 512 fp32 is 64 registers per thread of its 4 warps
COMBINE_SPLIT_CHUNK = 16


def combine(o_part: torch.Tensor, lse_part: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, heads: int,
            s_q: int, pdl: bool = False, splits: int | None = None) -> None:
    """Merge split partials into the outputs, in place: o_part [B, R, slots, 512] fp32 and lse_part [B, R, slots]
    fp32 (base 2, -inf for a split without keys; splits 0..splits-1 in the first slots, default all slots) ->
    out [B, s_q, H, 512] bf16, lse [B, H, s_q] fp32 (natural log), R = s_q * H. `pdl`: launched as a programmatic
    dependent of the split kernel (it waits for the partials)."""
    B, R, slots, _ = o_part.shape
    splits = splits or slots
    if not 1 <= splits <= slots:
        raise SnapMLAInputError(f"combine: {splits} splits do not fit o_part's {slots} slots per row")
    splits_p2 = 1 << (splits - 1).bit_length()
    tdecode.combine_kernel[(R, B)](o_part, lse_part, out, lse, R, heads, s_q, splits, slots, SPLITS_P2=splits_p2,
                                   SPLIT_CHUNK=min(splits_p2, COMBINE_SPLIT_CHUNK), PDL=pdl, launch_pdl=pdl,
                                   num_warps=4)


def quantize_and_decode(q_nope: torch.Tensor, q_rope: torch.Tensor, kv_content: torch.Tensor, kv_scale: torch.Tensor,
                        kv_rope: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor, softmax_scale: float,
                        num_splits: int | None = None, impl: str | None = None, q_in_decode: bool | None = None):
    """Q-quant + decode + combine, every input checked: q_nope [B, s_q, H, 512], q_rope [B, s_q, H, 64] bf16 -> (out,
    lse) as `decode_quantized`. `num_splits`, `impl` and `q_in_decode` as `decode_plan.plan_decode` takes them."""
    if q_nope.dim() != 4:
        raise SnapMLAInputError(f"q_nope must be [B, s_q, H, 512], got {tuple(q_nope.shape)}")
    _check(q_nope, "q_nope", torch.bfloat16, nx.KV_LORA_RANK, 4)
    _check(q_rope, "q_rope", torch.bfloat16, nx.ROPE_DIM, 4)
    B, s_q, H, _ = q_nope.shape
    if q_rope.shape[:3] != (B, s_q, H):
        raise SnapMLAInputError(f"q_nope {tuple(q_nope.shape)} and q_rope {tuple(q_rope.shape)} disagree on "
                                "[B, s_q, H]")
    check_pool(kv_content, kv_scale, kv_rope)
    if block_table.dim() != 2:
        raise SnapMLAInputError(f"block_table must be [B={B}, max_pages] int32 page ids, got "
                                f"{tuple(block_table.shape)}")
    plan = decode_plan.plan_decode(B, s_q, H, block_table.shape[1], q_nope.device, impl, num_splits,
                                   q_in_decode=q_in_decode)
    check_decode_step(block_table, seq_lens, plan, kv_content.shape[0])
    _check_device(q_nope, q_rope, kv_content, kv_scale, kv_rope, block_table, seq_lens)
    return quantize_and_decode_planned(q_nope.reshape(B * s_q, H, -1), q_rope.reshape(B * s_q, H, -1), kv_content,
                                       kv_scale, kv_rope, block_table, seq_lens, softmax_scale, plan)
