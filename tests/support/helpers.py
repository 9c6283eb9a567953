"""Test helpers: NaN-proof comparisons, a machine's GPUs as torch.cuda reports them, and the problem builders of
`harness.problems` under their names."""

from __future__ import annotations

import torch

from sglang_snapmla.numerics import error_metrics
from harness.problems import (  # noqa: F401  (re-exported for the tests)
    paged_problem,
    apply_extreme_scales,
    pool_arrays,
    golden_args,
    unwritten_slot_mask,
    poison_unwritten,
    garbage_table_tail,
    EXTREME_SCALE_CASES,
    HARD_DECODE_CASES,
    CUDA_DECODE_SMALL_CASES,
)


def fake_gpus(monkeypatch, gpus: dict) -> None:
    """torch.cuda as on a machine whose GPUs are `gpus` (index -> ((major, minor), name)); the dict is read at each
    call, so a test may change a GPU afterwards."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(gpus))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: gpus[i][0])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: gpus[i][1])


def assert_close(out, ref, rel_l2: float, one_minus_cos: float | None = None, what: str = ""):
    """rel-L2 (and optionally 1-cos) of out vs ref under the bounds. NaN/inf anywhere fails."""
    assert torch.isfinite(out).all(), f"{what}: non-finite values in output"
    m = error_metrics(out, ref)
    assert m["rel_l2"] <= rel_l2, f"{what}: rel-L2 {m['rel_l2']:.3e} > {rel_l2:.1e} ({m})"
    if one_minus_cos is not None:
        assert m["one_minus_cos"] <= one_minus_cos, f"{what}: 1-cos {m['one_minus_cos']:.3e} > {one_minus_cos:.1e}"
    return m


def clock_seconds(stamp: str) -> float:
    """Seconds since midnight of a log's time of day, "HH:MM:SS" or "HH:MM:SS.ffffff"."""
    from datetime import datetime

    return (datetime.strptime(stamp[:15], "%H:%M:%S.%f" if "." in stamp else "%H:%M:%S") - datetime(1900, 1, 1)) \
        .total_seconds()


def doc_sections(doc: str) -> dict[str, str]:
    """A markdown doc's sections: heading text (## or ###) -> its text, from the heading to the next heading of its
    level or above (subsections included)."""
    import re

    heads = [(m.start(), len(m.group(1)), m.group(2).strip()) for m in re.finditer(r"^(#{2,3}) (.+)$", doc, re.M)]
    out = {}
    for i, (start, level, title) in enumerate(heads):
        end = next((s for s, lv, _ in heads[i + 1:] if lv <= level), len(doc))
        out[title] = doc[start:end]
    return out


def ink_share(png) -> float:
    """The share of a PNG's pixels that are not its background (its most common colour): ~0.02 for a figure with
    empty axes (spines, ticks, labels), 0.18-0.5 for the benchmarks' plots -- whether a plot was drawn, which its
    byte size does not tell (a palette PNG of empty axes can outweigh a drawn one of fewer panels)."""
    from PIL import Image

    with Image.open(png) as im:
        rgb = im.convert("RGB")
    background = max(rgb.getcolors(rgb.size[0] * rgb.size[1]))[0]
    return 1 - background / (rgb.size[0] * rgb.size[1])


def doc_tables(section: str) -> list[list[dict[str, str]]]:
    """The markdown tables of a doc section, in order: each a list of rows, heading -> cell (stripped), with an empty
    first cell filled from the row above (the docs leave a group's name out under its first row)."""
    import re

    tables = []
    for block in re.findall(r"(?:^\|.*\|[ \t]*\n?)+", section, re.M):
        cells = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in block.strip().splitlines()]
        head, rows = cells[0], [dict(zip(cells[0], r, strict=True)) for r in cells[2:]]
        for above, row in zip(rows, rows[1:]):
            if row[head[0]] == "":
                row[head[0]] = above[head[0]]
        tables.append(rows)
    return tables


def cell_numbers(cell: str) -> list[tuple[float | None, float]]:
    """The numbers a table cell shows, each as (value, half a unit of its last printed digit): '**5 189** (1.04x)' ->
    5189 and 1.04, '2.12M' -> 2.12e6 (+-5e3), '38 ms (1 500 running)' -> 38 and 1500; a cell that is only '-' ->
    [(None, 0)]. Thousands are separated by spaces, as the docs print them."""
    import re

    if cell.replace("*", "").strip() == "-":
        return [(None, 0.0)]
    out = []
    for whole, frac, mega in re.findall(r"(\d{1,3}(?: \d{3})+|\d+)(\.\d+)?(M?)", cell.replace("*", "")):
        scale, decimals = (1e6 if mega else 1.0), (len(frac) - 1 if frac else 0)
        out.append((float(whole.replace(" ", "") + frac) * scale, 0.5 * 10.0 ** -decimals * scale))
    return out


def shows(cell: str, values: list, rel: float = 1e-9) -> bool:
    """Whether a table cell shows exactly `values` (None for '-') at the precision it prints."""
    numbers = cell_numbers(cell)
    return len(numbers) == len(values) and all(
        (shown is None) == (value is None) and (value is None or abs(shown - value) <= half + rel * abs(value))
        for (shown, half), value in zip(numbers, values))


def quoted_range(figures: list[str]) -> str:
    """'a' where the runs agree, else 'lo-hix' (the docs' way of quoting two runs; figures of one printed width,
    compared as strings)."""
    lo, hi = min(figures), max(figures)
    return lo if lo == hi else f"{lo[:-1]}-{hi}"
