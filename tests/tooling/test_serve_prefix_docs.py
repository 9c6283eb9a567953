"""Every cell of the prefix-serving tables in docs/BENCHMARKS-PREFIX-CACHE.md and docs/BENCHMARKS-SEVERAL-GPUS.md,
read back from the run its section names in results/serve/ (serve_prefix.json, its bench_serving outputs read again as
`serve_prefix --redraw` reads them): rates, TTFT, TPOT, cached tokens, GPU seconds, busy share and the ratios, at the
precision the doc prints. A column the test does not know fails, so a new column comes with its check."""

from pathlib import Path

import pytest

from benchmarks import serve_prefix as sp
from harness.results import load_results
from helpers import doc_sections, doc_tables, shows

ROOT = Path(__file__).resolve().parents[2]

# (doc, the section's heading or its start, the folder of results/serve/ its first table comes from)
TABLES = [
    ("BENCHMARKS-PREFIX-CACHE.md", "Prefix-heavy serving (H200, V3 shape)", "v3_h200_prefix"),
    ("BENCHMARKS-PREFIX-CACHE.md", "With four tokenizer processes", "v3_h200x2_tokenizer_workers"),
    ("BENCHMARKS-PREFIX-CACHE.md", "Multi-turn above flashmla BF16's pool", "hicache_multiturn_h200"),
    ("BENCHMARKS-PREFIX-CACHE.md", "With the record kernels", "hicache_record_kernels_h200"),
    ("BENCHMARKS-SEVERAL-GPUS.md", "Prefix-heavy serving, two GPUs under DP attention", "v3_h200x2_dp2_prefix"),
    ("BENCHMARKS-SEVERAL-GPUS.md", "Four GPUs under DP attention", "v3_h200x4_dp4"),
    ("BENCHMARKS-H100.md", "Prefix-heavy serving (H100, V2-Lite shape)", "v2lite_h100_prefix"),
    ("BENCHMARKS.md", "Kimi-K2 shape (one H200)", "kimi_k2_h200"),
]

BACKENDS = {"snapmla": "snapmla", "flashmla BF16": "flashmla", "flashmla FP8": "flashmla-fp8",
            "flashmla BF16 + HiCache": "flashmla-hicache", "snapmla + HiCache, torch copies": "snapmla-hicache-copies",
            "snapmla + HiCache, record kernels": "snapmla-hicache-kernels"}


def _ratio(a, b):
    return a / b if a is not None and b else None


def _busy(m):
    return 100 * (m["gpu_prefill_s"] + m["gpu_decode_s"]) / m["duration_s"]


# column heading -> the values its cell shows, from the row's metrics `m` and the run's rows by backend `ref`
COLUMNS = {
    "output tok/s": lambda m, ref: [m["output_tok_s"]],
    "TTFT p50 / mean / p99 s": lambda m, ref: [m[k] / 1e3 for k in ("median_ttft_ms", "mean_ttft_ms", "p99_ttft_ms")],
    "TPOT p50 ms": lambda m, ref: [m["median_tpot_ms"]],
    "cached / prompt tokens": lambda m, ref: [m["cached_tokens"], m["prompt_tokens"]],
    "peak running": lambda m, ref: [m.get("peak_running")],
    "prefill batches / span s": lambda m, ref: [m["prefill_batches"], m["prefill_span_s"]],
    "prefill batches": lambda m, ref: [m["prefill_batches"]],
    "prefill forwards": lambda m, ref: [m["prefill_batches"]],
    "GPU s prefill / decode": lambda m, ref: [m["gpu_prefill_s"], m["gpu_decode_s"]],
    "GPU s prefill / decode (both ranks)": lambda m, ref: [m["gpu_prefill_s"], m["gpu_decode_s"]],
    "GPU s prefill / decode (4 ranks)": lambda m, ref: [m["gpu_prefill_s"], m["gpu_decode_s"]],
    "GPU busy": lambda m, ref: [_busy(m)],
    "output vs BF16 / vs FP8": lambda m, ref: [_ratio(m["output_tok_s"], ref["flashmla"]["output_tok_s"]),
                                               _ratio(m["output_tok_s"], ref["flashmla-fp8"]["output_tok_s"])],
    "output vs BF16": lambda m, ref: [_ratio(m["output_tok_s"], ref["flashmla"]["output_tok_s"])],
    "output vs flashmla BF16": lambda m, ref: [_ratio(m["output_tok_s"], ref["flashmla"]["output_tok_s"])],
    "vs flashmla BF16 + HiCache": lambda m, ref: [_ratio(m["output_tok_s"], ref["flashmla-hicache"]["output_tok_s"])],
    "TTFT p50 / mean vs BF16": lambda m, ref: [_ratio(m[k], ref["flashmla"][k]) for k in ("median_ttft_ms",
                                                                                           "mean_ttft_ms")],
    "TTFT p50 vs BF16": lambda m, ref: [_ratio(m["median_ttft_ms"], ref["flashmla"]["median_ttft_ms"])],
    "TTFT p50 vs flashmla BF16 + HiCache": lambda m, ref: [_ratio(m["median_ttft_ms"],
                                                                   ref["flashmla-hicache"]["median_ttft_ms"])],
    "TTFT p50 vs it": lambda m, ref: [_ratio(m["median_ttft_ms"], ref["flashmla-hicache"]["median_ttft_ms"])],
}


def run_of(folder: str) -> dict[str, dict]:
    """backend -> workload -> metrics (the run's serve_prefix.json with its saved bench_serving outputs read again)."""
    path = ROOT / "results" / "serve" / folder
    results = sp.reparse(load_results(path / "serve_prefix.json", None, True), path)
    (model_runs,) = results.values()
    return {b: run.get("workloads", {}) for b, run in model_runs.items()}


def mismatches(table: list[dict[str, str]], runs: dict[str, dict]) -> list[str]:
    out = []
    for row in table:
        backend = BACKENDS[row["backend"]]
        workloads = list(runs[backend])
        workload = row.get("workload") or (workloads[0] if len(workloads) == 1 else None)
        assert workload, f"{row['backend']}: the table has no workload column and the run has {workloads}"
        ref = {b: r.get(workload, {}) for b, r in runs.items()}
        for col, cell in row.items():
            if col in ("workload", "backend"):
                continue
            assert col in COLUMNS, f"a column this test does not check: {col!r}"
            values = COLUMNS[col](runs[backend][workload], ref)
            if not shows(cell, values):
                out.append(f"{workload} / {row['backend']} / {col}: the doc shows {cell!r}, the run {values}")
    return out


@pytest.mark.parametrize("doc, title, folder", TABLES, ids=[t[2] for t in TABLES])
def test_each_prefix_serving_table_is_its_saved_run(doc, title, folder):
    sections = doc_sections((ROOT / "docs" / doc).read_text())
    found = [text for heading, text in sections.items() if heading.startswith(title)]
    assert len(found) == 1, f"docs/{doc} has {len(found)} sections starting {title!r}"
    assert f"results/serve/{folder}" in found[0], f"the section does not name results/serve/{folder}"
    table = doc_tables(found[0])[0]
    runs = run_of(folder)
    assert {BACKENDS[r["backend"]] for r in table} == set(runs), "the table's backends are not the run's"
    bad = mismatches(table, runs)
    assert not bad, "\n".join(bad)


def test_a_changed_figure_is_caught():
    """A doc row whose rate, a TTFT or a ratio differs from the run by one printed digit is named."""
    runs = run_of("v3_h200x4_dp4")
    table = doc_tables(doc_sections((ROOT / "docs" / "BENCHMARKS-SEVERAL-GPUS.md").read_text())[
        "Four GPUs under DP attention (4 x H200, V3 shape)"])[0]
    assert not mismatches(table, runs)
    for col, old, new in (("output tok/s", "3 238", "3 239"), ("TTFT p50 / mean / p99 s", "16.18", "16.19"),
                          ("output vs BF16 / vs FP8", "2.22x", "2.21x")):
        changed = [{**r, col: r[col].replace(old, new)} if r is table[0] else r for r in table]
        assert [m.split(":")[0] for m in mismatches(changed, runs)] == [f"shared-16k / snapmla / {col}"], col
