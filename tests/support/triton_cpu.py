"""Make Triton's CPU interpreter (TRITON_INTERPRET=1) compute bf16 and fp8 the way the GPU does.

Triton 3.6's interpreter keeps bf16 values as raw uint16 and fp8 as raw uint8 numpy arrays. Arithmetic and
`tl.dot` on bf16 then operate on bit patterns (silently wrong), and its float converter rounds fp32->fp8 half-up
without carrying into the exponent and without saturating. See ../shared/notes/triton-interpreter-on-cpu.md.

`install()` wraps the interpreter's float converter and its builder's binary / unary / fma / dot ops: operands
of a non-numpy float type are widened to float32 through torch (exact bit views), the op runs in float32 (an fp32
FMA with one rounding, `harness.exact_fp32.fma_f32`), and a float result is rounded back with torch
(round-to-nearest-even; fp8 saturates to its finite range like the GPU's cvt.rn.satfinite). Only active under the
interpreter; a no-op otherwise.
"""

from __future__ import annotations

import contextlib
import os

import numpy as np
import torch

from harness.exact_fp32 import fma_f32

_INSTALLED = False


def interpreter_active() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _torch_dtypes():
    import triton.language as tl

    return {
        tl.bfloat16: torch.bfloat16,
        tl.float8e4nv: torch.float8_e4m3fn,
        tl.float8e5: torch.float8_e5m2,
        tl.float8e4b8: torch.float8_e4m3fnuz,
        tl.float8e5b16: torch.float8_e5m2fnuz,
        tl.float16: torch.float16,
        tl.float32: torch.float32,
        tl.float64: torch.float64,
    }


_BITS_NP = {1: np.uint8, 2: np.int16}  # numpy dtypes torch can view as its 1- and 2-byte floats


def _np_to_torch(arr: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """The interpreter's numpy storage of ``dtype`` values (raw bits for bf16 / fp8) as a torch tensor."""
    arr = np.ascontiguousarray(arr)
    if dtype in (torch.float16, torch.float32, torch.float64):
        return torch.from_numpy(arr.astype(torch.empty((), dtype=dtype).numpy().dtype))
    size = torch.empty((), dtype=dtype).element_size()
    return torch.from_numpy(arr.view(_BITS_NP[size]).copy()).view(dtype)


def _torch_to_np_bits(t: torch.Tensor) -> np.ndarray:
    """``t`` in the interpreter's numpy storage for its dtype (uint16 bits for bf16, uint8 for fp8)."""
    if t.dtype in (torch.float16, torch.float32, torch.float64):
        return t.numpy()
    size = t.element_size()
    bits = t.contiguous().view({1: torch.uint8, 2: torch.int16}[size]).numpy()
    return bits.view({1: np.uint8, 2: np.uint16}[size])


def _round_to(x32: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype.is_floating_point and torch.finfo(dtype).bits == 8:
        fmax = torch.finfo(dtype).max
        x32 = x32.clamp(-fmax, fmax)  # satfinite; NaN stays NaN
    return x32.to(dtype)


def install() -> None:
    """Patch the interpreter (idempotent). Call before any kernel runs under TRITON_INTERPRET=1."""
    global _INSTALLED
    if _INSTALLED or not interpreter_active():
        return
    import triton.language as tl
    from triton.runtime import interpreter as interp

    tdt = _torch_dtypes()
    narrow = {tl.bfloat16, tl.float8e4nv, tl.float8e5, tl.float8e4b8, tl.float8e5b16}
    Handle = interp.TensorHandle
    Builder = interp.InterpreterBuilder

    def convert_float(data, src_dtype, dst_dtype, rounding_mode):
        if rounding_mode is not None and str(rounding_mode).lower().endswith("rtz"):
            raise NotImplementedError("triton_cpu fix-up implements round-to-nearest-even only")
        t = _np_to_torch(np.asarray(data), tdt[src_dtype]).float()
        return _torch_to_np_bits(_round_to(t, tdt[dst_dtype])).reshape(np.shape(data))

    def widen(h):
        """TensorHandle of a narrow float type -> (float32 handle, original scalar type)."""
        sc = h.dtype.scalar
        if sc in narrow:
            t = _np_to_torch(np.asarray(h.data), tdt[sc]).float()
            return Handle(t.numpy().reshape(np.shape(h.data)), tl.float32), sc
        return h, None

    def narrow_back(h, sc):
        if sc is None or h.dtype.scalar != tl.float32:
            return h
        t = torch.from_numpy(np.ascontiguousarray(h.data, dtype=np.float32))
        return Handle(_torch_to_np_bits(_round_to(t, tdt[sc])).reshape(np.shape(h.data)), sc)

    orig_binary, orig_unary, orig_fma = Builder.binary_op, Builder.unary_op, Builder.create_fma

    def binary_op(self, lhs, rhs, op):
        lw, ls = widen(lhs)
        rw, _ = widen(rhs)
        return narrow_back(orig_binary(self, lw, rw, op), ls)

    def unary_op(self, arg, op):
        aw, s = widen(arg)
        return narrow_back(orig_unary(self, aw, op), s)

    def create_fma(self, x, y, z):
        xw, _ = widen(x)
        yw, _ = widen(y)
        zw, zs = widen(z)
        if all(h.dtype.scalar == tl.float32 for h in (xw, yw, zw)):
            return narrow_back(Handle(fma_f32(xw.data, yw.data, zw.data), tl.float32), zs)
        return narrow_back(orig_fma(self, xw, yw, zw), zs)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        # Tensor cores multiply narrow operands exactly and accumulate in fp32: widen exactly, matmul in fp32.
        aw, _ = widen(a)
        bw, _ = widen(b)
        dw, ds = widen(d)
        acc = np.matmul(aw.data.astype(np.float32), bw.data.astype(np.float32)) + dw.data
        return narrow_back(Handle(acc.astype(dw.data.dtype), dw.dtype.scalar), ds)

    interp._convert_float = convert_float
    Builder.binary_op = binary_op
    Builder.unary_op = unary_op
    Builder.create_fma = create_fma
    Builder.create_dot = create_dot
    _INSTALLED = True


@contextlib.contextmanager
def recorded_loads():
    """Under the interpreter: every address a Triton kernel loads from inside the block (its mask's true lanes), as
    one list of numpy uint64 arrays, so that a test can say which elements of a tensor a kernel read (`elements_read`)
    -- a read past a tensor's end then fails an assertion instead of crashing the process, or passing unseen."""
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    original = builder.create_masked_load
    loads: list[np.ndarray] = []

    def create_masked_load(self, ptrs, mask, other, *args):
        loads.append(np.asarray(ptrs.data)[np.asarray(mask.data, dtype=bool)].astype(np.uint64).ravel())
        return original(self, ptrs, mask, other, *args)

    builder.create_masked_load = create_masked_load
    try:
        yield loads
    finally:
        builder.create_masked_load = original


def elements_read(loads: list[np.ndarray], t: torch.Tensor) -> set[int]:
    """Indices into `t`'s storage (element offsets from its storage's start) that `recorded_loads` saw loaded."""
    storage = t.untyped_storage()
    base, size, item = storage.data_ptr(), storage.nbytes(), t.element_size()
    out: set[int] = set()
    for addrs in loads:
        inside = addrs[(addrs >= base) & (addrs < base + size)]
        out.update(((inside - base) // item).tolist())
    return out
