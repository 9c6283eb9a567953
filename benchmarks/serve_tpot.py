"""Time per output token at fixed concurrencies, per server setup: what a change to a decode step's host or GPU work
costs a serving user (GPU host, after `source tools/gpu_host/env.sh`).

    python -m benchmarks.serve_tpot --model configs/models/deepseek-v3-shape \\
        --runs snapmla-flashmla-schedule snapmla --concurrency 1 128 --rounds 2 --out tpot_v3

Each round starts every run's server in turn (harness RUNS, dummy weights unless `--load-format auto`, page 64,
`--cuda-graph-max-bs` covering the largest concurrency, so every measured step replays a CUDA graph) and, per
concurrency c, sends an unmeasured warm-up, then `python -m sglang.bench_serving` random-ids (in --input-len / out
--output-len, every request the same, max(8, 2c) prompts, --max-concurrency c). A run's TPOT at c is the median over its
rounds of bench_serving's median TPOT (the same for ITL; output tok/s likewise). Rounds alternate the servers, so a
drift of the machine over the call reaches every run alike. Prints a table (each run's TPOT beside the first run's,
measured in the same call), writes serve_tpot.json and serve_tpot.png (`--redraw JSON` prints the table again and
draws the PNG where matplotlib is).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from harness.bench_serving import bench_serving
from harness.server import RUN_ENV, RUNS, kill_servers_on_exit, serving
from harness.results import read_json, save_png

METRICS = ("median_tpot_ms", "median_itl_ms", "output_tok_s")


def prompts_for(concurrency: int) -> int:
    """Enough requests that every slot serves two of them (a steady batch between the first admissions and the
    tail), at least 8 at concurrency 1."""
    return max(8, 2 * concurrency)


def summarize(samples: dict[str, dict[str, list[dict]]]) -> dict[str, dict[str, dict]]:
    """{run: {concurrency: [bench_serving metrics per round]}} -> {run: {concurrency: median of each metric over
    the rounds, and the rounds' TPOTs}}."""
    out: dict[str, dict[str, dict]] = {}
    for run, by_c in samples.items():
        for c, rounds in by_c.items():
            row = {m: round(statistics.median(r[m] for r in rounds), 3) if all(r.get(m) is not None for r in rounds)
                   else None for m in METRICS}
            row["tpot_rounds_ms"] = [r.get("median_tpot_ms") for r in rounds]
            out.setdefault(run, {})[c] = row
    return out


def table(summary: dict[str, dict[str, dict]]) -> str:
    """Markdown: one row per (run, concurrency), TPOT relative to the first run's at that concurrency."""
    runs = list(summary)
    lines = ["| run | concurrency | median TPOT ms | rounds' TPOT ms | median ITL ms | output tok/s | "
             f"TPOT vs {runs[0]} |", "|---|---:|---:|---|---:|---:|---:|"]
    for run in runs:
        for c, row in summary[run].items():
            base = summary[runs[0]].get(c, {}).get("median_tpot_ms")
            ratio = f"{row['median_tpot_ms'] / base:.3f}x" if base and row["median_tpot_ms"] else "-"
            lines.append(f"| {run} | {c} | {row['median_tpot_ms']} | {', '.join(map(str, row['tpot_rounds_ms']))} | "
                         f"{row['median_itl_ms']} | {row['output_tok_s']} | {ratio} |")
    return "\n".join(lines)


def plot(summary: dict[str, dict[str, dict]], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = list(summary)
    concurrencies = list(summary[runs[0]])
    fig, axes = plt.subplots(1, len(concurrencies), figsize=(3.2 * len(concurrencies), 3.2), squeeze=False)
    for ax, c in zip(axes[0], concurrencies):
        tpots = [summary[r].get(c, {}).get("median_tpot_ms") or 0 for r in runs]
        ax.bar(range(len(runs)), tpots, color=[f"C{i}" for i in range(len(runs))])
        ax.set_xticks(range(len(runs)), runs, rotation=20, ha="right", fontsize=7)
        ax.set_title(f"concurrency {c}", fontsize=9)
        ax.set_ylabel("median TPOT (ms)")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    save_png(fig, path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="configs/models/deepseek-v3-shape")
    ap.add_argument("--runs", nargs="+", default=["snapmla-flashmla-schedule", "snapmla"], choices=list(RUNS))
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 128])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--context-length", type=int, default=32768, help="at most the model's (4096: the small trained "
                    "checkpoint of tools/train_tiny_mla.py)")
    ap.add_argument("--load-format", default="dummy", help="'auto' for a trained checkpoint")
    ap.add_argument("--startup-timeout", type=float, default=420, help="seconds until /health answers")
    ap.add_argument("--bench-timeout", type=float, default=300)
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more server flags (last)")
    ap.add_argument("--out", type=Path, default=Path("serve_tpot_out"))
    ap.add_argument("--redraw", type=Path, help="only draw the PNG from this serve_tpot.json (no GPU needed)")
    args = ap.parse_args(argv)
    if args.redraw:
        saved = read_json(args.redraw)
        print(table(saved["summary"]))
        plot(saved["summary"], saved["title"], args.redraw.with_suffix(".png"))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    kill_servers_on_exit()
    title = f"{Path(args.model).name}, in {args.input_len} / out {args.output_len}"
    samples: dict[str, dict[str, list[dict]]] = {run: {} for run in args.runs}
    graph_bs = str(max(args.concurrency))
    for rnd in range(args.rounds):
        for i, run in enumerate(args.runs):
            log = args.out / f"server_{run}_round{rnd}.log"
            with serving(args.model, 31000 + i, ["--cuda-graph-max-bs", graph_bs, *RUNS[run], *args.extra], log,
                         args.startup_timeout, env=RUN_ENV.get(run), context_length=args.context_length,
                         load_format=args.load_format):
                for c in args.concurrency:
                    bench_serving(31000 + i, args.model, args.input_len, min(args.output_len, 32), c,
                                  args.bench_timeout, seed=2, max_concurrency=c)  # warm-up
                    metrics, text = bench_serving(31000 + i, args.model, args.input_len, args.output_len,
                                                  prompts_for(c), args.bench_timeout, max_concurrency=c)
                    (args.out / f"bench_{run}_c{c}_round{rnd}.txt").write_text(text)
                    samples[run].setdefault(str(c), []).append(metrics)
                    print(json.dumps({"run": run, "round": rnd, "concurrency": c} | metrics), flush=True)
    summary = summarize(samples)
    print(f"\n{title}, {args.rounds} round(s)\n{table(summary)}")
    (args.out / "serve_tpot.json").write_text(json.dumps({"title": title, "args": {k: str(v) for k, v in
                                                                                   vars(args).items()},
                                                          "samples": samples, "summary": summary}, indent=1))
    try:
        plot(summary, title, args.out / "serve_tpot.png")
    except ImportError:
        print("matplotlib is not installed here: draw the PNG with --redraw serve_tpot.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
