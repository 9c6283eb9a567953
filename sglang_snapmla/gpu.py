"""The GPUs snapmla's kernels run on.

Every path through the cache computes in FP8 e4m3: the Q-quant and the K-append write it, the decodes read it and
quantize P to it. Triton compiles that type (`float8e4nv`) for compute capability 8.9 and newer only (Ada, Hopper,
Blackwell; triton/backends/nvidia/compiler.py adds it to the supported FP8 types from 89 on): on an A100 (8.0) or an
A10 (8.6) a snapmla server would load its model and then stop at its first kernel compile. `unsupported_gpu` says
so at startup instead (`pool.check_pool_config`, run by the server-args pass and by the pool) and in the environment
report. The tuned sm_90a decode needs 9.0 exactly (`cuda_ext`); other GPUs from 8.9 on run the Triton kernels.
"""

from __future__ import annotations

import torch

FP8_MIN_CAPABILITY = (8, 9)  # the lowest compute capability Triton compiles float8e4nv for


def unsupported_gpu(device: str | torch.device = "cuda") -> str | None:
    """Why CUDA `device` cannot run snapmla's kernels (a message naming the fix), or None where it can. "cuda" with
    no index checks every visible GPU (the server-args pass: the ranks' GPUs are not assigned yet); no CUDA device
    at all is another check's business (None)."""
    if not torch.cuda.is_available():
        return None
    index = torch.device(device).index
    for i in [index] if index is not None else range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(i)
        if (major, minor) < FP8_MIN_CAPABILITY:
            return (f"--attention-backend snapmla computes in FP8 e4m3, which its Triton kernels compile for GPUs of "
                    f"compute capability {FP8_MIN_CAPABILITY[0]}.{FP8_MIN_CAPABILITY[1]} or newer (Ada, Hopper, "
                    f"Blackwell); GPU {i} ({torch.cuda.get_device_name(i)}) is sm_{major}{minor}. Serve this model "
                    "with another --attention-backend (e.g. flashinfer or triton) on it.")
    return None
