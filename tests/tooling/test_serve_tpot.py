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
