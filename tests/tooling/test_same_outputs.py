"""tools/kernel_dev/same_outputs.py: bit identity of two saved decodes, not closeness."""

import torch

from tools.kernel_dev import same_outputs as so


def _saved(out: torch.Tensor, lse: torch.Tensor) -> dict:
    return {"h16x16x4097q2": {"out": out, "lse": lse}}


def test_shape_names_parse():
    """The shapes are named as benchmarks/gpu/time_variants.py names them, and parsed by its parser."""
    from benchmarks.gpu.time_variants import parse_shape

    assert parse_shape("h16x16x4097q2") == (16, 16, 4097, 2, None)
    assert parse_shape("h32x130x2048") == (32, 130, 2048, 1, None)
    assert parse_shape("h128x1x640q2s57") == (128, 1, 640, 2, 57)
    assert all(parse_shape(shape) for shape in so.SHAPES)


def test_only_equal_bits_compare_equal():
    g = torch.Generator().manual_seed(0)
    out = torch.randn(4, 2, 16, 512, generator=g).bfloat16()
    lse = torch.randn(4, 2, 16, generator=g)
    lse[0, 0, 0] = float("nan")
    a = _saved(out, lse)
    # a copy is bit-identical, the NaN in the LSE included (NaN equals its own bits)
    assert so.compare(a, _saved(out.clone(), lse.clone())) == ["h16x16x4097q2: bit-identical"]
    # one bf16 ulp in one element, or +0 against -0 in the LSE: not the same bits
    nudged = out.clone()
    nudged.view(torch.int16)[1, 1, 3, 100] += 1
    assert so.compare(a, _saved(nudged, lse)) == ["h16x16x4097q2: DIFFER in out"]
    lse_zero, signed_zero = lse.clone(), lse.clone()
    lse_zero[1, 0, 0], signed_zero[1, 0, 0] = 0.0, -0.0
    assert so.compare(_saved(out, lse_zero), _saved(out, signed_zero)) == ["h16x16x4097q2: DIFFER in lse"]
    assert so.compare(a, {}) == ["h16x16x4097q2: DIFFER in out, lse"]
