"""Accuracy of snapmla on a trained model, through the server: perplexity, greedy agreement, long-generation drift.

    python -m tools.train_tiny_mla --out /tmp/tiny-mla --minutes 8
    python -m tools.eval_trained_model --model /tmp/tiny-mla --runs flashmla flashmla-fp8 snapmla triton --out eval_out

One server per backend (the first run is the reference, flashmla BF16), each given the same requests built from
the checkpoint's heldout.json (files never trained on):
  perplexity : prompt logprobs of the held-out windows, prefilled in 128-token chunks so that every chunk after the
               first attends to the earlier ones through the KV pool (snapmla: the FP8 cache, fetch-dequantized)
  greedy     : 64 held-out prompts x 256 new tokens (decode kernel); token agreement by position vs the reference
  drift      : 16 prompts x 2048 new tokens; agreement vs the reference in the first and the last 256 tokens
               (scale-plumbing bugs show up as a decay with length)
The triton backend (BF16 cache) gives the noise floor: how much two BF16 implementations already disagree.
Position-wise agreement cascades: after the first differing token the two texts have different contexts. So the
greedy run also records the reference's top-2 logprob margin at every position, and the table says where each
backend's continuations first part from the reference's and how close the reference's own top-2 were there (a
numerical perturbation flips near-ties; a bug also flips confident tokens). Teacher-forced agreement removes the
cascade: each backend prefills prompt + the reference's 2048-token continuation and its argmax at every position is
compared with the reference's token, in the first and the last 256 positions.
Prints a table, writes eval_trained_model.json.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness.server import RUNS, greedy_generate, kill_servers_on_exit, serving
from harness.probes import POOL_FLAGS, agreement

GREEDY_TOKENS, DRIFT_TOKENS, DRIFT_PROMPTS, WINDOW = 256, 2048, 16, 256
NEAR_TIE = 0.1  # nats between the reference's best and second-best token


def perplexity(prompt_logprobs: list[list[float]]) -> float:
    """exp of the mean negative log-likelihood over every scored token of every window."""
    flat = [lp for seq in prompt_logprobs for lp in seq]
    return math.exp(-sum(flat) / len(flat))


def top2_margins(top_logprobs: list[list]) -> list[float]:
    """Per generated position, best minus second-best logprob (nats), from SGLang's output_top_logprobs
    ([logprob, token id, text] entries, best first)."""
    return [pos[0][0] - pos[1][0] if len(pos) > 1 else math.inf for pos in top_logprobs]


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """First position where two generations differ (a length mismatch counts), None when identical."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def divergence_summary(gens: list[list[int]], ref_gens: list[list[int]], ref_margins: list[list[float]]) -> dict:
    """Where continuations first part from the reference's, and the reference's top-2 margin at that position."""
    firsts = [first_divergence(g, r) for g, r in zip(gens, ref_gens)]
    where = [d for d in firsts if d is not None]
    margins = [m[d] for d, m in zip(firsts, ref_margins) if d is not None and d < len(m)]
    return {"diverged": len(where), "prompts": len(firsts),
            "median_first_divergence": statistics.median(where) if where else None,
            "median_ref_margin": statistics.median(margins) if margins else None,
            "near_tie_fraction": sum(m < NEAR_TIE for m in margins) / len(margins) if margins else None}


def teacher_forced_argmax(top_logprobs: list, n: int) -> list[int]:
    """The model's top-1 token at each of the last `n` input positions, from SGLang's input_top_logprobs (one list of
    [logprob, token id, text] per scored position, end-aligned with the input; a leading entry may be None)."""
    return [pos[0][1] for pos in top_logprobs[-n:]]


def evaluate(port: int, held: dict, ref_drift: list[list[int]] | None = None, workers: int = 64) -> dict:
    """Perplexity, greedy and drift generations; then the teacher-forced pass over `ref_drift` (the reference
    backend's drift continuations; its own when None): every prompt + continuation is prefilled in 128-token chunks
    and the argmax at each continuation position is read back, so all backends predict from the same prefix."""
    prompts = held["prompts"][:DRIFT_PROMPTS]
    with ThreadPoolExecutor(workers) as ex:
        scored = list(ex.map(lambda w: greedy_generate(port, w, 1, return_logprob=True, logprob_start_len=0),
                             held["ppl_windows"]))
        greedy = list(ex.map(lambda p: greedy_generate(port, p, GREEDY_TOKENS, return_logprob=True,
                                                       top_logprobs_num=2), held["prompts"]))
        drift = [r["output_ids"] for r in ex.map(lambda p: greedy_generate(port, p, DRIFT_TOKENS), prompts)]
        forced_on = ref_drift if ref_drift is not None else drift
        forced = list(ex.map(lambda pc: greedy_generate(port, pc[0] + pc[1], 1, return_logprob=True,
                                                        logprob_start_len=len(pc[0]) - 1, top_logprobs_num=1),
                             zip(prompts, forced_on)))
    # input_token_logprobs: [logprob, token id, text] per prompt position; the first position has no logprob
    lps = [[t[0] for t in r["meta_info"]["input_token_logprobs"] if t[0] is not None] for r in scored]
    return {"perplexity": perplexity(lps), "greedy": [r["output_ids"] for r in greedy],
            "greedy_margins": [top2_margins(r["meta_info"]["output_top_logprobs"]) for r in greedy],
            "drift": drift,
            "teacher_forced": [teacher_forced_argmax(r["meta_info"]["input_top_logprobs"], len(c))
                               for r, c in zip(forced, forced_on)]}


def summarize(results: dict) -> dict:
    """The table's figures per backend from the saved results (the first backend is the reference): the few numbers
    a report keeps, without the token lists. Fractions in [0, 1]; None where a figure does not apply."""
    ref_name, ref = next(iter(results.items()))
    rows = {}
    for name, r in results.items():
        if "error" in r or "error" in ref:
            rows[name] = {"error": r.get("error") or ref.get("error")}
            continue
        d = divergence_summary(r["greedy"], ref["greedy"], ref["greedy_margins"])
        # argmax from the reference's own prefix vs the reference's tokens: no cascade, so a length-dependent decay
        # here is a real drift (the reference's row: its prefill vs its decode)
        tf = r.get("teacher_forced")
        rows[name] = {"perplexity": r["perplexity"], "ppl_ratio": r["perplexity"] / ref["perplexity"],
                      "greedy_agreement": agreement(r["greedy"], ref["greedy"]),
                      "drift_first": agreement(r["drift"], ref["drift"], 0, WINDOW),
                      "drift_last": agreement(r["drift"], ref["drift"], DRIFT_TOKENS - WINDOW), **d,
                      "teacher_forced_first": None if tf is None else agreement(tf, ref["drift"], 0, WINDOW),
                      "teacher_forced_last": None if tf is None else agreement(tf, ref["drift"],
                                                                               DRIFT_TOKENS - WINDOW),
                      "teacher_forced_by_window": None if tf is None else [
                          agreement(tf, ref["drift"], w, w + WINDOW) for w in range(0, DRIFT_TOKENS, WINDOW)]}
    return {"reference": ref_name, "results": rows}


def table(summary: dict) -> str:
    """The markdown table of `summarize`'s figures."""
    ref_name = summary["reference"]
    lines = [f"| backend | perplexity | ppl / {ref_name} | greedy agreement | drift: first {WINDOW} | "
             f"drift: last {WINDOW} | greedy prompts diverged | median first divergence | median {ref_name} top-2 "
             f"margin there (nats) | divergences at near-ties (< {NEAR_TIE}) | teacher-forced: first {WINDOW} | "
             f"teacher-forced: last {WINDOW} |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    fmt = lambda x, f, k=1: "-" if x is None else format(k * x, f)  # noqa: E731
    for name, r in summary["results"].items():
        if "error" in r:
            lines.append(f"| {name} | error: {r['error']} | | | | | | | | | | |")
            continue
        lines.append(f"| {name} | {r['perplexity']:.4f} | {r['ppl_ratio']:.4f} | "
                     f"{100 * r['greedy_agreement']:.1f} % | {100 * r['drift_first']:.1f} % | "
                     f"{100 * r['drift_last']:.1f} % | {r['diverged']}/{r['prompts']} | "
                     f"{fmt(r['median_first_divergence'], '.0f')} | {fmt(r['median_ref_margin'], '.3f')} | "
                     f"{fmt(r['near_tie_fraction'], '.0f', 100)} % | {fmt(r['teacher_forced_first'], '.1f', 100)} % | "
                     f"{fmt(r['teacher_forced_last'], '.1f', 100)} % |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="checkpoint dir written by tools/train_tiny_mla.py")
    ap.add_argument("--runs", nargs="+", default=["flashmla", "flashmla-fp8", "snapmla", "triton"], choices=list(RUNS))
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
        flags = [*RUNS[name], "--cuda-graph-max-bs", "64", "--chunked-prefill-size", "128", *POOL_FLAGS]
        try:
            with serving(args.model, 32000 + i, flags, args.out / f"server_eval_{name}.log", args.startup_timeout,
                         load_format="auto", context_length=4096):
                ref = results.get(args.runs[0], {})
                results[name] = evaluate(32000 + i, held, ref["drift"] if i > 0 and "drift" in ref else None)
        except Exception as e:  # reported in the table
            results[name] = {"error": repr(e)[:300]}
        saved.write_text(json.dumps(results))
    results = {name: results[name] for name in args.runs}  # table in --runs order
    summary = summarize(results)
    (args.out / "eval_trained_model_summary.json").write_text(json.dumps(summary, indent=1))
    print(f"\nmodel {args.model}; reference {args.runs[0]}; greedy {GREEDY_TOKENS} tokens x {len(held['prompts'])} "
          f"prompts; drift {DRIFT_TOKENS} tokens x {DRIFT_PROMPTS} prompts")
    print(table(summary))


if __name__ == "__main__":
    main()
