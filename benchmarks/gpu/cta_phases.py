"""Where a 64-row decode CTA's time goes, phase by phase and wave by wave (GPU host, after
`source tools/gpu_host/env.sh`):

    python3 -m benchmarks.gpu.cta_phases [--heads 128] [--shapes 64x640 128x640 256x1280] [--context-len 163840]
                                         [--out DIR]

Builds the copy of the kernel that `tools/kernel_dev/phase_stamps.py` writes (each CTA records %globaltimer and
clock64 at nine points of its life, and its SM) and runs the decode chain as a server replays it: Q-quant, decode
(and combine where split) captured in a CUDA graph, split count planned at the static page bound of --context-len.
After warm-up replays, one replay is stamped. Per shape and wave (a CTA's wave: its rank among the CTAs that ran on
its SM, by start time), the median over the wave's CTAs of each phase (µs; durations inside a CTA from clock64 at
the SM clock the stamps give, the CTA's start and end on the common %globaltimer axis from the first CTA's start):

    start       when the CTA started
    entry       start -> its mbarriers initialised
    pdl_wait    -> past griddepcontrol.wait (the Q-quant, launched before it, has completed); thread 0 first reads
                the sequence's length and block-table entries and issues its first pages, so this holds those
                round trips too
    q           -> Q landed in shared memory (as thread 0 sees it: after its q_scale reads)
    page0       release -> the first page landed
    qk0         first page landed -> its QK done
    loop        first QK done -> the last page's softmax published; per_page: loop / (pages - 1)
    pv_tail     last softmax -> last PV done
    epilogue    last PV done -> output stored
    total       start -> output stored
    gap         on the same SM: the previous CTA's end -> this CTA's start (waves after the first)

and the chain's time with the stamped kernel (graph of 20 calls, median of 15 replays; time the stamps' own cost
with `benchmarks/gpu/time_variants.py ... main stamps`). Prints a table, writes cta_phases.json and cta_phases.png
(the per-SM timeline of each shape) under --out; `--redraw JSON` redraws both from a saved run without a GPU."""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

import numpy as np

from harness.results import read_json, save_png

POINT_NAMES = ("start", "barriers", "released", "q", "page0", "qk0", "softmax", "pv", "end")
N_POINTS = len(POINT_NAMES)
PHASES = ("entry", "pdl_wait", "q", "page0", "qk0", "loop", "per_page", "pv_tail", "epilogue", "total")


def _p(name: str) -> int:
    return POINT_NAMES.index(name)


def phases(stamps: np.ndarray, pages: np.ndarray) -> dict:
    """Per-CTA phases from the stamp rows of the CTAs that ran (int64 [n, 2 * N_POINTS + 1]: globaltimer ns per
    point, clock64 per point, the SM) and each CTA's page count. Returns the SM clock (GHz, median over CTAs) and per
    CTA: sm, wave, start / end (µs from the first CTA's start, globaltimer) and the PHASES (µs, clock64)."""
    if stamps.ndim != 2 or stamps.shape[1] != 2 * N_POINTS + 1:
        raise ValueError(f"stamps must be [CTAs, {2 * N_POINTS + 1}], got {stamps.shape}")
    gt, clk, sm = stamps[:, :N_POINTS].astype(np.float64), stamps[:, N_POINTS:2 * N_POINTS], stamps[:, -1]
    if (gt == 0).any():
        missing = sorted({POINT_NAMES[j] for j in np.nonzero((gt == 0).any(axis=0))[0]})
        raise ValueError(f"CTAs without a stamp at {missing}: a split without pages or a CTA past the array "
                         f"(run shapes whose every CTA has pages)")
    t0 = gt[:, _p("start")].min()
    start, end = (gt[:, _p("start")] - t0) / 1e3, (gt[:, _p("end")] - t0) / 1e3
    wave = np.zeros(len(sm), dtype=np.int64)
    gap = np.full(len(sm), np.nan)
    rates = []
    for s in np.unique(sm):
        idx = np.nonzero(sm == s)[0]
        idx = idx[np.argsort(start[idx], kind="stable")]
        wave[idx] = np.arange(len(idx))
        gap[idx[1:]] = start[idx[1:]] - end[idx[:-1]]
        # the SM clock: its clock64 over %globaltimer from its first CTA's start to its last CTA's end (the longest
        # span a timer of coarse resolution divides), median over the SMs
        ns = gt[idx, _p("end")].max() - gt[idx, _p("start")].min()
        if ns > 0:
            rates.append((clk[idx, _p("end")].max() - clk[idx, _p("start")].min()) / ns)
    ghz = float(np.median(rates))

    def us(a: str, b: str) -> np.ndarray:
        return (clk[:, _p(b)] - clk[:, _p(a)]).astype(np.float64) / ghz / 1e3

    loop = us("qk0", "softmax")
    per = {"entry": us("start", "barriers"), "pdl_wait": us("barriers", "released"), "q": us("released", "q"),
           "page0": us("released", "page0"), "qk0": us("page0", "qk0"), "loop": loop,
           "per_page": np.where(pages > 1, loop / np.maximum(pages - 1, 1), np.nan), "pv_tail": us("softmax", "pv"),
           "epilogue": us("pv", "end"), "total": us("start", "end")}
    return {"ghz": ghz, "sm": sm, "wave": wave, "start": start, "end": end, "gap": gap, **per}


def summarize(p: dict) -> list[dict]:
    """One row per wave: CTAs, median start and end (µs) and the median of every phase and of the gap."""
    rows = []
    for w in range(int(p["wave"].max()) + 1):
        sel = p["wave"] == w
        row = {"wave": w, "ctas": int(sel.sum()), "start": float(np.median(p["start"][sel])),
               "end": float(np.median(p["end"][sel]))}
        for k in (*PHASES, "gap"):
            vals = p[k][sel]
            vals = vals[~np.isnan(vals)]
            row[k] = float(np.median(vals)) if len(vals) else None
        rows.append(row)
    return rows


def table(results: list[dict]) -> str:
    cols = ("start", "entry", "pdl_wait", "q", "page0", "qk0", "loop", "per_page", "pv_tail", "epilogue", "total",
            "end", "gap")
    lines = ["| shape | splits | pages a CTA | SM GHz | kernel µs | chain µs (graph) | wave | CTAs | "
             + " | ".join(cols) + " |",
             "|---|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(cols)]
    for r in results:
        for w in r["waves"]:
            lines.append(f"| h{r['heads']} b{r['batch']} s_k {r['s_k']} | {r['splits']} | {r['pages_per_cta']} | "
                         f"{r['ghz']:.2f} | {r['kernel_us']:.1f} | {r['chain_us']:.1f} | {w['wave']} | {w['ctas']} | "
                         + " | ".join("" if w[c] is None else f"{w[c]:.2f}" for c in cols) + " |")
    return "\n".join(lines)


def plot(results: list[dict], gpu: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 1, figsize=(11, 2.6 * len(results)), squeeze=False)
    colours = {"before pages": "tab:gray", "page loop": "tab:blue", "after pages": "tab:orange"}
    for ax, r in zip(axes[:, 0], results):
        c = r["ctas"]
        for i in range(len(c["sm"])):
            y = c["sm"][i] + 0.4 * (c["wave"][i] % 2)
            a, e = c["start"][i], c["end"][i]
            loop_start = e - c["loop"][i] - c["pv_tail"][i] - c["epilogue"][i]
            loop_end = loop_start + c["loop"][i]
            for (x0, x1), name in (((a, loop_start), "before pages"), ((loop_start, loop_end), "page loop"),
                                   ((loop_end, e), "after pages")):
                ax.plot([x0, x1], [y, y], color=colours[name], lw=1.2)
        ax.set_title(f"h{r['heads']} b{r['batch']} s_k {r['s_k']}, {r['splits']} split(s): kernel {r['kernel_us']:.1f} "
                     f"µs, chain {r['chain_us']:.1f} µs", fontsize=9)
        ax.set_ylabel("SM")
        ax.set_xlabel("µs from the first CTA's start")
    handles = [plt.Line2D([], [], color=v, lw=3, label=k) for k, v in colours.items()]
    axes[0, 0].legend(handles=handles, fontsize=7, loc="upper right")
    fig.suptitle(f"64-row decode CTAs per SM, one CUDA-graph replay ({gpu})", fontsize=10)
    fig.tight_layout()
    save_png(fig, path, dpi=110)


class Unstamped(Exception):
    """A shape whose CTAs would not all record their phases (the narrow kernel, or splits without pages)."""


def measure(heads: int, batch: int, s_k: int, context_len: int) -> dict:
    import torch

    from harness.kernel_timing import PAGE, capture_graph, make_inputs, time_graph
    from sglang_snapmla import cuda_ext, decode_plan, ops

    if heads <= 32:
        raise Unstamped(f"{heads} heads run the narrow kernel, which has no phase stamps (the 64-row kernel: > 32)")
    x = make_inputs(batch, s_k, heads, 1, 1, "cuda")[0]
    lens = torch.full((batch,), s_k, device="cuda", dtype=torch.int32)
    bound = decode_plan.static_max_pages(context_len)
    plan = decode_plan.plan_decode(batch, 1, heads, bound, torch.device("cuda"), "cuda")
    tiles, pages = -(-heads // 64), math.ceil(s_k / PAGE)
    n = tiles * batch * plan.splits
    # CTA index blockIdx.x + tiles (blockIdx.y + batch blockIdx.z), so its split is index // (tiles batch); the
    # kernel's split_pages gives split s the pages [s per, min((s + 1) per, P)), per = ceil(P / splits)
    per = -(-pages // plan.splits)
    split = np.arange(n) // (tiles * batch)
    cta_pages = np.clip(np.minimum((split + 1) * per, pages) - split * per, 0, None)
    if (cta_pages == 0).any():
        raise Unstamped(f"the plan's {plan.splits} splits leave CTAs without pages, which record no phases")
    qn, qr = x["q"][..., :512], x["q"][..., 512:]

    def chain():
        return ops.quantize_and_decode(qn, qr, x["kv8"], x["ks"], x["kr"], x["bt"], lens, 576 ** -0.5,
                                       num_splits=plan.splits, impl="cuda")

    module = cuda_ext.load()
    if not hasattr(module, "phase_stamps"):
        raise SystemExit("the loaded decode has no phase stamps: run with SNAPMLA_CUDA_SOURCE_DIR at the copy "
                         "tools/kernel_dev/phase_stamps.py writes (main() sets it)")
    chain_us = time_graph(lambda _: chain, 1)
    for _ in range(2):
        chain()
    torch.cuda.synchronize()
    graph = capture_graph([chain])
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    module.clear_phase_stamps()
    graph.replay()
    torch.cuda.synchronize()
    p = phases(module.phase_stamps()[:n].numpy(), cta_pages)
    return {"heads": heads, "batch": batch, "s_k": s_k, "splits": plan.splits, "context_len": context_len,
            "pages_per_cta": int(np.median(cta_pages)), "ghz": p["ghz"], "chain_us": round(chain_us, 1),
            "kernel_us": float(p["end"].max()), "waves": summarize(p),
            "ctas": {k: [None if isinstance(v, float) and math.isnan(v) else round(float(v), 3) for v in p[k]]
                     if k not in ("sm", "wave") else [int(v) for v in p[k]]
                     for k in ("sm", "wave", "start", "end", "loop", "pv_tail", "epilogue")}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heads", type=int, nargs="+", default=[128])
    ap.add_argument("--shapes", nargs="+", default=["64x640", "128x640", "256x1280"], help="BxS_K list")
    ap.add_argument("--context-len", type=int, default=163840, help="plan at this context length's static page bound")
    ap.add_argument("--copy-dir", type=Path, default=Path("ab"), help="where the stamped copy is written")
    ap.add_argument("--out", type=Path, default=Path("cta_phases_out"))
    ap.add_argument("--redraw", type=Path, help="only print the table and draw the PNG of this cta_phases.json")
    args = ap.parse_args(argv)
    if args.redraw:
        saved = read_json(args.redraw)
        print(table(saved["results"]))
        plot(saved["results"], saved["gpu"], Path(str(args.redraw).removesuffix(".xz")).with_suffix(".png"))
        return 0
    from sglang_snapmla import settings
    from tools.kernel_dev import phase_stamps

    os.environ[settings.CUDA_SOURCE_DIR_ENV] = str(phase_stamps.write(Path(phase_stamps.SOURCE_DIR), args.copy_dir))
    import torch

    results, skipped = [], []
    for heads in args.heads:
        for shape in args.shapes:
            b, sk = (int(v) for v in shape.split("x"))
            try:
                results.append(measure(heads, b, sk, args.context_len))
            except Unstamped as e:
                skipped.append(f"h{heads} b{b} s_k {sk}: {e}")
                print("skipped:", skipped[-1], flush=True)
                continue
            print(table(results[-1:]), flush=True)
            torch.cuda.empty_cache()
    gpu = torch.cuda.get_device_name()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cta_phases.json").write_text(json.dumps({"gpu": gpu, "context_len": args.context_len,
                                                         "results": results, "skipped": skipped}))
    plot(results, gpu, args.out / "cta_phases.png")
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
