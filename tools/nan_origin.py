"""Where a served model's outputs first turn non-finite, read from SGLang's own per-operator tensor dump
(`--debug-tensor-dump-output-folder`: the output of every leaf module in every forward pass, eager: the dump turns
CUDA graphs and the warm-up off), in the order the forward ran the operators.

    python -m tools.nan_origin report DUMP_DIR
        the table of a dump (CPU)
    python -m tools.nan_origin serve --model configs/models/deepseek-v3-fp8-dp-attention --runs snapmla flashmla \\
        --out DIR
        per run (harness.server.RUNS): a server with the dump on, the endpoint probe of benchmarks.serve_and_bench
        (its /generate, a few greedy tokens), the server stopped, the table; DIR keeps each run's log, the report
        JSON (with every operator's scan of the first non-finite pass), the dump, and an excerpt of that pass
        (first_non_finite_RUN.pt: the operators up to the first non-finite output; GPU host:
        tools/gpu_host/nan_origin.sh carries back all but the dump)

Per forward pass: its tokens, the first operator whose output holds a NaN or an infinity (the module's name as in
the checkpoint's index, e.g. `model.layers.3.mlp.experts`), how much of that output, how many operators after it,
and the largest finite magnitude any operator reached before it (an overflow shows as growth up to it; a NaN out of
finite inputs as none).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

BATCH_INFO = ".forward_batch_info."  # the dumper's keys for the pass's input ids, positions and sequence lengths


def tensors_of(value) -> list[torch.Tensor]:
    """The tensors one dump entry holds (an operator's output: a tensor or a list of them)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for t in value if isinstance(t, torch.Tensor)]
    return []


def scan(tensors: list[torch.Tensor]) -> tuple[int, int, float]:
    """(non-finite elements, elements, the largest finite |value|) over the floating tensors (0.0 where none)."""
    bad = total = 0
    largest = 0.0
    for t in tensors:
        if not t.is_floating_point() or not t.numel():
            continue
        values = t.float()
        finite = torch.isfinite(values)
        bad += int((~finite).sum())
        total += t.numel()
        if finite.any():
            largest = max(largest, values[finite].abs().max().item())
    return bad, total, largest


PREVIOUS_PASS = ("model", "logits_processor")  # outputs the dumper records after it has written their pass


def pass_keys(entries: dict) -> list[str]:
    """A pass file's entry names in execution order. The dumper writes a pass's file when the top-level model
    returns, so the model's own output and the logits computed from it open the next pass's file: left out."""
    keys = list(entries)
    while keys and keys[0] in PREVIOUS_PASS:
        keys = keys[1:]
    return keys


def pass_report(entries: dict, name: str) -> dict:
    """One pass file's entries (operator name -> output, in execution order) -> its row."""
    keys = pass_keys(entries)
    ops = [k for k in keys if BATCH_INFO not in k]
    ids = next((entries[k] for k in keys if k.endswith(BATCH_INFO + "input_ids")), None)
    row = {"pass": name, "tokens": None if ids is None else int(ids.numel()), "operators": len(ops),
           "first_non_finite": None, "non_finite_share": None, "non_finite_operators": 0,
           "largest_before": 0.0, "largest_before_at": None}
    for k in ops:
        bad, total, largest = scan(tensors_of(entries[k]))
        if bad:
            if row["first_non_finite"] is None:
                row["first_non_finite"], row["non_finite_share"] = k, bad / total
            row["non_finite_operators"] += 1
        elif row["first_non_finite"] is None and largest > row["largest_before"]:
            row["largest_before"], row["largest_before_at"] = largest, k
    return row


def report(dump_dir: Path) -> list[dict]:
    """Every pass file under `dump_dir` (one folder per rank, `PassNNNNN.pt`), in rank and pass order."""
    files = sorted(Path(dump_dir).glob("**/Pass*.pt"))
    if not files:
        raise SystemExit(f"{dump_dir}: no Pass*.pt files (did the server run with --debug-tensor-dump-output-folder "
                         "and answer a request?)")
    return [pass_report(torch.load(f, map_location="cpu", weights_only=False), str(f.relative_to(dump_dir)))
            for f in files]


def excerpt(dump_dir: Path, rows: list[dict], dest: Path, before: int = 24) -> dict | None:
    """The first pass with a non-finite output, small enough to carry back and read on a CPU: its forward-batch
    info, the outputs of the `before` operators ahead of the first non-finite one, that one and the next, saved to
    `dest` (name -> output, in execution order); returns that pass's per-operator scan (name, non-finite elements,
    largest finite |value|) for every operator of the pass, or None where every pass is finite. `rows`: `report` of
    the same dump, which names that pass, so only its file is read again. The full dump of a 61-layer model is
    hundreds of MB a pass; this is what locating the cause needs."""
    row = next((r for r in rows if r["first_non_finite"] is not None), None)
    if row is None:
        return None
    entries = torch.load(Path(dump_dir) / row["pass"], map_location="cpu", weights_only=False)
    keys = pass_keys(entries)
    ops = [k for k in keys if BATCH_INFO not in k]
    first = ops.index(row["first_non_finite"])
    kept = [k for k in keys if BATCH_INFO in k] + ops[max(0, first - before): first + 2]
    torch.save({k: entries[k] for k in kept}, dest)
    return {"pass": row["pass"], "first_non_finite": ops[first],
            "operators": [{"name": k, "non_finite": bad, "elements": n, "largest": big}
                          for k, bad, n, big in ((k, *scan(tensors_of(entries[k]))) for k in ops)]}


def table(rows: list[dict]) -> str:
    lines = ["| pass | tokens | operators | first non-finite output | its non-finite share | non-finite operators | "
             "largest finite magnitude before it |", "|---|---:|---:|---|---:|---:|---|"]
    for r in rows:
        share = "-" if r["non_finite_share"] is None else f"{r['non_finite_share']:.3f}"
        lines.append(f"| {r['pass']} | {r['tokens']} | {r['operators']} | {r['first_non_finite'] or 'none'} | {share} "
                     f"| {r['non_finite_operators']} | {r['largest_before']:.4g} ({r['largest_before_at']}) |")
    return "\n".join(lines)


def serve(model: str, runs: list[str], out: Path, port: int, new_tokens: int, startup_timeout: float) -> dict:
    """Per run: a server with the dump on, the probe, the report (the server stopped before it is read)."""
    from benchmarks.serve_and_bench import PROBE_TEXT
    from harness.server import RUN_ENV, RUNS, post, serving

    results = {}
    for run in runs:
        dump = out / f"dump_{run}"
        flags = [*RUNS[run], "--debug-tensor-dump-output-folder", str(dump)]
        with serving(model, port, flags, out / f"server_{run}.log", startup_timeout, env=RUN_ENV.get(run)):
            answer = post(port, "/generate", {"text": PROBE_TEXT, "return_logprob": True,
                                              "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0}})
        logprobs = [t[0] for t in answer["meta_info"].get("output_token_logprobs") or []]  # NaN arrives as None
        rows = report(dump)
        results[run] = {"probe_logprobs": logprobs, "passes": rows,
                        "first_non_finite_pass": excerpt(dump, rows, out / f"first_non_finite_{run}.pt")}
        print(f"## {run}: probe logprobs {logprobs}\n{table(rows)}\n", flush=True)
    (out / "nan_origin.json").write_text(json.dumps(results, indent=1))
    return results


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    rep = sub.add_parser("report", help="the table of a dump folder")
    rep.add_argument("dump_dir", type=Path)
    srv = sub.add_parser("serve", help="serve each run with the dump on, probe it, report (GPU)")
    srv.add_argument("--model", required=True)
    srv.add_argument("--runs", nargs="+", required=True)
    srv.add_argument("--out", type=Path, required=True)
    srv.add_argument("--port", type=int, default=30000)
    srv.add_argument("--new-tokens", type=int, default=3, help="greedy tokens the probe asks for (a pass each)")
    srv.add_argument("--startup-timeout", type=float, default=330)
    args = ap.parse_args(argv)
    if args.cmd == "report":
        print(table(report(args.dump_dir)))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    serve(args.model, args.runs, args.out, args.port, args.new_tokens, args.startup_timeout)


if __name__ == "__main__":
    main()
