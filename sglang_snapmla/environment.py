"""`python -m sglang_snapmla`: what this machine serves with, as a report to paste into a bug report.

Package and SGLang versions (and whether snapmla supports that SGLang), torch and CUDA, the GPU, which decode a server
would run and why (the prebuilt sm_90a library, the extension built with nvcc at first start, or the Triton kernels),
the compile-cache folders, and the serve command for this machine. Exit status 0 where a snapmla server can start,
1 where it cannot (no CUDA GPU, a GPU without FP8 e4m3 in Triton (`gpu`), an unsupported or missing SGLang,
SNAPMLA_DECODE_IMPL=cuda without the sm_90a decode).
Nothing is compiled; on an sm_90 GPU the prebuilt library, where shipped, runs its start-up check (one small decode).
"""

from __future__ import annotations

import importlib.metadata
import os
from dataclasses import dataclass
from pathlib import Path

from . import settings, sglang_release
from .gpu import unsupported_gpu


@dataclass(frozen=True)
class Decode:
    """The decode a server would run here: `kind` ("sm_90a prebuilt", "sm_90a built with nvcc", "Triton" or "none")
    and why."""
    kind: str
    why: str


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def decode_choice() -> Decode:
    """What `cuda_ext.load` and `decode_plan.decode_impl` would pick on this machine, without building anything."""
    import torch

    from . import cuda_ext, prebuilt

    if not torch.cuda.is_available():
        return Decode("none", "no CUDA GPU: serving needs an NVIDIA GPU (the tuned decode: sm_90, H100 / H200)")
    unsupported = unsupported_gpu()
    if unsupported:
        return Decode("none", unsupported)
    requested = settings.requested_decode_impl()
    if requested == "triton":
        return Decode("Triton", f"{settings.DECODE_IMPL_ENV}=triton")
    kind, _, why = cuda_ext.locate()
    if kind == "prebuilt":
        return Decode("sm_90a prebuilt", f"{prebuilt.LIBRARY.name}, checked against the executable spec on this GPU")
    if kind == "build":
        from torch.utils.cpp_extension import CUDA_HOME

        return Decode("sm_90a built with nvcc", f"{why}; nvcc under {CUDA_HOME} builds it at the first start "
                                               "(~25 s, cached)")
    if requested == "cuda":
        return Decode("none", f"{settings.DECODE_IMPL_ENV}=cuda, but the sm_90a decode is unavailable: {why}")
    return Decode("Triton", why)


# (what is cached, its environment variable, its default folder): the compile caches of a first start
CACHES = (
    ("Triton kernels", "TRITON_CACHE_DIR", "~/.triton/cache"),
    ("snapmla's decode extension (torch C++ extension, where no prebuilt library is shipped)", "TORCH_EXTENSIONS_DIR",
     "~/.cache/torch_extensions"),
    ("FlashInfer JIT (SGLang's norms, sampling, prefill)", "FLASHINFER_WORKSPACE_BASE", "~"),
    ("SGLang's JIT kernels (tvm-ffi)", "TVM_FFI_CACHE_DIR", "~/.cache/tvm-ffi"),
)


def cache_folders() -> list[tuple[str, str, Path]]:
    """(what, variable, folder) of the compile caches a first start fills (docs/DEPLOY.md, "Start-up time")."""
    out = []
    for what, var, default in CACHES:
        folder = Path(os.path.expanduser(os.environ.get(var, default)))
        out.append((what, var, folder / ".cache" / "flashinfer" if var == "FLASHINFER_WORKSPACE_BASE" else folder))
    return out


def report() -> tuple[list[str], int]:
    """The report's lines and the exit status (0: a snapmla server can start here)."""
    import torch

    problems = []
    lines = [f"sglang-snapmla {_version('sglang-snapmla') or '(not installed as a package)'}"]
    sglang_version = _version("sglang")
    if sglang_version is None:
        problems.append(f"SGLang is not installed: {sglang_release.install_fix()}")
        lines.append("SGLang: not installed")
    else:
        refusal = sglang_release.refusal(sglang_version)
        lines.append(f"SGLang {sglang_version}: " + ("supported" + (" (verified on GPUs)" if sglang_version ==
                                                                     sglang_release.GPU_VERIFIED else " (CPU-verified)")
                                                 if refusal is None else "NOT supported"))
        if refusal:
            problems.append(refusal)
    lines.append(f"torch {torch.__version__}, CUDA {torch.version.cuda or 'none (CPU build)'}")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for i in range(gpus):
        major, minor = torch.cuda.get_device_capability(i)
        lines.append(f"GPU {i}: {torch.cuda.get_device_name(i)}, sm_{major}{minor}")
    if gpus == 0:
        lines.append("GPU: none")
    try:
        settings.check_switches()
    except ValueError as e:
        problems.append(str(e))
    try:
        decode = decode_choice()
    except ValueError as e:  # SNAPMLA_DECODE_IMPL's own value, among the problems already
        decode = Decode("none", str(e))
    lines.append(f"decode: {decode.kind} ({decode.why})")
    if decode.kind == "none" and decode.why not in problems:
        problems.append(decode.why)
    lines.append("compile caches (keep them on a persistent volume in containers):")
    for what, var, folder in cache_folders():  # FlashInfer's variable names the folder above its .cache/flashinfer
        value = folder.parent.parent if var == "FLASHINFER_WORKSPACE_BASE" else folder
        lines.append(f"  {var}={value}  ({what}: {folder})")
    tp = f" --tp {gpus}" if gpus > 1 else ""
    lines.append(f"serve: sglang serve --model-path <checkpoint> --attention-backend snapmla{tp}")
    lines += [f"cannot serve here: {p}" for p in problems]
    return lines, 1 if problems else 0


def main() -> int:
    lines, status = report()
    print("\n".join(lines))
    return status
