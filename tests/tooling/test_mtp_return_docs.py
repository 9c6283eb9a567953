"""docs/BENCHMARKS.md, "MTP's return at TP 8 (simulated acceptance)": every cell of its table and the figures its text
draws from them are the two kept runs (results/serve/v3_fp8_tp8_h200_mtp_simulated and _repeat): the saved JSON for
the client's side, the server-log excerpts (`benchmarks.server_log_stats`) for the decode step."""

import functools
from pathlib import Path

import pytest

from benchmarks.server_log_stats import log_stats
from harness.results import read_json
from harness.server import MTP_SIMULATED_ACCEPT
from harness.server_log import decode_lines, read_log
from helpers import doc_sections, doc_tables, shows

ROOT = Path(__file__).resolve().parents[2]
# the table's run column -> its folder (each named by the backend its host served first)
FOLDERS = {"snapmla first": ROOT / "results/serve/v3_fp8_tp8_h200_mtp_simulated",
           "BF16 first": ROOT / "results/serve/v3_fp8_tp8_h200_mtp_simulated_repeat"}
SECTION = "MTP's return at TP 8 (simulated acceptance)"
LABELS = {"snapmla": "snapmla", "snapmla-mtp-simulated": "snapmla, MTP", "flashmla": "flashmla BF16",
          "flashmla-mtp-simulated": "flashmla BF16, MTP"}
BASE = {"snapmla-mtp-simulated": "snapmla", "flashmla-mtp-simulated": "flashmla"}


@functools.cache  # every figure reads the same two folders: each file is read once
def runs(run: str) -> dict:
    return {r["run"]: r for r in read_json(FOLDERS[run] / "serve_bench.json")}


@functools.cache
def step_ms(run: str, name: str) -> float:
    return log_stats(read_log(FOLDERS[run] / f"server_{name}.log.xz"))["decode_step_ms_at_peak"]


def text() -> str:
    return " ".join(doc_sections((ROOT / "docs/BENCHMARKS.md").read_text())[SECTION].split())


@pytest.mark.parametrize("run", FOLDERS)
def test_each_run_served_one_workload_with_the_simulated_draft_beside_none(run):
    rows = runs(run)
    assert set(rows) == set(LABELS)
    assert len({repr(r["workload"]) for r in rows.values()}) == 1
    for name, r in rows.items():
        assert r["completed"] == 64 and "error" not in r and r["peak_running_req"] == 63
        assert "--max-running-requests 64" in r["cmd"] and "deepseek-v3-fp8-tp8" in r["cmd"]
        simulated = f"SGLANG_SIMULATE_ACC_LEN={MTP_SIMULATED_ACCEPT}" in r["cmd"]
        assert simulated == (name in BASE) == ("--speculative-algorithm NEXTN" in r["cmd"])


def test_the_table_is_the_kept_runs():
    rows = doc_tables(doc_sections((ROOT / "docs/BENCHMARKS.md").read_text())[SECTION])[0]
    assert [(row["run"], row["backend"]) for row in rows] == [
        (run, LABELS[name]) for run in FOLDERS for name in runs(run)]  # the order each run served them in
    by_label = {(row["run"], row["backend"]): row for row in rows}
    for run in FOLDERS:
        saved = runs(run)
        for name, r in saved.items():
            row = by_label[(run, LABELS[name])]
            ratio = [r["output_tok_s"] / saved[BASE[name]]["output_tok_s"]] if name in BASE else []
            assert shows(row["output tok/s"], [r["output_tok_s"], *ratio]), row
            assert shows(row["TPOT p50 ms"], [r["median_tpot_ms"]]) and shows(row["TTFT p50 ms"], [r["median_ttft_ms"]])
            assert shows(row["accept length"], [r["accept_length"]]), row
            assert shows(row["decode step at 63 running, ms"], [step_ms(run, name)]), row
            step_ratio = [step_ms(run, name) / step_ms(run, BASE[name])] if name in BASE else [None]
            assert shows(row["step vs the backend's without MTP"], step_ratio), row


def test_the_text_quotes_the_table():
    t = text()
    snap, bf16 = "snapmla-mtp-simulated", "flashmla-mtp-simulated"

    def over_runs(figure, digits: int = 2) -> str:  # 'a' where the two runs print the same, else 'lo-hi'
        shown = sorted(f"{figure(run):.{digits}f}" for run in FOLDERS)
        return shown[0] if shown[0] == shown[-1] else f"{shown[0]}-{shown[-1]}"

    def rate(run, name):
        return runs(run)[name]["output_tok_s"]

    for name in BASE:
        tokens = over_runs(lambda run: float(MTP_SIMULATED_ACCEPT) * step_ms(run, BASE[name]) / step_ms(run, name))
        assert f"({tokens}x" in t or f"and {tokens}x)" in t, (name, tokens)
        assert f"{over_runs(lambda run: rate(run, name) / rate(run, BASE[name]))}x" in t, name
    cycles = [over_runs(lambda run: step_ms(run, n) / step_ms(run, BASE[n])) for n in BASE]
    assert f"costs {cycles[0]}x a decode step with snapmla and {cycles[1]}x with flashmla BF16" in t
    lead = over_runs(lambda run: step_ms(run, bf16) / step_ms(run, snap))
    assert (f"its cycle takes {over_runs(lambda run: step_ms(run, snap), 1)} ms against BF16's "
            f"{over_runs(lambda run: step_ms(run, bf16), 1)} ({lead}x)") in t
    steps = (over_runs(lambda run: step_ms(run, "snapmla"), 1), over_runs(lambda run: step_ms(run, "flashmla"), 1),
             over_runs(lambda run: step_ms(run, "flashmla") / step_ms(run, "snapmla")))
    assert f"({steps[0]} against {steps[1]} ms, {steps[2]}x)" in t
    gaps = (over_runs(lambda run: step_ms(run, bf16) - step_ms(run, snap), 1),
            over_runs(lambda run: step_ms(run, "flashmla") - step_ms(run, "snapmla"), 1))
    assert f"snapmla's cycle is {gaps[0]} ms shorter than BF16's, as its step is ({gaps[1]} ms)" in t
    more = over_runs(lambda run: 100 * (runs(run)[bf16]["accept_length"] / runs(run)[snap]["accept_length"] - 1), 0)
    assert f"BF16's MTP runs had {more} % more tokens a cycle" in t
    with_mtp = over_runs(lambda run: rate(run, snap) / rate(run, bf16))
    assert f"snapmla with MTP makes {with_mtp}x BF16's rate with MTP" in t


def test_the_step_comes_from_the_lines_the_text_counts():
    """With MTP one decode line a run decodes alone at the peak (256 tokens in ~100 cycles, a line each 40), without it
    several: the text says how many the median is over."""
    for run in FOLDERS:
        for name in LABELS:
            lines = [d for d in decode_lines(read_log(FOLDERS[run] / f"server_{name}.log.xz"))
                     if d["rate"] and d["running"] == 63 and not d["prefill_tokens"]]
            assert len(lines) == (1 if name in BASE else 6), (run, name)
    assert "which SGLang logs as one such line each, the runs without MTP as six" in text()
