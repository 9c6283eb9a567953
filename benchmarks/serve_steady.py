"""Sustained serving throughput with the KV pool full: the steady window of a long run, per backend, beside the
whole run's (burst) numbers.

    python -m benchmarks.serve_steady --model configs/models/deepseek-v2-lite-shape \\
        --backends snapmla flashmla flashmla-fp8 --out steady_v2lite
    python -m benchmarks.serve_steady --model configs/models/deepseek-v3-shape --max-running-requests 1024 \\
        --mem-fraction-static 0.26 --out steady_v3

A burst of same-length requests ends with a tail in which the last requests run almost alone, so its average says
little about a server that stays busy. Here every backend gets the same prompts of varied lengths (uniform in
[range_ratio x len, len]), enough of them to fill the pool `--turnovers` times over, all sent at once. The server
logs a decode line every `--decode-log-interval` steps. The **steady window** leaves out the first fill of the pool
and the bunched wave of finishes that follows it (`steady_window`): it starts once one pool's worth of requests has
been admitted after the first fill and ends at the last decode line that finds requests waiting (`#queue-req` > 0),
the pool at least `--usage-floor` of its largest use in the run; fewer than ~2 turnovers leave no window. Its
output rate is generated tokens over wall time: each line's `gen throughput` covers `interval` steps of
its `#running-req` requests, so the window's rate is sum(running) / sum(running / rate) (non-speculative decoding:
one token per request and step). Prefill batches inside the window count as the time they take; `window_breakdown`
splits the window into decoding alone and the time around prefill batches, and `gpu_breakdown` into the GPU's time
in decode forwards, in prefill forwards and outside every forward (the server's device timer, `gpu_time`).

The prompt count is sized once, from the first backend's pool (`--prompts` fixes it), and recorded in the JSON so
that every backend, also in a later `--resume` run, serves the same requests. Prints a table (steady output tok/s and
its ratio to flashmla BF16's, the burst's total and output tok/s as the client saw them, and the engine's output
rate over its own span from first to last decode line, `engine_rate`), writes serve_steady.json and
serve_steady.png (each backend's decode rate over the run, its steady window marked). `--from-log BACKEND LOG`
adds a backend's row from its server log alone (`entry_from_log`), e.g. when its client did not finish.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import shlex
import subprocess
from datetime import datetime, timedelta
from pathlib import Path

from harness import gpu_time
from harness.bench_serving import CONTEXT_LENGTH, bench_serving
from harness.server import RUN_ENV, RUNS, flush_cache, kill_servers_on_exit, start_server, stop_server, wait_healthy
from harness.server_log import decode_lines, pool_tokens, read_log
from harness.results import read_json, save_png, stored

REFERENCE = "flashmla"
DEFAULTS = dict(input_len=2048, output_len=2048, range_ratio=0.5)
# A full FP8 pool admits ~900 running requests on the V2-Lite shape (H100, 80 % of memory): batches above the largest
# captured one decode eagerly at about half the rate, so the graphs reach past the largest running batch.
CUDA_GRAPH_MAX_BS = 1024


def prompts_for_pool(pool: int, input_len: int, output_len: int, range_ratio: float, turnovers: float) -> int:
    """Requests that fill a pool of `pool` tokens `turnovers` times: a request holds its prompt and, on average over
    its life, half of its output; lengths average (1 + range_ratio) / 2 of the nominal ones."""
    mean = (1 + range_ratio) / 2
    held = mean * input_len + mean * output_len / 2
    return max(1, math.ceil(turnovers * pool / held))


def _line_rate(lines: list[dict]) -> float:
    """Output tok/s over decode lines: each covers `interval` steps of `running` requests in running * interval / rate
    seconds, so the rate is sum(running) / sum(running / rate) (non-speculative decoding: one token per request and
    step)."""
    return sum(line["running"] for line in lines) / sum(line["running"] / line["rate"] for line in lines)


def window_breakdown(window: list[dict], interval: int) -> dict:
    """Where a steady window's time goes, from its decode lines (`prefill_tokens`: prefill batches logged since the
    previous line) -> {"prefill_tokens_per_output", "decode_alone_tok_s", "prefill_us_per_token"}: prompt tokens
    prefilled per generated token, the rate of the lines with no prefill batch in between (decoding alone at the
    window's batch and lengths), and the time of the other lines beyond decoding at that rate, per prompt token
    (the prefill batches and whatever the server does around them). {} for lines without prefill counts."""
    timed = [line for line in window if line["rate"] and line["running"] > 0]
    if not timed or any("prefill_tokens" not in line for line in timed):
        return {}
    out = {"prefill_tokens_per_output": round(sum(line["prefill_tokens"] for line in timed)
                                              / sum(line["running"] * interval for line in timed), 3)}
    alone = [line for line in timed if line["prefill_tokens"] == 0]
    mixed = [line for line in timed if line["prefill_tokens"] > 0]
    if alone and mixed:
        rate = _line_rate(alone)
        extra = sum(line["running"] * interval * (1 / line["rate"] - 1 / rate) for line in mixed)
        out["decode_alone_tok_s"] = round(rate, 1)
        out["prefill_us_per_token"] = round(1e6 * extra / sum(line["prefill_tokens"] for line in mixed), 1)
    return out


def gpu_breakdown(window: list[dict], samples: list[dict], interval: int) -> dict:
    """Where the GPU time of a steady window goes, from the server's forward-time counters (`gpu_time`) sampled
    during the run -> {"gpu_decode_share", "gpu_prefill_share", "gpu_outside_share" (shares of the window's wall
    time: in decode forwards (with speculative decoding: draft, verify and draft-extend forwards), in prefill
    forwards, in neither: scheduling, the frontend, gaps between launches),
    "decode_gpu_ms_per_step", "prefill_gpu_us_per_token"}; {} when the samples do not cover the window.
    Log times are whole seconds (floored), so each line's time is taken as the middle of its second."""
    start, end = (line["time"] + timedelta(seconds=0.5) for line in (window[0], window[-1]))
    gpu = gpu_time.window_seconds(samples, start, end) if len(window) > 1 else None
    if not gpu:
        return {}
    wall = (end - start).total_seconds()
    decode = sum(gpu.get(c, 0.0) for c in gpu_time.DECODE_CATEGORIES)
    prefill = sum(gpu.get(c, 0.0) for c in gpu_time.PREFILL_CATEGORIES)
    tokens = sum(line.get("prefill_tokens", 0) for line in window[1:])  # logged after the window's first line
    out = {"gpu_decode_share": round(decode / wall, 3), "gpu_prefill_share": round(prefill / wall, 3),
           "gpu_outside_share": round(1 - sum(gpu.values()) / wall, 3),
           "decode_gpu_ms_per_step": round(1e3 * decode / (interval * (len(window) - 1)), 2)}
    if tokens:
        out["prefill_gpu_us_per_token"] = round(1e6 * prefill / tokens, 1)
    return out


def steady_window(lines: list[dict], usage_floor: float = 0.9, interval: int = 10) -> dict | None:
    """The steady window of a run's decode lines (`server_log_stats.decode_lines`, logged every `interval` decode
    steps), or None when the run never reaches it -> {"first", "last" (line indices), "seconds", "lines",
    "output_tok_s", "mean_running", "mean_usage"} and `window_breakdown`'s fields.

    The server first fills its pool from the queue and decodes that first fill alone until its shortest requests
    finish; then the first wave of finishes and admissions follows, bunched because the first fill started together.
    Neither is a steady state (the first is decode only, the second admits more prompt tokens per output token than
    a steady server does). The window therefore starts once one pool's worth of requests (the running count of the
    first fill) has been admitted after the fill, and runs to the last line that still finds requests waiting, with
    the pool at least `usage_floor` of its largest use in the run. A run too short for that (too few --turnovers)
    has no window."""
    if not lines:
        return None
    # SGLang runs prefill while it can admit, so its first decode line with requests waiting is the first fill
    fill = next((line for line in lines if line["queue"] > 0), None)
    if fill is None:
        return None
    refilled = fill["queue"] - fill["running"]  # the queue once the first fill's worth has been admitted again
    top = max(line["usage"] for line in lines)
    saturated = [i for i, line in enumerate(lines) if line["queue"] > 0 and line["usage"] >= usage_floor * top]
    start = next((i for i in saturated if lines[i]["queue"] <= refilled), None)
    if start is None:
        return None
    window = lines[start: saturated[-1] + 1]
    timed = [line for line in window if line["rate"] and line["running"] > 0]
    if not timed:
        return None
    return {"first": start, "last": saturated[-1], "lines": len(window),
            "seconds": (window[-1]["time"] - window[0]["time"]).total_seconds(),
            "output_tok_s": round(_line_rate(timed), 1),
            "mean_running": round(sum(line["running"] for line in window) / len(window), 1),
            "mean_usage": round(sum(line["usage"] for line in window) / len(window), 3),
            **window_breakdown(window, interval)}


def dp_steady_window(lines: list[dict], ranks: list[str], usage_floor: float, interval: int) -> dict | None:
    """Under DP attention: each rank's steady window (`steady_window` of its own lines), combined -> the server's
    output rate and running requests (sums over the ranks), its pool use and prefill figures (means), the shortest
    rank window, and "ranks"; "first"/"last" index `lines`. None unless every rank has a window. The GPU-time split
    is left out: SGLang's forward timer does not tell the ranks apart."""
    windows = []
    for rank in ranks:
        index = [i for i, line in enumerate(lines) if line["rank"] == rank]
        w = steady_window([lines[i] for i in index], usage_floor, interval)
        if w is None:
            return None
        windows.append({**w, "first": index[w["first"]], "last": index[w["last"]]})
    out = {"ranks": len(windows), "first": min(w["first"] for w in windows), "last": max(w["last"] for w in windows),
           "seconds": min(w["seconds"] for w in windows), "lines": sum(w["lines"] for w in windows)}
    for key in ("output_tok_s", "mean_running", "decode_alone_tok_s"):
        if all(key in w for w in windows):
            out[key] = round(sum(w[key] for w in windows), 1)
    for key in ("mean_usage", "prefill_tokens_per_output", "prefill_us_per_token"):
        if all(key in w for w in windows):
            out[key] = round(sum(w[key] for w in windows) / len(windows), 3)
    return out


def engine_rate(result: dict) -> dict | None:
    """A backend's entry of serve_steady.json -> the engine's side of the whole run: from its first to its last
    decode line (1 s resolution; the first comes from bench_serving's single test request, a few seconds before the
    burst), and the client's output tokens (bench_serving's output tok/s x its duration) over that span ->
    {"seconds", "output_tok_s"}, or None without both. A streaming client that cannot keep up with the engine
    reports a longer duration than the engine took: the two rates tell the attention backend's effect from the
    frontend's."""
    lines, burst = result.get("decode_lines") or [], result.get("burst") or {}
    if len(lines) < 2 or not burst.get("output_tok_s") or not burst.get("duration_s"):
        return None
    seconds = (datetime.fromisoformat(lines[-1]["time"]) - datetime.fromisoformat(lines[0]["time"])).total_seconds()
    if seconds <= 0:
        return None
    return {"seconds": seconds, "output_tok_s": round(burst["output_tok_s"] * burst["duration_s"] / seconds, 1)}


def run_backend(model: str, backend: str, workload: dict, out: Path, port: int, args) -> dict:
    """One server, the steady workload against it -> {"pool_tokens", "burst": metrics, "steady": window,
    "gpu_time_samples", ...}. workload["num_prompts"] is sized from this server's pool when it is not set yet. The
    server times its forwards on the GPU (`gpu_time`), sampled every second of the measured run."""
    log_path = out / f"server_{Path(model).name}_{backend}.log"
    graphs = workload["cuda_graph_max_bs"]  # 0: the server's own default (what a user who sets none gets)
    flags = [*(["--cuda-graph-max-bs", str(graphs)] if graphs else []),
             "--decode-log-interval", str(args.decode_log_interval), *gpu_time.SERVER_FLAGS, *RUNS[backend]]
    if workload.get("max_running_requests"):  # pools larger than a graph covers (the V3 shape's ~10M tokens)
        flags += ["--max-running-requests", str(workload["max_running_requests"])]
    if workload.get("mem_fraction_static"):  # after server_command's 0.80: SGLang takes a flag's last value
        flags += ["--mem-fraction-static", str(workload["mem_fraction_static"])]
    flags += shlex.split(workload.get("server_flags") or "")  # the parallel layout, last
    proc, log = start_server(model, port, flags, log_path, context_length=CONTEXT_LENGTH,
                             env={**RUN_ENV.get(backend, {}), **gpu_time.SERVER_ENV})
    res: dict = {"cmd": proc.cmd}
    try:
        wait_healthy(port, proc, args.startup_timeout)
        res["pool_tokens"] = pool_tokens(log_path.read_text(errors="replace"))
        if not workload.get("num_prompts"):
            workload["num_prompts"] = prompts_for_pool(res["pool_tokens"], workload["input_len"],
                                                       workload["output_len"], workload["range_ratio"], args.turnovers)
        # unmeasured warm-up of the same lengths (JIT builds, CUDA graph first replays), then an empty radix cache
        stream = workload.get("stream", True)
        bench_serving(port, model, workload["input_len"], 8, 16, args.bench_timeout, seed=2,
                      range_ratio=workload["range_ratio"], stream=stream)
        flush_cache(port)
        start = len(log_path.read_text(errors="replace").splitlines())
        sampler = gpu_time.GpuTimeSampler(port).start()
        try:
            res["burst"], text = bench_serving(port, model, workload["input_len"], workload["output_len"],
                                               workload["num_prompts"], args.bench_timeout,
                                               range_ratio=workload["range_ratio"], stream=stream)
            (out / f"bench_{Path(model).name}_{backend}_steady.txt").write_text(text)
        except subprocess.TimeoutExpired:
            # a client slower than the engine (or a short --bench-timeout): the server's log still holds the run
            # so far, and the steady window is the server's measure; no burst numbers
            res["client_timeout_s"] = args.bench_timeout
        finally:
            res["gpu_time_samples"] = sampler.stop()
        res.update(measured_run("\n".join(log_path.read_text(errors="replace").splitlines()[start:]),
                                args.usage_floor, args.decode_log_interval, res["gpu_time_samples"]))
    except Exception as e:  # recorded in the table, never hidden
        res["error"] = repr(e)[:300]
    finally:
        stop_server(proc, log)
    return res


def measured_run(log_text: str, usage_floor: float, interval: int, gpu_time_samples: tuple | list = ()) -> dict:
    """The server log of the measured run alone (and the GPU-time samples taken during it) -> {"decode_lines"
    (JSON-ready), "steady" (with `gpu_breakdown`'s fields where the samples cover it)}."""
    lines = decode_lines(log_text)
    ranks = sorted({line["rank"] for line in lines})
    if len(ranks) > 1:  # DP attention: each rank decodes its own requests, in the same steps as the others
        steady = dp_steady_window(lines, ranks, usage_floor, interval)
    else:
        steady = steady_window(lines, usage_floor, interval)
        if steady:
            steady.update(gpu_breakdown(lines[steady["first"]: steady["last"] + 1], gpu_time_samples, interval))
    return {"decode_lines": [{**line, "time": line["time"].isoformat()} for line in lines], "steady": steady}


def entry_from_log(text: str, usage_floor: float = 0.9, interval: int = 10) -> dict:
    """A backend's entry rebuilt from its server log alone -> {"pool_tokens", "decode_lines", "steady", "from_log"}:
    the measured run is what follows the last cache flush (run_backend flushes after the warm-up). The steady window
    is the server's own measure, so it survives a client that did not finish (bench_serving streams every response
    and falls behind the engine above ~8.7k output tok/s); the client's burst numbers and the engine span need the
    client's totals and are left out."""
    lines = text.splitlines()
    flushes = [i for i, line in enumerate(lines) if "POST /flush_cache" in line]
    if not flushes:
        raise ValueError("no cache flush in the log: not a serve_steady server log")
    return {"pool_tokens": pool_tokens(text), "from_log": True,
            **measured_run("\n".join(lines[flushes[-1] + 1:]), usage_floor, interval)}


def table(results: dict) -> str:
    """Markdown: one row per backend; the steady, burst and engine rates' ratios to flashmla BF16's."""
    backends, ref = results["backends"], results["backends"].get(REFERENCE, {})
    lines = ["| backend | pool tokens | steady output tok/s | vs flashmla BF16 | steady window s (lines) "
             "| mean running | mean pool use | decode alone tok/s (vs flashmla BF16) | prompt tokens per output "
             "| prefill µs per prompt token | GPU % decode / prefill / outside forwards "
             "| decode GPU ms per step | prefill GPU µs per prompt token "
             "| burst total tok/s | burst output tok/s | burst vs flashmla BF16 "
             "| engine s | engine output tok/s | engine vs flashmla BF16 |",
             ""]
    columns = lines[0].count("|") - 1
    lines[1] = "|---" + "|---:" * (columns - 1) + "|"
    ref_engine = engine_rate(ref) or {}
    for name, r in backends.items():
        if "error" in r:
            lines.append(f"| {name} | error: {r['error']} |" + " |" * (columns - 2))
            continue
        s, burst, engine = r.get("steady") or {}, r.get("burst") or {}, engine_rate(r) or {}
        ratio = _ratio(s.get("output_tok_s"), (ref.get("steady") or {}).get("output_tok_s"))
        burst_ratio = _ratio(burst.get("total_tok_s"), (ref.get("burst") or {}).get("total_tok_s"))
        engine_ratio = _ratio(engine.get("output_tok_s"), ref_engine.get("output_tok_s"))
        window = f"{s['seconds']:.0f} ({s['lines']})" if s else "no steady window"
        alone = s.get("decode_alone_tok_s")
        alone_ratio = _ratio(alone, (ref.get("steady") or {}).get("decode_alone_tok_s"))
        label = f"{name} (server log)" if r.get("from_log") else name
        if r.get("client_timeout_s"):
            label = f"{name} (client stopped at {r['client_timeout_s']:.0f} s)"
        lines.append(f"| {label} | {r.get('pool_tokens')} | {s.get('output_tok_s', '-')} | {ratio} | {window} "
                     f"| {s.get('mean_running', '-')} | {s.get('mean_usage', '-')} | {alone or '-'} ({alone_ratio}) "
                     f"| {s.get('prefill_tokens_per_output', '-')} | {s.get('prefill_us_per_token', '-')} "
                     f"| {_gpu_shares(s)} | {s.get('decode_gpu_ms_per_step', '-')} "
                     f"| {s.get('prefill_gpu_us_per_token', '-')} "
                     f"| {burst.get('total_tok_s', '-')} "
                     f"| {burst.get('output_tok_s', '-')} | {burst_ratio} | {engine.get('seconds', '-')} "
                     f"| {engine.get('output_tok_s', '-')} | {engine_ratio} |")
    return "\n".join(lines)


def _gpu_shares(steady: dict) -> str:
    keys = ("gpu_decode_share", "gpu_prefill_share", "gpu_outside_share")
    return " / ".join(f"{100 * steady[k]:.0f}" for k in keys) if all(k in steady for k in keys) else "-"


def _ratio(value, base) -> str:
    return f"{value / base:.2f}x" if value and base else "-"


def plot(results: dict, path: Path) -> Path:
    """Decode rate (gen throughput) over the run's seconds, one line per backend, steady windows shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    for k, (name, r) in enumerate(results["backends"].items()):
        lines = r.get("decode_lines") or []
        if not lines:
            continue
        t0 = datetime.fromisoformat(lines[0]["time"])
        xs = [(datetime.fromisoformat(line["time"]) - t0).total_seconds() for line in lines]
        ax.plot(xs, [line["rate"] or 0.0 for line in lines], label=name, color=f"C{k}", lw=1)
        s = r.get("steady")
        if s:
            ax.axvspan(xs[s["first"]], xs[s["last"]], color=f"C{k}", alpha=0.12)
    ax.set_xlabel("seconds since the first decode line")
    ax.set_ylabel("gen throughput (tok/s)")
    ax.set_title(f"{Path(results['model']).name}: decode rate, steady windows shaded")
    ax.legend()
    fig.tight_layout()
    save_png(fig, path, dpi=110)
    plt.close(fig)
    return path


def merge_runs(runs: list[dict]) -> dict:
    """One result of several runs of the same model and workload (e.g. one backend per GPU, all at once): their
    backends side by side. Another model or workload, or a backend in two runs, stops with the reason."""
    merged = {"model": runs[0]["model"], "workload": runs[0]["workload"], "backends": {}}
    for run in runs:
        for key in ("model", "workload"):
            if run[key] != merged[key]:
                raise SystemExit(f"--merge: runs of another {key} ({run[key]} against {merged[key]}); a steady-window "
                                 "comparison needs the same requests for every backend (pass --prompts to each run)")
        for backend, entry in run["backends"].items():
            if backend in merged["backends"]:
                raise SystemExit(f"--merge: {backend} is in more than one run")
            merged["backends"][backend] = entry
    return merged


def main(argv: list[str] | None = None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="configs/models/deepseek-v2-lite-shape")
    ap.add_argument("--backends", nargs="+", default=["snapmla", "flashmla", "flashmla-fp8"], choices=list(RUNS))
    ap.add_argument("--input-len", type=int, default=DEFAULTS["input_len"])
    ap.add_argument("--output-len", type=int, default=DEFAULTS["output_len"])
    ap.add_argument("--range-ratio", type=float, default=DEFAULTS["range_ratio"])
    ap.add_argument("--prompts", type=int, help="the request count (default: sized from the first backend's pool)")
    ap.add_argument("--turnovers", type=float, default=3.0,
                    help="how many times the requests fill the pool (the steady window needs more than ~2)")
    ap.add_argument("--usage-floor", type=float, default=0.9,
                    help="pool use of a steady line, relative to the run's peak")
    ap.add_argument("--cuda-graph-max-bs", type=int, default=CUDA_GRAPH_MAX_BS,
                    help="largest captured decode batch, the same for every backend (above the largest running "
                         "batch); 0: each server's default, as a user who sets none gets it")
    ap.add_argument("--max-running-requests", type=int,
                    help="cap on running requests, the same for every backend (default: SGLang's, from the pool)")
    ap.add_argument("--mem-fraction-static", type=float,
                    help="GPU memory for weights and the KV pool, the same bytes for every backend (default 0.80); "
                         "a smaller one makes the pool bind on the 8-layer V3 shape, whose ~10M-token pool at "
                         "0.80 stands for what 61 layers leave on a GPU")
    ap.add_argument("--server-flags", default="",
                    help="flags every server gets last, the same for every backend: the parallel layout, e.g. "
                         "'--tp 2 --enable-dp-attention --dp 2' (the steady window then sums the DP ranks)")
    ap.add_argument("--no-stream", action="store_true",
                    help="whole responses (bench_serving --disable-stream): no per-token work in the client and the "
                         "server's frontend, which a single streaming client cannot keep up with above ~8.7k tok/s; "
                         "the steady window is the server's measure either way")
    ap.add_argument("--decode-log-interval", type=int, default=10, help="decode steps per server log line")
    ap.add_argument("--resume", action="store_true", help="keep backends already measured in --out")
    ap.add_argument("--redraw", action="store_true",
                    help="print the table and draw the plot of --out's JSON; serve nothing")
    ap.add_argument("--merge", nargs="+", type=Path, metavar="JSON",
                    help="serve nothing: merge these serve_steady.json files (runs of one workload, e.g. one backend "
                         "per GPU at once, each with the same --prompts) into --out's, then print and draw it")
    ap.add_argument("--from-log", nargs=2, action="append", default=[], metavar=("BACKEND", "LOG"),
                    help="add BACKEND's entry from its server log (entry_from_log) instead of serving it; with "
                         "--resume, to the requests of --out's JSON (the log must come from that workload)")
    ap.add_argument("--startup-timeout", type=float, default=600)
    ap.add_argument("--bench-timeout", type=float, default=1800,
                    help="seconds for the client; past it the run's steady window still comes from the server log")
    ap.add_argument("--port", type=int, default=21000)
    ap.add_argument("--out", type=Path, default=Path("steady_out"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "serve_steady.json"
    workload = {"input_len": args.input_len, "output_len": args.output_len, "range_ratio": args.range_ratio,
                "num_prompts": args.prompts, "cuda_graph_max_bs": args.cuda_graph_max_bs,
                "max_running_requests": args.max_running_requests, "mem_fraction_static": args.mem_fraction_static,
                "stream": not args.no_stream, "server_flags": args.server_flags}
    results = {"model": args.model, "workload": workload, "backends": {}}
    saved = stored(path).exists()
    if args.redraw and not saved:
        raise SystemExit(f"--redraw: no {path}")
    if (args.resume or args.redraw) and saved:
        results = read_json(path)
        if results["model"] != args.model:
            raise SystemExit(f"{path} holds {results['model']}; pass another --out for {args.model}")
        workload = results["workload"]  # the same requests for every backend
    if args.merge:
        results = merge_runs([read_json(p) for p in args.merge])
        workload = results["workload"]
        path.write_text(json.dumps(results, indent=1))
    for backend, log in args.from_log:
        entry = entry_from_log(read_log(Path(log)), args.usage_floor, args.decode_log_interval)
        measured = results["backends"].get(backend, {})
        if measured.get("burst"):  # a measured backend's log read again: its client numbers stay
            entry = {**measured, **entry, "from_log": False}
        results["backends"][backend] = entry
        path.write_text(json.dumps(results, indent=1))
    kill_servers_on_exit()
    to_serve = [] if args.from_log or args.redraw or args.merge else args.backends
    if to_serve and importlib.util.find_spec("prometheus_client") is None:
        raise SystemExit("serve_steady starts servers with --enable-metrics (their GPU time per forward), which needs "
                         "prometheus-client: pip install prometheus-client (tools/gpu_host/build-runtime.sh's bundle "
                         "has it)")
    for backend in to_serve:
        if backend in results["backends"] and "error" not in results["backends"][backend]:
            continue
        results["backends"][backend] = run_backend(args.model, backend, workload, args.out, args.port, args)
        path.write_text(json.dumps(results, indent=1))
    print(f"{Path(results['model']).name}: {workload['num_prompts']} prompts, in {workload['input_len']} / out "
          f"{workload['output_len']}, lengths from {workload['range_ratio']} x; server flags "
          f"{workload.get('server_flags') or '(none)'}\n")
    print(table(results))
    print(f"\nJSON: {path}; plot: {plot(results, args.out / 'serve_steady.png')}")


if __name__ == "__main__":
    main()
