"""tools/fp8_outlier_sweep.py on the CPU: the points and the control checkpoint, the kernel-level measurement (SnapMLA
spec path), the metrics against the reference run, and the report of a saved sweep."""

import argparse
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tools import fp8_outlier_sweep as sweep
from harness import reparameterize
from tools.train_tiny_mla import model_config
from helpers import ink_share

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def points(tmp_path_factory):
    from transformers import DeepseekV3ForCausalLM

    torch.manual_seed(0)
    args = argparse.Namespace(hidden=64, layers=2, heads=2, experts=2, seq_len=64)
    base = tmp_path_factory.mktemp("sweep") / "base"
    DeepseekV3ForCausalLM(model_config(args, vocab=256, bos=0, eos=1)).save_pretrained(base, safe_serialization=True)
    return sweep.make_points(base, base.parent / "points", [1.0, 1024.0], 16.0), base


@pytest.fixture
def model(points, tmp_path):
    """The base checkpoint as the sweep reads it: its files and a heldout.json of three windows."""
    _, base = points
    model = tmp_path / "model"
    model.mkdir()
    for f in base.iterdir():
        (model / f.name).symlink_to(f)
    (model / "heldout.json").write_text(json.dumps({"ppl_windows": [[1, 2, 3]] * 3}))
    return model


def test_points_and_control(points):
    pts, base = points
    assert list(pts) == [sweep.ORIGINAL, "alpha=1", "alpha=1024"]
    assert json.loads((pts["alpha=1024"] / reparameterize.RECORD).read_text())["latent_spread"] == 16.0
    control = sweep.make_control(base, base.parent / "points")
    a, c = load_file(str(base / reparameterize.WEIGHTS)), load_file(str(control / reparameterize.WEIGHTS))
    p = "model.layers.0.self_attn."
    assert torch.equal(c[p + "kv_a_proj_with_mqa.weight"][512:], 8 * a[p + "kv_a_proj_with_mqa.weight"][512:])
    assert torch.equal(c[p + "q_b_proj.weight"], a[p + "q_b_proj.weight"])  # uncompensated: another model


def test_kernel_level_sees_the_magnitudes_and_snapmla_does_not_depend_on_alpha(points, gen):
    """alpha scales the RoPE key the cache meets exactly (powers of two), pushes values past torch's fp8 NaN bound,
    and leaves SnapMLA's decode error unchanged to the last bit (content scales from content alone, RoPE in bf16)."""
    pts, _ = points
    windows = torch.randint(0, 256, (2, 128), generator=gen).tolist()
    res = {name: sweep.kernel_level(path, windows, paths=("snapmla-spec",)) for name, path in pts.items()}
    for r1, r2 in zip(res["alpha=1"]["ranges"], res["alpha=1024"]["ranges"]):
        assert r2["k_rope_amax"] == 1024 * r1["k_rope_amax"]
        assert r1["k_nan_in_fp8_cast"] == 0 and r2["k_nan_in_fp8_cast"] > 0
        assert r2["q_rope_subnormal_in_fp8"] > r1["q_rope_subnormal_in_fp8"]
    assert res["alpha=1"]["errors"] == res["alpha=1024"]["errors"]
    err = res["alpha=1"]["errors"]["snapmla-spec"]
    assert all(0 < e["rel_l2"] < 0.1 and e["nan_rows"] == 0 for e in err)


def test_latent_sweep_shrinks_the_latent_and_snapmla_does_not_depend_on_beta(points, gen, tmp_path):
    """beta scales the latent the cache meets exactly (powers of two), puts it under FP8's normal range, and leaves
    SnapMLA's decode error unchanged to the last bit (per-token scales follow the latent, the query's its own)."""
    _, base = points
    pts = sweep.make_points(base, tmp_path, [], 1.0, [1 / 256, 1.0])
    assert list(pts) == [sweep.ORIGINAL, "beta=1/256", "beta=1"]
    windows = torch.randint(0, 256, (2, 128), generator=gen).tolist()
    res = {name: sweep.kernel_level(pts[name], windows, paths=("snapmla-spec",)) for name in ("beta=1/256", "beta=1")}
    for small, one in zip(res["beta=1/256"]["ranges"], res["beta=1"]["ranges"]):
        assert small["c_kv_amax"] == one["c_kv_amax"] / 256
        assert small["c_kv_subnormal_in_fp8"] > one["c_kv_subnormal_in_fp8"]
    def relative(r):  # the absolute rmse scales with the latent
        return [(e["rel_l2"], e["one_minus_cos"], e["nan_rows"]) for e in r["errors"]["snapmla-spec"]]

    assert relative(res["beta=1/256"]) == relative(res["beta=1"])
    table = sweep.format_kernel({name: {"ranges": r["ranges"],
                                        "errors": dict.fromkeys(sweep.PATHS, r["errors"]["snapmla-spec"])}
                                 for name, r in res.items()})
    assert "| c_KV below 2^-6 |" in table and table.count("\n| beta=") == 2


def test_no_runs_measures_the_kernel_level_only(model, tmp_path, monkeypatch, capsys):
    """`--runs` with no run and `--kernel-level`: every point's kernel level, a table and a plot, no server started;
    with neither, a clear error."""
    layer = {"ranges": [{"k_rope_amax": 1.0, "c_kv_amax": 2.0, "q_amax": 3.0, "k_nan_in_fp8_cast": 0.0,
                         "q_rope_subnormal_in_fp8": 0.0, "c_kv_subnormal_in_fp8": 0.5}],
             "errors": {p: [{"rel_l2": 0.01, "one_minus_cos": 1e-4, "nan_rows": 0.0}] for p in sweep.PATHS}}
    measured = []
    monkeypatch.setattr(sweep, "kernel_level", lambda path, windows: measured.append(path) or layer)
    monkeypatch.setattr(sweep, "serve_run", lambda *a, **k: pytest.fail("a server was started"))
    out = tmp_path / "out"
    sweep.main(["--model", str(model), "--out", str(out), "--alphas", "--betas", "0.25", "--runs", "--kernel-level"])
    saved = json.loads((out / "fp8_outlier_sweep.json").read_text())
    assert list(saved["kernel"]) == [sweep.ORIGINAL, "beta=1/4"] and len(measured) == 2 and saved["runs"] == {}
    assert "| beta=1/4 | 1 | 2 | 3 |" in capsys.readouterr().out
    assert ink_share(out / "fp8_outlier_sweep.png") > 0.05
    with pytest.raises(SystemExit):
        sweep.main(["--model", str(model), "--out", str(out), "--runs"])


def _probe(ids, lps):
    return {"ids": ids, "logprobs": lps}


@pytest.mark.parametrize("concurrent", [False, True])
def test_runs_after_the_reference_are_served_side_by_side_with_concurrent(model, tmp_path, monkeypatch, concurrent):
    """The reference run is served alone and first (the others are scored against its continuations); with
    --concurrent the other runs are then served at once, each PORT_STRIDE ports apart, without it one after
    another; a failed run is recorded and the rest still run."""
    import threading
    import time

    live, events = set(), []
    lock = threading.Lock()

    def serve_run(name, pts, control, held, port, log_dir, cont, startup_timeout):
        with lock:
            events.append(("start", name, port, sorted(live), cont))
            live.add(name)
        time.sleep(0.3)  # long enough for a run started beside this one to be seen
        with lock:
            live.discard(name)
        if name == "snapmla-triton":
            raise RuntimeError("server did not start")
        return {"points": {sweep.ORIGINAL: {"continuations": [[7]]} if name == "flashmla" else {}}}

    monkeypatch.setattr(sweep, "serve_run", serve_run)
    monkeypatch.setattr(sweep, "report", lambda results, runs, png: [])
    out = tmp_path / "out"
    sweep.main(["--model", str(model), "--out", str(out), "--alphas", "--port", "31000",
                "--runs", "flashmla", "flashmla-fp8", "snapmla", "snapmla-triton",
                *(["--concurrent"] if concurrent else [])])
    first, *others = events
    assert first == ("start", "flashmla", 31000, [], None)  # alone, and first
    assert sorted(e[2] for e in others) == [31000 + sweep.PORT_STRIDE * i for i in (1, 2, 3)]
    assert all(e[4] == [[7]] for e in others)  # scored against the reference's continuations
    overlapped = any(e[3] for e in others)
    assert overlapped == concurrent
    saved = json.loads((out / "fp8_outlier_sweep.json").read_text())["runs"]
    assert "error" in saved["snapmla-triton"] and all("points" in saved[r] for r in ("flashmla-fp8", "snapmla"))


def test_point_rows_compare_with_the_reference_at_the_same_point():
    ref_probe, near, broken = _probe([1, 2], [-0.5, -1.0]), _probe([1, 2], [-0.6, -1.0]), _probe([7, 7], [None, None])

    def point(ppl, probe, forced, nonfinite=0):
        return {"perplexity": ppl, "nonfinite_positions": nonfinite, "teacher_forced": forced,
                "alone": [probe], f"c{sweep.CONCURRENT}": [probe]}

    cont = [[5, 6, 7, 8]]
    results = {"runs": {
        "flashmla": {"points": {"original": {**point(10.0, ref_probe, [[5, 6, 7, 8]]), "continuations": cont},
                                "alpha=128": point(10.0, ref_probe, [[5, 6, 7, 8]])}},
        "flashmla-fp8": {"points": {"original": {**point(10.1, near, [[5, 6, 7, 0]]),  # a filler left early
                                                 f"c{sweep.CONCURRENT}": [{**near, "fillers": 480,
                                                                           "fillers_running": 479}]},
                                    "alpha=128": point(math.inf, broken, [[-1, -1, -1, -1]], nonfinite=9)}}}}
    rows = {(r["point"], r["run"]): r for r in sweep.point_rows(results, ["flashmla", "flashmla-fp8"])}
    ok, bad = rows[("original", "flashmla-fp8")], rows[("alpha=128", "flashmla-fp8")]
    assert ok["ppl_ratio"] == pytest.approx(1.01) and ok["teacher_forced"] == 0.75
    assert ok["dlogprob_alone"] == pytest.approx(0.05) and ok[f"identical_c{sweep.CONCURRENT}"] == 1
    assert bad["ppl_ratio"] == math.inf and bad["nonfinite_positions"] == 9 and bad["teacher_forced"] == 0
    assert bad["dlogprob_alone"] == math.inf and bad[f"identical_c{sweep.CONCURRENT}"] == 0
    assert rows[("alpha=128", "flashmla")]["dlogprob_alone"] == 0
    assert ok[f"held_c{sweep.CONCURRENT}"] == (479, 480) and bad[f"held_c{sweep.CONCURRENT}"] == (0, 0)
    table = sweep.format_serving(list(rows.values()))
    assert "| alpha=128 | flashmla-fp8 | inf | 9 | 0.0 % | inf | inf | 0/1 |" in table


@pytest.mark.parametrize("heads", [128, 64, 16])
def test_saved_sweep_reports_what_the_docs_quote(heads, tmp_path, capsys):
    """The committed H100 sweep redraws into the tables docs/ACCURACY.md quotes."""
    saved = ROOT / "results" / "accuracy" / f"fp8_outlier_sweep_h{heads}.json.xz"
    copy = tmp_path / saved.name
    copy.write_bytes(saved.read_bytes())
    sweep.main(["--redraw", str(copy)])
    printed = capsys.readouterr().out
    assert ink_share(tmp_path / f"fp8_outlier_sweep_h{heads}.png") > 0.05
    docs = (ROOT / "docs" / "ACCURACY.md").read_text()
    rows = [line for line in printed.splitlines() if line.startswith("| alpha=") or line.startswith("| original")]
    assert len(rows) == {128: 5 + 5 * 4, 64: 2 + 2 * 3, 16: 5 + 5 * 4}[heads]  # h64: the original and alpha=128
    for line in rows:
        assert line in docs, line
