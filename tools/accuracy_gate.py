"""Serving-scale accuracy gate: does a backend's output depend on how many requests share its decode batch?

    python -m tools.accuracy_gate --model CKPT --runs flashmla flashmla-fp8 snapmla snapmla-triton --out gate_out

CKPT is a checkpoint of tools/train_tiny_mla.py (a trained model: its outputs depend on what attention reads).
One server per run, CUDA graphs up to batch 512 (every level below decodes inside captured graphs). The same probe
prompts (held-out, never trained on) are generated greedily, PROBE_TOKENS new tokens each, at every concurrency
level: alone (1), and inside 8, 64, 160 and 512 concurrent requests; and once more alone right after level 1, their
prompts then radix-cache hits (prefix reuse through the pool). At each level the fillers (other held-out text
of varied lengths) are sent first, the probes once every filler decodes, and the fillers are aborted once the probes
have returned, so the probes decode in a batch that holds the fillers: past ~67 requests at 16 heads the sm_90a decode runs one split, the regime
busy servers run in. A level whose probes did not decode among all its fillers (a filler finished first, or the server
could not admit them all) is named beside the verdict: it measured a smaller batch. The radix cache is flushed between
levels, so every level prefills the probes the same way.

Per run and level, against the reference run (the first, flashmla BF16) at the same level: the mean |logprob
difference| of the generated tokens up to the first token where the two greedy outputs part, and how many probes
match the reference token for token. The error at level 1 is the run's FP8 floor on these prompts; the gate passes
when no level's error exceeds GATE_FACTOR x that floor + GATE_SLACK (an error that grows with batch size is a batch-
dependent bug, e.g. a wrong page at one split), and fails otherwise. Prints a table, writes accuracy_gate.json.
With `--evict-tokens N`, distinct prompts of N tokens in all (one new token each) run between the level-1 pass and
the radix pass: the probes' cached prefixes leave a device pool smaller than N, so under the hierarchical cache the
radix pass reads them back from host memory (the host pool's load path is gated), and without it recomputes them.
A run `name=base:KEY=VALUE;KEY=VALUE` serves `base`'s flags with that environment (e.g. another build of the plugin
on PYTHONPATH, or SNAPMLA_DECODE_IMPL=triton). `--server-flags` gives every run the same parallel layout (tensor
parallelism, DP attention: the reference then runs at that layout too); `--concurrent` serves all runs at once.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness.probes import POOL_FLAGS, PROBE_TOKENS, PROBES, generate_level, held, token_errors, workload
from harness.server import PORT_STRIDE, RUN_ENV, RUNS, flush_cache, greedy_generate, kill_servers_on_exit, serving

LEVELS = (1, 8, 64, 160, 512)
# Prefix reuse: after the level-1 pass the probes run alone once more, and all but their last page of prompt comes
# from the radix cache (snapmla: fetch-dequant of the cached rows into the MHA prefill), compared like a level
RADIX = "radix"
# --evict-tokens' prompts start with EVICT_FIRST_TOKEN + i (ids of the tokenizer's ordinary range), so that no two
# share a cached prefix, however the fillers repeat
EVICT_FIRST_TOKEN = 1000
# Gate bound: the error at any level <= GATE_FACTOR x the level-1 error + GATE_SLACK (nats per token)
GATE_FACTOR, GATE_SLACK = 1.5, 0.01


def parse_run(spec: str) -> tuple[str, list[str], dict]:
    """'name' (a RUNS entry) or 'name=base:KEY=VALUE;KEY=VALUE' -> (name, server flags, server environment)."""
    if "=" not in spec.split(":")[0]:
        return spec, RUNS[spec], RUN_ENV.get(spec, {})
    name, rest = spec.split("=", 1)
    base, _, env = rest.partition(":")
    return name, RUNS[base], {**RUN_ENV.get(base, {}), **dict(kv.split("=", 1) for kv in env.split(";") if kv)}


def gate(levels: dict, ref_levels: dict) -> dict:
    """A run's levels against the reference's: per level its error and identical probes; 'pass' when no level's
    error exceeds GATE_FACTOR x the level-1 error (the floor) + GATE_SLACK."""
    errs = {lv: token_errors(levels[lv], ref_levels[lv]) for lv in levels if lv in ref_levels}
    floor = errs["1"][0]
    ok = all(e <= GATE_FACTOR * floor + GATE_SLACK for e, _ in errs.values())
    return {"gate": "pass" if ok else "FAIL", "floor": floor,
            "levels": {lv: {"mean_abs_dlogprob": e, "identical": same} for lv, (e, same) in errs.items()}}


def not_held(levels: dict) -> list[str]:
    """'c160: 12/128' for each level whose probes did not all decode among all their fillers (`probes.held`): that
    level measured a smaller decode batch than its name says."""
    return [f"c{lv}: {k}/{n}" for lv, v in levels.items() for k, n in [held(v)] if k < n]


def level_columns() -> tuple[str, ...]:
    """The table's level columns, in order (read when called: a test may run fewer LEVELS)."""
    return (*map(str, LEVELS), RADIX)


def row_cells(max_running: int, verdict: dict, short: list[str]) -> list[str]:
    """A gate table row after the run's name: its largest decode batch, each level's error and identical probes ('-'
    where the level did not run), the verdict (`gate`) with the levels that did not hold all their fillers (`not_held`)
    beside it."""
    return [str(max_running),
            *(f"{v['mean_abs_dlogprob']:.4f}, {v['identical']}/{PROBES}" if v else "-"
              for v in (verdict["levels"].get(lv) for lv in level_columns())),
            verdict["gate"] + (f" (fewer fillers: {', '.join(short)})" if short else "")]


def max_running(log_path: Path) -> int:
    """The largest '#running-req' SGLang's scheduler logged (its decode batch)."""
    found = [int(m) for m in re.findall(r"#running-req: (\d+)", log_path.read_text(errors="replace"))]
    return max(found, default=0)


def evict(port: int, fillers: list[list[int]], tokens: int) -> int:
    """Prompts of the fillers, each with a distinct first token (no prefix shared with another or with a probe),
    `tokens` prompt tokens in all, one new token each, 16 at a time: what the device pool held before is pushed out
    of it. Returns the tokens sent."""
    prompts, sent = [], 0
    while sent < tokens:
        f = fillers[len(prompts) % len(fillers)]
        prompts.append([EVICT_FIRST_TOKEN + len(prompts), *f])
        sent += len(prompts[-1])
    with ThreadPoolExecutor(16) as ex:
        list(ex.map(lambda ids: greedy_generate(port, ids, 1), prompts))
    return sent


def measure_run(model: str, name: str, flags: list[str], env: dict, port: int, out: Path, startup_timeout: float,
                layout_flags: list[str], evict_tokens: int = 0) -> dict:
    """One server of run `name`, every level against it -> {"levels", "max_running", "env", "seconds", "startup_s"}, or
    {"error"} (reported in the table). `layout_flags` (e.g. --tp 2 --enable-dp-attention --dp 2) come last."""
    probes, fillers = workload(json.loads((Path(model) / "heldout.json").read_text()), max(LEVELS) - PROBES)
    log_path = out / f"server_{name}.log"
    # captured batch sizes: powers of two and the levels (a batch pads up to the next captured size)
    graph_bs = sorted({*LEVELS, *(2**k for k in range(10))} - {1024})
    server_flags = [*flags, "--cuda-graph-bs", *map(str, graph_bs), "--max-running-requests", str(max(LEVELS)),
                    *POOL_FLAGS, *layout_flags]
    t_start = time.time()
    try:
        with serving(model, port, server_flags, log_path, startup_timeout, load_format="auto",
                     context_length=4096, env=env):
            startup = time.time() - t_start
            greedy_generate(port, probes[0], 4)  # warm-up: JIT builds before the first level
            levels, t0 = {}, time.time()
            for level in LEVELS:
                flush_cache(port)
                levels[str(level)] = generate_level(port, probes, fillers, level)
                if level == 1:  # the same probes again, alone: their prompts are now radix-cache hits
                    if evict_tokens:
                        evict(port, fillers, evict_tokens)
                    levels[RADIX] = generate_level(port, probes, fillers, 1)
        return {"levels": levels, "max_running": max_running(log_path), "env": env,
                "seconds": round(time.time() - t0, 1), "startup_s": round(startup, 1)}
    except Exception as e:  # reported in the table
        return {"error": repr(e)[:300]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="checkpoint dir written by tools/train_tiny_mla.py")
    ap.add_argument("--runs", nargs="+", default=["flashmla", "flashmla-fp8", "snapmla"],
                    help="RUNS names or name=base:KEY=VALUE;...; the first is the reference")
    ap.add_argument("--server-flags", default="",
                    help="flags every run's server gets last, e.g. the parallel layout "
                         "'--tp 2 --enable-dp-attention --dp 2' (the reference runs at the same layout)")
    ap.add_argument("--concurrent", action="store_true",
                    help="serve all runs at once on the same GPUs, each measured by its own client; pass a "
                         "--mem-fraction-static in --server-flags that leaves room for all of them")
    ap.add_argument("--port", type=int, default=23000, help="run i serves on port + PORT_STRIDE x i")
    ap.add_argument("--evict-tokens", type=int, default=0,
                    help="distinct prompt tokens sent between the level-1 and the radix pass (above the device pool: "
                         "the radix pass reads the probes' prefixes back from the hierarchical cache's host pool)")
    ap.add_argument("--startup-timeout", type=float, default=400)
    ap.add_argument("--out", type=Path, default=Path("gate_out"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    kill_servers_on_exit()
    saved = args.out / "accuracy_gate.json"
    results = json.loads(saved.read_text()) if saved.exists() else {}
    layout_flags = shlex.split(args.server_flags)
    if layout_flags:
        results["server_flags"] = args.server_flags
    runs = [parse_run(s) for s in args.runs]
    pending = []
    for i, (name, flags, env) in enumerate(runs):
        if name in results and "error" not in results[name]:
            print(f"{name}: kept from {saved}", flush=True)
        else:
            pending.append((name, flags, env, args.port + PORT_STRIDE * i))

    def measure(job):
        name, flags, env, port = job
        return name, measure_run(args.model, name, flags, env, port, args.out, args.startup_timeout, layout_flags,
                                 args.evict_tokens)

    with ThreadPoolExecutor(max(1, len(pending)) if args.concurrent else 1) as ex:
        for name, result in ex.map(measure, pending):
            results[name] = result
            saved.write_text(json.dumps(results))
    ref_name = runs[0][0]
    ref = results[ref_name]
    print(f"\nmodel {args.model}; server flags {args.server_flags or '(none)'}; reference {ref_name}; {PROBES} probes "
          f"x {PROBE_TOKENS} tokens; gate: error at every level <= {GATE_FACTOR} x level-1 error + {GATE_SLACK}")
    print("| run | max decode batch | " + " | ".join(f"{lv if lv == RADIX else 'c' + lv}: mean abs dlogprob, identical"
                                                   for lv in level_columns()) + " | gate |")
    print("|---|---:|" + "---:|" * len(level_columns()) + "---|")
    summary = {}
    for name, _, _ in runs[1:]:
        r = results[name]
        if "error" in r or "error" in ref:
            error = r["error"] if "error" in r else f"reference {ref_name}: {ref['error']}"
            print(f"| {name} | error: {error} |")
            summary[name] = {"gate": "error"}
            continue
        short = not_held(r["levels"])
        summary[name] = {**gate(r["levels"], ref["levels"]), "max_running": r["max_running"], "not_held": short}
        print(f"| {name} | " + " | ".join(row_cells(r["max_running"], summary[name], short)) + " |")
    if "error" not in ref:
        short = not_held(ref["levels"])
        print(f"reference {ref_name}: " + ("fewer fillers at " + ", ".join(short) if short else
                                            "every probe decoded among all its level's fillers"))
    print("server start (s, process to /health): " + ", ".join(
        f"{name} {results[name].get('startup_s', '-')}" for name, _, _ in runs))
    results["summary"] = summary
    saved.write_text(json.dumps(results))


if __name__ == "__main__":
    main()
