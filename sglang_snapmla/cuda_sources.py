"""Where the sm_90a decode's CUDA sources live and how nvcc compiles them, for both builds of it: the torch
extension (`cuda_ext`, the developer path) and the prebuilt library (`prebuilt`, shipped in the package)."""

from pathlib import Path

from . import kernels as kernels_pkg

# the kernels folder is mapped into the package (sglang_snapmla.kernels), so ask the package where it lives
SOURCE_DIR = Path(kernels_pkg.__file__).resolve().parent / "cuda"
# -lineinfo: Nsight Compute can map SASS back to source lines (no effect on the code)
CODEGEN_FLAGS = ("-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-lineinfo")
