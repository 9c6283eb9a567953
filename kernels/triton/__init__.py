"""Triton kernels for SnapMLA (called through sglang_snapmla.ops)."""
