"""Triton kernels for the SnapMLA cache rows: fused Q-quant, fused K-append, fetch-dequant.

All three implement `sglang_snapmla.numerics` bit-for-bit: scale = max(amax/448, floor) with IEEE division,
content = fp8(clamp(x/scale, +-448)) (RNE), rope' = bf16(rope/scale) (RNE); the content's quotients by a
reciprocal and one correction that gives the division's result (`_div_rn`). The Q-quant takes a block of heads of
one token per program (decode_plan.q_quant_rows); the K-append and the fetch one row per program.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

LATENT = tl.constexpr(512)
ROPE = tl.constexpr(64)


@triton.jit
def _row_amax(x):
    """x [R, D] fp32 -> [R]: each row's max |x|; NaN for a row holding a NaN, +inf for one holding an infinity. The
    max is taken over the values' bit patterns with the sign cleared, which order finite magnitudes as the values do
    and put +inf above them and every NaN above +inf: a mask and an integer max a value, where a float max drops NaNs
    (a NaN test and a select per value cost three; a NaN-keeping max needs tl.reduce with a combine function, which
    the CPU interpreter runs ~6x slower)."""
    bits = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    return tl.max(bits, axis=1).to(tl.float32, bitcast=True)


@triton.jit
def _div_rn(x, s, r):
    """x / s correctly rounded (IEEE division's fp32 result) for bf16 values x [R, D] in fp32 and a row scale s
    [R, 1] >= SCALE_FLOOR with |x| <= 448 s (the content under its own scale), given r = RN(1 / s) [R, 1]: x * r and
    one Markstein correction (the FMA's remainder s * q - x is exact), three fp32 operations and a sign a value where
    div.rn refines a reciprocal, checks the operands' range and may branch for every value. x * r alone is off by an
    ulp for some values, enough to flip fp8 roundings; with the correction the quotient equals the division's for
    every bf16 value under every scale a bf16 row can have, wherever it is at least 2^-12 (smaller ones are fp8
    zeros either way): `python -m tools.kernel_dev.q_division_sweep` checks all of them. The quotient takes x's sign
    bit: the compiler rewrites -fma(s, q, -x) as fma(-s, q, x), exact but for the sign of a zero, which turns x = -0
    into +0 on sm_90, where the division gives -0."""
    q = x * r
    q = tl.fma(-tl.fma(s, q, -x), r, q)
    sign = x.to(tl.int32, bitcast=True) & -2147483648
    return (q.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def _quantize_rows(content, rope, FP8_MAX: tl.constexpr, SCALE_FLOOR: tl.constexpr):
    """content [R, 512] fp32, rope [R, 64] fp32 -> (content fp8 [R, 512], scale fp32 [R], rope' bf16 [R, 64]), each
    row on its own (every reduction is along axis 1).

    The spec's non-finite policy (numerics.quantize_with_scale): a row with a NaN or an infinity is stored as
    content 0, RoPE 0 and scale NaN. One max reduction per part gives both the scale and the verdict (NaN or +inf
    marks a non-finite row); such a row is quantized with the floor scale (its values zeroed first) so that no
    infinity reaches the division. No clamp before the fp8 cast: on sm_89+ the cast is cvt.rn.satfinite (as the
    interpreter's fix-up), which saturates a quotient just above 448 as the spec's clamp does. The RoPE keeps
    div.rn: a large RoPE over a small scale overflows to inf, as in the spec, where the correction would give NaN."""
    amax = tl.where(_row_amax(rope) < float("inf"), _row_amax(content), float("nan"))  # NaN: a non-finite RoPE
    finite = amax < float("inf")
    scale = tl.maximum(tl.math.div_rn(tl.where(finite, amax, 0.0), FP8_MAX), SCALE_FLOOR)
    s = scale[:, None]
    q = _div_rn(tl.where(finite[:, None], content, 0.0), s, tl.math.div_rn(1.0, s))
    rope_aligned = tl.math.div_rn(tl.where(finite[:, None], rope, 0.0), s)
    return q.to(tl.float8e4nv), tl.where(finite, scale, float("nan")), rope_aligned.to(tl.bfloat16)


@triton.jit
def quantize_q_kernel(
    q_nope_ptr, q_rope_ptr,  # [T, H, 512], [T, H, 64] bf16 (any strides on T and H; last dim contiguous)
    q8_ptr, q_scale_ptr, q_rope_out_ptr,  # [T, H, 512] fp8, [T, H] fp32, [T, H, 64] bf16, contiguous
    stride_nt, stride_nh, stride_rt, stride_rh, H,
    ROWS: tl.constexpr,  # heads of one token per program (decode_plan.q_quant_rows); the last block is masked past H
    FP8_MAX: tl.constexpr, SCALE_FLOOR: tl.constexpr,
    PDL: tl.constexpr,  # programmatic dependent launch, both ways (decode_plan.pdl_enabled)
):
    if PDL:
        gdc_wait()  # the producer of q_nope / q_rope (a GEMM) has finished and its writes are visible
        gdc_launch_dependents()  # the decode that follows may launch and run its prologue
    t = tl.program_id(0).to(tl.int64)  # 64-bit: row offsets exceed 2^31 bytes on large pools and batches
    h = tl.program_id(1).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    in_h = h < H
    live = in_h[:, None]
    dc = tl.arange(0, LATENT)[None, :]
    dr = tl.arange(0, ROPE)[None, :]
    content = tl.load(q_nope_ptr + t * stride_nt + h[:, None] * stride_nh + dc, mask=live, other=0.0)
    rope = tl.load(q_rope_ptr + t * stride_rt + h[:, None] * stride_rh + dr, mask=live, other=0.0)
    q8, scale, rope_al = _quantize_rows(content.to(tl.float32), rope.to(tl.float32), FP8_MAX, SCALE_FLOOR)
    row = t * H + h
    tl.store(q8_ptr + row[:, None] * LATENT + dc, q8, mask=live)
    tl.store(q_scale_ptr + row, scale, mask=in_h)
    tl.store(q_rope_out_ptr + row[:, None] * ROPE + dr, rope_al, mask=live)


@triton.jit
def append_kv_kernel(
    c_kv_ptr, k_rope_ptr, loc_ptr,  # [T, 512], [T, 64] bf16 (row strides given), [T] int64 slot ids
    kv_content_ptr, kv_scale_ptr, kv_rope_ptr,  # pool arrays of one layer: [N, 512] fp8, [N] fp32, [N, 64] bf16
    stride_c, stride_r,
    FP8_MAX: tl.constexpr, SCALE_FLOOR: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64) + tl.arange(0, 1)  # one row, as a [1, D] block for _quantize_rows
    dc = tl.arange(0, LATENT)[None, :]
    dr = tl.arange(0, ROPE)[None, :]
    slot = tl.load(loc_ptr + t).to(tl.int64)
    content = tl.load(c_kv_ptr + t[:, None] * stride_c + dc).to(tl.float32)
    rope = tl.load(k_rope_ptr + t[:, None] * stride_r + dr).to(tl.float32)
    k8, scale, rope_al = _quantize_rows(content, rope, FP8_MAX, SCALE_FLOOR)
    tl.store(kv_content_ptr + slot[:, None] * LATENT + dc, k8)
    tl.store(kv_scale_ptr + slot, scale)
    tl.store(kv_rope_ptr + slot[:, None] * ROPE + dr, rope_al)


@triton.jit
def fetch_dequant_kernel(
    loc_ptr,  # [N] int64 slot ids
    kv_content_ptr, kv_scale_ptr, kv_rope_ptr,  # pool arrays of one layer
    c_kv_out_ptr, k_rope_out_ptr,  # [N, 512], [N, 64] bf16 (row strides given)
    stride_co, stride_ro,
):
    i = tl.program_id(0).to(tl.int64)
    dc = tl.arange(0, LATENT)
    dr = tl.arange(0, ROPE)
    slot = tl.load(loc_ptr + i).to(tl.int64)
    scale = tl.load(kv_scale_ptr + slot)
    content = tl.load(kv_content_ptr + slot * LATENT + dc).to(tl.float32)
    rope = tl.load(kv_rope_ptr + slot * ROPE + dr).to(tl.float32)
    tl.store(c_kv_out_ptr + i * stride_co + dc, (content * scale).to(tl.bfloat16))
    tl.store(k_rope_out_ptr + i * stride_ro + dr, (rope * scale).to(tl.bfloat16))
