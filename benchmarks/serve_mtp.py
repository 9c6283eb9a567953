"""Speculative decoding with a trained MTP layer: what DeepSeek's NEXTN draft gains on each attention backend, and
whether speculation changes a backend's greedy tokens.

    python -m benchmarks.serve_mtp --model CKPT --runs snapmla snapmla-mtp flashmla flashmla-mtp --out DIR

CKPT: a checkpoint of `tools/train_tiny_mla.py --mtp` (a trained model and its trained MTP layer; `-mtp` runs serve
that layer as the draft: NEXTN, 2 steps, top-k 1, 3 draft tokens, harness.server.MTP). One server per run, one after
another on the same GPU (CUDA graphs up to the largest concurrency, the accuracy gate's pool). At each concurrency c
(`--concurrency`) the first max(c, 4) held-out prompts (256 tokens, never trained on) are generated greedily,
`--new-tokens` each (EOS ignored), c at a time: `--warm-up` passes unmeasured, then `--rounds` measured. Per run and c:
output tokens per second and the median request's time per output token (median over rounds, with their range), the
accept length (output tokens over verify steps, summed over the requests; the draft proposes 2 tokens a step, so at
most 3), the GPU time of the decode forwards per output token (each forward's time on the server's device timer,
`harness.gpu_time`: draft, verify and draft-extend passes with MTP; it includes host work inside a forward, such as
building its metadata, where the GPU waits for it, but not the scheduler's work between forwards: wall time per token
minus this is time outside the forwards; SGLang counts a forward when a later one ends, so a forward or two at each
end of a round fall into its neighbours), and for an `X-mtp` run against `X` (the same backend without the draft),
the outputs identical token for token and the mean share of leading tokens they have in common; likewise against the
`--reference` run (FlashMLA BF16 without a draft by default).
Greedy speculative decoding accepts a draft token only where it is the target's own greedy choice, so a backend's
outputs with and without MTP differ only where its numerics differ between a verify step (s_q 3) and a decode step.
Prints a table, writes serve_mtp.json (after each run; the outputs' token ids in serve_mtp_ids.json) and a PNG. Runs
already in OUT/serve_mtp.json are kept and not served again, so a call cut short is continued by the next (and a
folder holding every run is compared and printed again without a GPU).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness import gpu_time
from harness.probes import POOL_FLAGS, first_difference
from harness.results import read_json, save_png, stored
from harness.server import RUN_ENV, RUNS, greedy_generate, kill_servers_on_exit, serving

PROMPTS_AT_LEAST = 4  # prompts at concurrency 1 (one after another)
# unmeasured passes per concurrency: the first meets the batch size's graphs, the second the prompts' cached prefixes
# as every measured round does (a prefill over a cached prefix runs other kernels)
WARM_UP_PASSES = 2
MTP_SUFFIX = "-mtp"


def generate_level(port: int, prompts: list[list[int]], concurrency: int, new_tokens: int) -> dict:
    """All `prompts`, `concurrency` at a time -> {"seconds", "latencies", "ids", "completion_tokens",
    "verify_steps", "gpu_s"} (verify steps None without a draft; gpu_s: the growth of the server's forward-time
    counters over the round, {category: GPU seconds}, None where it reports none)."""
    def one(ids):
        t0 = time.monotonic()
        r = greedy_generate(port, ids, new_tokens)
        meta = r["meta_info"]
        return r["output_ids"], time.monotonic() - t0, meta["completion_tokens"], meta.get("spec_verify_ct")

    before = gpu_time.server_seconds(port)
    t0 = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        done = list(pool.map(one, prompts))
    seconds, after = time.monotonic() - t0, gpu_time.server_seconds(port)
    return {"seconds": seconds, "ids": [d[0] for d in done], "latencies": [d[1] for d in done],
            "completion_tokens": sum(d[2] for d in done),
            "verify_steps": None if any(d[3] is None for d in done) else sum(d[3] for d in done),
            "gpu_s": {c: after[c] - before.get(c, 0.0) for c in after} if before and after else None}



def summarize(rounds: list[dict], new_tokens: int) -> dict:
    """One concurrency level's measured rounds -> medians and ranges (tok/s, ms per output token), accept length, the
    decode forwards' GPU ms per output token (median; None where a round has no device-timer counters)."""
    rates = [r["completion_tokens"] / r["seconds"] for r in rounds]
    tpot = [statistics.median(r["latencies"]) / new_tokens * 1e3 for r in rounds]
    steps = [r["verify_steps"] for r in rounds]
    out = {"output_tok_s": statistics.median(rates), "output_tok_s_range": [min(rates), max(rates)],
           "ms_per_token": statistics.median(tpot), "ms_per_token_range": [min(tpot), max(tpot)],
           "accept_length": None, "ids": rounds[-1]["ids"]}
    if all(s for s in steps):
        out["accept_length"] = sum(r["completion_tokens"] for r in rounds) / sum(steps)
    gpu = [r.get("gpu_s") for r in rounds]
    out["gpu_decode_ms_per_token"] = None if not all(gpu) else statistics.median(
        sum(g.get(c, 0.0) for c in gpu_time.DECODE_CATEGORIES) / r["completion_tokens"] * 1e3
        for g, r in zip(gpu, rounds))
    return out


def shared(a: list[list[int]], b: list[list[int]]) -> tuple[int, float]:
    """(outputs identical token for token, mean share of leading tokens two sets of outputs have in common)."""
    lead = [first_difference(u, v) / max(1, len(u)) for u, v in zip(a, b)]
    return sum(u == v for u, v in zip(a, b)), statistics.fmean(lead)


def measure_run(model: str, run: str, levels: list[int], rounds: int, new_tokens: int, port: int, out: Path,
                startup_timeout: float, warm_up: int = WARM_UP_PASSES) -> dict:
    prompts = json.loads((Path(model) / "heldout.json").read_text())["prompts"]
    flags = [*RUNS[run], "--cuda-graph-max-bs", str(max(levels)), "--max-running-requests", str(max(levels)),
             *POOL_FLAGS, *gpu_time.SERVER_FLAGS]
    t0 = time.time()
    try:
        with serving(model, port, flags, out / f"server_{run}.log", startup_timeout, load_format="auto",
                     context_length=4096, env={**RUN_ENV.get(run, {}), **gpu_time.SERVER_ENV}):
            res = {"startup_s": round(time.time() - t0, 1), "levels": {}}
            for c in levels:
                batch = prompts[:max(c, PROMPTS_AT_LEAST)]
                for _ in range(warm_up):
                    generate_level(port, batch, c, new_tokens)
                res["levels"][str(c)] = summarize(
                    [generate_level(port, batch, c, new_tokens) for _ in range(rounds)], new_tokens)
            return res
    except Exception as e:  # reported in the table
        return {"error": repr(e)[:300]}


def compare(results: dict, reference: str) -> None:
    """Adds to each run's levels its outputs against its base backend (an -mtp run against the run without it) and
    against the `reference` run."""
    runs = [r for r in results if "levels" in results[r]]
    for run in runs:
        for c, lv in results[run]["levels"].items():
            lv.pop("vs_base", None), lv.pop("vs_reference", None)
            for key, other in (("vs_base", run.removesuffix(MTP_SUFFIX)), ("vs_reference", reference)):
                if other != run and other in runs and c in results[other]["levels"]:
                    same, lead = shared(lv["ids"], results[other]["levels"][c]["ids"])
                    lv[key] = {"run": other, "identical": same, "outputs": len(lv["ids"]), "leading_share": lead}


def table(results: dict) -> str:
    rows = ["| run | c | output tok/s (range) | ms per token | GPU ms per token (decode forwards) | accept length | "
            "vs the run without MTP | vs reference |", "|---|---:|---:|---:|---:|---:|---|---|"]

    def cmp(v):
        return f"{v['identical']}/{v['outputs']} identical, {v['leading_share']:.0%} leading" if v else "-"

    for run, res in results.items():
        if "error" in res:
            rows.append(f"| {run} | | error: {res['error']} | | | | | |")
            continue
        for c, lv in res["levels"].items():
            lo, hi = lv["output_tok_s_range"]
            acc = f"{lv['accept_length']:.2f}" if lv["accept_length"] else "-"
            gpu = lv.get("gpu_decode_ms_per_token")  # None, or absent from a run saved without it
            rows.append(f"| {run} | {c} | {lv['output_tok_s']:.0f} ({lo:.0f}-{hi:.0f}) | {lv['ms_per_token']:.2f} | "
                        f"{'-' if gpu is None else f'{gpu:.2f}'} | {acc} | {cmp(lv.get('vs_base'))} | "
                        f"{cmp(lv.get('vs_reference'))} |")
    return "\n".join(rows)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for run, res in results.items():
        if "levels" in res:
            cs = list(res["levels"])
            ax.plot([int(c) for c in cs], [res["levels"][c]["output_tok_s"] for c in cs], marker="o", label=run,
                    linestyle="--" if run.endswith(MTP_SUFFIX) else "-")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("output tokens / s")
    ax.set_title("Greedy decoding with and without the trained MTP draft")
    if ax.lines:  # no run served: an empty plot
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="checkpoint dir of tools/train_tiny_mla.py --mtp")
    ap.add_argument("--runs", nargs="+", default=["flashmla", "flashmla-mtp", "snapmla", "snapmla-mtp"],
                    choices=list(RUNS))
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warm-up", type=int, default=WARM_UP_PASSES,
                    help="unmeasured passes per concurrency before the rounds")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--startup-timeout", type=float, default=400)
    ap.add_argument("--reference", default="flashmla", help="the run every other run's outputs are compared with")
    ap.add_argument("--out", type=Path, default=Path("serve_mtp_out"))
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    results, meta = load(a.out)
    to_serve = [run for run in a.runs if "levels" not in results.get(run, {})]
    workload = {"model": a.model, "new_tokens": a.new_tokens, "rounds": a.rounds, "concurrency": a.concurrency}
    if to_serve and results and {k: meta.get(k) for k in workload} != workload:
        raise SystemExit(f"{a.out} holds runs of another workload ({ {k: meta.get(k) for k in workload} }): serve "
                         "these into another --out")
    if not to_serve and meta:
        workload = {k: meta[k] for k in workload}  # compared again: the runs keep the workload they were served with
    cfg = json.loads((Path(a.model) / "config.json").read_text()) if to_serve else {}
    if any(r.endswith(MTP_SUFFIX) for r in to_serve) and not cfg.get("num_nextn_predict_layers"):
        raise SystemExit(f"{a.model} has no MTP layer (num_nextn_predict_layers); train it with "
                         "`python -m tools.train_tiny_mla --mtp`")
    kill_servers_on_exit()
    meta = {**workload, "reference": a.reference}
    for run in to_serve:
        results[run] = measure_run(a.model, run, a.concurrency, a.rounds, a.new_tokens, a.port, a.out,
                                   a.startup_timeout, a.warm_up)
        compare(results, a.reference)
        save(a.out, results, meta)
        print(table({run: results[run]}), flush=True)
    compare(results, a.reference)  # runs served by earlier calls, against this call's reference
    save(a.out, results, meta)
    print(table(results))
    plot(results, a.out / "serve_mtp.png")


def save(out: Path, results: dict, meta: dict) -> None:
    """serve_mtp.json without the outputs' token ids, which go to serve_mtp_ids.json."""
    ids = {run: {c: lv["ids"] for c, lv in res.get("levels", {}).items()} for run, res in results.items()}
    runs = {run: {**res, "levels": {c: {k: v for k, v in lv.items() if k != "ids"} for c, lv in res["levels"].items()}}
            if "levels" in res else res for run, res in results.items()}
    (out / "serve_mtp.json").write_text(json.dumps({"meta": meta, "runs": runs}, indent=1))
    (out / "serve_mtp_ids.json").write_text(json.dumps(ids))


def load(out: Path) -> tuple[dict, dict]:
    """(runs, meta) an earlier call saved in `out` (serve_mtp.json, or .json.xz as results/ keeps it), the runs' token
    ids put back (serve_mtp_ids.json, or .json.xz); ({}, {}) where there is none."""
    if not stored(out / "serve_mtp.json").is_file():
        return {}, {}
    saved = read_json(out / "serve_mtp.json")
    results = saved["runs"]
    for run, levels in read_json(out / "serve_mtp_ids.json").items():
        for c, lv_ids in levels.items():
            results[run]["levels"][c]["ids"] = lv_ids
    return results, saved["meta"]


if __name__ == "__main__":
    main()
