"""The torch.compile check (tools/check_torch_compile.py): the two servers' flags, the comparison, the table."""

from tools import check_torch_compile as ctc


def test_only_the_compiled_server_compiles_and_both_capture_the_same_batches():
    eager, compiled = (ctc.variant_flags("snapmla", v, 8) for v in ctc.VARIANTS)
    assert "--enable-torch-compile" not in eager
    assert compiled[:len(eager)] == eager
    assert compiled[len(eager):] == ["--enable-torch-compile", "--torch-compile-max-bs", "8"]
    assert eager[eager.index("--cuda-graph-max-bs") + 1] == "8"


def test_outputs_are_compared_per_level_and_errors_reported():
    def probe(ids, lps):
        return {"ids": ids, "logprobs": lps}

    eager = {"levels": {"1": [probe([1, 2, 3], [-0.1, -0.2, -0.3]), probe([4, 5], [-1.0, -1.0])]},
             "median_tpot_ms": 5.0, "startup_s": 40.0}
    compiled = {"levels": {"1": [probe([1, 2, 3], [-0.1, -0.2, -0.3]), probe([4, 6], [-1.0, -1.5])]},
                "median_tpot_ms": 4.0, "startup_s": 200.0}
    cmp = ctc.compare(eager, compiled)
    assert cmp["1"]["identical"] == 1 and cmp["1"]["probes"] == 2
    assert abs(cmp["1"]["mean_abs_dlogprob"] - 0.5 / 5) < 1e-9  # 5 tokens up to and incl. the first difference
    text = ctc.table({"snapmla": {"eager": eager, "compiled": compiled, "compare": cmp},
                      "flashmla": {"eager": eager, "compiled": {"error": "RuntimeError('did not start')"},
                                   "compare": ctc.compare(eager, {"error": "x"})}})
    assert "| snapmla | 1 | 1/2 | 0.10000 | 5.0 | 4.0 | 40.0 | 200.0 |" in text
    assert "| flashmla | - | error: RuntimeError('did not start') |" in text


def test_every_server_is_compared_with_flashmla_bf16_eager_when_it_ran():
    def server(ids):
        return {"levels": {"1": [{"ids": ids, "logprobs": [-0.5] * len(ids)}]}, "median_tpot_ms": 1.0,
                "startup_s": 1.0}

    results = {"snapmla": {"eager": server([1, 2]), "compiled": server([1, 3])},
               "flashmla": {"eager": server([1, 2]), "compiled": server([1, 2])}}
    against = ctc.against_reference(results)
    assert against["snapmla"]["eager"]["1"]["identical"] == 1 and against["snapmla"]["compiled"]["1"]["identical"] == 0
    assert "| snapmla compiled | 1 | 0/1 | 0.00000 |" in ctc.reference_table(against)
    assert ctc.against_reference({"snapmla": results["snapmla"]}) == {}  # no reference run: no table rows
    assert ctc.against_reference({**results, "flashmla": {"eager": {"error": "x"}, "compiled": {"error": "x"}}}) == {}


def test_the_accuracy_doc_quotes_the_saved_check():
    """docs/ACCURACY.md "torch.compile": both tables are the tool's tables of
    results/accuracy/torch_compile_h200 (the second regrouped by level, at 4 decimals)."""
    import re
    from pathlib import Path

    from harness.results import read_json
    from helpers import doc_sections, doc_tables
    from tools import check_torch_compile as ctc

    root = Path(__file__).resolve().parents[2]
    section = doc_sections((root / "docs" / "ACCURACY.md").read_text())[
        "torch.compile (`--enable-torch-compile`) against eager"]
    doc_runs, doc_reference = doc_tables(section)[:2]
    results = read_json(root / "results" / "accuracy" / "torch_compile_h200" / "check_torch_compile.json")
    (printed,) = doc_tables(ctc.table(results))
    assert [list(r.values()) for r in doc_runs] == [list(r.values()) for r in printed]
    reference = {(r["server"], r["level"]): r for r in doc_tables(ctc.reference_table(ctc.against_reference(
        results)))[0]}
    assert len(doc_reference) == len({server for server, _ in reference}) - 1  # flashmla BF16 eager is the reference
    for row in doc_reference:
        server = re.sub(r"^SGLang FP8 \(flashmla-fp8\)", "flashmla-fp8", row["server"]).replace("flashmla BF16",
                                                                                                 "flashmla")
        for level, cell in (("1", row["level 1: mean abs dlogprob, identical"]), ("8", row["level 8"])):
            r = reference[(server, level)]
            assert cell == f"{float(r['mean abs dlogprob']):.4f}, {r['identical to flashmla eager']}", (row, r)
