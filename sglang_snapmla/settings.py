"""The environment switches of sglang-snapmla, all read here (docs/DEPLOY.md, "Environment variables"; the kernel
development switch SNAPMLA_CUDA_SOURCE_DIR: docs/DEVELOPING.md). SGLang's own SGLANG_MAX_KV_CHUNK_CAPACITY, which
snapmla bounds on block-FP8 weights, is read and set where it is bounded (`extend.bound_mha_chunk_capacity`).

Each is read when it is used, not at import: a test, or a process that sets one after importing the plugin, sees
the value of the moment.
"""

from __future__ import annotations

import os

DECODE_IMPL_ENV = "SNAPMLA_DECODE_IMPL"  # auto | cuda | triton
PDL_ENV = "SNAPMLA_PDL"  # 0 turns programmatic dependent launch off
# 1: the sm_90a 64-row decode quantizes Q from its bf16 rows itself instead of behind the Q-quant kernel (opt-in)
Q_IN_DECODE_ENV = "SNAPMLA_Q_IN_DECODE"
CHECK_INDICES_ENV = "SNAPMLA_CHECK_INDICES"  # 1: the public ops check slot ids, page ids and lengths (a host sync)
EXTEND_ROUTE_ENV = "SNAPMLA_EXTEND_ROUTE"  # auto | mha | absorbed: the route of prefills over a cached prefix
HICACHE_COPIES_ENV = "SNAPMLA_HICACHE_COPIES"  # kernels (default) | torch: what moves HiCache pages between host and device
# 1: FlashMLA's tile schedule, which snapmla never reads, is computed every step as SGLang's flashmla backend does
# (measuring what skipping it saves, benchmarks/serve_tpot.py)
FLASHMLA_SCHEDULE_ENV = "SNAPMLA_FLASHMLA_SCHEDULE"
CUDA_SOURCE_DIR_ENV = "SNAPMLA_CUDA_SOURCE_DIR"  # kernel development: build the CUDA decode from another source dir
# deployment | sglang (default): how `--load-format dummy` draws a block-FP8 model (`dummy_weights`)
DUMMY_WEIGHTS_ENV = "SNAPMLA_DUMMY_WEIGHTS"


def interpreter_mode() -> bool:
    """Triton runs in its CPU interpreter (TRITON_INTERPRET=1, Triton's own switch): no CUDA kernels, no PDL."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def requested_decode_impl() -> str:
    return os.environ.get(DECODE_IMPL_ENV, "auto")


def pdl_allowed() -> bool:
    return os.environ.get(PDL_ENV, "1") != "0"


def q_in_decode_requested() -> bool:
    return os.environ.get(Q_IN_DECODE_ENV, "0") == "1"


def requested_extend_route() -> str:
    return os.environ.get(EXTEND_ROUTE_ENV, "auto")


def index_checks_enabled() -> bool:
    return os.environ.get(CHECK_INDICES_ENV, "0") == "1"


def requested_hicache_copies() -> str:
    return os.environ.get(HICACHE_COPIES_ENV, "kernels")


def flashmla_schedule_computed() -> bool:
    return os.environ.get(FLASHMLA_SCHEDULE_ENV, "0") == "1"


def cuda_source_dir() -> str | None:
    return os.environ.get(CUDA_SOURCE_DIR_ENV) or None


def requested_dummy_weights() -> str:
    return os.environ.get(DUMMY_WEIGHTS_ENV, "sglang")
