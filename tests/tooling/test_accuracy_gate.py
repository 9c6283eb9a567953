"""The serving-scale accuracy gate's arithmetic (tools/accuracy_gate.py), on made-up outputs (no server)."""

import math
import time

from harness import probes as probes_module
from tools import accuracy_gate as ag


def probe(ids, lps):
    return {"ids": ids, "logprobs": lps}


def test_errors_stop_at_the_first_differing_token_and_nan_is_infinite():
    ref = [probe([1, 2, 3], [-0.1, -0.2, -0.3])]
    assert probes_module.token_errors(ref, ref) == (0.0, 1)
    run = [probe([1, 5, 3], [-0.2, -0.4, -9.0])]  # parts at token 1: tokens 0 and 1 compared, token 2 not
    err, same = probes_module.token_errors(run, ref)
    assert math.isclose(err, (0.1 + 0.2) / 2) and same == 0
    assert probes_module.token_errors([probe([1, 2, 3], [-0.1, None, -0.3])], ref)[0] == math.inf


def test_the_gate_fails_an_error_that_grows_with_batch_size():
    ref = {lv: [probe([1, 2], [-0.1, -0.2])] for lv in ("1", "512", ag.RADIX)}
    steady = {lv: [probe([1, 2], [-0.11, -0.21])] for lv in ref}
    assert ag.gate(steady, ref)["gate"] == "pass"
    grown = {**steady, "512": [probe([1, 2], [-0.3, -0.5])]}
    result = ag.gate(grown, ref)
    assert result["gate"] == "FAIL" and math.isclose(result["floor"], 0.01)
    assert ag.gate({**steady, "512": [probe([1, 2], [-0.1, None])]}, ref)["gate"] == "FAIL"


def test_runs_name_a_base_and_an_environment():
    assert ag.parse_run("snapmla") == ("snapmla", ag.RUNS["snapmla"], {})
    name, flags, env = ag.parse_run("bug=snapmla:PYTHONSAFEPATH=1;PYTHONPATH=/a:/b")
    assert name == "bug" and flags == ag.RUNS["snapmla"] and env == {"PYTHONSAFEPATH": "1", "PYTHONPATH": "/a:/b"}
    assert ag.parse_run("snapmla-triton")[2] == {"SNAPMLA_DECODE_IMPL": "triton"}


def test_every_run_gets_the_layout_flags_last_and_concurrent_runs_are_all_measured(monkeypatch, tmp_path):
    import contextlib
    import json
    import sys

    model = tmp_path / "ckpt"
    model.mkdir()
    (model / "heldout.json").write_text(json.dumps({"prompts": [[1, 2, 3]] * ag.PROBES, "ppl_windows": [[5] * 2000]}))
    served = {}

    @contextlib.contextmanager
    def fake_serving(model_dir, port, flags, log_path, timeout, **kw):
        served[port] = flags
        log_path.write_text("[2026-11-26 10:00:00 DP0 TP0] Decode batch, #running-req: 7, #token: 1\n")
        yield None

    def fake_generate(port, ids, new_tokens, **kw):
        run = port // ag.PORT_STRIDE % 100  # each run's server answers with its own tokens
        out = {"output_ids": [run] * new_tokens}
        if kw.get("return_logprob"):
            out["meta_info"] = {"output_token_logprobs": [[-0.01 * run]] * new_tokens}
        return out

    monkeypatch.setattr(ag, "serving", fake_serving)
    monkeypatch.setattr(ag, "greedy_generate", fake_generate)
    monkeypatch.setattr(probes_module, "greedy_generate", fake_generate)
    monkeypatch.setattr(ag, "flush_cache", lambda port: None)
    monkeypatch.setattr(ag, "LEVELS", (1, 8))
    monkeypatch.setattr(sys, "argv", ["accuracy_gate", "--model", str(model), "--runs", "flashmla", "snapmla",
                                      "--server-flags", "--tp 2 --enable-dp-attention --dp 2", "--concurrent",
                                      "--port", "34000", "--out", str(tmp_path / "out")])
    ag.main()
    assert sorted(served) == [34000, 34000 + ag.PORT_STRIDE]
    assert all(flags[-5:] == ["--tp", "2", "--enable-dp-attention", "--dp", "2"] for flags in served.values())
    results = json.loads((tmp_path / "out" / "accuracy_gate.json").read_text())
    assert results["server_flags"] == "--tp 2 --enable-dp-attention --dp 2"
    assert results["flashmla"]["max_running"] == 7 and "startup_s" in results["snapmla"]
    assert results["summary"]["snapmla"]["levels"]["1"]["identical"] == 0  # the second server's tokens differ from the first's


def test_concurrent_runs_under_dp_attention_get_disjoint_ports():
    """Servers side by side (--concurrent) derive their ports from their HTTP ports: under DP attention the
    handshake at +13 and the torch.distributed and ZMQ ports from +233 on (the DP controller's worker ports reach
    ~+260). Runs PORT_STRIDE apart must not share one, or a server dies with EADDRINUSE."""
    from sglang.srt.server_args import DP_ATTENTION_HANDSHAKE_PORT_DELTA, ZMQ_TCP_PORT_DELTA

    def ports(http: int) -> set[int]:
        return {http, http + DP_ATTENTION_HANDSHAKE_PORT_DELTA, *range(http + ZMQ_TCP_PORT_DELTA,
                                                                       http + ZMQ_TCP_PORT_DELTA + 32)}

    runs = [ports(35000 + ag.PORT_STRIDE * i) for i in range(4)]
    assert all(not (runs[i] & runs[j]) for i in range(4) for j in range(i + 1, 4))


def test_eviction_runs_between_the_level_one_and_the_radix_pass(monkeypatch, tmp_path):
    """--evict-tokens: between the probes' first pass and their radix pass, distinct prompts (no shared first token)
    of at least that many tokens, so that the radix pass finds the probes' prefixes outside the device pool."""
    import contextlib
    import json

    model = tmp_path / "ckpt"
    model.mkdir()
    probes = [[7, 8, 9, i] for i in range(ag.PROBES)]
    (model / "heldout.json").write_text(json.dumps({"prompts": probes, "ppl_windows": [[5] * 2000]}))
    calls = []

    @contextlib.contextmanager
    def fake_serving(model_dir, port, flags, log_path, timeout, **kw):
        log_path.write_text("")
        yield None

    def fake_generate(port, ids, new_tokens, **kw):
        calls.append(("probe" if ids in probes else "other", list(ids), new_tokens))
        out = {"output_ids": [1] * new_tokens}
        if kw.get("return_logprob"):
            out["meta_info"] = {"output_token_logprobs": [[-0.1]] * new_tokens}
        return out

    monkeypatch.setattr(ag, "serving", fake_serving)
    monkeypatch.setattr(ag, "greedy_generate", fake_generate)
    monkeypatch.setattr(probes_module, "greedy_generate", fake_generate)
    monkeypatch.setattr(ag, "flush_cache", lambda port: None)
    monkeypatch.setattr(ag, "LEVELS", (1, 40))  # 8 fillers for level 40, which runs after the radix pass

    def fake_stream(port, ids, new_tokens, decoding, rid=None, timeout=900):
        calls.append(("filler", list(ids), new_tokens))
        decoding.set()
        return time.monotonic() + 60  # leaves the batch after the probes

    monkeypatch.setattr(probes_module, "stream_generate", fake_stream)
    monkeypatch.setattr(probes_module, "abort_request", lambda port, rid: None)
    result = ag.measure_run(str(model), "snapmla-hicache", [], {}, 33000, tmp_path, 10, [], evict_tokens=20000)
    assert set(result["levels"]) == {"1", ag.RADIX, "40"}
    kinds = [k for k, _, _ in calls]
    first_pass_end = 1 + ag.PROBES  # the warm-up request, then level 1's probes
    assert kinds[1:first_pass_end] == ["probe"] * ag.PROBES
    radix_start = kinds.index("probe", first_pass_end)
    assert kinds[radix_start:radix_start + ag.PROBES] == ["probe"] * ag.PROBES
    evicting = calls[first_pass_end:radix_start]
    assert evicting and all(k == "other" and new == 1 for k, _, new in evicting)
    assert sum(len(ids) for _, ids, _ in evicting) >= 20000
    assert len({ids[0] for _, ids, _ in evicting}) == len(evicting)  # no two share a cached prefix


# Every gate table of docs/ACCURACY.md, in the doc's order: the saved run it shows (None: the tensor-parallel table,
# printed by the script on a host whose data was not kept, as the doc says) and its rows' runs.
GATE_TABLES = [
    ("results/accuracy/accuracy_gate_fp8_h128.json", {"flashmla FP8 (SGLang)": "flashmla-fp8",
                                                       "FlashInfer MLA, FP8 cache (SGLang)": "flashinfer-fp8",
                                                       "snapmla (sm_90a decode)": "snapmla"}),
    ("results/accuracy/accuracy_gate_fp8_h64.json", {"flashmla FP8 (SGLang)": "flashmla-fp8",
                                                      "snapmla (sm_90a decode)": "snapmla"}),
    ("results/accuracy/accuracy_gate.json", {"SGLang FP8 (flashmla, `--kv-cache-dtype fp8_e4m3`)": "flashmla-fp8",
                                             "snapmla (sm_90a decode)": "snapmla",
                                             "snapmla with the capture-view bug": "snapmla-capture-view-bug"}),
    ("results/accuracy/gate_narrow_h200/accuracy_gate.json", {
        "snapmla (sm_90a narrow decode)": "snapmla", "snapmla with the capture-view bug": "snapmla-capture-view-bug"}),
    ("results/accuracy/gate_narrow_h100/accuracy_gate.json", {
        "snapmla (sm_90a narrow decode)": "snapmla", "snapmla with the capture-view bug": "snapmla-capture-view-bug"}),
    ("results/accuracy/gate_fillers160/accuracy_gate.json", {
        "SGLang FP8": "flashmla-fp8", "snapmla (sm_90a decode)": "snapmla",
        "snapmla with the capture-view bug": "snapmla-capture-view-bug",
        "snapmla, `SNAPMLA_DECODE_IMPL=triton`": "snapmla-triton"}),
    ("results/accuracy/accuracy_gate_h128.json", {"snapmla (sm_90a decode)": "snapmla",
                                                  "snapmla, `SNAPMLA_DECODE_IMPL=triton`": "snapmla-triton",
                                                  "snapmla with the capture-view bug": "snapmla-capture-view-bug"}),
    (None, {}),
    ("results/accuracy/accuracy_gate_h128_dp2.json", {"flashmla FP8 (`fp8_e4m3`)": "flashmla-fp8",
                                                      "snapmla (sm_90a decode)": "snapmla",
                                                      "snapmla with the capture-view bug": "snapmla-capture-view-bug"}),
    ("results/accuracy/accuracy_gate_h128_dp4.json", {"flashmla FP8 (`fp8_e4m3`)": "flashmla-fp8",
                                                      "snapmla (sm_90a decode)": "snapmla",
                                                      "snapmla with the capture-view bug": "snapmla-capture-view-bug"}),
    ("results/serve/pp2_h200x2/accuracy_gate.json", {"snapmla, `--pp-size 2`": "snapmla"}),
    ("results/accuracy/gate_fp8_weights_h200/accuracy_gate.json", {
        "SGLang FP8 (flashmla, `--kv-cache-dtype fp8_e4m3`)": "flashmla-fp8",
        "snapmla (sm_90a decode; radix prefill absorbed)": "snapmla",
        "snapmla with the capture-view bug": "snapmla-capture-view-bug"}),
]


def gate_tables() -> list[tuple[str, list[dict[str, str]]]]:
    """(the text before it since the previous table, the table) for each gate table of docs/ACCURACY.md."""
    import re
    from pathlib import Path

    from helpers import doc_tables

    doc = (Path(__file__).resolve().parents[2] / "docs" / "ACCURACY.md").read_text()
    out, start = [], 0
    for m in re.finditer(r"^\| run \| largest decode batch.*\n(?:\|.*\n?)+", doc, re.M):
        out.append((doc[start:m.start()], doc_tables(m.group())[0]))
        start = m.end()
    return out


def test_every_gate_table_of_the_accuracy_doc_is_its_saved_run():
    """Each cell of each gate table in docs/ACCURACY.md recomputed from the probes' saved tokens and logprobs
    against flashmla BF16's (`accuracy_gate.gate`), the run named in the text above the table."""
    from pathlib import Path

    from harness.results import read_json

    root = Path(__file__).resolve().parents[2]
    tables = gate_tables()
    assert len(tables) == len(GATE_TABLES)
    for (before, table), (data, rows) in zip(tables, GATE_TABLES):
        if data is None:
            assert "as the script printed it" in before
            continue
        assert data.rsplit("/accuracy_gate.json", 1)[0] in before or data in before, data
        saved = read_json(root / data)
        assert [r["run"] for r in table] == list(rows), data
        for row in table:
            cells = list(row.values())[1:]
            run = saved[rows[row["run"]]]
            verdict = ag.gate(run["levels"], saved["flashmla"]["levels"])
            assert cells == ag.row_cells(run["max_running"], verdict, ag.not_held(run["levels"])), (data, row["run"])
