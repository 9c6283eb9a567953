"""benchmarks/serve_mtp.py without a GPU: the accept length and the output comparisons it reports, a saved folder
continued rather than served again, the refusal of a draft the checkpoint lacks; and docs/BENCHMARKS.md's "MTP with a
trained draft" section and the README's MTP figures read back from the run kept in results/."""

import json
import math
import shutil
from pathlib import Path

import pytest

from benchmarks import serve_mtp
from harness.results import read_json, stored
from helpers import doc_sections, doc_tables, shows

ROOT = Path(__file__).resolve().parents[2]
KEPT = ROOT / "results" / "serve" / "mtp_trained_draft_h200"
KEPT_H100 = ROOT / "results" / "serve" / "mtp_trained_draft_h100"
SECTION = "MTP with a trained draft (H200, small trained checkpoint)"
SECTION_H100 = "The same on an H100, with each step's GPU time"


def _round(seconds, latencies, tokens, steps, ids=((1, 2, 3),)):
    return {"seconds": seconds, "latencies": latencies, "completion_tokens": tokens, "verify_steps": steps,
            "ids": [list(i) for i in ids]}


def _level(ids):
    return {"output_tok_s": 1.0, "output_tok_s_range": [1.0, 1.0], "ms_per_token": 1.0,
            "ms_per_token_range": [1.0, 1.0], "accept_length": None, "ids": ids}


def test_accept_length_is_output_tokens_over_verify_steps_of_all_rounds():
    rounds = [_round(2.0, [1.0, 2.0], 300, 120), _round(1.0, [3.0, 3.0], 300, 100), _round(1.5, [2.0, 2.0], 300, 80)]
    lv = serve_mtp.summarize(rounds, new_tokens=150)
    assert lv["accept_length"] == pytest.approx(900 / 300)
    assert lv["output_tok_s"] == 200 and lv["output_tok_s_range"] == [150, 300]
    assert lv["ms_per_token"] == pytest.approx(2000 / 150) and lv["ms_per_token_range"] == pytest.approx([10, 20])
    assert serve_mtp.summarize([_round(1.0, [1.0], 3, None)], 3)["accept_length"] is None  # no draft: no verify


def test_a_run_reads_the_device_timer_of_its_decode_forwards_per_output_token(tmp_path, monkeypatch):
    """The server runs with SGLang's device timer; each measured round's decode forwards (draft, verify and draft
    extend with MTP; not prefill) give GPU ms per output token, beside wall ms per token."""
    import contextlib

    (tmp_path / "heldout.json").write_text(json.dumps({"prompts": [[1, 2]] * 4}))
    started = {}

    @contextlib.contextmanager
    def serving(model, port, flags, log, timeout, **kw):
        started.update(flags=flags, env=kw["env"])
        yield None

    counters = {"decode": 0.0, "target_verify": 0.0, "eagle_draft": 0.0, "extend": 0.0}

    def read_counters(url, timeout=5):
        assert url == "http://127.0.0.1:30123/metrics"
        return dict(counters)

    calls = []

    def generate(port, ids, new_tokens):  # one request: 8 tokens, 4 ms of target verify, 2 of draft, 5 of prefill
        calls.append(ids)
        counters["target_verify"] += 0.004
        counters["eagle_draft"] += 0.002
        counters["extend"] += 0.005
        return {"output_ids": [7] * new_tokens, "meta_info": {"completion_tokens": new_tokens, "spec_verify_ct": 4}}

    monkeypatch.setattr(serve_mtp, "serving", serving)
    monkeypatch.setattr(serve_mtp, "greedy_generate", generate)
    monkeypatch.setattr(serve_mtp.gpu_time, "read_counters", read_counters)
    res = serve_mtp.measure_run(str(tmp_path), "snapmla-mtp", [1], 2, 8, 30123, tmp_path, 1.0)
    assert "--enable-metrics" in started["flags"] and started["env"]["SGLANG_ENABLE_METRICS_DEVICE_TIMER"] == "1"
    # by default two warm-up passes (the second meets the prompts' cached prefixes, as the measured rounds do), then
    # 2 rounds
    assert len(calls) == (2 + 2) * 4
    lv = res["levels"]["1"]
    assert lv["gpu_decode_ms_per_token"] == pytest.approx(6 / 8)  # 4 requests x 6 ms over 4 x 8 tokens
    assert lv["accept_length"] == pytest.approx(2)
    assert "| snapmla-mtp | 1 |" in serve_mtp.table({"snapmla-mtp": res}) and "| 0.75 | 2.00 |" in serve_mtp.table(
        {"snapmla-mtp": res})
    # a server whose metrics hold no device timer: no GPU figure, shown as "-"
    monkeypatch.setattr(serve_mtp.gpu_time, "read_counters", lambda url, timeout=5: {})
    res = serve_mtp.measure_run(str(tmp_path), "snapmla", [1], 1, 8, 30123, tmp_path, 1.0)
    assert res["levels"]["1"]["gpu_decode_ms_per_token"] is None
    assert "| - | 2.00 |" in serve_mtp.table({"snapmla": res})


def test_warm_up_passes_default_to_two_and_follow_the_flag(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text(json.dumps({"num_nextn_predict_layers": 1}))
    passes = []

    def measure_run(*args):
        passes.append(args[-1])
        return {"error": "not served here"}

    monkeypatch.setattr(serve_mtp, "measure_run", measure_run)
    monkeypatch.setattr(serve_mtp, "kill_servers_on_exit", lambda: None)
    serve_mtp.main(["--model", str(tmp_path), "--runs", "snapmla", "--out", str(tmp_path / "a")])
    serve_mtp.main(["--model", str(tmp_path), "--runs", "snapmla", "--warm-up", "3", "--out", str(tmp_path / "b")])
    assert passes == [2, 3]


def test_outputs_are_compared_with_the_same_backend_without_mtp_and_with_the_reference():
    assert serve_mtp.shared([[1, 2, 3, 4], [5, 6]], [[1, 2, 9, 4], [5, 6]]) == (1, pytest.approx(0.75))
    results = {"snapmla": {"levels": {"4": _level([[1, 2, 9, 9]])}},
               "snapmla-mtp": {"levels": {"4": _level([[1, 2, 9, 4]])}},
               "flashmla": {"levels": {"4": _level([[1, 2, 3, 4]])}},
               "flashmla-fp8": {"error": "did not start"}}
    # a comparison left from an earlier reference is replaced, not kept beside the new one
    results["flashmla"]["levels"]["4"]["vs_reference"] = {"run": "snapmla"}
    serve_mtp.compare(results, "flashmla")
    mtp = results["snapmla-mtp"]["levels"]["4"]
    assert mtp["vs_base"] == {"run": "snapmla", "identical": 0, "outputs": 1, "leading_share": 0.75}
    assert mtp["vs_reference"] == {"run": "flashmla", "identical": 0, "outputs": 1, "leading_share": 0.5}
    assert "vs_base" not in results["snapmla"]["levels"]["4"]  # its base is itself
    assert not {"vs_base", "vs_reference"} & set(results["flashmla"]["levels"]["4"])
    assert "| flashmla-fp8 | | error: did not start |" in serve_mtp.table(results)


def test_a_saved_folder_is_continued_and_compared_without_serving(tmp_path, monkeypatch, capsys):
    shutil.copy(stored(KEPT / "serve_mtp.json"), tmp_path)
    shutil.copy(KEPT / "serve_mtp_ids.json.xz", tmp_path)
    kept = read_json(KEPT / "serve_mtp.json")

    def no_server(*a, **k):
        raise AssertionError("a run the folder holds was served again")

    monkeypatch.setattr(serve_mtp, "measure_run", no_server)
    serve_mtp.main(["--model", str(tmp_path / "absent"), "--runs", *kept["runs"], "--out", str(tmp_path)])
    assert json.loads((tmp_path / "serve_mtp.json").read_text()) == kept  # compared again: the same figures
    assert "| snapmla-mtp | 64 |" in capsys.readouterr().out
    assert serve_mtp.load(tmp_path)[0]["snapmla"]["levels"]["64"]["ids"][0][:1]  # the outputs' ids put back
    # a run the folder lacks, of another workload, is not served beside them
    with pytest.raises(SystemExit, match="another workload"):
        serve_mtp.main(["--model", str(tmp_path / "absent"), "--runs", "snapmla-triton", "--new-tokens", "64",
                        "--out", str(tmp_path)])


def test_a_draft_run_on_a_checkpoint_without_an_mtp_layer_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"num_nextn_predict_layers": 0}))
    with pytest.raises(SystemExit, match="train_tiny_mla --mtp"):
        serve_mtp.main(["--model", str(tmp_path), "--runs", "snapmla-mtp", "--out", str(tmp_path / "out")])


def _accept(runs, run):
    values = [lv["accept_length"] for lv in runs[run]["levels"].values()]
    return f"{min(values):.2f}-{max(values):.2f}"


def assert_rows_are_the_run(rows, runs):
    """Each row of an MTP table (run, concurrency) shows its kept level: rates, ms per token, accept length and the
    output comparisons."""
    for row in rows:
        lv = runs[row["run"]]["levels"][row["c"]]
        assert shows(row["output tok/s (range)"], [lv["output_tok_s"], *lv["output_tok_s_range"]]), row
        assert shows(row["ms per token"], [lv["ms_per_token"]]), row
        assert shows(row["accept length"], [lv["accept_length"]]), row
        for column, key in (("identical to the run without MTP", "vs_base"),
                            ("identical to FlashMLA BF16", "vs_reference")):
            cmp = lv.get(key)
            values = [cmp["identical"], cmp["outputs"], 100 * cmp["leading_share"]] if cmp else [None]
            assert shows(row[column], values), (row, column)


def test_the_mtp_section_is_the_kept_run():
    kept = read_json(KEPT / "serve_mtp.json")
    runs = kept["runs"]
    assert kept["meta"]["reference"] == "flashmla" and kept["meta"]["new_tokens"] == 256
    rows = doc_tables(doc_sections((ROOT / "docs" / "BENCHMARKS.md").read_text())[SECTION])[0]
    assert len(rows) == sum(len(r["levels"]) for r in runs.values())
    assert_rows_are_the_run(rows, runs)
    text = doc_sections((ROOT / "docs" / "BENCHMARKS.md").read_text())[SECTION]
    accepts = (_accept(runs, "snapmla-mtp"), _accept(runs, "flashmla-mtp"), _accept(runs, "flashmla-fp8-mtp"))
    assert f"accept length\n{accepts[0]} against FlashMLA BF16's {accepts[1]} and SGLang FP8's {accepts[2]}" in text
    train = read_json(KEPT / "train_log.json")
    assert f"{train['steps']} steps, held-out perplexity {math.exp(train['heldout_loss']):.2f}" in text
    assert f"{100 * train['heldout_mtp_agreement']:.1f} % of positions" in text


def _one_request_ratios(runs) -> str:
    """snapmla's output rate at one request over FlashMLA BF16's, without MTP and with it: 'lo-hi'."""
    one = [runs[r]["levels"]["1"]["output_tok_s"] for r in ("snapmla", "flashmla", "snapmla-mtp", "flashmla-mtp")]
    ratios = sorted((one[0] / one[1], one[2] / one[3]))
    return f"{ratios[0]:.2f}-{ratios[1]:.2f}x"


def test_the_h100_section_is_its_kept_run():
    """The H100 table, every cell with the GPU time per token from the servers' device timer, and the one-request
    figures the text draws from it."""
    kept = read_json(KEPT_H100 / "serve_mtp.json")
    runs = kept["runs"]
    assert kept["meta"]["reference"] == "flashmla" and kept["meta"]["new_tokens"] == 256
    text = doc_sections((ROOT / "docs" / "BENCHMARKS.md").read_text())[SECTION_H100]
    assert "results/serve/mtp_trained_draft_h100/" in text
    rows = doc_tables(text)[0]
    assert len(rows) == sum(len(r["levels"]) for r in runs.values()) == 15
    assert_rows_are_the_run(rows, runs)
    assert all(shows(row["GPU ms per token (decode forwards)"],
                     [runs[row["run"]]["levels"][row["c"]]["gpu_decode_ms_per_token"]]) for row in rows)
    one = {r: runs[r]["levels"]["1"] for r in runs}
    flat = " ".join(text.split())
    assert (f"snapmla makes {one['snapmla']['output_tok_s'] / one['flashmla']['output_tok_s']:.2f}x FlashMLA BF16's "
            f"rate ({one['snapmla']['output_tok_s']:.0f} against {one['flashmla']['output_tok_s']:.0f} tok/s") in flat
    gpu = [one[r]["gpu_decode_ms_per_token"] for r in ("snapmla", "flashmla", "flashmla-fp8")]
    assert f"({gpu[0]:.2f} ms against {gpu[1]:.2f} and {gpu[2]:.2f})" in flat
    gains = sorted(one[f"{r}-mtp"]["output_tok_s"] / one[r]["output_tok_s"] for r in ("flashmla", "snapmla"))
    assert f"({gains[1]:.2f}x and {gains[0]:.2f}x)" in flat
    train = read_json(KEPT_H100 / "train_log.json")
    assert f"{train['steps']} steps in 2 minutes, held-out perplexity {math.exp(train['heldout_loss']):.2f}" in flat
    assert f"the model's next at {100 * train['heldout_mtp_agreement']:.1f} % of held-out positions" in flat


def test_the_readme_quotes_the_kept_runs():
    runs, h100 = read_json(KEPT / "serve_mtp.json")["runs"], read_json(KEPT_H100 / "serve_mtp.json")["runs"]
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert (f"snapmla's verify accepts {_accept(runs, 'snapmla-mtp')} tokens a cycle, FlashMLA BF16's "
            f"{_accept(runs, 'flashmla-mtp')}") in readme
    gpu = [h100[r]["levels"]["1"]["gpu_decode_ms_per_token"] for r in ("snapmla", "flashmla")]
    assert (f"snapmla made {_one_request_ratios(runs)} BF16's rate on an H200 and {_one_request_ratios(h100)} on an "
            f"H100, where its forwards took the same GPU time as BF16's ({gpu[0]:.2f} and {gpu[1]:.2f} ms a token") \
        in readme
