"""The fixed-concurrency TPOT benchmark (benchmarks/serve_tpot.py): prompts per concurrency, the median over
rounds, the table's ratios against the first run."""

from benchmarks import serve_tpot as st
from harness.server import RUN_ENV, RUNS


def test_every_slot_serves_two_requests():
    assert [st.prompts_for(c) for c in (1, 4, 128)] == [8, 8, 256]


def test_rounds_reduce_to_their_median_and_the_table_compares_with_the_first_run():
    def m(tpot, itl=None, rate=100.0):
        return {"median_tpot_ms": tpot, "median_itl_ms": itl or tpot, "output_tok_s": rate}

    samples = {"snapmla-flashmla-schedule": {"1": [m(10.0), m(12.0), m(11.0)], "128": [m(40.0)]},
               "snapmla": {"1": [m(9.0), m(30.0), m(10.0)], "128": [m(42.0, rate=None)]}}
    summary = st.summarize(samples)
    assert summary["snapmla"]["1"]["median_tpot_ms"] == 10.0  # the slow round does not set it
    assert summary["snapmla"]["1"]["tpot_rounds_ms"] == [9.0, 30.0, 10.0]
    assert summary["snapmla"]["128"]["output_tok_s"] is None  # a round without the number: none
    text = st.table(summary)
    assert "| snapmla | 1 | 10.0 | 9.0, 30.0, 10.0 | 10.0 | 100.0 | 0.909x |" in text
    assert "| snapmla | 128 | 42.0 | 42.0 | 42.0 | None | 1.050x |" in text
    assert "| snapmla-flashmla-schedule | 1 | 11.0 |" in text and text.count("1.000x") == 2


def test_the_schedule_run_is_snapmla_with_flashmlas_schedule_computed():
    assert RUNS["snapmla-flashmla-schedule"] == RUNS["snapmla"]
    assert RUN_ENV["snapmla-flashmla-schedule"] == {"SNAPMLA_FLASHMLA_SCHEDULE": "1"}


def _section(title: str) -> str:
    from pathlib import Path

    from helpers import doc_sections

    root = Path(__file__).resolve().parents[2]
    return doc_sections((root / "docs" / "DESIGN.md").read_text())[title]


def test_design_doc_tpot_tables_are_the_saved_runs():
    """docs/DESIGN.md "Per-step metadata (H200)": its two TPOT tables are `serve_tpot.table` of the saved runs, cell
    for cell (the second without the one-round column, a run that died shown as such)."""
    from pathlib import Path

    from harness.results import read_json
    from helpers import doc_tables

    root = Path(__file__).resolve().parents[2]
    doc = [t for t in doc_tables(_section("Per-step metadata (H200)")) if "concurrency" in t[0]]
    for table, folder in zip(doc, ("v3_h200_tpot_flashmla_schedule", "v3_h200_tpot_backends"), strict=True):
        saved = read_json(root / "results" / "serve" / folder / "serve_tpot.json")["summary"]
        (printed,) = doc_tables(st.table(saved))
        assert len(table) == len(printed), folder
        for row, want in zip(table, printed):
            printed_col = {col: col if col in want else col.replace(" BF16", "") for col in row}  # the run's label
            if row["median TPOT ms"] == "-":  # the run that died: nothing measured
                assert want["median TPOT ms"] == "None" and list(row.values())[-1] == "died", row
                continue
            assert {col: want[printed_col[col]] for col in row} == row, (folder, row)


def test_design_doc_step_metadata_table_is_the_saved_run():
    """The host-time table of "Per-step metadata (H200)" is results/bench/step_metadata_h200's rows."""
    from pathlib import Path

    from harness.results import read_json
    from helpers import doc_tables, shows

    root = Path(__file__).resolve().parents[2]
    rows = read_json(root / "results" / "bench" / "step_metadata_h200" / "step_metadata.json")["rows"]
    (table,) = [t for t in doc_tables(_section("Per-step metadata (H200)")) if "heads" in t[0]]
    assert len(table) == len(rows)
    for row, r in zip(table, rows):
        values = [r["heads"], r["batch"], r["flashmla_schedule_us"], r["left_of_schedule_us"], r["snapmla_plan_us"],
                  r["attention_layer_us"], 100 * r["schedule_share"]]
        assert all(shows(cell, [v]) for cell, v in zip(row.values(), values, strict=True)), (row, r)
