"""Metrics of tools/eval_trained_model.py (the server-driven accuracy evaluation)."""

import math
import sys
from pathlib import Path

import pytest

from tools import eval_trained_model as ev


def test_perplexity_is_exp_mean_nll_over_all_tokens():
    assert ev.perplexity([[math.log(0.5)] * 3, [math.log(0.25)]]) == pytest.approx(math.exp(
        -(3 * math.log(0.5) + math.log(0.25)) / 4))


def test_agreement_by_position_and_window():
    a = [[1, 2, 3, 4], [5, 6, 7, 8]]
    b = [[1, 2, 0, 4], [5, 0, 0, 0]]
    assert ev.agreement(a, b) == pytest.approx(4 / 8)
    assert ev.agreement(a, b, 0, 2) == pytest.approx(3 / 4)
    assert ev.agreement(a, b, 2) == pytest.approx(1 / 4)
    assert ev.agreement([[1, 2, 3]], [[1, 2]]) == pytest.approx(2 / 3)  # a short generation counts as disagreement


def test_server_scripts_install_their_exit_cleanup():
    """The serving scripts' shared cleanup registers (a fresh process: it replaces the SIGTERM handler)."""
    import subprocess

    code = ("import signal; from harness import server as s; "
            "s.kill_servers_on_exit(); print('OK', signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert "OK True" in res.stdout, res.stderr[-2000:]


def test_divergence_summary_reports_where_and_how_close_the_reference_was():
    ref = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]]
    got = [[1, 2, 0, 0], [5, 6, 7, 8], [0, 9, 9, 9]]
    margins = [[2.0, 2.0, 0.05, 1.0], [1.0] * 4, [3.0, 1.0, 1.0, 1.0]]
    d = ev.divergence_summary(got, ref, margins)
    assert (d["diverged"], d["prompts"]) == (2, 3)
    assert d["median_first_divergence"] == 1  # positions 2 and 0
    assert d["median_ref_margin"] == pytest.approx((0.05 + 3.0) / 2)
    assert d["near_tie_fraction"] == pytest.approx(0.5)
    assert ev.first_divergence([1, 2], [1, 2, 3]) == 2 and ev.first_divergence([1], [1]) is None
    top = [[[-0.1, 7, None], [-2.5, 3, None]], [[-0.2, 1, None]]]
    assert ev.top2_margins(top) == [pytest.approx(2.4), math.inf]


def test_teacher_forced_argmax_is_end_aligned():
    # SGLang's input_top_logprobs: one entry per scored input position (the first may be None), top-1 first
    top = [None, [[-0.5, 11, None]], [[-0.1, 12, None]], [[-0.2, 13, None]]]
    assert ev.teacher_forced_argmax(top, 2) == [12, 13]
    assert ev.teacher_forced_argmax(top, 3) == [11, 12, 13]


def test_the_summary_keeps_the_tables_figures_without_the_token_lists(monkeypatch):
    """`summarize` gives each backend's figures against the first backend's (the reference), and `table` prints them;
    the teacher-forced windows are the reference's drift tokens, window by window."""
    monkeypatch.setattr(ev, "DRIFT_TOKENS", 4)
    monkeypatch.setattr(ev, "WINDOW", 2)
    ref = {"perplexity": 10.0, "greedy": [[1, 2, 3]], "greedy_margins": [[1.0, 0.05, 1.0]], "drift": [[1, 2, 3, 4]],
           "teacher_forced": [[1, 2, 3, 4]]}
    other = {"perplexity": 10.5, "greedy": [[1, 9, 3]], "greedy_margins": [[1.0, 1.0, 1.0]],
             "drift": [[1, 2, 0, 0]], "teacher_forced": [[1, 2, 3, 0]]}
    s = ev.summarize({"ref": ref, "other": other, "broken": {"error": "died"}})
    assert s["reference"] == "ref"
    o = s["results"]["other"]
    assert o["ppl_ratio"] == pytest.approx(1.05) and o["greedy_agreement"] == pytest.approx(2 / 3)
    assert (o["drift_first"], o["drift_last"]) == (1.0, 0.0)
    assert (o["teacher_forced_first"], o["teacher_forced_last"]) == (1.0, 0.5)
    assert o["teacher_forced_by_window"] == [1.0, 0.5]
    assert (o["diverged"], o["median_first_divergence"], o["median_ref_margin"]) == (1, 1, 0.05)
    assert s["results"]["ref"]["ppl_ratio"] == 1.0 and s["results"]["broken"] == {"error": "died"}
    lines = ev.table(s).splitlines()
    assert lines[3] == ("| other | 10.5000 | 1.0500 | 66.7 % | 100.0 % | 0.0 % | 1/1 | 1 | 0.050 | 100 % | 100.0 % "
                        "| 50.0 % |")
    assert lines[4].startswith("| broken | error: died |")


def test_the_accuracy_doc_quotes_the_saved_fp8_path_evaluation():
    """docs/ACCURACY.md "The serving gate and the trained-model evaluation with SGLang's FP8 paths": the evaluation
    table is `eval_trained_model.table` of results/accuracy/eval_trained_model_fp8_h128, number for number."""
    from pathlib import Path

    from harness.results import read_json
    from helpers import cell_numbers, doc_sections, doc_tables
    from tools import eval_trained_model as etm

    root = Path(__file__).resolve().parents[2]
    section = doc_sections((root / "docs" / "ACCURACY.md").read_text())[
        "The serving gate and the trained-model evaluation with SGLang's FP8 paths"]
    (doc,) = [t for t in doc_tables(section) if "backend" in t[0]]
    saved = read_json(root / "results/accuracy/eval_trained_model_fp8_h128.json")
    (printed,) = doc_tables(etm.table(etm.summarize(saved)))
    assert len(doc) == len(printed)
    for row, want in zip(doc, printed):
        assert [cell_numbers(c) for c in list(row.values())[1:]] == [
            cell_numbers(c.replace("- %", "-")) for c in list(want.values())[1:]], (row, want)
