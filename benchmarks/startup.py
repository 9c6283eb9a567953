"""How long a server takes to start, per phase, with empty compile caches (cold) and with the caches a first start
left (warm), backends side by side:

    python -m benchmarks.startup --models configs/models/deepseek-v3-shape configs/models/deepseek-v2-lite-shape \\
        --backends snapmla flashmla --gpus 2 3 --caches /scratch/startup_caches --out startup_out \\
        --server-flags='--cuda-graph-max-bs 512 --mem-fraction-static 0.60'

Per model, two passes. In each, every backend's server (harness.server RUNS, dummy weights) starts at the same moment
on its own GPU, so that the compiles of both compete for the same CPU; each backend has its own cache folders
(CACHE_VARIABLES, under CACHES/BACKEND, HOME included, so that the CUDA driver's and every library's default cache
folder lies there too). The cold pass empties them first; the warm pass starts on what the cold start left.

Per server: seconds from process start to /health answering 200 ("to ready", 0.5 s resolution), the first greedy
request after it (a path the server's own warm-up did not compile shows here), and the log's phases
(harness.server_log.startup_report: SGLang's engine timings, the longest silences and the line that ended each).
Goals against flashmla BF16 (GOALS): warm, snapmla's decode-graph capture <= 1.5x flashmla's and to ready <=
flashmla's + 10 s; cold, to ready <= flashmla's + 30 s. Prints the table and the goals, writes startup.json and
startup.png.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import threading
import time
from pathlib import Path

from harness.server_log import startup_report
from harness.server import RUNS, greedy_generate, kill_servers_on_exit, start_server, stop_server, wait_healthy
from harness.results import save_png

# every compile cache a start fills, by the variable that moves it (docs/DEPLOY.md, "Start-up time")
# (Python's bytecode is not among them: pip writes it when it installs a package)
CACHE_VARIABLES = ("TRITON_CACHE_DIR", "TORCH_EXTENSIONS_DIR", "FLASHINFER_WORKSPACE_BASE", "TVM_FFI_CACHE_DIR",
                   "TORCHINDUCTOR_CACHE_DIR", "XDG_CACHE_HOME", "CUDA_CACHE_PATH", "HOME")
PASSES = ("cold", "warm")
# (pass, what is compared, limit): snapmla against flashmla BF16 of the same model and pass
GOALS = (("warm", "decode graphs ratio", 1.5), ("warm", "ready difference s", 10.0),
         ("cold", "ready difference s", 30.0))
FIRST_REQUEST_IDS = list(range(100, 612))  # 512 ids every bundled config's vocabulary holds


def cache_env(root: Path) -> dict[str, str]:
    """The server environment that puts every compile cache under `root` (one folder per variable)."""
    return {var: str(root / var.lower()) for var in CACHE_VARIABLES}


def start_one(model: str, backend: str, gpu: str, port: int, caches: Path, phase: str, flags: list[str],
              out: Path, timeout: float) -> dict:
    """One server's start (as the module docstring describes) -> its row."""
    env = {**cache_env(caches), "CUDA_VISIBLE_DEVICES": gpu}
    for folder in env.values():
        Path(folder).mkdir(parents=True, exist_ok=True)
    log_path = out / f"server_{Path(model).name}_{backend}_{phase}.log"
    proc, log = start_server(model, port, [*RUNS[backend], *flags], log_path, env=env)
    row = {"model": Path(model).name, "backend": backend, "pass": phase, "gpu": gpu, "caches": str(caches),
           "cmd": proc.cmd}
    try:
        row["ready_s"] = round(wait_healthy(port, proc, timeout, poll_s=0.5), 1)
        t0 = time.time()
        greedy_generate(port, FIRST_REQUEST_IDS, 8, timeout=timeout)
        row["first_request_s"] = round(time.time() - t0, 2)
    except Exception as e:  # recorded in the table, never hidden
        row["error"] = repr(e)[:300]
    finally:
        stop_server(proc, log)
    row["log"] = startup_report(log_path.read_text(errors="replace"))
    return row


def run_pass(model: str, backends: list[str], gpus: list[str], phase: str, args) -> list[dict]:
    """All backends' servers started together, one GPU each; a cold pass empties each backend's caches first."""
    rows: list[dict] = [{} for _ in backends]
    threads = []
    for i, (backend, gpu) in enumerate(zip(backends, gpus)):
        caches = args.caches / backend
        if phase == "cold":
            shutil.rmtree(caches, ignore_errors=True)

        def work(i=i, backend=backend, gpu=gpu, caches=caches):
            rows[i] = start_one(model, backend, gpu, args.port + 10 * i, caches, phase,
                                shlex.split(args.server_flags), args.out, args.timeout)
        threads.append(threading.Thread(target=work))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return rows


def phases(row: dict) -> dict:
    """The table's columns of one row: to ready, before the log's first line (Python's imports), weights, decode
    graphs, the first request."""
    engine = row.get("log", {}).get("engine", {})
    in_log = row.get("log", {}).get("log_to_ready_s")
    return {"ready_s": row.get("ready_s"),
            "before_log_s": round(row["ready_s"] - in_log, 1) if row.get("ready_s") is not None and in_log else None,
            "weights_s": engine.get("load_weight"), "graphs_s": engine.get("cuda_graph.decode"),
            "first_request_s": row.get("first_request_s")}


def goals(rows: list[dict], backend: str = "snapmla", base: str = "flashmla") -> list[dict]:
    """GOALS evaluated per model: {"model", "pass", "what", "value", "limit", "met"} (met None where a row is
    missing or failed)."""
    found = []
    for model in dict.fromkeys(r["model"] for r in rows):
        for phase, what, limit in GOALS:
            ours = next((phases(r) for r in rows if (r["model"], r["backend"], r["pass"]) == (model, backend, phase)),
                        None)
            ref = next((phases(r) for r in rows if (r["model"], r["backend"], r["pass"]) == (model, base, phase)),
                       None)
            value = None
            if ours and ref:
                if what == "decode graphs ratio" and ours["graphs_s"] and ref["graphs_s"]:
                    value = round(ours["graphs_s"] / ref["graphs_s"], 2)
                elif what == "ready difference s" and ours["ready_s"] is not None and ref["ready_s"] is not None:
                    value = round(ours["ready_s"] - ref["ready_s"], 1)
            found.append({"model": model, "pass": phase, "what": what, "value": value, "limit": limit,
                          "met": None if value is None else value <= limit})
    return found


def _cell(v) -> str:
    return "-" if v is None else f"{v}"


def table(rows: list[dict]) -> str:
    lines = ["| model | pass | backend | to ready s | before the log s | weights s | decode graphs s | first request s "
             "| longest silence |", "|---|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        p = phases(r)
        silences = r.get("log", {}).get("silences") or []
        quiet = f"{silences[0][0]:.0f} s before '{silences[0][1][:50]}'" if silences else "-"
        lines.append(f"| {r['model']} | {r['pass']} | {r['backend']} | {_cell(p['ready_s'])} | "
                     f"{_cell(p['before_log_s'])} | {_cell(p['weights_s'])} | {_cell(p['graphs_s'])} | "
                     f"{_cell(p['first_request_s'])} | {r.get('error') or quiet} |")
    lines += ["", "| model | pass | snapmla against flashmla BF16 | value | goal | met |", "|---|---|---|---:|---:|---|"]
    for g in goals(rows):
        met = "-" if g["met"] is None else ("yes" if g["met"] else "**no**")
        lines.append(f"| {g['model']} | {g['pass']} | {g['what']} | {_cell(g['value'])} | <= {g['limit']} | {met} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = [f"{r['model'].replace('-shape', '')}\n{r['pass']} {r['backend']}" for r in rows]
    graphs = [phases(r)["graphs_s"] or 0 for r in rows]
    rest = [max((phases(r)["ready_s"] or 0) - g, 0) for r, g in zip(rows, graphs)]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows)), 4))
    ax.bar(labels, graphs, label="decode graph capture")
    ax.bar(labels, rest, bottom=graphs, label="rest of the start")
    ax.set_ylabel("seconds from process start to ready")
    ax.legend()
    ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    save_png(fig, path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", required=True)
    ap.add_argument("--backends", nargs="+", default=["snapmla", "flashmla"], choices=sorted(RUNS))
    ap.add_argument("--gpus", nargs="+", required=True, help="one GPU index per backend")
    ap.add_argument("--caches", type=Path, required=True, help="the backends' cache folders go under it")
    ap.add_argument("--server-flags", default="")
    ap.add_argument("--port", type=int, default=25000)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--out", type=Path, default=Path("startup_out"))
    args = ap.parse_args(argv)
    if len(args.gpus) != len(args.backends):
        ap.error(f"--gpus names {len(args.gpus)} GPUs for {len(args.backends)} backends: one per backend")
    args.out.mkdir(parents=True, exist_ok=True)
    kill_servers_on_exit()
    rows = []
    for model in args.models:
        for phase in PASSES:
            rows += run_pass(model, args.backends, args.gpus, phase, args)
            (args.out / "startup.json").write_text(json.dumps({"rows": rows, "goals": goals(rows),
                                                               "server_flags": args.server_flags,
                                                               "cache_variables": CACHE_VARIABLES}, indent=1))
            print(table(rows), flush=True)
    plot(rows, args.out / "startup.png")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
