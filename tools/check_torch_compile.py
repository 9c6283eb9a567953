"""A server with `--enable-torch-compile` against the same server without it, per backend, on the small trained
checkpoint (GPU host; tools/train_tiny_mla.py):

    python -m tools.check_torch_compile --model CKPT --runs snapmla flashmla --out compile_out

Per run two servers in turn, the same flags but for torch.compile: `eager` (the model's forward as SGLang runs it,
in CUDA graphs) and `compiled` (`--enable-torch-compile --torch-compile-max-bs MAX_BS`: SGLang compiles the forward
of every captured batch up to MAX_BS with Inductor before capturing it). On each: the held-out probes (harness/probes)
greedily at 1 and MAX_BS concurrent requests, so that every decode step runs a compiled graph, then
`python -m sglang.bench_serving` at concurrency 1 (random ids, in 256 / out 128, 8 prompts) for the batch-1 TPOT.
Reported per run: the probes whose greedy outputs are identical between the two servers at each level, the mean
|logprob difference| before the first differing token (nats), both servers' median TPOT and start-up time (the
compiled one's includes Inductor's compilation). With flashmla among the runs, every server is also compared with
flashmla BF16 eager, the accuracy gate's reference (the same measures). Prints the tables and writes
check_torch_compile.json (`--reprint JSON` prints the tables of a saved one again).
A server that does not start, or a run whose outputs differ, is reported, not hidden: the server log says why.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from harness.bench_serving import bench_serving
from harness.probes import POOL_FLAGS, generate_level, token_errors, workload
from harness.server import RUN_ENV, RUNS, flush_cache, greedy_generate, kill_servers_on_exit, serving
from harness.results import read_json

VARIANTS = ("eager", "compiled")
REFERENCE = "flashmla"  # its eager server: the accuracy gate's reference, flashmla BF16


def variant_flags(run: str, variant: str, max_bs: int) -> list[str]:
    """The run's server flags for `variant`: every batch up to max_bs captured (and compiled when `compiled`)."""
    flags = [*RUNS[run], "--cuda-graph-max-bs", str(max_bs), "--max-running-requests", str(max_bs), *POOL_FLAGS]
    if variant == "compiled":
        flags += ["--enable-torch-compile", "--torch-compile-max-bs", str(max_bs)]
    return flags


def measure(model: str, run: str, variant: str, max_bs: int, port: int, out: Path, startup_timeout: float) -> dict:
    """One server: the probes' greedy outputs at 1 and max_bs requests, the batch-1 TPOT, its start-up seconds; or
    {"error"}."""
    probes, fillers = workload(json.loads((Path(model) / "heldout.json").read_text()), max_bs)
    t0 = time.time()
    try:
        with serving(model, port, variant_flags(run, variant, max_bs), out / f"server_{run}_{variant}.log",
                     startup_timeout, load_format="auto", context_length=4096, env=RUN_ENV.get(run)):
            startup = time.time() - t0
            greedy_generate(port, probes[0], 4)  # warm-up
            levels = {}
            for level in (1, max_bs):
                flush_cache(port)
                levels[str(level)] = generate_level(port, probes, fillers, level)
            metrics, text = bench_serving(port, model, 256, 128, 8, 300, max_concurrency=1)
            (out / f"bench_{run}_{variant}.txt").write_text(text)
        return {"levels": levels, "median_tpot_ms": metrics["median_tpot_ms"], "startup_s": round(startup, 1)}
    except Exception as e:  # reported in the table
        return {"error": repr(e)[:300]}


def compare(eager: dict, compiled: dict) -> dict:
    """Per level: probes with identical greedy outputs and the mean |logprob difference| (compiled vs eager)."""
    if "error" in eager or "error" in compiled:
        return {}
    out = {}
    for level, ref in eager["levels"].items():
        err, same = token_errors(compiled["levels"][level], ref)
        out[level] = {"identical": same, "probes": len(ref), "mean_abs_dlogprob": err}
    return out


def against_reference(results: dict) -> dict:
    """{run: {variant: `compare` of that server with flashmla BF16 eager}}; {} without a served reference run."""
    ref = results.get(REFERENCE, {}).get("eager")
    if not ref or "error" in ref:
        return {}
    return {run: {v: compare(ref, r[v]) for v in VARIANTS} for run, r in results.items()}


def reference_table(against: dict) -> str:
    lines = [f"| server | level | identical to {REFERENCE} eager | mean abs dlogprob |", "|---|---:|---:|---:|"]
    for run, by_variant in against.items():
        for variant, levels in by_variant.items():
            for level, m in levels.items():
                lines.append(f"| {run} {variant} | {level} | {m['identical']}/{m['probes']} | "
                             f"{m['mean_abs_dlogprob']:.5f} |")
    return "\n".join(lines)


def table(results: dict) -> str:
    lines = ["| run | level | identical greedy outputs | mean abs dlogprob | TPOT eager ms | TPOT compiled ms | "
             "start eager s | start compiled s |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for run, r in results.items():
        e, c = r["eager"], r["compiled"]
        if not r["compare"]:
            lines.append(f"| {run} | - | error: {e.get('error') or c.get('error')} | | | | | |")
            continue
        for level, m in r["compare"].items():
            lines.append(f"| {run} | {level} | {m['identical']}/{m['probes']} | {m['mean_abs_dlogprob']:.5f} | "
                         f"{e['median_tpot_ms']} | {c['median_tpot_ms']} | {e['startup_s']} | {c['startup_s']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a trained checkpoint with heldout.json (needed unless --reprint)")
    ap.add_argument("--runs", nargs="+", default=["snapmla"], choices=list(RUNS))
    ap.add_argument("--max-bs", type=int, default=8, help="--torch-compile-max-bs and the captured batches")
    ap.add_argument("--startup-timeout", type=float, default=900, help="seconds until /health (compilation included)")
    ap.add_argument("--out", type=Path, default=Path("compile_out"))
    ap.add_argument("--reprint", type=Path, help="only print the tables of this check_torch_compile.json")
    args = ap.parse_args(argv)
    if args.reprint:
        results = read_json(args.reprint)
        print(f"{table(results)}\n\n{reference_table(against_reference(results))}")
        return 0
    if not args.model:
        ap.error("--model is needed (a trained checkpoint with heldout.json)")
    args.out.mkdir(parents=True, exist_ok=True)
    kill_servers_on_exit()
    results = {}
    for i, run in enumerate(args.runs):
        r = {v: measure(args.model, run, v, args.max_bs, 31500 + 10 * i + j, args.out, args.startup_timeout)
             for j, v in enumerate(VARIANTS)}
        r["compare"] = compare(r["eager"], r["compiled"])
        results[run] = r
        print(json.dumps({"run": run, "compare": r["compare"]} | {v: {k: x for k, x in r[v].items() if k != "levels"}
                                                                  for v in VARIANTS}), flush=True)
    print(f"{table(results)}\n\n{reference_table(against_reference(results))}")
    (args.out / "check_torch_compile.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
