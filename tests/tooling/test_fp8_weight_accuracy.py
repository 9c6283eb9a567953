"""The accuracy gate on block-FP8 weights that docs/ACCURACY.md quotes (results/accuracy/gate_fp8_weights_h200): every
cell of its table and the two prefill routes' agreement recomputed from the probes' saved tokens and logprobs."""

from pathlib import Path

import pytest

from harness.probes import token_errors
from harness.results import read_json
from helpers import doc_sections
from tools.accuracy_gate import GATE_FACTOR, GATE_SLACK, gate

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "results/accuracy/gate_fp8_weights_h200"
LEVELS = ("1", "8", "64", "160", "512", "radix")
ROWS = {"flashmla-fp8": "| SGLang FP8", "snapmla": "| snapmla (sm_90a", "snapmla-mha": "| snapmla, `SNAPMLA_EXTEND",
        "snapmla-capture-view-bug": "| snapmla with the capture-view bug"}


@pytest.fixture(scope="module")
def saved():
    return read_json(DATA / "accuracy_gate.json.xz")


def section() -> str:
    return doc_sections((ROOT / "docs/ACCURACY.md").read_text())["Block-FP8 weights"]


@pytest.mark.parametrize("run", ROWS)
def test_table_rows_are_the_gate_recomputed_from_the_probes(saved, run):
    verdict = gate(saved[run]["levels"], saved["flashmla"]["levels"])
    assert verdict == {k: saved["summary"][run][k] for k in ("gate", "floor", "levels")}
    row = next(ln for ln in section().splitlines() if ln.startswith(ROWS[run]))
    cells = [f"{verdict['levels'][lv]['mean_abs_dlogprob']:.4f}, {verdict['levels'][lv]['identical']}/32"
             for lv in LEVELS]
    assert row.endswith(" | ".join([str(saved[run]["max_running"]), *cells, verdict["gate"]]) + " |"), row
    assert saved["summary"][run]["not_held"] == []
    assert verdict["gate"] == ("FAIL" if run == "snapmla-capture-view-bug" else "pass")


def test_snapmla_against_sglang_fp8_per_level(saved):
    ratios = [saved["summary"]["snapmla"]["levels"][lv]["mean_abs_dlogprob"]
              / saved["summary"]["flashmla-fp8"]["levels"][lv]["mean_abs_dlogprob"] for lv in LEVELS]
    assert f"{min(ratios):.2f}-{max(ratios):.2f}x SGLang FP8's" in section()


def test_the_two_prefill_routes_agree_within_the_fp8_floor(saved):
    """The radix level (a cached prompt's last page prefilled over its prefix) through the absorbed route (snapmla's
    choice there) and the pinned MHA route: their difference to each other is below snapmla's level-1 error against
    BF16, and each stays within the gate's bound; the levels without a cached prefix are the same tokens."""
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
