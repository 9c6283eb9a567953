"""The sm_90a CUDA decode: the prebuilt library shipped in the package (`prebuilt`, no nvcc needed where it serves),
or the torch C++ extension built at first use with nvcc and cached (the developer path).

`load()` returns a module with `decode_split` -- the prebuilt library where it is shipped and passes its check on
this GPU, else the extension where nvcc builds it -- or None with the reason logged once (no CUDA device, not an
sm_90 GPU, neither a usable library nor nvcc, a failed build). Callers fall back to the Triton kernels;
`ops.decode_quantized` uses this module by default on sm_90 (SNAPMLA_DECODE_IMPL=auto; `triton` opts out, `cuda`
makes its absence an error). SNAPMLA_CUDA_SOURCE_DIR (kernel development) always builds from its sources.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from pathlib import Path

import torch

from . import settings
from .cuda_sources import CODEGEN_FLAGS, SOURCE_DIR

log = logging.getLogger(__name__)
# Kernel development only: build from another copy of kernels/cuda (an A/B of two kernel versions on one machine);
# it gets its own extension name so that torch's build cache keeps both.
SOURCE_DIR_ENV = settings.CUDA_SOURCE_DIR_ENV
SOURCES = ("binding.cpp", "snapmla_decode_sm90.cu")
NVCC_FLAGS = (*CODEGEN_FLAGS, "-Xptxas=-v")  # the code generation of the prebuilt library, register report


def unavailable_reason() -> str | None:
    """Why no sm_90a decode can run on this machine's GPU, or None when one can (prebuilt or built)."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        return f"needs an sm_90 GPU (H100/H200), found sm_{major}{minor}"
    return None


def build(build_directory: str | None = None, verbose: bool = False):
    """Compile (or reuse torch's cached build of) the extension and import it; no GPU is needed to build."""
    from torch.utils.cpp_extension import load as torch_load

    source_dir, name = SOURCE_DIR, "snapmla_sm90"
    if settings.cuda_source_dir():
        source_dir = Path(settings.cuda_source_dir()).resolve()
        name += "_" + hashlib.sha1(str(source_dir).encode()).hexdigest()[:8]
        log.warning("SnapMLA CUDA decode built from %s=%s (kernel development override)", SOURCE_DIR_ENV, source_dir)
    return torch_load(name=name, sources=[str(source_dir / s) for s in SOURCES],
                      extra_cuda_cflags=list(NVCC_FLAGS), extra_include_paths=[str(source_dir)],
                      build_directory=build_directory, verbose=verbose)


def locate() -> tuple[str, object, str]:
    """Which sm_90a decode this machine would run, without building anything: ("prebuilt", the library's module, ""),
    ("build", None, why no library serves) where nvcc can build the extension, or ("unavailable", None, why)."""
    reason = unavailable_reason()
    if reason is not None:
        return "unavailable", None, reason
    from . import prebuilt

    module, why_not = (None, "kernel development build") if settings.cuda_source_dir() else prebuilt.load()
    if module is not None:
        return "prebuilt", module, ""
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME is None:
        return "unavailable", None, f"{why_not}; and no nvcc (CUDA_HOME unset) to build it"
    return "build", None, why_not


@functools.lru_cache(maxsize=1)
def load():
    """The sm_90a decode module (prebuilt library, else built extension), or None (reason logged once)."""
    kind, module, reason = locate()
    if kind == "prebuilt":
        log.info("SnapMLA decode: sm_90a CUDA kernel, prebuilt library (SNAPMLA_DECODE_IMPL=triton selects the "
                 "Triton kernel)")
        return module
    if kind == "build":
        try:
            module = build()
            log.info("SnapMLA decode: sm_90a CUDA kernel, built here with nvcc (%s; SNAPMLA_DECODE_IMPL=triton "
                     "selects the Triton kernel)", reason)
            return module
        except Exception as e:  # a failed build is reported, the Triton path stays usable
            reason = f"{reason}; build failed: {e!r:.500}"
    log.warning("SnapMLA sm90 CUDA decode unavailable (%s); using the Triton kernels, several times slower at 128 "
                "heads (docs/BENCHMARKS.md)", reason)
    return None
