"""Every cell of the decode-kernel tables in docs/BENCHMARKS.md and docs/BENCHMARKS-H100.md, read back from the
bench_kernels run each names in results/bench/ (µs per kernel, the ratios, TFLOPS, GB/s, the error against FlashMLA
BF16), at the precision the doc prints. A column the test does not know fails, so a new column comes with its check."""

from pathlib import Path

import pytest

from harness.results import read_json
from helpers import doc_sections, doc_tables, shows

ROOT = Path(__file__).resolve().parents[2]

# (doc, section heading, which of its tables, the run in results/bench/)
TABLES = [
    ("BENCHMARKS.md", "Decode kernel (H200)", 0, "kernels_h200.json"),
    ("BENCHMARKS-H100.md", "Decode kernel (H100)", 0, "kernels_h100.json"),
    ("BENCHMARKS-H100.md", "Decode kernel (H100)", 1, "kernels_h200_heads_8_32_64.json"),
]
KEYS = {"h": "h", "heads": "h", "s_q": "s_q", "b": "b", "batch": "b", "s_k": "sk"}


def _us(kernel):
    return lambda d: [d[kernel]["us"]]


def _ours(d):
    return d.get("snapmla_cuda_sm90", d["snapmla_triton"])  # what bench_kernels' table calls "ours"


COLUMNS = {
    "snapmla_triton us": _us("snapmla_triton"),
    "snapmla_cuda_sm90 us": _us("snapmla_cuda_sm90"),
    "snapmla µs": _us("snapmla_cuda_sm90"),
    "flashmla_bf16 us": _us("flashmla_bf16"),
    "FlashMLA BF16 µs": _us("flashmla_bf16"),
    "flashmla_fp8_pertensor us": _us("flashmla_fp8_pertensor"),
    "FlashMLA FP8 µs": _us("flashmla_fp8_pertensor"),
    "FlashInfer BF16 µs": _us("flashinfer_fa3_bf16"),
    "FlashInfer FP8 µs": _us("flashinfer_fa3_fp8"),
    "ours TFLOPS": lambda d: [_ours(d)["tflops"]],
    "ours GB/s": lambda d: [_ours(d)["gbps"]],
    "ours / FlashMLA BF16": lambda d: [_ours(d)["speedup_vs_flashmla_bf16"]],
    "vs FlashMLA BF16": lambda d: [_ours(d)["speedup_vs_flashmla_bf16"]],
    "ours / FlashMLA FP8": lambda d: [d["flashmla_fp8_pertensor"]["us"] / _ours(d)["us"]],
    "vs FlashMLA FP8": lambda d: [d["flashmla_fp8_pertensor"]["us"] / _ours(d)["us"]],
    "rel err vs BF16": lambda d: [_ours(d)["rel_err_vs_flashmla_bf16"]],
    "Triton µs (vs BF16)": lambda d: [d["snapmla_triton"]["us"], d["snapmla_triton"]["speedup_vs_flashmla_bf16"]],
}


def run_of(name: str) -> dict[tuple, dict]:
    """(h, s_q, b, s_k) -> kernel -> the run's record."""
    out: dict[tuple, dict] = {}
    for r in read_json(ROOT / "results" / "bench" / name)["results"]:
        out.setdefault((r["h"], r["s_q"], r["b"], r["sk"]), {})[r["kernel"]] = r
    return out


def table_of(doc: str, title: str, index: int) -> list[dict[str, str]]:
    section = doc_sections((ROOT / "docs" / doc).read_text())[title]
    return [t for t in doc_tables(section) if "s_q" in t[0]][index]


def mismatches(table: list[dict[str, str]], run: dict[tuple, dict]) -> list[str]:
    out = []
    for row in table:
        key = {KEYS[c]: int(v.replace(" ", "")) for c, v in row.items() if c in KEYS}
        shape = (key["h"], key["s_q"], key["b"], key["sk"])
        assert shape in run, f"{shape}: not in the run"
        for col, cell in row.items():
            if col in KEYS:
                continue
            assert col in COLUMNS, f"a column this test does not check: {col!r}"
            values = COLUMNS[col](run[shape])
            if not shows(cell, values):
                out.append(f"{shape} / {col}: the doc shows {cell!r}, the run {values}")
    return out


@pytest.mark.parametrize("doc, title, index, name", TABLES, ids=[t[3] for t in TABLES])
def test_each_kernel_table_is_its_saved_run(doc, title, index, name):
    section = doc_sections((ROOT / "docs" / doc).read_text())[title]
    assert f"results/bench/{name}" in section, f"the section does not name results/bench/{name}"
    table, run = table_of(doc, title, index), run_of(name)
    assert len(table) == len(run), f"the doc has {len(table)} rows, the run {len(run)} shapes"
    bad = mismatches(table, run)
    assert not bad, "\n".join(bad)


def test_a_changed_cell_is_caught():
    """One printed digit off -- a time, a ratio, the error -- is named."""
    table, run = table_of("BENCHMARKS.md", "Decode kernel (H200)", 0), run_of("kernels_h200.json")
    assert not mismatches(table, run)
    row = next(r for r in table if (r["h"], r["b"], r["s_k"]) == ("16", "128", "16384"))
    for col, new in (("snapmla_cuda_sm90 us", "340.4"), ("ours / FlashMLA BF16", "1.74x"),
                     ("rel err vs BF16", "0.0297"), ("ours GB/s", "3968")):
        changed = [{**r, col: new} if r is row else r for r in table]
        assert [m.split(":")[0] for m in mismatches(changed, run)] == [f"(16, 1, 128, 16384) / {col}"], col
