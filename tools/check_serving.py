"""Serving correctness scenarios: radix prefix-cache reuse and chunked prefill give the same greedy outputs as a
server that neither reuses prefixes nor chunks (GPU host, runtime active).

    python -m tools.check_serving --runs snapmla flashmla --out check_out

Per backend two servers are started one after the other (same dummy weights: SGLang seeds the dummy init):
  cached : radix cache on, --chunked-prefill-size 4096 (a 16k prompt is prefilled in 4 chunks, each attending to
           the previous chunks through the pool: fetch-dequant for snapmla)
  plain  : --disable-radix-cache --chunked-prefill-size -1 (every prompt prefilled whole, nothing reused)
Scenarios (token ids drawn with a fixed seed, greedy, 32 new tokens):
  prefix : 32 prompts = one shared 2048-token prefix + 64 distinct tokens; on `cached` they run one at a time after
           the prefix is cached (cached_tokens must be >= 2048), then all 32 at once; on `plain` one at a time
  chunked: one 16384-token prompt
With --hicache a third server per backend runs the hierarchical cache over a small device pool:
  hicache: --enable-hierarchical-cache --hicache-ratio 4 --max-total-tokens HICACHE_POOL (+ --hicache-storage-backend
           file with --hicache-storage): the shared prefix is cached, then distinct prompts of twice the device pool
           (with storage: twice the device and host pools) evict it to host memory (to storage), then the 32 prefix
           prompts run one at a time -- their prefixes come back from host (storage) and their outputs must equal
           the `cached` server's, whose device pool kept the prefix (row `hicache_reload vs cached`; against `plain`
           as the other scenarios too). Cached tokens include host hits; where the server reports them, the host /
           storage share is recorded
Prints a table (identical sequences, token agreement vs `plain`) and writes check_serving.json. With a trained
checkpoint (tools/train_tiny_mla.py; `--load-format auto --context-length 4096 --long-len 3584 --chunk 1024`)
the logits are no longer flat and the comparison becomes a sharp detector. Agreement below
100 % is reported, not hidden: with dummy (random) weights the logits are nearly flat, so any numeric difference
between a prefill from fresh BF16 latents and one from the FP8 pool can flip a greedy choice.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from harness.server import RUNS, greedy_generate, kill_servers_on_exit, serving

NEW_TOKENS = 32
HICACHE_RATIO = 4  # the HiCache server's host pool: 4 x its device pool


def generate(port: int, ids: list[int]) -> dict:
    r = greedy_generate(port, ids, NEW_TOKENS, timeout=600)
    return {"ids": r["output_ids"], "cached": r["meta_info"].get("cached_tokens", 0),
            "cached_details": r["meta_info"].get("cached_tokens_details")}


def flush(port: int) -> None:
    """Empty the radix cache (the endpoint answers plain text, not JSON)."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/flush_cache", data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        if r.status != 200:
            raise RuntimeError(f"/flush_cache answered {r.status}")
    time.sleep(0.5)


def prompts(vocab: int, long_len: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    rand = lambda n: torch.randint(100, vocab - 100, (n,), generator=g).tolist()  # noqa: E731
    prefix = rand(2048)
    return [prefix + rand(64) for _ in range(32)], rand(long_len)


def run_server(backend: str, mode: str, args, port: int) -> dict:
    if mode == "cached":
        flags = ["--chunked-prefill-size", str(args.chunk)]
    elif mode == "hicache":
        flags = ["--chunked-prefill-size", str(args.chunk), "--enable-hierarchical-cache", "--hicache-ratio",
                 str(HICACHE_RATIO),
                 "--max-total-tokens", str(args.hicache_pool), "--enable-cache-report",
                 *(["--hicache-storage-backend", "file"] if args.hicache_storage else [])]
    else:
        flags = ["--disable-radix-cache", "--chunked-prefill-size", "-1"]
    res = {}
    try:
        with serving(args.model, port, [*RUNS[backend], "--cuda-graph-max-bs", "64", *flags],
                     args.out / f"server_check_{backend}_{mode}.log", args.startup_timeout,
                     load_format=args.load_format, context_length=args.context_length):
            _check(port, mode, args, res)
    except Exception as e:  # reported in the table
        res["error"] = repr(e)[:300]
    return res


def _check(port: int, mode: str, args, res: dict) -> None:
    """Prefix-cache and chunked-prefill requests against one server; their outputs into `res`."""
    prefix_prompts, long_prompt = prompts(args.vocab, args.long_len)
    if mode == "hicache":
        flush(port)
        generate(port, prefix_prompts[0])  # the shared prefix on the device (and written through to host)
        g = torch.Generator().manual_seed(1)
        # distinct prompts: the device pool turns over twice, and with file storage the host pool too, so that the
        # prefix comes back from storage
        turnover = args.hicache_pool * (1 + HICACHE_RATIO if args.hicache_storage else 1)
        for _ in range(2 * turnover // args.chunk):
            generate(port, torch.randint(100, args.vocab - 100, (args.chunk - NEW_TOKENS,), generator=g).tolist())
        res["hicache_reload"] = [generate(port, p) for p in prefix_prompts]
        return
    seq = []
    for p in prefix_prompts:
        if mode == "plain":
            flush(port)
        seq.append(generate(port, p))
    res["prefix_sequential"] = seq
    if mode == "cached":
        flush(port)
        generate(port, prefix_prompts[0])  # caches the shared prefix
        with ThreadPoolExecutor(32) as ex:
            res["prefix_batched"] = list(ex.map(lambda p: generate(port, p), prefix_prompts))
    flush(port)
    res["chunked"] = [generate(port, long_prompt)]


def agreement(a: list[dict], b: list[dict]) -> tuple[int, float]:
    same = sum(x["ids"] == y["ids"] for x, y in zip(a, b))
    tok = sum(sum(u == v for u, v in zip(x["ids"], y["ids"])) for x, y in zip(a, b))
    return same, tok / max(1, sum(len(y["ids"]) for y in b))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="configs/models/deepseek-v2-lite-shape")
    ap.add_argument("--runs", nargs="+", default=["snapmla", "flashmla"], choices=list(RUNS))
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--long-len", type=int, default=16384, help="tokens of the chunked-prefill prompt")
    ap.add_argument("--chunk", type=int, default=4096, help="--chunked-prefill-size of the `cached` server")
    ap.add_argument("--load-format", default="dummy", help="'auto' for a trained checkpoint")
    ap.add_argument("--context-length", type=int, default=32768)
    ap.add_argument("--hicache", action="store_true", help="also the hierarchical cache's reload scenario")
    ap.add_argument("--hicache-pool", type=int, default=16384, help="--max-total-tokens of the HiCache server")
    ap.add_argument("--hicache-storage", action="store_true", help="the HiCache server also stores to file storage")
    ap.add_argument("--startup-timeout", type=float, default=300)
    ap.add_argument("--out", type=Path, default=Path("check_out"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    kill_servers_on_exit()
    results, rows = {}, []
    for i, backend in enumerate(args.runs):
        plain = run_server(backend, "plain", args, 31000 + 2 * i)
        cached = run_server(backend, "cached", args, 31001 + 2 * i)
        results[backend] = {"plain": plain, "cached": cached}
        # (row label, scenario, the server that ran it, the server it is compared with)
        scenarios = [(scen, scen, cached, plain) for scen in ("prefix_sequential", "prefix_batched", "chunked")]
        if args.hicache:
            hicache = results[backend]["hicache"] = run_server(backend, "hicache", args, 31100 + i)
            scenarios.append(("hicache_reload", "hicache_reload", hicache, plain))
            # the criterion proper: a server whose device pool kept the prefix (FP8 pages on both sides)
            scenarios.append(("hicache_reload vs cached", "hicache_reload", hicache, cached))
        (args.out / "check_serving.json").write_text(json.dumps(results))
        for scen, key, served, base in scenarios:
            if key not in served or "prefix_sequential" not in base:
                rows.append(f"| {backend} | {scen} | error: {served.get('error') or base.get('error')} | | |")
                continue
            ref = base["chunked"] if key == "chunked" else base["prefix_sequential"]
            same, tok = agreement(served[key], ref)
            hits = sum(r["cached"] >= 2048 for r in served[key])
            rows.append(f"| {backend} | {scen} | {same}/{len(ref)} | {100 * tok:.1f} % | {hits}/{len(ref)} |")
        print(rows[-1], flush=True)
    print(f"\nmodel {args.model}: greedy {NEW_TOKENS} tokens, `cached` server vs `plain` server (no radix cache, "
          "no chunking); `hicache_reload vs cached`: the HiCache server vs the `cached` one")
    print("| backend | scenario | identical sequences | token agreement | requests with >= 2048 cached tokens |")
    print("|---|---|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
