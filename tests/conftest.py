"""Test setup: CPU runs use Triton's interpreter (with our bf16/fp8 fix-up); GPU tests are marked `gpu`.

Every test gets its own generator, seeded from the run's base seed (fresh each run unless SNAPMLA_TEST_SEED is
set; printed in the header so a failure can be replayed) and the test's id.
"""

import os
import random
import zlib

import pytest
import torch

# tests/product: the plugin, pool, backend and kernels as SGLang uses them; tests/tooling: the benchmarks, the
# accuracy study and the tools; tests/support (on the path through pyproject's pytest `pythonpath`): what both
# import (helpers, the Triton interpreter fix-up, stand-ins)

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton_cpu  # noqa: E402  (must run after TRITON_INTERPRET is decided)

triton_cpu.install()

BASE_SEED = int(os.environ.get("SNAPMLA_TEST_SEED", random.SystemRandom().randrange(2**31)))
# pytest-xdist's workers start from this process's environment: they draw the same base seed
os.environ["SNAPMLA_TEST_SEED"] = str(BASE_SEED)


def pytest_configure(config):
    # pytest-xdist's workers (`-n auto`: one per core) would each start torch's and the BLAS's thread pools at one
    # thread per core, n^2 threads on n cores, which run the CPU work far slower than n threads do (docs/DEVELOPING.md,
    # "Threads"). Each worker gets its share of the cores unless OMP_NUM_THREADS is set already; the workers start
    # from this (the controller's) environment, after pytest_configure.
    workers = len(getattr(config.option, "tx", None) or []) if getattr(config.option, "dist", "no") != "no" else 0
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ and not hasattr(config, "workerinput"):
        os.environ["OMP_NUM_THREADS"] = os.environ["SNAPMLA_WORKER_THREADS"] = str(
            max(1, (os.cpu_count() or 1) // workers))


def pytest_report_header(config):
    return [f"snapmla: base seed {BASE_SEED} (replay with SNAPMLA_TEST_SEED={BASE_SEED}); "
            f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '0')}; cuda={torch.cuda.is_available()}"]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    # the header is hidden under -q, which CI uses; a failure must still name the seed that replays it
    if exitstatus != 0:
        terminalreporter.write_line(f"snapmla: replay with SNAPMLA_TEST_SEED={BASE_SEED}")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        # the plugin refuses --device cpu unless Triton runs in its interpreter, which conftest only turns on where
        # there is no CUDA (a GPU host's Triton compiles for the GPU)
        if os.environ.get("TRITON_INTERPRET", "0") != "1":
            skip = pytest.mark.skip(reason="runs on the CPU through Triton's interpreter: needs TRITON_INTERPRET=1 "
                                           "(CPU machines)")
            for item in items:
                if "cpu_interpreter" in item.keywords:
                    item.add_marker(skip)
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (`pytest -m gpu -n 0` on an H100 or H200)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def gen(request):
    seed = (BASE_SEED ^ zlib.crc32(request.node.nodeid.encode())) & 0x7FFFFFFF
    return torch.Generator().manual_seed(seed)
