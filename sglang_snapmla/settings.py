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


# each switch's values, its default first (docs/DEPLOY.md, "Environment variables"); unset or empty is the default
VALUES = {
    DECODE_IMPL_ENV: ("auto", "cuda", "triton"),
    PDL_ENV: ("1", "0"),
    Q_IN_DECODE_ENV: ("0", "1"),
    CHECK_INDICES_ENV: ("0", "1"),
    EXTEND_ROUTE_ENV: ("auto", "mha", "absorbed"),
    HICACHE_COPIES_ENV: ("kernels", "torch"),
    FLASHMLA_SCHEDULE_ENV: ("0", "1"),
    DUMMY_WEIGHTS_ENV: ("sglang", "deployment"),
}


def read(name: str) -> str:
    """A switch's value, one of VALUES[name]. Any other value is refused with the values it takes: read as the
    default, a typo (`SNAPMLA_CHECK_INDICES=true`, `SNAPMLA_PDL=off`) would leave a server silently without what it
    asked for."""
    values = VALUES[name]
    value = os.environ.get(name, "")
    if value == "":
        return values[0]
    if value not in values:
        raise ValueError(f"{name}={value!r}: set it to {' or '.join(map(repr, values))} ({values[0]!r} is the "
                         "default; docs/DEPLOY.md, \"Environment variables\"), or unset it")
    return value


def check_switches() -> None:
    """Reads every switch once, so that an unknown value stops a process where it starts (the plugin calls this
    when SGLang loads it) rather than at the first step that reads it."""
    for name in VALUES:
        read(name)


def requested_decode_impl() -> str:
    return read(DECODE_IMPL_ENV)


def pdl_allowed() -> bool:
    return read(PDL_ENV) == "1"


def q_in_decode_requested() -> bool:
    return read(Q_IN_DECODE_ENV) == "1"


def requested_extend_route() -> str:
    return read(EXTEND_ROUTE_ENV)


def index_checks_enabled() -> bool:
    return read(CHECK_INDICES_ENV) == "1"


def requested_hicache_copies() -> str:
    return read(HICACHE_COPIES_ENV)


def flashmla_schedule_computed() -> bool:
    return read(FLASHMLA_SCHEDULE_ENV) == "1"


def cuda_source_dir() -> str | None:
    return os.environ.get(CUDA_SOURCE_DIR_ENV) or None


def requested_dummy_weights() -> str:
    return read(DUMMY_WEIGHTS_ENV)
