"""The result files of the serving benchmarks: a matrix run's JSON ({model: {backend: {"workloads": {...}, ...}}}),
resumed or merged from several runs."""

from __future__ import annotations

import json
from pathlib import Path


def merge_into(results: dict, other: dict) -> dict:
    """Adds `other`'s runs to `results` in place: a (model, backend) measured in several calls keeps the workloads
    of all of them (a later call's run of the same workload replaces the earlier one)."""
    for model, backends in other.items():
        for backend, run in backends.items():
            mine = results.setdefault(model, {}).setdefault(backend, {})
            workloads = {**mine.get("workloads", {}), **run.get("workloads", {})}
            mine.update(run)
            mine["workloads"] = workloads
    return results


def load_results(saved: Path, merge: list[Path] | None, resume: bool) -> dict:
    """The results a matrix run starts from: the merged files of `merge`, or with `resume` those already `saved`."""
    results: dict = {}
    for f in merge or []:
        merge_into(results, json.loads(f.read_text()))
    if not merge and resume and saved.exists():
        results = json.loads(saved.read_text())
    return results
