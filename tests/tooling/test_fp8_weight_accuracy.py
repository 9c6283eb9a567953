"""The accuracy gate on block-FP8 weights that docs/ACCURACY.md quotes (results/accuracy/gate_fp8_weights_h200): every
cell of its table recomputed from the probes' saved tokens and logprobs; and the two prefill routes' agreement from
the gate run that pinned the MHA route beside snapmla's choice (results/accuracy/gate_fp8_weights_routes_h200)."""

from pathlib import Path

import pytest

from harness.probes import token_errors
from harness.results import read_json
from helpers import doc_sections
from tools.accuracy_gate import GATE_FACTOR, GATE_SLACK, gate, level_columns, row_cells

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "results/accuracy/gate_fp8_weights_h200"
ROUTES = ROOT / "results/accuracy/gate_fp8_weights_routes_h200"
LEVELS = level_columns()
ROWS = {"flashmla-fp8": "| SGLang FP8", "snapmla": "| snapmla (sm_90a",
        "snapmla-capture-view-bug": "| snapmla with the capture-view bug"}


@pytest.fixture(scope="module")
def saved():
    return read_json(DATA / "accuracy_gate.json.xz")


@pytest.fixture(scope="module")
def routes():
    return read_json(ROUTES / "accuracy_gate.json.xz")


def section() -> str:
    return doc_sections((ROOT / "docs/ACCURACY.md").read_text())["Block-FP8 weights"]


@pytest.mark.parametrize("run", ROWS)
def test_table_rows_are_the_gate_recomputed_from_the_probes(saved, run):
    verdict = gate(saved[run]["levels"], saved["flashmla"]["levels"])
    assert verdict == {k: saved["summary"][run][k] for k in ("gate", "floor", "levels")}
    row = next(ln for ln in section().splitlines() if ln.startswith(ROWS[run]))
    cells = row_cells(saved[run]["max_running"], verdict, saved["summary"][run]["not_held"])
    assert row.endswith(" | ".join(cells) + " |"), row
    assert saved["summary"][run]["not_held"] == []
    assert verdict["gate"] == ("FAIL" if run == "snapmla-capture-view-bug" else "pass")


def test_snapmla_against_sglang_fp8_per_level(saved):
    ratios = [saved["summary"]["snapmla"]["levels"][lv]["mean_abs_dlogprob"]
              / saved["summary"]["flashmla-fp8"]["levels"][lv]["mean_abs_dlogprob"] for lv in LEVELS]
    quoted = f"{min(ratios):.2f}-{max(ratios):.2f}x SGLang FP8's"
    assert quoted in section() and quoted in " ".join((ROOT / "README.md").read_text().split())
    errors = [saved["summary"]["snapmla"]["levels"][lv]["mean_abs_dlogprob"] for lv in LEVELS]
    assert max(errors) <= saved["summary"]["snapmla"]["floor"]  # "no level is above its level-1 floor"
    assert f"({min(errors):.4f}-{max(errors):.4f} nats)" in section()
    train = read_json(DATA / "train_log.json")
    assert train["device"] == "NVIDIA H200" and f"{train['steps']:,}".replace(",", " ") + " steps" in section()


def test_the_gate_ran_the_kernels_as_they_are():
    """The gate's snapmla servers logged the sm_90a decode (its table row says so)."""
    from harness.server_log import read_log

    for run in ("snapmla", "snapmla-capture-view-bug"):
        assert "sm_90a CUDA kernel" in read_log(DATA / f"server_{run}.log.xz"), run


def test_the_two_prefill_routes_agree_within_the_fp8_floor(routes):
    """The radix level (a cached prompt's last page prefilled over its prefix) through the absorbed route (snapmla's
    choice there) and the pinned MHA route: their difference to each other is below snapmla's level-1 error against
    BF16, and each stays within the gate's bound; the levels without a cached prefix are the same tokens."""
    saved = routes
    snap, mha = saved["snapmla"]["levels"], saved["snapmla-mha"]["levels"]
    assert saved["snapmla-mha"]["env"] == {"SNAPMLA_EXTEND_ROUTE": "mha"} and saved["snapmla"]["env"] == {}
    for lv in ("1", "8", "64", "160", "512"):
        assert [p["ids"] for p in snap[lv]] == [p["ids"] for p in mha[lv]], lv
    between, same = token_errors(snap["radix"], mha["radix"])
    floor = saved["summary"]["snapmla"]["floor"]
    assert between < floor
    bound = GATE_FACTOR * floor + GATE_SLACK
    for run in ("snapmla", "snapmla-mha"):
        assert saved["summary"][run]["levels"]["radix"]["mean_abs_dlogprob"] <= bound
    text = section().replace("\n", " ")
    assert f"differ by {between:.4f} nats" in text and f"{same} of 32 identical" in text
    assert f"({floor:.4f}, snapmla's level-1 error" in text
    assert f"{GATE_FACTOR} x {floor:.4f} + {GATE_SLACK} = {bound:.4f}" in text


EVAL = ROOT / "results/accuracy/eval_fp8_weights_h200/eval_trained_model_summary.json"


def test_the_teacher_forced_tables_are_the_saved_evaluation():
    """The evaluation on FP8 weights that the section quotes: its table is `tools.eval_trained_model.table` of the
    saved summary, the per-window rows are its teacher-forced windows, and the prose's figures are its own."""
    from tools import eval_trained_model as ev

    summary = read_json(EVAL)
    text = section()
    assert ev.table(summary) in text
    r = summary["results"]
    for name, label in (("flashmla", "flashmla BF16 (its prefill"), ("flashmla-fp8", "SGLang FP8 |"),
                        ("snapmla", "snapmla |"), ("triton", "triton (BF16 floor)")):
        by_window = text.split("Teacher-forced agreement per 256-token window")[1]
        row = next(ln for ln in by_window.splitlines() if ln.startswith(f"| {label}"))
        assert row.endswith(" | ".join(f"{100 * x:.1f}" for x in r[name]["teacher_forced_by_window"]) + " |"), row
    snap, floor, fp8 = (r[k] for k in ("snapmla", "triton", "flashmla-fp8"))
    for key in ("teacher_forced_first", "teacher_forced_last"):
        assert f"{100 * (floor[key] - snap[key]):.1f}" in text and f"{100 * (snap[key] - fp8[key]):.1f}" in text
    windows = list(zip(*(x["teacher_forced_by_window"] for x in (fp8, snap, floor))))
    assert all(f < s for f, s, _ in windows)  # "above SGLang FP8"
    assert f"within {100 * max(b - s for _, s, b in windows):.1f} points of the floor" in text
    assert max(abs(x["ppl_ratio"] - 1) for x in r.values()) < 0.0006  # "within 0.06 %"
    assert summary["checkpoint"]["steps"] == 1249 and "1 249 steps" in text


def test_the_readme_quotes_the_teacher_forced_figures_of_the_saved_evaluation():
    r = read_json(EVAL)["results"]
    readme = " ".join((ROOT / "README.md").read_text().split())
    pct = lambda name, key: f"{100 * r[name][key]:.1f}"  # noqa: E731
    for name in ("snapmla", "triton", "flashmla-fp8"):
        assert f"{pct(name, 'teacher_forced_first')} / {pct(name, 'teacher_forced_last')}" in readme, name
