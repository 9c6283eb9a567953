"""benchmarks/startup.py without a server: the goals against flashmla BF16, the table, and the passes' cache
folders (a cold pass starts from empty folders, a warm one from what the cold start left)."""

from pathlib import Path

from benchmarks import startup

LOG = """[2026-11-22 23:41:50] server_args=ServerArgs(model_path='m')
[2026-11-22 23:42:59 TP0] Capture target decode CUDA graph begin. backend=full
[2026-11-22 23:44:06] Engine startup timings (s): load_weight=0.15, kv_cache_allocation=0.03, scheduler_e2e=72.54, \
cuda_graph={{prefill=0.00, decode={graphs}, target_verify=0.00}}, tokenizer_e2e=108.88
[2026-11-22 23:44:08] The server is fired up and ready to roll!
"""


def _row(backend, phase, ready, graphs, model="v3-shape"):
    return {"model": model, "backend": backend, "pass": phase, "ready_s": ready, "first_request_s": 0.4,
            "log": startup.startup_report(LOG.format(graphs=graphs))}


def _goals(rows):
    return {(g["pass"], g["what"]): g for g in startup.goals(rows)}


def test_goals_compare_snapmla_with_flashmla_of_the_same_pass():
    rows = [_row("snapmla", "cold", 250.0, 90.0), _row("flashmla", "cold", 230.0, 99.0),
            _row("snapmla", "warm", 45.0, 12.0), _row("flashmla", "warm", 30.0, 9.0)]
    g = _goals(rows)
    assert g[("cold", "ready difference s")]["value"] == 20.0 and g[("cold", "ready difference s")]["met"]
    assert g[("warm", "decode graphs ratio")]["value"] == 1.33 and g[("warm", "decode graphs ratio")]["met"]
    assert g[("warm", "ready difference s")]["value"] == 15.0 and g[("warm", "ready difference s")]["met"] is False
    text = startup.table(rows)
    assert "| v3-shape | warm | ready difference s | 15.0 | <= 10.0 | **no** |" in text
    # 138 s from the log's first line to ready: 250 - 138 s before it (the process's imports)
    assert "| v3-shape | cold | snapmla | 250.0 | 112.0 | 0.15 | 90.0 | 0.4 |" in text


def test_a_failed_start_leaves_its_goals_open_not_met():
    rows = [{"model": "m", "backend": "snapmla", "pass": "warm", "error": "RuntimeError('server exited with 1')",
             "log": startup.startup_report("")}, _row("flashmla", "warm", 30.0, 9.0, model="m")]
    g = _goals(rows)
    assert g[("warm", "ready difference s")]["met"] is None and g[("cold", "ready difference s")]["value"] is None
    assert "server exited with 1" in startup.table(rows)


def test_cold_pass_empties_each_backends_caches_and_warm_keeps_them(tmp_path, monkeypatch):
    seen = []

    def fake_start(model, backend, gpu, port, caches, phase, flags, out, timeout):
        env = startup.cache_env(caches)
        assert "HOME" in env and all(Path(v).is_relative_to(caches) for v in env.values())  # no default escapes
        leftovers = sorted(p.name for p in caches.rglob("*") if p.is_file())
        seen.append((backend, gpu, port, phase, leftovers))
        Path(env["TRITON_CACHE_DIR"]).mkdir(parents=True, exist_ok=True)
        (Path(env["TRITON_CACHE_DIR"]) / f"kernel_{phase}").write_text("compiled")
        return {"model": model, "backend": backend, "pass": phase}

    monkeypatch.setattr(startup, "start_one", fake_start)
    args = type("A", (), {"caches": tmp_path, "port": 25000, "server_flags": "", "out": tmp_path, "timeout": 1})
    (tmp_path / "snapmla" / "stale").mkdir(parents=True)
    (tmp_path / "snapmla" / "stale" / "old_kernel").write_text("from an earlier model")
    for phase in startup.PASSES:
        startup.run_pass("m", ["snapmla", "flashmla"], ["2", "3"], phase, args)
    assert sorted(seen) == [("flashmla", "3", 25010, "cold", []), ("flashmla", "3", 25010, "warm", ["kernel_cold"]),
                            ("snapmla", "2", 25000, "cold", []), ("snapmla", "2", 25000, "warm", ["kernel_cold"])]
