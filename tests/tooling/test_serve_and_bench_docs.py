"""Every cell of the serve_and_bench tables in docs/BENCHMARKS.md ("Decode-heavy burst above the captured graphs",
"Long prompts, long outputs, a pool that binds"), read back from the runs kept in results/serve/: bench_serving's rates
and latencies (`serve_and_bench --reprint`), and from each server's log its pool, peak batch, decode step at the peak
(`benchmarks.server_log_stats`), graph capture and the long-context table's decode and prefill rates as that section
defines them; a ratio in parentheses against the table's flashmla BF16 row. A column the test does not know fails."""

import re
import statistics
from pathlib import Path

import pytest

from benchmarks import serve_and_bench as sb
from benchmarks.server_log_stats import log_stats
from harness.server_log import BATCH_LINE, decode_lines, field, pool_tokens, read_log
from helpers import doc_sections, doc_tables, shows

ROOT = Path(__file__).resolve().parents[2]
SERVE = ROOT / "results" / "serve"
BASE = "flashmla BF16"  # the row the parenthesized ratios are against

# (section heading, which of its tables, min_queue of the run's reprint, row label -> (folder, run))
TABLES = {
    "burst-graphs": ("Graphs covering the burst", 0, 100,
                     {"snapmla": ("burst_h200_graphs", "snapmla"), BASE: ("burst_h200_graphs", "flashmla")}),
    "burst-unstreamed": ("Graphs covering the burst", 1, 100,
                         {"snapmla": ("burst_h200_unstreamed", "snapmla"),
                          BASE: ("burst_h200_unstreamed", "flashmla")}),
    "burst-default-graphs": ("No graph flag", 0, 100,
                             {"snapmla": ("burst_h200_default_graphs", "snapmla"),
                              BASE: ("burst_h200_default_graphs", "flashmla")}),
    "long-context": ("Long prompts, long outputs, a pool that binds", 0, 5,
                     {"snapmla": ("long_context_h200/with_bf16", "snapmla"),
                      BASE: ("long_context_h200/with_bf16", "flashmla"),
                      "snapmla, another machine": ("long_context_h200/with_fp8", "snapmla"),
                      "SGLang FP8, same machine": ("long_context_h200/with_fp8", "flashmla-fp8")}),
}


def near_peak_decode(log: str) -> list[float]:
    """The long-context section's decode column: the median generation rate of the decode lines within 2 of the peak
    batch, and the step that rate gives the peak batch (ms)."""
    rated = [d for d in decode_lines(log) if d["rate"]]
    peak = max(d["running"] for d in rated)
    rate = statistics.median(d["rate"] for d in rated if d["running"] >= peak - 2)
    return [rate, 1000 * peak / rate]


def full_chunk_intake(log: str) -> list[float]:
    """The long-context section's prefill column: the median input rate of the full 8 192-token prefill chunks."""
    return [statistics.median(field(ln, "input throughput (token/s)") for ln in log.splitlines()
                              if BATCH_LINE.match(ln) and " Prefill batch" in ln and field(ln, "#new-token") == 8192)]


def graph_capture(log: str) -> list[float]:
    """Seconds and GB of the decode graph capture, as the server logged them."""
    (found,) = re.findall(r"Capture target decode CUDA graph end\. elapsed=([\d.]+) s, mem usage=([\d.]+) GB", log)
    return [float(v) for v in found]


def graphs_to(log: str) -> list[int]:
    (sizes,) = re.findall(r"Capture target decode CUDA graph begin\..*?bs=\[([\d, ]+)\]", log)
    return [max(int(b) for b in sizes.split(","))]


def with_ratio(key: str, scale: float = 1.0):
    """A bench_serving figure, and in parentheses its ratio to the table's BF16 row (not shown on that row, nor on
    rows the section gives without one)."""
    def values(run, base, cell):
        shown = [run["bench"][key] / scale]
        return shown + [run["bench"][key] / base["bench"][key]] if "(" in cell else shown
    return values


def bench(key: str, scale: float = 1.0):
    return lambda run, base, cell: [run["bench"][key] / scale]


COLUMNS = {
    "output tok/s": with_ratio("output_tok_s"),
    "output tok/s (bench_serving)": with_ratio("output_tok_s"),
    "median TTFT s": with_ratio("median_ttft_ms", 1e3),
    "median TTFT (= latency) s": with_ratio("median_ttft_ms", 1e3),
    "median TPOT ms": bench("median_tpot_ms"),
    "duration s": bench("duration_s"),
    "engine span s": bench("engine_span_s"),
    "engine output tok/s": with_ratio("engine_output_tok_s"),
    "pool tokens": lambda run, base, cell: [pool_tokens(run["log"])],
    "peak running": lambda run, base, cell: [run["stats"]["peak_running"]],
    "step at the peak": lambda run, base, cell: [run["stats"]["decode_step_ms_at_peak"], run["stats"]["peak_running"]],
    "eager step at the peak": lambda run, base, cell: [run["stats"]["decode_step_ms_at_peak"],
                                                       run["stats"]["peak_running"]],
    "graphs: capture s, GB": lambda run, base, cell: graph_capture(run["log"]),
    "capture s, GB": lambda run, base, cell: graph_capture(run["log"]),
    "graphs to": lambda run, base, cell: graphs_to(run["log"]),
    "decode at the peak, tok/s (step)": lambda run, base, cell: near_peak_decode(run["log"]),
    "prefill intake, tok/s": lambda run, base, cell: full_chunk_intake(run["log"]),
}
NO_BENCH = {"output tok/s", "median TTFT s", "median TPOT ms"}  # cells of a run whose client was cut: '-' or 'cut at'


def runs_of(rows: dict, min_queue: int) -> dict:
    out = {}
    for label, (folder, run) in rows.items():
        reprinted = {r["run"]: r for r in sb.reprint(SERVE / folder, min_queue)}
        log = read_log(SERVE / folder / f"server_{run}.log.xz")
        out[label] = {"bench": reprinted.get(run), "log": log, "stats": log_stats(log, min_queue)}
    return out


def section_of(title: str) -> str:
    """The docs/BENCHMARKS.md section whose heading starts with `title`."""
    (section,) = [t for h, t in doc_sections((ROOT / "docs" / "BENCHMARKS.md").read_text()).items()
                  if h.startswith(title)]
    return section


def table_of(name: str) -> list[dict[str, str]]:
    title, index, _, _ = TABLES[name]
    return doc_tables(section_of(title))[index]


def mismatches(table: list[dict[str, str]], runs: dict) -> list[str]:
    out = []
    assert {r["run"] for r in table} == set(runs), "the table's rows are not the runs this test reads"
    for row in table:
        run = runs[row["run"]]
        for col, cell in row.items():
            if col == "run":
                continue
            assert col in COLUMNS, f"a column this test does not check: {col!r}"
            if run["bench"] is None and col in NO_BENCH:
                ok = cell == "-" or cell.startswith("cut at ")
                values = "no bench_serving result"
            else:
                values = COLUMNS[col](run, runs[BASE], cell)
                ok = shows(cell, values)
            if not ok:
                out.append(f"{row['run']} / {col}: the doc shows {cell!r}, the run {values}")
    return out


@pytest.mark.parametrize("name", TABLES)
def test_each_serve_and_bench_table_is_its_saved_runs(name):
    _, _, min_queue, rows = TABLES[name]
    bad = mismatches(table_of(name), runs_of(rows, min_queue))
    assert not bad, "\n".join(bad)


def test_a_changed_figure_is_caught():
    """A cell off by one printed digit -- a rate, a ratio, a step from the log -- is named."""
    _, _, min_queue, rows = TABLES["burst-unstreamed"]
    table, runs = table_of("burst-unstreamed"), runs_of(rows, min_queue)
    assert not mismatches(table, runs)
    snap = table[0]
    for col in ("output tok/s (bench_serving)", "engine output tok/s", "step at the peak", "pool tokens"):
        changed = {**snap, col: re.sub(r"\d(?=\D*$)", lambda m: str((int(m.group()) + 1) % 10), snap[col], count=1)}
        assert [m.split(":")[0] for m in mismatches([changed, table[1]], runs)] == [f"snapmla / {col}"], col


def test_the_startup_table_is_its_saved_run():
    """docs/BENCHMARKS.md "Start-up, cold and warm": each row's phases (`benchmarks.startup.phases`) and longest
    silence are the saved run's (results/serve/startup_h200x4/startup.json)."""
    from benchmarks import startup
    from harness.results import read_json

    rows = read_json(SERVE / "startup_h200x4" / "startup.json")["rows"]
    models = {"V3 shape": "deepseek-v3-shape", "V2-Lite shape": "deepseek-v2-lite-shape"}
    backends = {"snapmla": "snapmla", BASE: "flashmla"}
    table = doc_tables(section_of("Start-up, cold and warm"))[0]
    assert len(table) == len(rows)
    bad = []
    for row in table:
        (run,) = [r for r in rows if (r["model"], r["pass"], r["backend"]) == (models[row["model"]], row["pass"],
                                                                              backends[row["backend"]])]
        p = startup.phases(run)
        expected = {"to ready s": p["ready_s"], "before the log s": p["before_log_s"], "weights s": p["weights_s"],
                    "decode graphs s": p["graphs_s"], "first request s": p["first_request_s"],
                    "longest silence": run["log"]["silences"][0][0]}
        assert set(row) - {"model", "pass", "backend"} == set(expected), row
        bad += [f"{row['model']} {row['pass']} {row['backend']} / {col}: {row[col]!r} against {value}"
                for col, value in expected.items()
                if not shows(row[col].split(" before")[0].split(",")[0], [value])]
    assert not bad, "\n".join(bad)
