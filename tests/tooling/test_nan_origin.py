"""tools/nan_origin.py on synthetic dumps laid out as SGLang 0.5.17's `--debug-tensor-dump-output-folder` writes them
(one folder per rank, PassNNNNN.pt: operator name -> output in execution order, the previous pass's `model` output
first, the pass's forward-batch info last), and its serve loop against a stubbed server."""

import contextlib
import math

import pytest
import torch

from tools import nan_origin


def _pass(prev_model_out, first_bad: str | None, tokens: int = 6) -> dict:
    """A pass of a two-layer model: embedding, per layer attention and MoE outputs, the final norm; NaN from
    `first_bad` on (everything after it computed from it). It opens with the previous pass's model output and the
    logits computed from it (NaN where that output is), as the dumper writes them."""
    names = ["model.embed_tokens", "model.layers.0.self_attn.o_proj", "model.layers.0.mlp.experts",
             "model.layers.1.self_attn.o_proj", "model.layers.1.mlp.experts", "model.norm"]
    entries = {}
    if prev_model_out is not None:
        entries["model"] = prev_model_out
        entries["logits_processor"] = torch.full((prev_model_out.shape[0], 32), prev_model_out.sum().item())
    bad = False
    for i, name in enumerate(names):
        out = torch.full((tokens, 8), float(i + 1), dtype=torch.bfloat16)
        bad = bad or name == first_bad
        if bad:
            out[: max(1, tokens // 2)] = float("nan")
        entries[name] = out if "o_proj" not in name else [out]  # linear layers return (output, bias)
    entries["model.forward_batch_info.input_ids"] = torch.arange(tokens)
    entries["model.forward_batch_info.positions"] = torch.arange(tokens)
    return entries


@pytest.fixture
def dump(tmp_path):
    rank = tmp_path / "TP0_PP0_Rank0_pid1"
    rank.mkdir()
    torch.save(_pass(None, None, tokens=6), rank / "Pass00000.pt")
    # the next pass opens with the previous pass's (finite, but huge) model output and its logits (inf: the sum
    # overflows): not this pass's operators
    torch.save(_pass(torch.full((6, 8), 1e38), "model.layers.1.self_attn.o_proj", tokens=1), rank / "Pass00001.pt")
    torch.save(_pass(torch.full((1, 8), float("nan")), "model.embed_tokens", tokens=1), rank / "Pass00002.pt")
    return tmp_path


def test_the_first_non_finite_operator_of_each_pass_in_execution_order(dump):
    rows = nan_origin.report(dump)
    assert [r["pass"] for r in rows] == [f"TP0_PP0_Rank0_pid1/Pass0000{i}.pt" for i in range(3)]
    clean, late, early = rows
    assert clean["first_non_finite"] is None and clean["non_finite_operators"] == 0 and clean["tokens"] == 6
    assert clean["operators"] == 6 and clean["largest_before"] == 6.0 and clean["largest_before_at"] == "model.norm"
    # not the alphabetically first (model.layers.1.mlp.experts), not the leading `model` entry of the pass before
    assert late["first_non_finite"] == "model.layers.1.self_attn.o_proj" and late["tokens"] == 1
    assert late["non_finite_operators"] == 3 and late["largest_before"] == 3.0
    assert late["largest_before_at"] == "model.layers.0.mlp.experts"
    assert early["first_non_finite"] == "model.embed_tokens" and early["largest_before_at"] is None
    table = nan_origin.table(rows).splitlines()
    assert len(table) == 5 and "| 1 | 6 | model.layers.1.self_attn.o_proj | 1.000 | 3 |" in table[3]


def test_a_non_finite_share_counts_the_elements(tmp_path):
    entries = {"model.embed_tokens": torch.tensor([1.0, math.inf, float("nan"), -2.0])}
    (tmp_path / "r").mkdir()
    torch.save(entries, tmp_path / "r" / "Pass00000.pt")
    row = nan_origin.report(tmp_path)[0]
    assert row["non_finite_share"] == 0.5 and row["tokens"] is None


def test_an_empty_dump_says_what_is_missing(tmp_path):
    with pytest.raises(SystemExit, match="--debug-tensor-dump-output-folder"):
        nan_origin.report(tmp_path)


def test_serve_turns_the_dump_on_and_reports_each_run(tmp_path, monkeypatch):
    """Each run's server gets its RUNS flags plus the dump folder; the probe is serve_and_bench's; the server is
    stopped before its dump is read; the JSON keeps the probe's logprobs (None: NaN) and the passes."""
    import harness.server as hs
    from benchmarks.serve_and_bench import PROBE_TEXT

    started, live, envs = [], [], []

    @contextlib.contextmanager
    def serving(model, port, flags, log_path, startup_timeout, env=None):
        started.append(flags)
        envs.append(env)
        live.append(True)
        try:
            yield None
        finally:
            live.pop()
            folder = flags[flags.index("--debug-tensor-dump-output-folder") + 1] + "/TP0_PP0_Rank0_pid7"
            (tmp_path / folder).mkdir(parents=True)
            torch.save(_pass(None, "model.layers.0.mlp.experts"), tmp_path / folder / "Pass00000.pt")

    def post(port, path, body):
        assert path == "/generate" and body["text"] == PROBE_TEXT and live
        return {"meta_info": {"output_token_logprobs": [[None, 0, None]] * body["sampling_params"]["max_new_tokens"]}}

    monkeypatch.setattr(hs, "serving", serving)
    monkeypatch.setattr(hs, "post", post)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    runs = ["snapmla-mha", "flashmla"]
    res = nan_origin.serve("m", runs, out.relative_to(tmp_path), 30000, 3, 10)
    assert [f[: len(hs.RUNS[r])] for f, r in zip(started, runs)] == [hs.RUNS[r] for r in runs]
    assert all(f[-2:] == ["--debug-tensor-dump-output-folder", f"out/dump_{r}"] for f, r in zip(started, runs))
    assert envs == [{"SNAPMLA_EXTEND_ROUTE": "mha"}, None]  # each run's server environment (harness.server.RUN_ENV)
    assert res["flashmla"]["probe_logprobs"] == [None] * 3
    assert res["snapmla-mha"]["passes"][0]["first_non_finite"] == "model.layers.0.mlp.experts"
    assert (out / "nan_origin.json").exists()
    assert res["flashmla"]["first_non_finite_pass"]["first_non_finite"] == "model.layers.0.mlp.experts"
    assert (out / "first_non_finite_flashmla.pt").exists()


def test_the_excerpt_keeps_the_first_non_finite_pass_up_to_its_first_bad_operator(dump, tmp_path):
    dest = tmp_path / "first.pt"
    found = nan_origin.excerpt(dump, nan_origin.report(dump), dest, before=2)
    assert found["pass"] == "TP0_PP0_Rank0_pid1/Pass00001.pt"  # the first pass holding one, not Pass00000
    assert found["first_non_finite"] == "model.layers.1.self_attn.o_proj"
    assert [o["name"] for o in found["operators"]][0] == "model.embed_tokens"  # the previous pass's entries skipped
    assert [o["non_finite"] > 0 for o in found["operators"]] == [False] * 3 + [True] * 3
    kept = torch.load(dest, weights_only=False)
    assert list(kept) == ["model.forward_batch_info.input_ids", "model.forward_batch_info.positions",
                          "model.layers.0.self_attn.o_proj", "model.layers.0.mlp.experts",
                          "model.layers.1.self_attn.o_proj", "model.layers.1.mlp.experts"]
    assert nan_origin.excerpt(dump, nan_origin.report(dump), tmp_path / "none.pt", before=2) is not None
    clean = tmp_path / "clean" / "r"
    clean.mkdir(parents=True)
    torch.save(_pass(None, None), clean / "Pass00000.pt")
    assert nan_origin.excerpt(clean.parent, nan_origin.report(clean.parent), tmp_path / "clean.pt") is None
    assert not (tmp_path / "clean.pt").exists()
