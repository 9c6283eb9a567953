"""The interpreter fix-up makes bf16 arithmetic / tl.dot and fp32->fp8 casts match the GPU (torch) exactly."""

import pytest
import torch
import triton
import triton.language as tl

import triton_cpu

pytestmark = pytest.mark.skipif(not triton_cpu.interpreter_active(), reason="interpreter-only test")


@triton.jit
def _bf16_dot_kernel(a_ptr, b_ptr, out_ptr, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr):
    rm, rk, rn = tl.arange(0, M), tl.arange(0, K), tl.arange(0, N)
    a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])
    b = tl.load(b_ptr + rk[:, None] * N + rn[None, :])
    tl.store(out_ptr + rm[:, None] * N + rn[None, :], tl.dot(a, b))


@triton.jit
def _bf16_arith_kernel(a_ptr, b_ptr, out_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    a = tl.load(a_ptr + r)
    b = tl.load(b_ptr + r)
    tl.store(out_ptr + r, a * b + a)  # bf16 ops, bf16 result


@triton.jit
def _fp8_cast_kernel(x_ptr, out_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    tl.store(out_ptr + r, tl.load(x_ptr + r).to(tl.float8e4nv))


def test_bf16_dot_is_exact(gen):
    a = torch.randn(16, 32, generator=gen).to(torch.bfloat16)
    b = torch.randn(32, 16, generator=gen).to(torch.bfloat16)
    out = torch.empty(16, 16)
    _bf16_dot_kernel[(1,)](a, b, out, 16, 32, 16)
    ref = a.double() @ b.double()
    assert (out.double() - ref).abs().max() < 1e-4  # fp32 accumulation of exact bf16 products


def test_bf16_arithmetic_rounds_like_torch(gen):
    a = torch.randn(256, generator=gen).to(torch.bfloat16)
    b = torch.randn(256, generator=gen).to(torch.bfloat16)
    out = torch.empty(256, dtype=torch.bfloat16)
    _bf16_arith_kernel[(1,)](a, b, out, 256)
    ref = (a * b) + a  # torch: each op rounds to bf16
    assert torch.equal(out, ref)


def test_fp32_to_fp8_cast_is_rne_saturating(gen):
    grid = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
    grid = grid[torch.isfinite(grid)].sort().values
    ties = (grid[1:] + grid[:-1]) / 2
    x = torch.cat([torch.randn(1024, generator=gen) * 50, ties, torch.tensor([1000.0, -1000.0, 470.0])])
    n = 2048
    x = torch.cat([x, torch.zeros(n - x.numel())])
    out = torch.empty(n, dtype=torch.float8_e4m3fn)
    _fp8_cast_kernel[(1,)](x, out, n)
    ref = x.clamp(-448, 448).to(torch.float8_e4m3fn)
    assert torch.equal(out.view(torch.uint8), ref.view(torch.uint8))
