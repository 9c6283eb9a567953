"""Start an SGLang server per backend, check its endpoints, run `python -m sglang.bench_serving`, compare.

    python -m benchmarks.serve_and_bench --model configs/models/deepseek-v2-lite-shape \
        --runs snapmla flashmla flashmla-fp8 --num-prompts 320 --out bench_out

Each run: `python -m sglang.launch_server --load-format dummy` with the anchor's flags (page 64, context 32768,
--mem-fraction-static 0.80, --cuda-graph-max-bs 256, --grammar-backend none), then /generate,
/v1/completions and /v1/chat/completions, then bench_serving random-ids in 4096 / out 512 (range ratio 1.0;
`--range-ratio 0.5` draws each request's lengths in [half, all] of them). Prints a table (total and output tok/s, median
TPOT / ITL / TTFT, pool tokens, peak running requests, the engine's output tok/s from the server log's batches during the
measured call, ratios vs flashmla BF16 of the same call) and writes JSON. The
decode-heavy burst of docs/BENCHMARKS.md: `--runs snapmla flashmla flashmla-fp8 --input-len 1024 --output-len 1024
--range-ratio 0.5 --num-prompts 1500 --cuda-graph-max-bs 512 --extra --mem-fraction-static 0.60`.
Runs (`--runs`): see RUNS; `snapmla-mtp` / `flashmla-mtp` / `flashmla-fp8-mtp` add DeepSeek MTP (NEXTN)
speculative decoding.
`--greedy-repeat` also generates a fixed greedy batch twice and records whether the outputs are identical;
`--extra` passes more server flags (e.g. `--tp 2 --enable-dp-attention --dp 2`, see tools/gpu_host/multi_gpu.sh).
One backend per GPU at once: one process per backend (`CUDA_VISIBLE_DEVICES`, `--port`, `--out`), then `--merge`
their folders into one.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness.bench_serving import METRICS, bench_serving, parse_metrics
from harness.results import read_json, save_png, stored
from harness.server_log import engine_span, peak_running_requests, pool_tokens, read_log
from harness.server import (LAUNCHERS, RUN_ENV, RUNS, flush_cache, greedy_generate, kill_servers_on_exit, post,
                            start_server, stop_server, wait_healthy)

PROBE_TEXT = "def fibonacci(n):"  # the endpoint probe's /generate prompt (tools/nan_origin.py sends it too)


def check_endpoints(port: int, model: str) -> dict:
    """One greedy request to each of /generate, /v1/completions and /v1/chat/completions: their texts, and the
    /generate request's token ids and logprobs (None where the server sent a non-finite one), which show whether a
    backend's outputs are one repeated token or NaN where their text is empty."""
    gen = post(port, "/generate", {"text": PROBE_TEXT, "return_logprob": True,
                                   "sampling_params": {"max_new_tokens": 16, "temperature": 0}})
    comp = post(port, "/v1/completions", {"model": model, "prompt": "import os\n", "max_tokens": 16,
                                          "temperature": 0})
    chat = post(port, "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": "hello"}],
                                               "max_tokens": 16, "temperature": 0})
    out = {"generate": gen["text"], "completions": comp["choices"][0]["text"],
           "chat": chat["choices"][0]["message"]["content"]}
    assert all(isinstance(v, str) for v in out.values()), out
    assert gen["meta_info"]["completion_tokens"] == 16, gen["meta_info"]
    tokens = gen["meta_info"].get("output_token_logprobs") or []  # [logprob, token id, text] per token
    out["generate_ids"] = [t[1] for t in tokens]
    out["generate_logprobs"] = [t[0] if t[0] is None else round(t[0], 4) for t in tokens]
    return out


def non_finite_probe(endpoints: dict | None) -> str:
    """'n/16' where n of the endpoint probe's greedy logprobs are not finite (null in the JSON), '-' where the run
    kept none."""
    logprobs = (endpoints or {}).get("generate_logprobs")
    return f"{sum(lp is None for lp in logprobs)}/{len(logprobs)}" if logprobs else "-"


def text_share(r: dict) -> str:
    """The output tokens that decode to text: bench_serving's retokenized count over its output tokens. Near 1 for
    a model whose outputs are tokens; a NaN output is token 0, which decodes to no text."""
    tokens, text = r.get("output_tokens"), r.get("retokenized_output_tokens")
    return f"{text / tokens:.2f}" if tokens and text is not None else "-"


def probe_non_finite(endpoints: dict | None) -> bool:
    """Whether any of the endpoint probe's greedy logprobs was not finite (`non_finite_probe` counts them)."""
    return any(lp is None for lp in (endpoints or {}).get("generate_logprobs") or [])


def probe_line(name: str, res: dict) -> str:
    """The line a run prints as soon as its server answers and its endpoint probe returns, so that a run stopped
    later (a call's time limit) still says how it started and whether its outputs are finite."""
    return (f"serve_and_bench: {name}: answered in {res['startup_s']} s; endpoint probe: "
            f"{non_finite_probe(res['endpoints'])} greedy logprobs not finite")


def warn_non_finite(name: str, endpoints: dict) -> None:
    """One loud line where the endpoint probe's greedy logprobs are not finite: such a run's outputs are NaN, so
    bench_serving's TTFT and TPOT (timed from the first streamed chunk with text) are not a request's, and its rate
    is that of a model that may skip work (a NaN token's routing) -- not a deployment's."""
    if probe_non_finite(endpoints):
        print(f"serve_and_bench: {name}: {non_finite_probe(endpoints)} of the endpoint probe's greedy logprobs are not "
              "finite (NaN outputs): its TTFT / TPOT are not comparable and its rate may not be a deployment's",
              file=sys.stderr)


def greedy_repeat(port: int, prompts: int = 8, new_tokens: int = 32) -> dict:
    """A fixed greedy batch (seeded token ids, sent concurrently) generated twice, the radix cache flushed before
    each pass: the outputs must be identical between the two (CUDA graphs, batching and, on several GPUs, the
    collectives are deterministic). Without the flush the second pass would be a prefix hit, whose last page is
    prefilled over the cached prefix (another route, and for an FP8 cache the quantized keys): a different
    computation, which can flip a near-tie."""
    rng = random.Random(0)
    batch = [[rng.randrange(100, 20000) for _ in range(rng.randrange(50, 600))] for _ in range(prompts)]
    runs = []
    for _ in range(2):
        flush_cache(port)
        with ThreadPoolExecutor(prompts) as ex:
            runs.append([r["output_ids"] for r in ex.map(lambda ids: greedy_generate(port, ids, new_tokens), batch)])
    return {"identical": runs[0] == runs[1], "outputs": runs[0]}


def run_one(name: str, args, out_dir: Path, port: int, save_row=lambda res: None) -> dict:
    """One backend's server, probe and bench. `save_row(res)` is called with the row as it grows, so the caller can
    save it before the run ends: once the server has answered its endpoint probe (start-up time and probe), and as
    soon as bench_serving has returned. A time limit that kills serve_and_bench during the bench keeps the start-up,
    and one that kills it while the server stops (up to 30 s) keeps the measured run (`--merge` and `--reprint` fill
    in its pool and peak from the server log)."""
    t0 = time.time()
    log_path = out_dir / f"server_{name}.log"
    graphs = ["--cuda-graph-max-bs", str(args.cuda_graph_max_bs)] if args.cuda_graph_max_bs else []
    proc, log = start_server(args.model, port, [*graphs, *RUNS[name], *args.extra], log_path,
                             env=RUN_ENV.get(name), launcher=args.launcher)
    res = {"run": name, "cmd": proc.cmd, "workload": workload_of(args)}
    measured_from = None  # the server log's size when the measured bench_serving call starts
    try:
        wait_healthy(port, proc, args.startup_timeout)
        res["startup_s"] = round(time.time() - t0, 1)
        res["endpoints"] = check_endpoints(port, args.model)
        print(probe_line(name, res), flush=True)
        warn_non_finite(name, res["endpoints"])
        if args.greedy_repeat:
            res["greedy_repeat"] = greedy_repeat(port)
        save_row(res)
        if args.num_prompts:
            if args.warmup_prompts:  # first-use JIT builds (FlashInfer prefill, Triton variants) stay out of the run
                bench_serving(port, args.model, args.input_len, args.warmup_output_len or args.output_len,
                              args.warmup_prompts, args.bench_timeout, seed=2)
            measured_from = log_path.stat().st_size
            metrics, text = bench_serving(port, args.model, args.input_len, args.output_len, args.num_prompts,
                                          args.bench_timeout, stream=not args.disable_stream,
                                          range_ratio=args.range_ratio)
            (out_dir / f"bench_{name}.txt").write_text(text)
            res.update(metrics)
            save_row(res)
    except Exception as e:  # recorded in the table, never hidden
        res["error"] = repr(e)[:300]
    finally:
        stop_server(proc, log)
    raw = log_path.read_bytes()
    text = raw.decode(errors="replace")
    res.update(log_fields(text))
    if measured_from is not None:
        res.update(engine_rate(raw[measured_from:].decode(errors="replace"), res.get("output_tokens")))
    if "error" in res:
        res["server_log_tail"] = text[-3000:]
    return res


def log_fields(log: str) -> dict:
    """What a run's row takes from its server log: the pool's size in tokens and the largest running batch."""
    return {"pool_tokens": pool_tokens(log), "peak_running_req": peak_running_requests(log)}


def engine_rate(measured_log: str, output_tokens: float | None, min_queue: int = 0) -> dict:
    """The engine's side of a run, from the server log lines the measured bench_serving call wrote: seconds from its
    first prefill batch (with `min_queue` requests waiting) to its last decode batch, and the output tokens over them
    (1 s resolution). bench_serving's own output rate also counts the streaming to its client, which bounds it in
    large streamed bursts."""
    span = engine_span(measured_log, min_queue)
    return {"engine_span_s": span,
            "engine_output_tok_s": round(output_tokens / span) if span and output_tokens else None}


def workload_of(args) -> dict:
    """What a run measured, beside its backend: runs of one workload can be merged (`merge_folders`)."""
    return {"model": args.model, "input_len": args.input_len, "output_len": args.output_len,
            "range_ratio": args.range_ratio, "num_prompts": args.num_prompts,
            "cuda_graph_max_bs": args.cuda_graph_max_bs, "disable_stream": args.disable_stream, "extra": args.extra}


def cut_runs(folder: Path, rows: list[dict]) -> list[dict]:
    """Runs whose bench_serving summary (bench_RUN.txt) is in `folder` but whose row is not in its serve_bench.json:
    serve_and_bench killed after that bench had printed and before the row was saved (`run_one`'s `measured` saves
    it as soon as the bench returns; a SIGKILL can come sooner). Each row is rebuilt from the summary and the server
    log, with the folder's workload (every run of one serve_and_bench measured the same), and says so: `"recovered": "bench text and
    server log"`; its start-up time and endpoint probe are not kept."""
    named = {r["run"] for r in rows}
    found = []
    for bench in sorted(folder.glob("bench_*.txt*")):
        run = bench.name.removeprefix("bench_").split(".txt")[0]
        if run in named or run in {f["run"] for f in found}:
            continue
        if not rows:
            raise SystemExit(f"{bench}: no saved run in {folder} gives its workload; rerun it")
        found.append({"run": run, "workload": rows[0]["workload"], "recovered": "bench text and server log",
                      **parse_metrics(read_log(bench))})
    return found


def fill_from_log(r: dict, folder: Path) -> dict:
    """r with the pool size and peak batch it lacks taken from its server log in `folder` (a row saved as soon as its
    bench returned, before its server stopped, or rebuilt by `cut_runs`), and the bench_serving figures it has no key
    for (METRICS grown after it ran) from its bench text there."""
    log = stored(folder / f"server_{r['run']}.log")
    if log.exists() and any(r.get(k) is None for k in ("pool_tokens", "peak_running_req")):
        r.update({k: v for k, v in log_fields(read_log(log)).items() if r.get(k) is None})
    bench = stored(folder / f"bench_{r['run']}.txt")
    if bench.exists() and any(k not in r for k in METRICS):
        r.update({k: v for k, v in parse_metrics(read_log(bench)).items() if k not in r})
    return r


def merge_folders(folders: list[Path], out: Path) -> list[dict]:
    """Runs of one workload saved in several folders (e.g. one backend per GPU, all at once) as one folder `out`:
    their results side by side in out/serve_bench.json, their server logs and bench_serving texts copied (and a run
    a time limit cut after its bench, `cut_runs`). Another workload, or a run name in two folders, stops with the
    reason."""
    merged: list[dict] = []
    out.mkdir(parents=True, exist_ok=True)
    for folder in folders:
        rows = read_json(folder / "serve_bench.json")
        for r in [fill_from_log(r, folder) for r in [*rows, *cut_runs(folder, rows)]]:
            if merged and r.get("workload") != merged[0].get("workload"):
                raise SystemExit(f"--merge: {folder} ran another workload ({r.get('workload')} against "
                                 f"{merged[0].get('workload')}); compare runs of the same requests")
            if any(m["run"] == r["run"] for m in merged):
                raise SystemExit(f"--merge: the run {r['run']} is in more than one folder")
            merged.append(r)
            for name in (f"server_{r['run']}.log", f"bench_{r['run']}.txt"):
                kept = stored(folder / name)
                if kept.exists():
                    shutil.copyfile(kept, out / kept.name)
    (out / "serve_bench.json").write_text(json.dumps(merged, indent=1))
    return merged


def reprint(folder: Path, min_queue: int) -> list[dict]:
    """A saved run's results with the engine's span and rate from each run's server log in `folder` (whole logs:
    `min_queue` marks where the measured call's intake starts); output tokens as bench_serving counted them (older
    results: its output rate times its duration)."""
    results = read_json(folder / "serve_bench.json")
    for r in results:
        log = stored(folder / f"server_{r['run']}.log")
        tokens = r.get("output_tokens") or (r.get("output_tok_s") or 0) * (r.get("duration_s") or 0)
        if log.exists():
            r.update(engine_rate(read_log(log), tokens, min_queue))
        fill_from_log(r, folder)
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="configs/models/deepseek-v2-lite-shape")
    ap.add_argument("--runs", nargs="+", default=["snapmla", "flashmla"], choices=list(RUNS))
    ap.add_argument("--num-prompts", type=int, default=320)
    ap.add_argument("--warmup-prompts", type=int, default=16, help="unmeasured bench_serving run first (0: none)")
    ap.add_argument("--warmup-output-len", type=int, default=None,
                    help="output tokens per warm-up request (default: --output-len); the warm-up's prompts are always "
                         "--input-len long, so long prompts with long outputs warm up in seconds")
    ap.add_argument("--input-len", type=int, default=4096)
    ap.add_argument("--output-len", type=int, default=512)
    ap.add_argument("--range-ratio", type=float, default=1.0,
                    help="bench_serving --random-range-ratio: lengths drawn in [ratio x len, len]")
    ap.add_argument("--cuda-graph-max-bs", type=int, default=256,
                    help="largest captured decode batch; 0: no flag, the server's own default (what a user who sets "
                         "none gets: SGLang's for BF16, snapmla's larger one for its pool)")
    ap.add_argument("--port", type=int, default=30000,
                    help="the first run's server port, the next runs' the ports after it (another port for a second "
                         "serve_and_bench on the same host, e.g. one per GPU with CUDA_VISIBLE_DEVICES)")
    ap.add_argument("--startup-timeout", type=float, default=300, help="seconds until /health answers")
    ap.add_argument("--bench-timeout", type=float, default=400)
    ap.add_argument("--greedy-repeat", action="store_true",
                    help="generate a fixed greedy batch twice and record whether the outputs are identical")
    ap.add_argument("--disable-stream", action="store_true",
                    help="bench_serving --disable-stream: whole responses, so that SGLang's per-token streaming "
                         "frontend (~10-20k output tok/s) does not set the duration (no TTFT / TPOT then)")
    ap.add_argument("--launcher", default="launch_server", choices=LAUNCHERS,
                    help="python -m sglang.launch_server, or the sglang CLI's serve subcommand")
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more server flags (last)")
    ap.add_argument("--out", type=Path, default=Path("bench_out"))
    ap.add_argument("--reprint", type=Path, metavar="DIR",
                    help="print the table of a saved run (DIR/serve_bench.json), the engine's rate recomputed from the "
                         "server logs in DIR (server_RUN.log[.xz]) from the first prefill batch with --min-queue "
                         "requests waiting (a measured burst's intake; its warm-up sends fewer), and draw its plot "
                         "(DIR/serve_bench.png)")
    ap.add_argument("--min-queue", type=int, default=0, help="with --reprint or --merge (see --reprint)")
    ap.add_argument("--merge", type=Path, nargs="+", metavar="DIR",
                    help="runs of one workload saved in these folders (e.g. one backend per GPU at once) into one "
                         "folder --out, then its table as --reprint prints it and its plot")
    args = ap.parse_args()
    if args.merge:
        merge_folders(args.merge, args.out)
        args.reprint = args.out
    if args.reprint:
        print(table(reprint(args.reprint, args.min_queue)))
        print("plot:", plot(read_json(args.reprint / "serve_bench.json"), args.reprint / "serve_bench.png"))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    kill_servers_on_exit()
    results = []

    def save(rows: list[dict]) -> None:
        (args.out / "serve_bench.json").write_text(json.dumps(rows, indent=1))

    for i, name in enumerate(args.runs):
        r = run_one(name, args, args.out, args.port + i, save_row=lambda res: save([*results, res]))
        results.append(r)
        print(json.dumps({k: v for k, v in r.items() if k not in ("server_log_tail", "greedy_repeat")}
                         | {"greedy_repeat_identical": r.get("greedy_repeat", {}).get("identical")}), flush=True)
        if "server_log_tail" in r:
            print(r["server_log_tail"], flush=True)
        # after every run: a call cut short by a time limit keeps the runs it finished
        save(results)
    print(f"\nmodel {args.model}, random-ids in {args.input_len} / out {args.output_len} (range ratio "
          f"{args.range_ratio:g}), {args.num_prompts} prompts")
    print(table(results))
    print("plot:", plot(results, args.out / "serve_bench.png"))


def run_label(r: dict) -> str:
    """A run's name on the plot, with what its outputs were where they were not all text: the endpoint probe's
    non-finite logprobs and the share of output tokens with text (`non_finite_probe`, `text_share`)."""
    endpoints, share = r.get("endpoints"), text_share(r)
    notes = ([f"probe NaN {non_finite_probe(endpoints)}"] if probe_non_finite(endpoints) else []) + (
        [f"text {share}"] if share != "-" and float(share) < 0.9 else [])
    return "\n".join([r["run"], ", ".join(notes)]) if notes else r["run"]


def plot(results: list[dict], path: Path) -> Path:
    """Output tok/s and median TTFT per run, side by side; a run whose outputs are not all text says so under its
    bars (`run_label`), since bench_serving times TTFT from the first streamed chunk with text."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    names = [run_label(r) for r in results]
    for ax, (key, label) in zip(axes, (("output_tok_s", "output tok/s"),
                                       ("median_ttft_ms", "median TTFT ms (first chunk with text)"))):
        ax.bar(names, [r.get(key) or 0 for r in results], color=[f"C{i}" for i in range(len(names))])
        ax.set_title(label)
        ax.tick_params(axis="x", rotation=20)
    fig.tight_layout()
    save_png(fig, path, dpi=110)
    plt.close(fig)
    return path


def table(results: list[dict]) -> str:
    """Markdown: one row per run; ratios against the flashmla BF16 run of the same call (where it ran)."""
    base = next((r for r in results if r["run"] == "flashmla" and r.get("total_tok_s")), None)

    def ratio(r: dict, key: str) -> str:
        return f"{r[key] / base[key]:.2f}x" if base and r.get(key) and base.get(key) else "-"

    lines = ["| run | total tok/s | output tok/s | median TPOT ms | median ITL ms | median TTFT ms | pool tokens | "
             "peak running req | output vs flashmla BF16 | TTFT vs flashmla BF16 | pool vs flashmla BF16 | "
             "engine output tok/s | engine vs flashmla BF16 | outputs with text | probe logprobs not finite |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['run']} | {r.get('total_tok_s')} | {r.get('output_tok_s')} | {r.get('median_tpot_ms')} | "
                     f"{r.get('median_itl_ms')} | {r.get('median_ttft_ms')} | {r.get('pool_tokens')} | "
                     f"{r.get('peak_running_req')} | {ratio(r, 'output_tok_s')} | {ratio(r, 'median_ttft_ms')} | "
                     f"{ratio(r, 'pool_tokens')} | {r.get('engine_output_tok_s')} | "
                     f"{ratio(r, 'engine_output_tok_s')} | "
                     f"{text_share(r)} | {non_finite_probe(r.get('endpoints'))} |"
                     + (f" error: {r['error']}" if "error" in r else ""))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
