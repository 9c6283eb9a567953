"""Serving runs for benchmarks and tools: the named server setups (RUNS), starting and stopping an SGLang server in
its own process group, and the few HTTP calls every measurement makes.

    from harness.server import RUNS, start_server, wait_healthy, stop_server, greedy_generate, stream_generate

Not part of the shipped package: `benchmarks/` and `tools/` share it (python -m from the repository root).
"""

from __future__ import annotations

import atexit
import errno
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

RUNS = {
    "snapmla": ["--attention-backend", "snapmla"],
    "snapmla-fp8flag": ["--attention-backend", "snapmla", "--kv-cache-dtype", "fp8_e4m3"],
    "flashmla": ["--attention-backend", "flashmla", "--page-size", "64"],
    "flashmla-fp8": ["--attention-backend", "flashmla", "--page-size", "64", "--kv-cache-dtype", "fp8_e4m3"],
    "triton": ["--attention-backend", "triton", "--page-size", "64"],
    # FlashInfer's MLA over an FP8 pool: SGLang 0.5.17's backend casts the layer's whole pool to BF16 on every decode
    # step and prefix extend (flashinfer_mla_backend.py), a BF16 decode over a per-step copy of FP8-rounded keys
    "flashinfer-fp8": ["--attention-backend", "flashinfer", "--kv-cache-dtype", "fp8_e4m3"],
}
MTP = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
       "--speculative-num-draft-tokens", "3"]  # DeepSeek's MTP layer as the draft: target verify with s_q = 3
RUNS |= {f"{run}-mtp": [*RUNS[run], *MTP] for run in ("snapmla", "flashmla", "flashmla-fp8")}
# FlashMLA with every prefix prefill through MHA, as the snapmla plugin routes them: SGLang's DeepSeek handler sends
# an extend batch whose cached prefix sums to < 8192 tokens (every chunked-prefill tail at in 4096) to absorbed MLA
# for flashmla, which at 128 heads costs ~3.4x MHA's FLOPs (docs/BENCHMARKS.md). The same decode and
# pool as `flashmla`; isolates the decode's share of a throughput ratio.
RUNS["flashmla-mhaprefill"] = RUNS["flashmla"]
# the hierarchical cache: evicted prefix pages kept in host memory (4x the device pool) and loaded back on a hit
HICACHE = ["--enable-hierarchical-cache", "--hicache-ratio", "4"]
RUNS |= {f"{run}-hicache": [*RUNS[run], *HICACHE] for run in ("snapmla", "flashmla", "flashmla-fp8")}
# host records moved by the record kernels (the default, named) or by the torch copies
RUNS["snapmla-hicache-kernels"] = RUNS["snapmla-hicache-copies"] = RUNS["snapmla-hicache"]
RUNS["snapmla-triton"] = RUNS["snapmla"]  # snapmla with its Triton decode instead of the sm_90a one
# snapmla with every prefill over a cached prefix on MHA outside captured prefill graphs (the route model off)
RUNS["snapmla-mha"] = RUNS["snapmla"]
# snapmla computing FlashMLA's tile schedule every step, as SGLang's flashmla backend does (it never reads it)
RUNS["snapmla-flashmla-schedule"] = RUNS["snapmla"]
# Servers side by side serve PORT_STRIDE apart: SGLang derives a server's other ports from its HTTP port (under DP
# attention its ZMQ and torch.distributed ports from port + 233 up to ~port + 260), so their ranges must not overlap
PORT_STRIDE = 100
RUN_ENV = {"flashmla-mhaprefill": {"SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD": "1"},  # run -> server environment
           "snapmla-triton": {"SNAPMLA_DECODE_IMPL": "triton"}, "snapmla-mha": {"SNAPMLA_EXTEND_ROUTE": "mha"},
           "snapmla-hicache-kernels": {"SNAPMLA_HICACHE_COPIES": "kernels"},
           "snapmla-hicache-copies": {"SNAPMLA_HICACHE_COPIES": "torch"},
           "snapmla-flashmla-schedule": {"SNAPMLA_FLASHMLA_SCHEDULE": "1"}}
# MTP's return on dummy weights, whose draft is never the target's token (accept length 1.00): SGLang's
# SGLANG_SIMULATE_ACC_LEN makes every verify keep this many tokens a request on average (its "match-expected"
# method: the floor or the ceiling, weighted to this mean) and fills them with one fixed token id, so a step's work
# and the tokens it yields are those of a draft that good while the outputs carry no text. 2.5 of 3: the accept
# length a trained MTP layer reached at 3 draft tokens on every backend (2.51-2.62, docs/BENCHMARKS.md "MTP with a
# trained draft")
MTP_SIMULATED_ACCEPT = "2.5"
for _run in ("snapmla", "flashmla", "flashmla-fp8"):
    RUNS[f"{_run}-mtp-simulated"] = RUNS[f"{_run}-mtp"]
    RUN_ENV[f"{_run}-mtp-simulated"] = {"SGLANG_SIMULATE_ACC_LEN": MTP_SIMULATED_ACCEPT,
                                        "SGLANG_SIMULATE_ACC_METHOD": "match-expected"}
# SGL_USE_DEEPGEMM_BMM=1: SGLang keeps a block-FP8 kv_b_proj's w_kc / w_vc in FP8 and runs the absorbed BMMs on
# DeepGEMM's masked grouped GEMM, whose q_nope output is head-major with rows padded per head (the layout of
# tests/product/test_backend.py's "head_major" case; snapmla's log names the layout it met). SGLang honours it only
# with DeepGEMM's JIT on, which then runs every FP8 GEMM; SGLANG_JIT_DEEPGEMM_PRECOMPILE=0 compiles each kernel at its
# first use instead of for every batch size before the server answers (docs/DEPLOY.md)
DEEPGEMM_BMM_ENV = {"SGL_USE_DEEPGEMM_BMM": "1", "SGLANG_ENABLE_JIT_DEEPGEMM": "1", "SGLANG_JIT_DEEPGEMM_PRECOMPILE": "0"}
for _run in ("snapmla", "flashmla"):
    RUNS[f"{_run}-deepgemm-bmm"] = RUNS[_run]
    RUN_ENV[f"{_run}-deepgemm-bmm"] = DEEPGEMM_BMM_ENV


def json_request(port: int, path: str, payload: dict) -> urllib.request.Request:
    """A POST of `payload` as JSON to the local server's `path`."""
    return urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(payload).encode(),
                                  headers={"Content-Type": "application/json"})


def post(port: int, path: str, payload: dict, timeout: float = 120) -> dict:
    with urllib.request.urlopen(json_request(port, path, payload), timeout=timeout) as r:
        return json.loads(r.read())


def flush_cache(port: int, timeout: float = 60) -> None:
    """Empty the server's radix cache (SGLang's /flush_cache; refused while requests run): a measured workload then
    starts without prefix hits left by a warm-up or an earlier workload that used the same seeded prompts."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/flush_cache", data=b"", method="POST")
    urllib.request.urlopen(req, timeout=timeout).close()  # a refusal (HTTP 400) raises HTTPError


def greedy_payload(ids: list[int], new_tokens: int, **extra) -> dict:
    """/generate's body for token ids, greedy, exactly `new_tokens` new tokens (EOS ignored); `extra` joins it."""
    return {"input_ids": ids, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True},
            **extra}


def greedy_generate(port: int, ids: list[int], new_tokens: int, timeout: float = 900, **extra) -> dict:
    """/generate on token ids (`greedy_payload`), the whole answer at once."""
    return post(port, "/generate", greedy_payload(ids, new_tokens, **extra), timeout=timeout)


def stream_generate(port: int, ids: list[int], new_tokens: int, decoding: threading.Event | None = None,
                    rid: str | None = None, timeout: float = 900) -> float:
    """`greedy_generate`, streamed (server-sent events, one per new token), under request id `rid` if given (for
    `abort_request`): sets `decoding` at the first event (the request is prefilled and in the decode batch); returns
    time.monotonic() at the end of the stream (it has left the batch). RuntimeError if the server streams an error."""
    payload = greedy_payload(ids, new_tokens, stream=True, **({"rid": rid} if rid else {}))
    with urllib.request.urlopen(json_request(port, "/generate", payload), timeout=timeout) as r:
        for line in r:
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                break
            # parsed only where it may be an error: an event repeats the output so far (SGLang streams cumulative
            # output ids), and the gate reads hundreds of these streams at once in one Python process
            if b'"error"' in data and "error" in (event := json.loads(data)):
                raise RuntimeError(f"/generate streamed an error: {event['error']}")
            if decoding is not None:
                decoding.set()
    return time.monotonic()


def abort_request(port: int, rid: str, timeout: float = 60) -> None:
    """SGLang's /abort_request for request `rid`: the request leaves the batch at the scheduler's next step and its
    stream ends as a finished one. A rid that has already finished is ignored by the server."""
    # SGLang answers an empty body, so not `post`
    urllib.request.urlopen(json_request(port, "/abort_request", {"rid": rid}), timeout=timeout).close()


def wait_healthy(port: int, proc: subprocess.Popen, timeout: float, poll_s: float = 2) -> float:
    """Seconds until /health answers 200 (polled every `poll_s`); RuntimeError if the server exits first,
    TimeoutError after `timeout`."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return time.time() - t0
        except Exception:
            pass
        time.sleep(poll_s)
    raise TimeoutError("server not healthy in time")


_live_servers: set[int] = set()


def _kill_live_servers(*_):
    """Servers run in their own process group; a killed benchmark must not leave one holding the GPU."""
    for pgid in list(_live_servers):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _live_servers.clear()


def kill_servers_on_exit() -> None:
    """Whatever ends the script (return, exception, SIGTERM from a timeout), no server outlives it."""
    atexit.register(_kill_live_servers)
    signal.signal(signal.SIGTERM, lambda *a: (_kill_live_servers(), sys.exit(143)))


# the two documented ways to start a server (README): the module, and the `sglang` CLI's `serve` subcommand, which
# loads plugins at another point (tests/product/test_plugin.py). Where the console script is not installed (a --target
# runtime), the CLI runs as its script does: sglang.cli.main.main with argv "serve ...".
LAUNCHERS = ("launch_server", "sglang-serve")


def server_command(model: str, port: int, flags: list[str], load_format: str = "dummy", context_length: int = 32768,
                   launcher: str = "launch_server") -> list[str]:
    """The server's command line: `python -m sglang.launch_server ...` or `sglang serve ...` (LAUNCHERS)."""
    if launcher == "launch_server":
        head = [sys.executable, "-m", "sglang.launch_server"]
    elif launcher == "sglang-serve":
        cli = shutil.which("sglang")
        head = [cli, "serve"] if cli else [sys.executable, "-c", "from sglang.cli.main import main; main()", "serve"]
    else:
        raise ValueError(f"unknown launcher {launcher!r}; one of {LAUNCHERS}")
    return [*head, "--model-path", model, "--load-format", load_format, "--context-length", str(context_length),
            "--mem-fraction-static", "0.80", "--grammar-backend", "none", "--port", str(port), *flags]


def check_port_free(port: int) -> None:
    """RuntimeError naming the fix if a server could not bind `port`: SGLang's HTTP server then fails to bind while
    its scheduler starts anyway, and the run dies minutes later at the warm-up. The tools' default ports lie below
    Linux's ephemeral range (32768-60999), where any outgoing connection on the host (another server's NCCL or ZMQ
    sockets, a client's requests) may hold a port."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a closed connection's port is free
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise RuntimeError(f"port {port} is in use on this host; pass another --port (below 32768, outside "
                                   "the ports outgoing connections take)") from e


def model_config(model: str) -> dict:
    """The model folder's config.json, {} where it has none (a hub id, or a folder without one)."""
    path = Path(model) / "config.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def block_fp8_config(model: str) -> bool:
    """Whether the model folder's config ships block-FP8 weights (`quantization_config`: fp8 with a
    weight_block_size), as DeepSeek-V3/R1 and Kimi-K2 do."""
    from sglang_snapmla.block_fp8 import block_fp8_quantization

    return block_fp8_quantization(model_config(model).get("quantization_config"))


def top1_moe_refusal(model: str, release: str) -> str | None:
    """Why `model` cannot be served on SGLang `release`, naming the fix, or None. With top-k 1, SGLang 0.5.17's Triton
    MoE writes the down projection straight into its output and then, for a routed_scaling_factor other than 1,
    rescales a buffer it never wrote: every MoE output is stale memory, NaN where that memory holds NaN, on every
    attention backend alike (`python -m tools.fp8_moe_check` shows it on a GPU). 0.5.23 routes such a factor through
    that buffer. The per-GPU configs' top-1 (one GPU's share of top-8) takes factor 1.0, one multiply of the MoE
    output that a deployment's top-8 fuses into its reduce."""
    cfg = model_config(model)
    factor = cfg.get("routed_scaling_factor")
    if release != "0.5.17" or cfg.get("num_experts_per_tok") != 1 or factor in (None, 1.0):
        return None
    return (f"{Path(model) / 'config.json'}: num_experts_per_tok 1 with routed_scaling_factor {factor}: SGLang "
            "0.5.17's Triton MoE then returns a buffer it never wrote (stale memory, NaN outputs); set "
            "routed_scaling_factor to 1.0 in that config (harness.server.top1_moe_refusal)")


def draft_worker_refusal(flags: list[str], release: str, has_deep_gemm: bool) -> str | None:
    """Why a speculative server cannot start on SGLang `release`, naming the fix, or None. 0.5.17's draft worker
    (speculative/eagle_worker_v2.py, `_capture_cuda_graphs`) imports DeepSeek's sparse-attention backend, which
    imports deep_gemm, for every attention backend and every model, after the weights load and the target's graphs
    are captured: without deep_gemm the server dies minutes into its start. `pip install sglang` brings it
    (sgl-deep-gemm); the GPU hosts' bundled runtime does not (tools/gpu_host/env.sh says how its wheel travels)."""
    if release != "0.5.17" or "--speculative-algorithm" not in flags or has_deep_gemm:
        return None
    return ("--speculative-algorithm: SGLang 0.5.17's draft worker imports deep_gemm when it captures its CUDA graphs, "
            "and it is not importable here; install sgl-deep-gemm==0.1.5.post1 (on a GPU host: its wheel in .whl, "
            "tools/gpu_host/env.sh) (harness.server.draft_worker_refusal)")


def deep_gemm_refusal(model: str, env: dict, has_deep_gemm: bool) -> str | None:
    """Why a server with environment `env` (RUN_ENV) cannot measure what it is for, naming the fix, or None: DeepGEMM's
    JIT asked for where deep_gemm is not importable (SGLang would fall back to Triton's FP8 GEMMs), or
    SGL_USE_DEEPGEMM_BMM=1 on a model without block-FP8 weights (SGLang would run the BF16 BMM it always runs)."""
    if env.get("SGL_USE_DEEPGEMM_BMM") == "1" and not block_fp8_config(model):
        return (f"SGL_USE_DEEPGEMM_BMM=1 changes only a block-FP8 checkpoint's kv_b_proj, and {model} has no block-FP8 "
                "weights: serve a configs/models/*-fp8-* config (harness.server.deep_gemm_refusal)")
    if env.get("SGLANG_ENABLE_JIT_DEEPGEMM") == "1" and not has_deep_gemm:
        return ("SGLANG_ENABLE_JIT_DEEPGEMM=1, but deep_gemm is not importable here: install sgl-deep-gemm==0.1.5.post1 "
                "(on a GPU host: its wheel in .whl, tools/gpu_host/env.sh) (harness.server.deep_gemm_refusal)")
    return None


def simulated_accept_refusal(flags: list[str], env: dict) -> str | None:
    """Why a server with SGLANG_SIMULATE_ACC_LEN in `env` would not measure a draft of that accept length, naming the
    fix, or None: no speculative decoding in `flags` (the variable does nothing), a length outside 1 .. the draft
    tokens a verify checks (SGLang clamps it), or an installed SGLang that does not read it (the dummy draft would
    then be accepted never, silently)."""
    if "SGLANG_SIMULATE_ACC_LEN" not in env:
        return None
    if "--speculative-algorithm" not in flags:
        return ("SGLANG_SIMULATE_ACC_LEN is set for a server without --speculative-algorithm: serve an -mtp run "
                "(harness.server.simulated_accept_refusal)")
    length = float(env["SGLANG_SIMULATE_ACC_LEN"])
    if "--speculative-num-draft-tokens" in flags:  # else SGLang picks the count: the length is checked against it
        drafts = int(flags[flags.index("--speculative-num-draft-tokens") + 1])
        if not 1.0 <= length <= drafts:
            return (f"SGLANG_SIMULATE_ACC_LEN={length:g} is outside 1 .. {drafts}, the tokens a verify checks: pick a "
                    "length in that range (harness.server.simulated_accept_refusal)")
    from sglang.srt.environ import envs

    if not hasattr(envs, "SGLANG_SIMULATE_ACC_LEN"):
        return ("the installed SGLang does not read SGLANG_SIMULATE_ACC_LEN: serve these runs on 0.5.17 or 0.5.23 "
                "(harness.server.simulated_accept_refusal)")
    return None


def dummy_weights_env(model: str, load_format: str) -> dict:
    """The server environment that makes a dummy load of a block-FP8 config draw weights as a deployment's, for every
    backend alike (sglang_snapmla.dummy_weights); empty otherwise."""
    from sglang_snapmla.dummy_weights import DUMMY_WEIGHTS_ENV

    return {DUMMY_WEIGHTS_ENV: "deployment"} if load_format == "dummy" and block_fp8_config(model) else {}


def start_server(model: str, port: int, flags: list[str], log_path: Path, load_format: str = "dummy",
                 context_length: int = 32768, env: dict | None = None, launcher: str = "launch_server"):
    """The server (`server_command`) in its own process group; returns (process, log). Bundled configs have no
    weights (load_format "dummy"); a trained checkpoint passes "auto". env: added to the server's environment
    (RUN_ENV[run]), after `dummy_weights_env`."""
    check_port_free(port)
    from sglang_snapmla.sglang_release import installed

    release = installed()
    has_deep_gemm = importlib.util.find_spec("deep_gemm") is not None
    refused = (top1_moe_refusal(model, release) or draft_worker_refusal(flags, release, has_deep_gemm)
               or deep_gemm_refusal(model, env or {}, has_deep_gemm) or simulated_accept_refusal(flags, env or {}))
    if refused:
        raise ValueError(refused)
    env = {**dummy_weights_env(model, load_format), **(env or {})}
    log = open(log_path, "w")
    cmd = server_command(model, port, flags, load_format, context_length, launcher)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, **env} if env else None)
    proc.cmd = " ".join([*(f"{k}={v}" for k, v in (env or {}).items()), *cmd])
    _live_servers.add(proc.pid)
    return proc, log


def stop_server(proc: subprocess.Popen, log) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the server already exited (e.g. it failed to start: its log says why)
        pass
    _live_servers.discard(proc.pid)
    log.close()


@contextmanager
def serving(model: str, port: int, flags: list[str], log_path: Path, startup_timeout: float, **start_kwargs):
    """A server (`start_server`) that answers /health within `startup_timeout` s, for the block; stopped however the
    block ends (its log then says why it did not start, if it did not)."""
    proc, log = start_server(model, port, flags, log_path, **start_kwargs)
    try:
        wait_healthy(port, proc, startup_timeout)
        yield proc
    finally:
        stop_server(proc, log)
