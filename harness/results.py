"""The result files of the benchmarks and tools: a matrix run's JSON ({model: {backend: {"workloads": {...}, ...}}}),
resumed or merged from several runs, and the reading of any saved JSON, plain or as results/ keeps its large ones
(NAME.json.xz)."""

from __future__ import annotations

import json
import lzma
from pathlib import Path


def stored(path: Path) -> Path:
    """`path`, or its xz-compressed copy NAME.json.xz where only that exists (results/ keeps JSON over 12 KB so)."""
    xz = path.with_name(path.name + ".xz")
    return xz if not path.exists() and xz.exists() else path


def read_json(path: Path):
    """The JSON at `path` (`stored`: plain or .xz; a path ending in .xz is read through lzma)."""
    path = stored(Path(path))
    with (lzma.open(path, "rt") if path.suffix == ".xz" else open(path)) as f:
        return json.load(f)


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
        merge_into(results, read_json(f))
    if not merge and resume and stored(saved).exists():
        results = read_json(saved)
    return results
