"""Accuracy of snapmla on a trained model, through the server: perplexity, greedy agreement, long-generation drift.

    python examples/train_tiny_mla.py --out /tmp/tiny-mla --minutes 8
    python examples/eval_trained_model.py --model /tmp/tiny-mla --runs flashmla snapmla triton --out eval_out

One server per backend (the first run is the reference, flashmla BF16), each given the same requests built from
the checkpoint's heldout.json (files never trained on):
  perplexity : prompt logprobs of the held-out windows, prefilled in 128-token chunks so that every chunk after the
               first attends to the earlier ones through the KV pool (snapmla: the FP8 cache, fetch-dequantized)
  greedy     : 64 held-out prompts x 256 new tokens (decode kernel); token agreement by position vs the reference
  drift      : 16 prompts x 2048 new tokens; agreement vs the reference in the first and the last 256 tokens
               (scale-plumbing bugs show up as a decay with length)
The triton backend (BF16 cache) gives the noise floor: how much two BF16 implementations already disagree.
Prints a table, writes eval_trained_model.json.
"""

from __future__ import annotations

import argparse
import json
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from serve_and_bench import RUNS, greedy_generate, kill_servers_on_exit, start_server, stop_server, wait_healthy

GREEDY_TOKENS, DRIFT_TOKENS, DRIFT_PROMPTS, WINDOW = 256, 2048, 16, 256


def perplexity(prompt_logprobs: list[list[float]]) -> float:
    """exp of the mean negative log-likelihood over every scored token of every window."""
    flat = [lp for seq in prompt_logprobs for lp in seq]
    return math.exp(-sum(flat) / len(flat))


def agreement(a: list[list[int]], b: list[list[int]], start: int = 0, end: int | None = None) -> float:
    """Fraction of positions [start, end) where two sets of generations hold the same token."""
    same = total = 0
    for x, y in zip(a, b):
        xs, ys = x[start:end], y[start:end]
        same += sum(u == v for u, v in zip(xs, ys))
        total += max(len(xs), len(ys))
    return same / max(1, total)


def evaluate(port: int, held: dict, workers: int = 64) -> dict:
    with ThreadPoolExecutor(workers) as ex:
        scored = list(ex.map(lambda w: greedy_generate(port, w, 1, return_logprob=True, logprob_start_len=0),
                             held["ppl_windows"]))
        greedy = list(ex.map(lambda p: greedy_generate(port, p, GREEDY_TOKENS), held["prompts"]))
        drift = list(ex.map(lambda p: greedy_generate(port, p, DRIFT_TOKENS), held["prompts"][:DRIFT_PROMPTS]))
    # input_token_logprobs: [logprob, token id, text] per prompt position; the first position has no logprob
    lps = [[t[0] for t in r["meta_info"]["input_token_logprobs"] if t[0] is not None] for r in scored]
    return {"perplexity": perplexity(lps), "greedy": [r["output_ids"] for r in greedy],
            "drift": [r["output_ids"] for r in drift]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="checkpoint dir written by examples/train_tiny_mla.py")
    ap.add_argument("--runs", nargs="+", default=["flashmla", "snapmla", "triton"], choices=list(RUNS))
    ap.add_argument("--startup-timeout", type=float, default=300)
    ap.add_argument("--out", type=Path, default=Path("eval_out"))
    ap.add_argument("--resume", action="store_true",
                    help="keep the backends already measured without error in --out (a run cut off by a time limit)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    kill_servers_on_exit()
    held = json.loads((Path(args.model) / "heldout.json").read_text())
    saved = args.out / "eval_trained_model.json"
    results = json.loads(saved.read_text()) if args.resume and saved.exists() else {}
    results = {k: v for k, v in results.items() if k in args.runs and "error" not in v}
    for i, name in enumerate(args.runs):
        if name in results:
            print(f"{name}: kept from {saved}", flush=True)
            continue
        flags = [*RUNS[name], "--cuda-graph-max-bs", "64", "--chunked-prefill-size", "128"]
        proc, log = start_server(args.model, 32000 + i, flags, args.out / f"server_eval_{name}.log",
                                 load_format="auto", context_length=4096)
        try:
            wait_healthy(32000 + i, proc, args.startup_timeout)
            results[name] = evaluate(32000 + i, held)
        except Exception as e:  # reported in the table
            results[name] = {"error": repr(e)[:300]}
        finally:
            stop_server(proc, log)
        saved.write_text(json.dumps(results))
    ref_name = args.runs[0]
    results = {name: results[name] for name in args.runs}  # table in --runs order
    ref = results[ref_name]
    print(f"\nmodel {args.model}; reference {ref_name}; greedy {GREEDY_TOKENS} tokens x {len(held['prompts'])} "
          f"prompts; drift {DRIFT_TOKENS} tokens x {DRIFT_PROMPTS} prompts")
    print(f"| backend | perplexity | ppl / {ref_name} | greedy agreement | drift: first {WINDOW} | "
          f"drift: last {WINDOW} |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        if "error" in r or "error" in ref:
            print(f"| {name} | error: {r.get('error') or ref.get('error')} | | | | |")
            continue
        print(f"| {name} | {r['perplexity']:.4f} | {r['perplexity'] / ref['perplexity']:.4f} | "
              f"{100 * agreement(r['greedy'], ref['greedy']):.1f} % | "
              f"{100 * agreement(r['drift'], ref['drift'], 0, WINDOW):.1f} % | "
              f"{100 * agreement(r['drift'], ref['drift'], DRIFT_TOKENS - WINDOW):.1f} % |")


if __name__ == "__main__":
    main()
