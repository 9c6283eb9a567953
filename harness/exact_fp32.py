"""float32 arithmetic with the GPU's single roundings, in numpy: what an FFMA and a correctly rounded quotient or
reciprocal give. For the CPU interpreter's fix-up (tests/support/triton_cpu.py: the interpreter's own fma
multiplies, rounds and adds) and for checks of the kernels' arithmetic against IEEE results
(tools/kernel_dev/q_division_sweep.py)."""

import numpy as np


def fma_f32(x, y, z) -> np.ndarray:
    """x * y + z of float32 values with one rounding to nearest even. The product is exact in float64; the sum is
    rounded to odd there (TwoSum's error decides the last bit), and rounding that to float32 is the single correct
    rounding (53 >= 2 x 24 + 2 bits)."""
    x, y, z = (np.asarray(a, dtype=np.float32).astype(np.float64) for a in (x, y, z))
    with np.errstate(invalid="ignore", over="ignore"):
        p = x * y
        s = p + z
        bp = s - z
        err = (p - bp) + (z - (s - bp))
        inexact_even = np.isfinite(s) & (err != 0) & ((s.view(np.int64) & 1) == 0)
        s = np.where(inexact_even, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
        return s.astype(np.float32)


def div_rn_f32(x, s) -> np.ndarray:
    """x / s correctly rounded to float32 (div.rn.f32), for finite float32 x and normal s, x / s in float32's normal
    range or 0. The float64 quotient rounded to float32 may be a double rounding; of it and its two float32
    neighbours the result is the one whose remainder x - s * c is smallest (each remainder exact in float64: s * c has
    48 bits and lies within a factor 2 of x). A quotient of float32 values is never exactly halfway between two
    float32 values, so there is no tie to break."""
    x = np.asarray(x, dtype=np.float32)
    s = np.broadcast_to(np.asarray(s, dtype=np.float32), x.shape)
    c = (x.astype(np.float64) / s.astype(np.float64)).astype(np.float32)
    cands = np.stack([c, np.nextafter(c, np.float32(np.inf)), np.nextafter(c, np.float32(-np.inf))])
    rem = np.abs(x.astype(np.float64) - s.astype(np.float64) * cands.astype(np.float64))
    return np.take_along_axis(cands, rem.argmin(axis=0)[None], axis=0)[0]
