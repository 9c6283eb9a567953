"""harness/server.py's `serving`: the server every tool measures is stopped however the measurement ends."""

import types
from pathlib import Path

import pytest

from harness import server


@pytest.fixture
def calls(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(server, "start_server", lambda model, port, flags, log_path, **kw: (
        seen.append(("start", port, tuple(flags), kw)) or (types.SimpleNamespace(pid=1), open(log_path, "w"))))
    monkeypatch.setattr(server, "stop_server", lambda proc, log: seen.append(("stop",)) or log.close())
    return seen


def test_serving_starts_waits_and_stops(calls, monkeypatch, tmp_path):
    monkeypatch.setattr(server, "wait_healthy", lambda port, proc, timeout: calls.append(("healthy", timeout)))
    with server.serving("m", 31000, ["--x"], tmp_path / "log", 5.0, load_format="auto") as proc:
        calls.append(("body", proc.pid))
    assert calls == [("start", 31000, ("--x",), {"load_format": "auto"}), ("healthy", 5.0), ("body", 1), ("stop",)]


@pytest.mark.parametrize("fails", ["startup", "measurement"])
def test_serving_stops_the_server_when_anything_fails(calls, monkeypatch, tmp_path, fails):
    def healthy(port, proc, timeout):
        if fails == "startup":
            raise RuntimeError("server exited with 1")

    monkeypatch.setattr(server, "wait_healthy", healthy)
    with pytest.raises(RuntimeError):
        with server.serving("m", 31000, [], tmp_path / "log", 5.0):
            raise RuntimeError("a request failed")
    assert calls[-1] == ("stop",)


def test_a_port_another_socket_holds_is_refused_before_the_server_starts(monkeypatch, tmp_path):
    """start_server checks its HTTP port first: SGLang's server, started on a port another socket holds, fails to bind
    its HTTP server while the scheduler runs on, and dies minutes later at the warm-up. A free port passes."""
    import socket

    started = []
    monkeypatch.setattr(server.subprocess, "Popen", lambda *a, **k: started.append(a) or types.SimpleNamespace(pid=7))
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        with pytest.raises(RuntimeError, match=f"port {taken} is in use.*another --port"):
            server.start_server("m", taken, [], tmp_path / "log")
    assert not started
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    proc, log = server.start_server("m", free, [], tmp_path / "log")
    log.close()
    server._live_servers.discard(proc.pid)
    assert len(started) == 1


def test_a_speculative_server_without_deep_gemm_is_refused_on_0_5_17_before_it_starts(monkeypatch, tmp_path):
    """SGLang 0.5.17's draft worker imports deep_gemm when it captures its graphs, minutes into the start, for every
    backend: start_server refuses such a server at once, naming the wheel. Without --speculative-algorithm, with
    deep_gemm importable, or on 0.5.23, nothing is refused."""
    import sglang_snapmla.sglang_release as release

    mtp = server.RUNS["flashmla-mtp"]
    assert server.draft_worker_refusal(mtp, "0.5.17", has_deep_gemm=True) is None
    assert server.draft_worker_refusal(server.RUNS["flashmla"], "0.5.17", has_deep_gemm=False) is None
    assert server.draft_worker_refusal(mtp, "0.5.23", has_deep_gemm=False) is None
    started = []
    monkeypatch.setattr(server.subprocess, "Popen", lambda *a, **k: started.append(a) or types.SimpleNamespace(pid=7))
    monkeypatch.setattr(release, "installed", lambda: "0.5.17")
    monkeypatch.setattr(server.importlib.util, "find_spec", lambda name: None if name == "deep_gemm" else object())
    with pytest.raises(ValueError, match="imports deep_gemm.*sgl-deep-gemm==0.1.5.post1.*.whl"):
        server.start_server("m", free_port(), mtp, tmp_path / "log")
    assert not started


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_saved_json_is_read_plain_or_xz_compressed(tmp_path):
    """harness.results.read_json / stored: NAME.json where it exists, else NAME.json.xz (results/ keeps large JSON so);
    a path given with .xz is read through lzma; load_results resumes from either form."""
    import json
    import lzma

    from harness.results import load_results, read_json, stored

    data = {"m": {"snapmla": {"workloads": {"w": {"total_tok_s": 1.5}}}}}
    xz = tmp_path / "serve_matrix.json.xz"
    with lzma.open(xz, "wt") as f:
        json.dump(data, f)
    plain = tmp_path / "serve_matrix.json"
    assert stored(plain) == xz and read_json(plain) == data and read_json(xz) == data
    assert load_results(plain, None, resume=True) == data
    plain.write_text(json.dumps({"plain": 1}))
    assert stored(plain) == plain and read_json(plain) == {"plain": 1}


def test_results_folder_stays_small():
    """The tracked results stay under 6 MB: large JSON and text compressed, server logs as excerpts (results/README)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "results"
    total = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    assert total <= 6_000_000, f"results/ holds {total / 1e6:.2f} MB"
    limits = {".json": 8_000, ".txt": 4096}  # above these, kept as NAME.json.xz / NAME.txt.xz (results/README)
    plain = [f for f in root.rglob("*") if f.suffix in limits and f.stat().st_size > limits[f.suffix]]
    assert not plain, f"compress with xz -9e: {plain}"


def test_a_server_log_excerpt_keeps_each_traceback_whole():
    """Why a server died stays in its kept log: every traceback from its first line through the exception line, the
    lines around it (access log, CUDA's hint after the exception) left out."""
    from harness import results

    trace = ["[2026-12-03 06:06:54] Scheduler hit an exception: Traceback (most recent call last):",
             '  File "/tmp/sglang-runtime/sglang/srt/models/deepseek_v2.py", line 2180, in forward_core',
             "    return self.forward_normal_one_shot_core(",
             "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
             "",
             '  File "/tmp/sglang-runtime/flashinfer/prefill.py", line 3391, in plan',
             "torch.AcceleratorError: CUDA error: an illegal memory access was encountered"]
    batch = ("[2026-12-03 06:06:53] Prefill batch, #new-seq: 1, #new-token: 8192, #cached-token: 0, token usage: 0.00,"
             " #running-req: 0, #queue-req: 0")
    noise = "[2026-12-03 06:06:52] INFO:     127.0.0.1:5000 - \"POST /generate HTTP/1.1\" 200 OK"
    text = "\n".join([noise, batch, noise, *trace, "Search for `cudaErrorIllegalAddress' in the CUDA docs", noise])
    head, *rest = results.server_log_excerpt(text).splitlines()
    assert rest == [batch, *trace]
    assert "and tracebacks (4 others left out)" in head


def test_a_server_log_excerpt_keeps_what_the_benchmarks_read_back(tmp_path, monkeypatch):
    """`python -m harness.results excerpt`: the kept log gives the same batches, pool size, peak batch and engine
    span as the whole log and keeps its graph capture lines, drops the rest, cuts the server-args line, says what it
    left out, and is written xz-compressed only."""
    import lzma
    import sys

    from harness import results, server_log

    batches = server_log.read_log(Path(__file__).resolve().parents[2] / "results" / "serve" / "burst_h200_unstreamed"
                                  / "server_snapmla.log.xz").splitlines()[1:]
    noise = ["[2026-11-30 02:37:01] INFO:     127.0.0.1:5000 - \"POST /generate HTTP/1.1\" 200 OK", "Warmup ..."]
    whole = [batches[0].replace("server_args=ServerArgs(", "server_args=ServerArgs(" + "x" * 2000), *noise]
    for line in batches[1:]:
        whole += [line, *noise]
    text = "\n".join(whole) + "\n"
    kept = results.server_log_excerpt(text)
    head, args, *rest = kept.splitlines()
    assert rest == batches[1:] and len(args) == results.SERVER_ARGS_CHARS and "server_args=" in args
    assert f"the {len(rest)} lines" in head and f"({2 * len(rest) + 2} others left out)" in head
    for read in (server_log.pool_tokens, server_log.peak_running_requests, server_log.decode_lines,
                 lambda t: server_log.engine_span(t, 100)):
        assert read(kept) == read(text)
    assert server_log.pool_tokens(kept) == 3366464 and server_log.engine_span(kept, 100) is not None
    assert any("decode CUDA graph end" in line for line in rest)
    src, dst = tmp_path / "server.log", tmp_path / "server.log.xz"
    src.write_text(text)
    monkeypatch.setattr(sys, "argv", ["results", "excerpt", str(src), str(dst)])
    results.main()
    assert lzma.decompress(dst.read_bytes()).decode() == kept
    monkeypatch.setattr(sys, "argv", ["results", "excerpt", str(src), str(tmp_path / "plain.log")])
    with pytest.raises(SystemExit):
        results.main()


def test_plots_are_kept_as_palette_pngs_that_look_like_the_figure(tmp_path):
    """harness.results.save_png: the figure rendered at its dpi, stored with at most 256 colours -- under 60 % of
    matplotlib's own PNG's bytes and within a few levels of its pixels -- and `python -m harness.results png` stores
    an existing PNG the same way."""
    import subprocess
    import sys

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from PIL import Image

    from harness.results import save_png
    from helpers import ink_share

    fig, ax = plt.subplots(figsize=(6, 4))
    for k in range(6):
        ax.plot(np.linspace(0, 10, 200), np.sin(np.linspace(0, 10, 200) + k), label=f"run {k}")
    ax.legend()
    ax.set_title("decode step, ms")
    plain, kept = tmp_path / "plain.png", tmp_path / "kept.png"
    fig.savefig(plain, dpi=110)
    assert save_png(fig, kept, dpi=110) == kept
    plt.close(fig)
    with Image.open(plain) as a, Image.open(kept) as b:
        assert b.mode == "P" and a.size == b.size
        diff = np.abs(np.asarray(a.convert("RGB"), dtype=int) - np.asarray(b.convert("RGB"), dtype=int))
    assert diff.mean() < 1.0 and kept.stat().st_size < 0.6 * plain.stat().st_size, (diff.mean(), kept.stat().st_size)
    subprocess.run([sys.executable, "-m", "harness.results", "png", str(plain)], check=True,
                   cwd=Path(__file__).resolve().parents[2])
    with Image.open(plain) as again:
        assert again.mode == "P"
    # the tests' check that a plot was drawn tells these six lines from empty axes of the same size
    blank_fig, _ = plt.subplots(figsize=(6, 4))
    blank = save_png(blank_fig, tmp_path / "blank.png", dpi=110)
    plt.close(blank_fig)
    assert ink_share(blank) < 0.05 < ink_share(kept), (ink_share(blank), ink_share(kept))


def test_a_deepgemm_bmm_run_is_refused_where_it_would_not_run_deepgemm(monkeypatch, tmp_path):
    """The -deepgemm-bmm runs set DeepGEMM's JIT and SGL_USE_DEEPGEMM_BMM=1 for the server; start_server refuses one
    whose model has no block-FP8 weights (SGLang would keep its BF16 BMM) or where deep_gemm is not importable (its
    FP8 GEMMs would stay on Triton), before anything starts. A block-FP8 config with deep_gemm starts."""
    import sglang_snapmla.sglang_release as release

    env = server.RUN_ENV["snapmla-deepgemm-bmm"]
    assert server.RUNS["snapmla-deepgemm-bmm"] == server.RUNS["snapmla"]
    assert env == server.RUN_ENV["flashmla-deepgemm-bmm"] and env["SGLANG_JIT_DEEPGEMM_PRECOMPILE"] == "0"
    models = Path(__file__).resolve().parents[2] / "configs/models"
    fp8, bf16 = str(models / "deepseek-v3-fp8-tp8"), str(models / "deepseek-v3-shape")
    assert server.deep_gemm_refusal(fp8, env, has_deep_gemm=True) is None
    assert server.deep_gemm_refusal(fp8, {}, has_deep_gemm=False) is None
    started = []
    monkeypatch.setattr(server.subprocess, "Popen", lambda *a, **k: started.append(k["env"]) or
                        types.SimpleNamespace(pid=7))
    monkeypatch.setattr(release, "installed", lambda: "0.5.17")
    spec = {"deep_gemm": None}
    monkeypatch.setattr(server.importlib.util, "find_spec", lambda name: spec.get(name, object()))
    with pytest.raises(ValueError, match="not importable here: install sgl-deep-gemm"):
        server.start_server(fp8, free_port(), server.RUNS["snapmla-deepgemm-bmm"], tmp_path / "log", env=env)
    spec["deep_gemm"] = object()
    with pytest.raises(ValueError, match=f"{bf16} has no block-FP8 weights"):
        server.start_server(bf16, free_port(), server.RUNS["snapmla-deepgemm-bmm"], tmp_path / "log", env=env)
    assert not started
    server.start_server(fp8, free_port(), server.RUNS["snapmla-deepgemm-bmm"], tmp_path / "log", env=env)
    assert started and started[0]["SGL_USE_DEEPGEMM_BMM"] == "1" and started[0]["SGLANG_ENABLE_JIT_DEEPGEMM"] == "1"
    server._live_servers.clear()


def test_a_simulated_accept_length_is_refused_where_it_would_not_apply(monkeypatch, tmp_path):
    """The -mtp-simulated runs serve MTP with SGLANG_SIMULATE_ACC_LEN (a dummy draft is never accepted): start_server
    refuses the variable on a server without a draft or with a length a verify of its draft tokens cannot reach,
    before anything starts; the installed SGLang reads it."""
    from sglang.srt.environ import envs

    env = server.RUN_ENV["snapmla-mtp-simulated"]
    flags = server.RUNS["snapmla-mtp-simulated"]
    assert flags == server.RUNS["snapmla-mtp"] and hasattr(envs, "SGLANG_SIMULATE_ACC_LEN")
    assert 1 < float(env["SGLANG_SIMULATE_ACC_LEN"]) <= int(flags[flags.index("--speculative-num-draft-tokens") + 1])
    assert server.simulated_accept_refusal(flags, env) is None
    assert server.simulated_accept_refusal(server.RUNS["snapmla"], {}) is None
    assert "without --speculative-algorithm" in server.simulated_accept_refusal(server.RUNS["snapmla"], env)
    assert "outside 1 .. 3" in server.simulated_accept_refusal(flags, {"SGLANG_SIMULATE_ACC_LEN": "3.5"})
    started = []
    monkeypatch.setattr(server.subprocess, "Popen", lambda *a, **k: started.append(k["env"]) or
                        types.SimpleNamespace(pid=7))
    monkeypatch.setattr(server.importlib.util, "find_spec", lambda name: object())
    bf16 = str(Path(__file__).resolve().parents[2] / "configs/models/deepseek-v3-shape")
    with pytest.raises(ValueError, match="without --speculative-algorithm"):
        server.start_server(bf16, free_port(), server.RUNS["snapmla"], tmp_path / "log", env=env)
    assert not started
    server.start_server(bf16, free_port(), flags, tmp_path / "log", env=env)
    assert started[0]["SGLANG_SIMULATE_ACC_LEN"] == env["SGLANG_SIMULATE_ACC_LEN"]
    server._live_servers.clear()
