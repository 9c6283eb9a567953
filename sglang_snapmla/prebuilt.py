"""The sm_90a decode as a prebuilt shared library: built ahead with nvcc (no GPU needed), shipped in the package, loaded
with ctypes where it serves -- no nvcc, no build step, no torch ABI to match there.

    python -m sglang_snapmla.prebuilt            # builds kernels/cuda/prebuilt/libsnapmla_decode_sm90.so (~1-2 min)

Run it before `pip wheel .` (the wheel then carries the library) or while preparing a container image. `cuda_ext.load`
prefers this library where it is present and passes `self_check` on the GPU (one small decode against the executable
spec); otherwise it builds the torch extension with nvcc, the developer path.

`PrebuiltDecode.decode_split` has the torch binding's signature (kernels/cuda/binding.cpp) and checks what the
kernel's address arithmetic relies on, as the binding does.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from . import numerics as nx
from .cuda_sources import CODEGEN_FLAGS, SOURCE_DIR as CUDA_DIR
from .decode_plan import PARTIAL_MIN_SLOTS, q_rows_fit_the_kernel

log = logging.getLogger(__name__)
LIBRARY = CUDA_DIR / "prebuilt" / "libsnapmla_decode_sm90.so"
SOURCES = ("snapmla_decode_sm90.cu", "c_api.cu")
SYMBOL = "snapmla_decode_split_sm90"
# the CUDA runtime linked statically: the library then needs only a driver for the CUDA release that built it
NVCC_FLAGS = (*CODEGEN_FLAGS, "-shared", "-Xcompiler", "-fPIC", "-cudart", "static")
_P, _I32, _I64, _F32 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_float


class DecodeParams(ctypes.Structure):
    """snapmla::DecodeParams (kernels/cuda/snapmla_decode_sm90.h), field by field in the header's order and C types
    (tests/product/test_prebuilt.py compares the two; the library reports its sizeof, which `PrebuiltDecode` checks)."""
    _fields_ = [("q8", _P), ("q_scale", _P), ("q_rope", _P), ("q_nope", _P), ("q_pe", _P), ("kv_content", _P),
                ("kv_scale", _P), ("kv_rope", _P), ("block_table", _P), ("seq_lens", _P), ("o_part", _P),
                ("lse_part", _P), ("out", _P), ("lse_out", _P), ("pool_rows", _I64), ("bt_entries", _I64),
                ("stride_qn_t", _I64), ("stride_qn_h", _I64), ("stride_qp_t", _I64), ("stride_qp_h", _I64),
                ("stride_bt", _I32), ("batch", _I32),
                ("R", _I32), ("H", _I32), ("S_Q", _I32), ("num_splits", _I32), ("part_slots", _I32),
                ("launch_flags", _I32), ("qk_scale_log2", _F32)]


def build(out: Path = LIBRARY, nvcc: str | None = None, source_dir: Path = CUDA_DIR) -> Path:
    """Compile the library with nvcc (no GPU needed) -> its path."""
    nvcc = nvcc or shutil.which("nvcc")
    if nvcc is None:
        raise RuntimeError("nvcc not found: building the prebuilt SnapMLA decode needs the CUDA toolkit (12.8+)")
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [nvcc, *NVCC_FLAGS, f"-I{source_dir}", "-o", str(out), *(str(source_dir / s) for s in SOURCES)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"nvcc failed ({' '.join(cmd)}):\n{res.stderr[-3000:]}")
    return out


def _common_params(kv_content, kv_scale, kv_rope, block_table, seq_lens, o_part, lse_part, out, lse_out, batch: int,
                   R: int, H: int, S_Q: int, qk_scale_log2: float, num_splits: int, bt_entries: int,
                   launch_flags: int) -> DecodeParams:
    """DecodeParams without Q, checked as the binding's common_params checks them."""
    for t in (kv_content, kv_scale, kv_rope, o_part, lse_part, out, lse_out):
        if not t.is_contiguous():
            raise RuntimeError("snapmla sm90 decode: CUDA, contiguous tensors expected")
    final = out.numel() > 0
    if final and not (num_splits == 1 and lse_out.numel() > 0 and out.dtype == torch.bfloat16
                      and lse_out.dtype == torch.float32):
        raise RuntimeError("snapmla sm90 decode: final outputs (bf16 out, fp32 lse) only with num_splits == 1")
    if not final and not (o_part.numel() > 0 and lse_part.numel() > 0):
        raise RuntimeError("snapmla sm90 decode: pass either the split partials or the final outputs")
    slots = 1 if final else o_part.shape[2]
    if not final and not (o_part.dim() == 4 and lse_part.dim() == 3 and lse_part.shape[2] == slots
                          and slots >= num_splits):
        raise RuntimeError("snapmla sm90 decode: o_part [B, R, slots, 512] and lse_part [B, R, slots] with "
                           "slots >= num_splits")
    if block_table.dtype != torch.int32 or block_table.stride(1) != 1:
        raise RuntimeError("block_table must be int32 with unit stride in its last dim")
    storage = block_table.untyped_storage().nbytes() // 4 - block_table.storage_offset()
    if not 0 <= bt_entries <= storage:
        raise RuntimeError("snapmla sm90 decode: bt_entries exceeds the block table's storage")
    return DecodeParams(
        kv_content=kv_content.data_ptr(), kv_scale=kv_scale.data_ptr(), kv_rope=kv_rope.data_ptr(),
        block_table=block_table.data_ptr(), seq_lens=seq_lens.data_ptr(), o_part=None if final else o_part.data_ptr(),
        lse_part=None if final else lse_part.data_ptr(), out=out.data_ptr() if final else None,
        lse_out=lse_out.data_ptr() if final else None, pool_rows=kv_content.shape[0], bt_entries=bt_entries,
        stride_bt=block_table.stride(0), batch=batch, R=R, H=H, S_Q=S_Q, num_splits=num_splits,
        part_slots=slots, launch_flags=launch_flags, qk_scale_log2=qk_scale_log2)


def split_params(q8, q_scale, q_rope, kv_content, kv_scale, kv_rope, block_table, seq_lens, o_part, lse_part, out,
                 lse_out, R: int, H: int, S_Q: int, qk_scale_log2: float, num_splits: int, bt_entries: int,
                 launch_flags: int) -> DecodeParams:
    """The kernel's DecodeParams for the torch binding's `decode_split` arguments, checked as the binding checks them
    (what the kernel's address arithmetic relies on); any device, nothing launched. Either the split partials o_part
    [B, R, slots, 512] / lse_part [B, R, slots] (slots >= num_splits: the decode plan may space rows further apart
    than the splits, `decode_plan.partial_slots`) or, with one split, the final out / lse_out."""
    for t in (q8, q_scale, q_rope):
        if not t.is_contiguous():
            raise RuntimeError("snapmla sm90 decode: CUDA, contiguous tensors expected")
    p = _common_params(kv_content, kv_scale, kv_rope, block_table, seq_lens, o_part, lse_part, out, lse_out,
                       q8.shape[0], R, H, S_Q, qk_scale_log2, num_splits, bt_entries, launch_flags)
    p.q8, p.q_scale, p.q_rope = q8.data_ptr(), q_scale.data_ptr(), q_rope.data_ptr()
    return p


def split_params_q_bf16(q_nope, q_pe, kv_content, kv_scale, kv_rope, block_table, seq_lens, o_part, lse_part, out,
                        lse_out, R: int, H: int, S_Q: int, qk_scale_log2: float, num_splits: int, bt_entries: int,
                        launch_flags: int) -> DecodeParams:
    """The same for the binding's `decode_split_q_bf16` (bf16 Q rows, quantized by the 64-row kernel)."""
    if not (q_nope.dtype == q_pe.dtype == torch.bfloat16 and q_nope.dim() == q_pe.dim() == 3
            and q_nope.shape[2] == nx.KV_LORA_RANK and q_pe.shape[2] == nx.ROPE_DIM and q_nope.stride(2) == 1
            and q_pe.stride(2) == 1 and q_nope.shape[0] == q_pe.shape[0] and q_nope.shape[1] == q_pe.shape[1] == H
            and S_Q > 0 and q_nope.shape[0] % S_Q == 0):
        raise RuntimeError("snapmla sm90 decode: q_nope [B x s_q, H, 512] and q_pe [B x s_q, H, 64] bf16 on CUDA, "
                           "last dim contiguous")
    if not q_rows_fit_the_kernel(q_nope, q_pe):
        raise RuntimeError("snapmla sm90 decode: q_nope rows must be 16-byte aligned and q_pe rows 4-byte aligned")
    p = _common_params(kv_content, kv_scale, kv_rope, block_table, seq_lens, o_part, lse_part, out, lse_out,
                       q_nope.shape[0] // S_Q, R, H, S_Q, qk_scale_log2, num_splits, bt_entries, launch_flags)
    p.q_nope, p.q_pe = q_nope.data_ptr(), q_pe.data_ptr()
    p.stride_qn_t, p.stride_qn_h, p.stride_qp_t, p.stride_qp_h = (*q_nope.stride()[:2], *q_pe.stride()[:2])
    return p


def launch_error(err: int, describe) -> str:
    """The message for the library's error code `err` (`describe`: its snapmla_error_string)."""
    return (f"snapmla sm90 decode launch failed: {describe(err).decode()}"
            + (" (TMA descriptor encoding failed: the pool arrays, q8, q_rope and out must be 16-byte aligned; or bf16 "
               "Q for fewer than 33 query rows)" if err == 1 else ""))


class PrebuiltDecode:
    """The library's decode behind the torch binding's `decode_split` signature."""

    def __init__(self, path: Path = LIBRARY):
        self.path = path
        self.lib = ctypes.CDLL(str(path))
        self.fn = getattr(self.lib, SYMBOL)
        self.fn.argtypes, self.fn.restype = [ctypes.POINTER(DecodeParams), _P], ctypes.c_int
        self.lib.snapmla_decode_params_size.restype = ctypes.c_size_t
        built = self.lib.snapmla_decode_params_size()
        if built != ctypes.sizeof(DecodeParams):
            raise RuntimeError(f"{path.name} was built with a {built}-byte DecodeParams, this package's is "
                               f"{ctypes.sizeof(DecodeParams)} bytes: rebuild it (python -m sglang_snapmla.prebuilt)")
        self.lib.snapmla_error_string.argtypes, self.lib.snapmla_error_string.restype = [ctypes.c_int], ctypes.c_char_p

    def decode_split(self, q8, q_scale, q_rope, kv_content, kv_scale, kv_rope, block_table, seq_lens, o_part, lse_part,
                     out, lse_out, R: int, H: int, S_Q: int, qk_scale_log2: float, num_splits: int, bt_entries: int,
                     launch_flags: int) -> None:
        for t in (q8, q_scale, q_rope, kv_content, kv_scale, kv_rope, o_part, lse_part, out, lse_out):
            if not t.is_cuda:
                raise RuntimeError("snapmla sm90 decode: CUDA, contiguous tensors expected")
        self._launch(split_params(q8, q_scale, q_rope, kv_content, kv_scale, kv_rope, block_table, seq_lens, o_part,
                                  lse_part, out, lse_out, R, H, S_Q, qk_scale_log2, num_splits, bt_entries,
                                  launch_flags), q8.device)

    def decode_split_q_bf16(self, q_nope, q_pe, kv_content, kv_scale, kv_rope, block_table, seq_lens, o_part,
                            lse_part, out, lse_out, R: int, H: int, S_Q: int, qk_scale_log2: float, num_splits: int,
                            bt_entries: int, launch_flags: int) -> None:
        for t in (q_nope, q_pe, kv_content, kv_scale, kv_rope, o_part, lse_part, out, lse_out):
            if not t.is_cuda:
                raise RuntimeError("snapmla sm90 decode: CUDA, contiguous tensors expected")
        self._launch(split_params_q_bf16(q_nope, q_pe, kv_content, kv_scale, kv_rope, block_table, seq_lens, o_part,
                                         lse_part, out, lse_out, R, H, S_Q, qk_scale_log2, num_splits, bt_entries,
                                         launch_flags), q_nope.device)

    def _launch(self, params: DecodeParams, device: torch.device) -> None:
        err = self.fn(ctypes.byref(params), torch.cuda.current_stream(device).cuda_stream)
        if err != 0:
            raise RuntimeError(launch_error(err, self.lib.snapmla_error_string))


# The check's bound on rel-L2 against the spec. The sm_90a decode's own error on small cases like the check's (2-16
# heads, 1-2 query tokens, lengths across page edges) is at most MEASURED_MAX_REL_L2 over 1 200 seeded draws, median
# 4-6e-3 (`python3 -m tools.kernel_dev.decode_seed_sweep`: results/bench/decode_seed_sweep_small_cases.json.xz, its
# four cases without outliers); twice that keeps a right library passing and names one off by 5 % (rel-L2 0.05).
MEASURED_MAX_REL_L2 = 1.56e-2
SELF_CHECK_REL_L2 = 2 * MEASURED_MAX_REL_L2
# slots per partial row in the check's 3-split decode: the padding a server's plans give small partials
CHECK_SLOTS = PARTIAL_MIN_SLOTS


def self_check(module, device: str = "cuda") -> str | None:
    """One small decode (2 sequences over page edges, 16 heads, 2 query tokens, one split and three) through `module`
    against the executable spec (`numerics`: the decode, and the combine of its split partials) on `device` -> None,
    or what differed. Catches a library that loads but does not run right here; the three splits' partial rows are
    CHECK_SLOTS slots apart, as a server's padded partials are (`decode_plan.partial_slots`), so a library that
    spaces them by the split count fails too. (`device="cpu"` with TRITON_INTERPRET=1: tests run the check itself on CPU
    tensors, with an injected decode.)"""
    gen = torch.Generator(device=device).manual_seed(0)
    B, H, s_q, lens = 2, 16, 2, [130, 64]
    pages = 3
    latent = torch.randn(B * pages * 64 + 64, 576, device=device, generator=gen).to(torch.bfloat16)
    pool = nx.quantize_kv(latent[:, :512], latent[:, 512:])
    table = (torch.randperm(B * pages, device=device, generator=gen) + 1).to(torch.int32).view(B, pages)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    q = torch.randn(B, s_q, H, 576, device=device, generator=gen).to(torch.bfloat16)
    query = nx.quantize_q(q[..., :512], q[..., 512:])
    ref, _ = nx.snapmla_decode_reference(query, pool, table, seq_lens, 576 ** -0.5)
    for splits in (1, 3):
        out = torch.empty(B, s_q, H, 512, dtype=torch.bfloat16, device=device)
        lse = torch.empty(B, H, s_q, device=device)
        o_part = torch.empty(B, s_q * H, CHECK_SLOTS, 512, device=device) if splits > 1 else lse[:0]
        lse_part = torch.empty(B, s_q * H, CHECK_SLOTS, device=device) if splits > 1 else lse[:0]
        final = (out, lse) if splits == 1 else (out[:0], lse[:0])
        module.decode_split(query.content, query.scale, query.rope, pool.content, pool.scale, pool.rope, table,
                            seq_lens, o_part, lse_part, *final, s_q * H, H, s_q, 576 ** -0.5 * 1.4426950408889634,
                            splits, table.numel(), 0)
        if device != "cpu":
            torch.cuda.synchronize()
        got = out.float() if splits == 1 else nx.merge_splits(o_part, lse_part, splits).view(B, s_q, H, 512)
        rel = float((got - ref.float()).norm() / ref.float().norm())
        if not rel <= SELF_CHECK_REL_L2:
            return f"{splits} split(s): rel-L2 {rel:.3g} against the spec (at most {SELF_CHECK_REL_L2:.3g})"
    return None


@functools.lru_cache(maxsize=1)
def load() -> tuple[PrebuiltDecode | None, str | None]:
    """(the library's decode, None) where it is shipped, loads and passes `self_check` on this GPU, else (None, why)."""
    if not LIBRARY.exists():
        return None, f"no prebuilt library ({LIBRARY.name} not shipped; `python -m sglang_snapmla.prebuilt` builds it)"
    if torch.cuda.is_current_stream_capturing():  # the check synchronizes: never inside a graph capture
        return None, "prebuilt library not checked: first asked for inside a CUDA graph capture"
    try:
        module = PrebuiltDecode()
        problem = self_check(module)
    except Exception as e:  # a library that does not load or run here: reported, the other paths stay usable
        return None, f"prebuilt library unusable here: {e!r:.300}"
    if problem:
        return None, f"prebuilt library failed its check on this GPU: {problem}"
    return module, None


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="build the prebuilt sm_90a SnapMLA decode library")
    ap.add_argument("--out", type=Path, default=LIBRARY)
    args = ap.parse_args(argv)
    print(build(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
