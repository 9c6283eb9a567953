"""Kernel sources: Triton (triton/) and CUDA (cuda/). Imported as sglang_snapmla.kernels."""
