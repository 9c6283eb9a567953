"""The suite's pytest-xdist workers share the machine's cores (tests/conftest.py, pytest_configure)."""

import os

import pytest
import torch


def test_each_xdist_worker_runs_its_share_of_the_cores():
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers < 2:
        pytest.skip("one test process: it may use every core")
    ours = os.environ.get("SNAPMLA_WORKER_THREADS")
    if ours is None and "OMP_NUM_THREADS" in os.environ:
        pytest.skip("OMP_NUM_THREADS was set before the run: the caller's thread count")
    assert ours is not None, "tests/conftest.py gave the workers no thread count: each starts one thread per core"
    assert torch.get_num_threads() == int(ours)
    assert int(ours) * workers <= max(os.cpu_count() or 1, workers), f"{workers} workers x {ours} threads"
