"""The prefill/decode pair check's verdicts (tools/check_pd_pair.py), with stand-in servers: it passes a pair whose
outputs equal the single server's and that refuses another layout, and fails a pair that differs on long prompts or
does not refuse."""

import json

import pytest

from tools import check_pd_pair as pd


def _answer(ids, new_tokens):
    return [(sum(ids) + 7 * i) % 1000 for i in range(new_tokens)]


class _Proc:
    pid = 0

    def poll(self):
        return None


@pytest.fixture
def servers(monkeypatch, tmp_path):
    """Four stand-in servers on the tool's ports; `bugs` turns on a decode side that misreads prompts of more
    than 5 pages, or a mismatch side that decodes instead of refusing."""
    model = tmp_path / "cfg"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 1000}))
    bugs, logs, pair_bodies = set(), {}, []
    names = ("single", "prefill", "decode", "mismatch")

    def start_server(model_dir, port, flags, log_path, **kw):
        name = names[(port - 36000) // 20]
        logs[name] = log_path
        log_path.write_text(" ".join(flags) + "\n")
        return _Proc(), None

    def greedy_generate(port, ids, new_tokens, timeout=None, **extra):
        name = names[(port - 36000) // 20]
        if name != "single":
            pair_bodies.append(extra)
        out = _answer(ids, new_tokens)
        if name == "decode" and "long-prompt" in bugs and len(ids) > 5 * pd.PAGE:
            out[-1] += 1
        if name == "mismatch" and "no-refusal" not in bugs:
            with open(logs["mismatch"], "a") as f:
                f.write(f"RuntimeError: {pd.MISMATCH_ERROR}: prefill server has kv_cache_dtype={pd.KV_LAYOUT}, "
                        "but decode server has kv_cache_dtype=auto.\n")
            raise ConnectionError("server gone")
        return {"output_ids": out}

    monkeypatch.setattr(pd, "start_server", start_server)
    monkeypatch.setattr(pd, "wait_healthy", lambda port, proc, timeout: None)
    monkeypatch.setattr(pd, "stop_server", lambda proc, log: None)
    monkeypatch.setattr(pd, "flush_cache", lambda port: None)
    monkeypatch.setattr(pd, "greedy_generate", greedy_generate)
    monkeypatch.setattr(pd, "REFUSAL_TIMEOUT", 2)

    def run():
        code = pd.main(["--model", str(model), "--load-format", "dummy", "--port", "36000",
                        "--out", str(tmp_path / "out")])
        return code, json.loads((tmp_path / "out" / "pd_pair.json").read_text())

    return run, bugs, logs, pair_bodies


def test_an_equal_pair_that_refuses_another_layout_passes(servers):
    run, _, logs, pair_bodies = servers
    code, result = run()
    assert code == 0 and result["sequential_identical"] == len(result["prompt_tokens"])
    assert max(result["prompt_tokens"]) > 10 * pd.PAGE  # prompts of many pages travel
    assert pd.KV_LAYOUT in result["mismatch_refusal"]
    assert "--disaggregation-mode decode" in logs["decode"].read_text()
    rooms = [b["bootstrap_room"] for b in pair_bodies if b.get("bootstrap_room") not in (None, 7)]
    assert all(rooms.count(r) == 2 for r in rooms)  # each room posted to both sides of the pair, once


@pytest.mark.parametrize("bug", ["long-prompt", "no-refusal"])
def test_a_pair_that_differs_or_does_not_refuse_fails(servers, bug):
    run, bugs, _, _ = servers
    bugs.add(bug)
    code, result = run()
    assert code == 1
    if bug == "long-prompt":
        assert result["sequential_identical"] < len(result["prompt_tokens"])
    else:
        assert result["mismatch_refusal"] is None
