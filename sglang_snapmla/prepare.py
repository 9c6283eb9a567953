"""Compile once what a snapmla server compiles at its first start, so that an image or a persistent volume carries it
and every replica starts without a compiler and without the JIT wait.

    python -m sglang_snapmla.prepare --model-path deepseek-ai/DeepSeek-V3-0324 --tp 8 --trust-remote-code

Run it where the image is built, on a machine with nvcc and the serving GPUs' architecture, with the flags the
servers will use (any `sglang serve` flags; `--attention-backend snapmla` is added). It starts SGLang's server, which
compiles at its first start (SGLang's FlashInfer and tvm-ffi kernels, the Triton kernels of the decode-graph capture,
snapmla's decode extension where the package carries no prebuilt library), waits for it, sends requests that reach
each prefill path once (a prompt, a prompt over its cached prefix with few and with many new tokens -- the two routes
of `extend.prefers_absorbed` -- a prompt longer than one prefill chunk, a concurrent batch) and the sampler's FlashInfer
kernels (requests with top-k / top-p and with min-p), stops it, and prints the
cache folders it filled with the variables that point a server at them (docs/DEPLOY.md, "Start-up time"). Keep those
folders in the image (or set the variables to a volume): a server started there compiles nothing, provided its
environment names the same CUDA toolkit folder (`CUDA_HOME`, printed at the end; the folder need not exist there):
FlashInfer runs its build step at every start, and it recompiles, with nvcc, any cached kernel whose build command
(which names that folder's nvcc) changed.
Exit status 0 when the server started and answered every request; 1 otherwise, with the tail of its log.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .environment import cache_folders

PROMPT_IDS = range(100, 1100)  # token ids every MLA model's vocabulary holds
PREFIX_TOKENS, FEW_NEW, NEW_TOKENS, BATCH = 2048, 32, 8, 8
# SGLang's sampler takes argmax for a batch of greedy requests only; a request asking top-k, top-p or min-p (and a
# sampled request batched with greedy ones, whose top-k of 1 it then applies) goes through FlashInfer's sampling
# kernels, which FlashInfer builds with nvcc at their first use: on a fresh H200 the server stopped 86 s for it
# (docs/DEPLOY.md, "Start-up time"), and a machine without nvcc cannot build them. One request of each path.
SAMPLED = ({"temperature": 0.8, "top_p": 0.9, "top_k": 20}, {"temperature": 0.8, "min_p": 0.05})


def compiler_home() -> str | None:
    """The CUDA toolkit folder FlashInfer's JIT builds with, by its own rule: CUDA_HOME, CUDA_PATH, else the folder
    above the `nvcc` on PATH (not resolved: the path itself goes into the build commands); None where none is set."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        return home
    nvcc = shutil.which("nvcc")
    return os.path.dirname(os.path.dirname(nvcc)) if nvcc else None


def server_command(server_flags: list[str], port: int) -> list[str]:
    """SGLang's server with the given flags (none naming the backend or the port), snapmla's backend and `port`."""
    return [sys.executable, "-m", "sglang.launch_server", *server_flags, "--attention-backend", "snapmla", "--port",
            str(port)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _call(port: int, path: str, payload: dict | None = None, timeout: float = 600) -> dict:
    data = json.dumps(payload).encode() if payload is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                 headers={"Content-Type": "application/json"} if data else {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        body = r.read()
    return json.loads(body) if body.strip() else {}


def wait_ready(port: int, proc: subprocess.Popen, timeout: float) -> None:
    """Until /health answers 200; RuntimeError if the server exits or `timeout` s pass."""
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with status {proc.returncode} before it answered")
        try:
            _call(port, "/health", timeout=5)
            return
        except (urllib.error.URLError, OSError, ValueError):
            time.sleep(2)
    raise RuntimeError(f"the server did not answer /health within {timeout:.0f} s")


def prompt(n: int, offset: int = 0) -> list[int]:
    return [PROMPT_IDS[(offset + i) % len(PROMPT_IDS)] for i in range(n)]


def generate(port: int, ids: list[int], sampling: dict | None = None) -> None:
    """NEW_TOKENS tokens for `ids`, greedy unless `sampling` gives other sampling parameters."""
    params = {"max_new_tokens": NEW_TOKENS, **(sampling or {"temperature": 0})}
    out = _call(port, "/generate", {"input_ids": ids, "sampling_params": params})
    if "output_ids" not in out and "text" not in out:
        raise RuntimeError(f"/generate answered without output: {str(out)[:200]}")


def warm_requests(port: int, max_prompt: int, chunk: int | None) -> list[str]:
    """The requests that reach each prefill path once; returns what was sent, one line each."""
    sent = []
    prefix = prompt(min(PREFIX_TOKENS, max_prompt // 2))
    for name, ids in (("prompt", prefix),
                      ("cached prefix + few new tokens", prefix + prompt(FEW_NEW, 7)),
                      ("cached prefix + many new tokens", prefix + prompt(min(PREFIX_TOKENS, max_prompt // 2), 13))):
        generate(port, ids)
        sent.append(f"{name}: {len(ids)} tokens")
    if chunk and chunk + 64 <= max_prompt:
        generate(port, prompt(chunk + 64, 29))
        sent.append(f"longer than one prefill chunk: {chunk + 64} tokens")
    with ThreadPoolExecutor(BATCH) as ex:
        list(ex.map(lambda i: generate(port, prompt(64 + 32 * i, 101 * i)), range(BATCH)))
    sent.append(f"{BATCH} concurrent prompts")
    with ThreadPoolExecutor(1 + len(SAMPLED)) as ex:
        list(ex.map(lambda i: generate(port, prompt(96, 53 * i), SAMPLED[i - 1] if i else None),
                    range(1 + len(SAMPLED))))
    sent.append("sampled prompts (top-k and top-p; min-p) beside a greedy one")
    return sent


def server_limits(port: int) -> tuple[int, int | None]:
    """(longest prompt the server takes, its prefill chunk or None) from /server_info (4 096 and None where it does
    not answer)."""
    try:
        info = _call(port, "/server_info", timeout=30)
    except (urllib.error.URLError, OSError, ValueError):
        return 4096 - NEW_TOKENS, None
    max_prompt = info.get("max_req_input_len") or info.get("context_length") or 4096
    chunk = info.get("chunked_prefill_size")
    return int(max_prompt) - NEW_TOKENS, (int(chunk) if chunk and int(chunk) > 0 else None)


def cache_report() -> list[str]:
    lines = ["| cache | variable | folder | MB |", "|---|---|---|---:|"]
    for what, var, folder in cache_folders():
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) if folder.is_dir() else 0
        lines.append(f"| {what} | {var} | {folder} | {size / 1e6:.1f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_snapmla.prepare", description=__doc__.split("\n\n")[0],
                                 epilog="Other arguments go to the server (sglang serve's flags).")
    ap.add_argument("--startup-timeout", type=float, default=1800, help="seconds for the first start (default 1800)")
    ap.add_argument("--server-log", type=Path, help="the server's log (default: a temporary file)")
    # the server flags this command reads itself (in either spelling, --flag value or --flag=value)
    ap.add_argument("--model-path", required=True, help="the checkpoint, as the servers will be given it")
    ap.add_argument("--port", help=argparse.SUPPRESS)
    ap.add_argument("--attention-backend", default="snapmla", help=argparse.SUPPRESS)
    args, server_flags = ap.parse_known_args(argv)
    if args.port is not None:
        ap.error("--port: the preparation picks a free port of its own")
    if args.attention_backend != "snapmla":
        ap.error(f"--attention-backend {args.attention_backend}: this prepares snapmla servers")
    server_flags = ["--model-path", args.model_path, *server_flags]
    cuda_home = compiler_home()
    if cuda_home is None:
        ap.error("no CUDA toolkit found (nvcc on PATH, or CUDA_HOME): run the preparation where the image is built, "
                 "with the toolkit installed")
    port = free_port()
    if args.server_log:
        log_path = args.server_log
    else:
        fd, name = tempfile.mkstemp(prefix="snapmla_prepare_", suffix=".log")
        os.close(fd)
        log_path = Path(name)
    cmd = server_command(server_flags, port)
    print(f"starting: CUDA_HOME={cuda_home}", " ".join(cmd), f"(log: {log_path})", flush=True)
    t0 = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "CUDA_HOME": cuda_home})
        try:
            wait_ready(port, proc, args.startup_timeout)
            print(f"ready after {time.time() - t0:.0f} s", flush=True)
            sent = warm_requests(port, *server_limits(port))
        except (RuntimeError, urllib.error.URLError, OSError) as e:
            tail = log_path.read_text(errors="replace").splitlines()[-30:]
            print(f"sglang-snapmla prepare: {e}\n--- the server log's last lines ---\n" + "\n".join(tail),
                  file=sys.stderr)
            return 1
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
    print("sent: " + "; ".join(sent))
    decode = [line for line in log_path.read_text(errors="replace").splitlines() if "SnapMLA decode:" in line
              or "SnapMLA sm90 CUDA decode unavailable" in line]
    if decode:
        print("decode: " + decode[0].split("] ", 1)[-1])
    print(f"done in {time.time() - t0:.0f} s; the caches this start filled (keep them, or point the variables at a "
          "volume that holds them):")
    print("\n".join(cache_report()))
    print(f"and set CUDA_HOME={cuda_home} where the servers run (the folder need not exist there): FlashInfer's cached "
          "kernels were built with that compiler path, and a server that resolves another one rebuilds them with nvcc")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
