"""The Q-quant's content division (x * RN(1/s) and one Markstein correction) against IEEE division on a stride of the
exhaustive sweep, and the exact fp32 arithmetic the sweep and the CPU interpreter's fix-up rest on."""

from fractions import Fraction

import numpy as np

from harness.exact_fp32 import div_rn_f32, fma_f32
from tools.kernel_dev import q_division_sweep


def rn_f32(exact: Fraction) -> np.float32:
    """The float32 nearest to an exact rational (ties to even), by comparing the neighbours of a close guess."""
    c = np.float32(float(exact))
    cands = [c, np.nextafter(c, np.float32(np.inf)), np.nextafter(c, np.float32(-np.inf))]
    return min(cands, key=lambda v: (abs(Fraction(float(v)) - exact), int(np.array(v).view(np.int32)) & 1))


def test_fma_f32_rounds_once():
    """Against exact rationals: near cancellation (where a multiply, round and add gives a different result), across
    exponents, and a sum 2^-70 above a float32 halfway point, which float64 rounds onto the halfway point (then a
    second rounding to even goes the wrong way: -(1 + 2^-23) (2^-24 - 2^-47) + (1 + 2^-23) is 1 + 2^-23 by one
    rounding, 1 by two)."""
    rng = np.random.default_rng(7)
    n = 400
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-40, 40, n))).astype(np.float32)
    y = (rng.standard_normal(n) * np.exp2(rng.integers(-40, 40, n))).astype(np.float32)
    z = (-(x.astype(np.float64) * y) * (1 + rng.standard_normal(n) * 1e-7)).astype(np.float32)
    x[0], y[0], z[0] = -(1 + 2.0 ** -23), 2.0 ** -24 - 2.0 ** -47, 1 + 2.0 ** -23
    got = fma_f32(x, y, z)
    twice = (x * y + z).astype(np.float32)
    want = np.array([rn_f32(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))) for a, b, c in zip(x, y, z)])
    assert np.array_equal(got.view(np.int32), want.view(np.int32))
    assert not np.array_equal(twice.view(np.int32), want.view(np.int32))  # the case the fix-up exists for


def test_div_rn_f32_is_the_correctly_rounded_quotient():
    rng = np.random.default_rng(8)
    x = (rng.standard_normal(400) * np.exp2(rng.integers(-30, 30, 400))).astype(np.float32)
    s = (rng.random(400) * np.exp2(rng.integers(-20, 20, 400)) + 1e-30).astype(np.float32)
    want = np.array([rn_f32(Fraction(float(a)) / Fraction(float(b))) for a, b in zip(x, s)])
    assert np.array_equal(div_rn_f32(x, s).view(np.int32), want.view(np.int32))


def test_one_correction_gives_the_division_on_a_stride_of_every_bf16_row():
    """Every 97th bf16 amax (337 scales, 11 M values): with the correction no fp8 byte and no fp32 quotient >= 2^-12
    differs from the division's; x * r alone differs (so the sweep can tell)."""
    res = q_division_sweep.sweep(stride=97, jobs=2)
    assert res["amaxes"] == 337 and res["pairs"] > 10_000_000
    assert res["corrected"]["fp8"] == 0 and res["corrected"]["fp32"] == 0
    assert res["reciprocal"]["fp8"] > 0 and res["reciprocal"]["fp32"] > 0
