"""A prefill/decode pair of snapmla servers on one host gives the greedy outputs of one snapmla server, and a decode
server with another KV layout is refused at the pair's handshake (GPU host, runtime active, 2 GPUs or 1).

    python -m tools.check_pd_pair --model CKPT --out pd_out            # CKPT: tools/train_tiny_mla.py's checkpoint
    python -m tools.check_pd_pair --model configs/models/deepseek-v2-lite-shape --load-format dummy --out pd_out

Servers, all started at once (the last GPU of CUDA_VISIBLE_DEVICES decodes, the first prefills):
  single   : snapmla, first GPU (the reference: prefill and decode in one server)
  prefill  : snapmla --disaggregation-mode prefill, first GPU; its bootstrap server on --bootstrap-port
  decode   : snapmla --disaggregation-mode decode, last GPU
  mismatch : flashmla BF16 (page size 64, as snapmla) --disaggregation-mode decode, last GPU
Transfer: `--transfer-backend` (default mooncake_tcp: Mooncake's TCP transport, GPU memory staged through host memory,
no RDMA device needed). The prompt's pages travel as the pool's three arrays per layer (FP8 content, fp32 scales,
BF16 RoPE: SnapMLAPool.get_contiguous_buf_infos), and the decode server's kernel reads them.

A request to the pair is what SGLang's router sends: the same /generate body, with `bootstrap_host`, `bootstrap_port`
and a fresh `bootstrap_room`, posted to the prefill and the decode server at once; the decode server's answer is the
output. Prompts: the checkpoint's held-out prompts and held-out windows cut to 1-16 pages (random token ids from the
config's vocabulary with dummy weights), NEW_TOKENS greedy tokens each.
  sequential : one prompt at a time through the pair and through `single`: every output must be identical (the
               same kernels on the same batch, so bit-equal logits)
  concurrent : all prompts at once through the pair, against `single`'s sequential outputs, beside the single
               server's own outputs at once against one at a time (batching alone moves near-ties: reported, not gated)
Radix caches are flushed before each pass: a prompt is prefilled from fresh latents on both sides.
  mismatch   : one request to prefill + mismatch: the mismatch server must refuse it with SGLang's
               "KV cache dtype mismatch" error naming snapmla's layout (plugin.KV_LAYOUT)
Prints a table, writes pd_pair.json; exits 1 when the sequential outputs differ or the mismatch is not refused.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness.server import (RUNS, flush_cache, greedy_generate, kill_servers_on_exit, start_server, stop_server,
                            wait_healthy)
from sglang_snapmla.plugin import KV_LAYOUT

NEW_TOKENS = 32
PAGE = 64
MISMATCH_ERROR = "KV cache dtype mismatch"
# a small pool: every server here shares its GPU with others, and the prompts need a few thousand tokens
POOL_FLAGS = ["--max-total-tokens", "65536", "--mem-fraction-static", "0.3"]
REFUSAL_TIMEOUT = 120  # s for the mismatch server to log the refusal (it comes at the request's first handshake)


def prompts(model: Path, load_format: str, seed: int = 0) -> list[list[int]]:
    """Held-out prompts and windows cut to 1..16 pages (trained checkpoint), or random ids of the same lengths."""
    lengths = [PAGE - 7, PAGE + 1, 3 * PAGE, 5 * PAGE + 17, 8 * PAGE, 11 * PAGE + 40, 16 * PAGE - 1]
    held = model / "heldout.json"
    if load_format != "dummy" and held.exists():
        h = json.loads(held.read_text())
        windows = [w[:n] for w, n in zip(h["ppl_windows"], lengths * 4) if len(w) >= n]
        return h["prompts"][:16] + windows
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(n)] for n in lengths * 3]


def bootstrap(bootstrap_port: int, room: int) -> dict:
    """The /generate fields that join a request's prefill and decode halves (what SGLang's router adds)."""
    return {"bootstrap_host": "127.0.0.1", "bootstrap_port": bootstrap_port, "bootstrap_room": room}


def through_pair(prefill_port: int, decode_port: int, bootstrap_port: int, ids: list[int], room: int,
                 timeout: float = 300) -> dict:
    """One request through the pair: the same body (with the bootstrap fields) to both servers at once; the decode
    server's answer."""
    pd = bootstrap(bootstrap_port, room)
    with ThreadPoolExecutor(2) as ex:
        prefill = ex.submit(greedy_generate, prefill_port, ids, NEW_TOKENS, timeout, **pd)
        decode = ex.submit(greedy_generate, decode_port, ids, NEW_TOKENS, timeout, **pd)
        out = decode.result()
        prefill.result()
    return out


def refusal(log_path: Path, proc, timeout: float) -> str | None:
    """The mismatch server's log line that names the KV layout mismatch, or None if none came within `timeout` s
    (or the server exited without one)."""
    def found():
        return next((ln.strip() for ln in log_path.read_text(errors="replace").splitlines() if MISMATCH_ERROR in ln),
                    None)

    t0 = time.time()
    while time.time() - t0 < timeout:
        exited = proc.poll() is not None
        time.sleep(1)  # after an exit: the log's last lines
        if (line := found()) or exited:
            return line
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--load-format", default="auto", help="auto (a trained checkpoint) or dummy (a bundled config)")
    ap.add_argument("--context-length", type=int, default=4096)
    ap.add_argument("--transfer-backend", default="mooncake_tcp")
    ap.add_argument("--gpus", type=int, default=2, help="GPUs visible: 2 (prefill on the first, decode on the "
                                                         "second) or 1 (all on one)")
    ap.add_argument("--port", type=int, default=26000, help="single, prefill, decode, mismatch on port + 20 i")
    ap.add_argument("--bootstrap-port", type=int, default=8998)
    ap.add_argument("--startup-timeout", type=float, default=900)
    ap.add_argument("--out", type=Path, default=Path("pd_out"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    kill_servers_on_exit()
    decode_gpu = args.gpus - 1
    pd = ["--disaggregation-transfer-backend", args.transfer_backend,
          "--disaggregation-bootstrap-port", str(args.bootstrap_port), "--host", "127.0.0.1"]
    setups = {
        "single": [*RUNS["snapmla"], *POOL_FLAGS],
        "prefill": [*RUNS["snapmla"], *POOL_FLAGS, *pd, "--disaggregation-mode", "prefill", "--base-gpu-id", "0"],
        "decode": [*RUNS["snapmla"], *POOL_FLAGS, *pd, "--disaggregation-mode", "decode",
                   "--base-gpu-id", str(decode_gpu)],
        "mismatch": [*RUNS["flashmla"], *POOL_FLAGS, *pd, "--disaggregation-mode", "decode",
                     "--base-gpu-id", str(decode_gpu)],
    }
    ports = {name: args.port + 20 * i for i, name in enumerate(setups)}
    # Mooncake's TCP transport on one host (SGLang's own PD test setup): loopback addresses, pooled connections
    env = {"MC_TCP_ENABLE_CONNECTION_POOL": "true", "SGLANG_HOST_IP": "127.0.0.1"}
    servers, result = {}, {"transfer_backend": args.transfer_backend, "gpus": args.gpus, "model": str(args.model),
                           "load_format": args.load_format}
    t0 = time.time()
    for name, flags in setups.items():
        servers[name] = start_server(str(args.model), ports[name], flags, args.out / f"server_{name}.log",
                                     load_format=args.load_format, context_length=args.context_length, env=env)
    try:
        for name, (proc, _) in servers.items():
            wait_healthy(ports[name], proc, args.startup_timeout)
        result["startup_s"] = round(time.time() - t0, 1)
        todo = prompts(args.model, args.load_format)
        warm = [t + 1 for t in todo[0][:PAGE + 3]]  # warm-up (JIT builds) on a prompt that shares no page with them
        greedy_generate(ports["single"], warm, 4)
        through_pair(ports["prefill"], ports["decode"], args.bootstrap_port, warm, room=1)
        rooms = iter(range(1000, 10**9))

        def pair(ids):
            return through_pair(ports["prefill"], ports["decode"], args.bootstrap_port, ids, next(rooms))["output_ids"]

        def single(ids):
            return greedy_generate(ports["single"], ids, NEW_TOKENS)["output_ids"]

        def each(fn, at_once: bool):
            """fn over the prompts, one at a time or all at once, from empty radix caches (every prompt prefilled
            from fresh latents, in the pair and in the single server alike)."""
            for name in ("single", "prefill"):
                try:
                    flush_cache(ports[name])
                except OSError as e:  # noted: a prefix hit then differs from a fresh prefill in FP8 rounding
                    result.setdefault("flush_refused", []).append(f"{name}: {e}")
            if not at_once:
                return [fn(ids) for ids in todo]
            with ThreadPoolExecutor(len(todo) * 2) as ex:
                return list(ex.map(fn, todo))

        ref, seq = each(single, False), each(pair, False)
        conc, single_conc = each(pair, True), each(single, True)

        def agreement(outs):
            return sum(x == y for a, b in zip(outs, ref) for x, y in zip(a, b)) / sum(len(b) for b in ref)

        result |= {
            "prompt_tokens": [len(p) for p in todo],
            "sequential_identical": sum(a == b for a, b in zip(seq, ref)),
            "concurrent_identical": sum(a == b for a, b in zip(conc, ref)),
            "token_agreement_concurrent": agreement(conc),
            "single_concurrent_identical": sum(a == b for a, b in zip(single_conc, ref)),
            "single_token_agreement_concurrent": agreement(single_conc),
            "outputs": {"single": ref, "pair_sequential": seq, "pair_concurrent": conc,
                        "single_concurrent": single_conc},
        }
        # the other layout: a request through prefill + mismatch must be refused at the handshake; the refused
        # request never completes, so its two halves are posted from daemon threads and the log is what is read
        proc, _ = servers["mismatch"]
        for port in (ports["prefill"], ports["mismatch"]):
            threading.Thread(target=_post_ignoring_errors, daemon=True,
                             args=(port, args.bootstrap_port, todo[0], 7)).start()
        result["mismatch_refusal"] = refusal(args.out / "server_mismatch.log", proc, timeout=REFUSAL_TIMEOUT)
    except Exception as e:  # reported in the table and the JSON; the server logs say more
        result["error"] = repr(e)[:500]
    finally:
        for proc_log in servers.values():
            stop_server(*proc_log)
    (args.out / "pd_pair.json").write_text(json.dumps(result))
    return 0 if report(result) else 1


def report(result: dict) -> bool:
    """Print the table; True when the pair passes (every one-at-a-time output identical, the mismatch refused)."""
    n = len(result.get("prompt_tokens", []))
    refused = result.get("mismatch_refusal") or ""
    ok = "error" not in result and result["sequential_identical"] == n and KV_LAYOUT in refused
    lengths = result.get("prompt_tokens", [0])
    gpus = "prefill GPU 0, decode GPU 1" if result["gpus"] > 1 else "one GPU"
    print(f"\nPD pair ({result['transfer_backend']}, {gpus}), model {result['model']}, {n} prompts of "
          f"{min(lengths)}-{max(lengths)} tokens x {NEW_TOKENS} greedy tokens")
    print("| check | result |\n|---|---|")
    if "error" in result:
        print(f"| error | {result['error']} |")
    else:
        print(f"| servers up (all four, process to /health) | {result['startup_s']} s |")
        print(f"| pair = single server, one request at a time | {result['sequential_identical']}/{n} identical |")
        print(f"| pair, all at once, vs single | {result['concurrent_identical']}/{n} identical, token agreement "
              f"{result['token_agreement_concurrent']:.4f} |")
        print(f"| single server, all at once, vs itself one at a time (batching alone) | "
              f"{result['single_concurrent_identical']}/{n} identical, token agreement "
              f"{result['single_token_agreement_concurrent']:.4f} |")
        print(f"| flashmla BF16 decode server behind snapmla prefill | {refused or 'NOT refused'} |")
    print("PASS" if ok else "FAIL")
    return ok


def _post_ignoring_errors(port: int, bootstrap_port: int, ids: list[int], room: int) -> None:
    """One half of a pair request whose other half is refused: it fails or hangs by design."""
    try:
        greedy_generate(port, ids, NEW_TOKENS, timeout=120, **bootstrap(bootstrap_port, room))
    except Exception:
        pass


if __name__ == "__main__":
    sys.exit(main())
