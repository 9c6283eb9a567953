"""Layer by layer: snapmla's attention outputs against the flashmla backend's (BF16) on one fixed batch, through
two real servers.

    python -m tools.compare_layers --model configs/models/deepseek-v2-lite-shape --out layers_out
    python -m tools.compare_layers --model /tmp/tiny-mla --load-format auto --out layers_out   # trained model

Each server runs eagerly (`--disable-cuda-graph`: SGLang's tensor-dump hooks only see eager forwards) with
`--debug-tensor-dump-output-folder`, which saves every module's output of every forward pass, and gets the same
greedy batch in one /generate call. For the forward passes whose inputs are identical in both runs (same token ids
and positions: the prefill, and decode steps until the greedy outputs part), each layer's MLA attention output
(`model.layers.<i>.self_attn.attn_mqa`: the latent output of the absorbed path, before W_UV) is compared, flashmla
as the reference. Bounds: rel-L2 <= 5e-2 and 1-cos <= 2e-3 per layer. Prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
from pathlib import Path

import torch

from harness.server import RUNS, kill_servers_on_exit, post, serving

ATTN_KEY = re.compile(r"^model\.layers\.(\d+)\.self_attn\.attn_mqa$")
INPUT_KEYS = ("model.forward_batch_info.input_ids", "model.forward_batch_info.positions")
REL_L2_BOUND, ONE_MINUS_COS_BOUND = 5e-2, 2e-3


def load_passes(dump_dir: Path) -> list[dict]:
    """Every forward pass SGLang's tensor dumper saved under `dump_dir` (one rank), in order."""
    (rank_dir,) = [d for d in dump_dir.iterdir() if d.is_dir() and d.name.startswith("TP0_")]
    return [torch.load(f, map_location="cpu") for f in sorted(rank_dir.glob("Pass*.pt"))]


def same_inputs(a: dict, b: dict) -> bool:
    return all(k in a and k in b and torch.equal(a[k], b[k]) for k in INPUT_KEYS)


def compare(passes: list[dict], ref_passes: list[dict]) -> dict[int, list[dict]]:
    """{layer: [error metrics of one pass, ...]} over the passes that have a reference pass with the same inputs."""
    from sglang_snapmla.numerics import error_metrics

    per_layer: dict[int, list[dict]] = {}
    unused = list(ref_passes)
    for p in passes:  # each pass against the first unused reference pass with the same inputs
        i = next((i for i, r in enumerate(unused) if same_inputs(p, r)), None)
        if i is None:
            continue
        r = unused.pop(i)
        for key, ref in r.items():
            m = ATTN_KEY.match(key)
            if m and key in p:
                metrics = error_metrics(p[key].float(), ref.float())
                per_layer.setdefault(int(m.group(1)), []).append(
                    {"tokens": int(ref.shape[0]), **{k: float(v) for k, v in metrics.items()}})
    return per_layer


def summary_table(per_layer: dict[int, list[dict]]) -> tuple[str, bool]:
    lines = ["| layer | passes | max rel-L2 | max 1-cos | within bounds |", "|---:|---:|---:|---:|---|"]
    ok = bool(per_layer)
    for layer in sorted(per_layer):
        rel = max(x["rel_l2"] for x in per_layer[layer])
        cos = max(x["one_minus_cos"] for x in per_layer[layer])
        good = rel <= REL_L2_BOUND and cos <= ONE_MINUS_COS_BOUND
        ok &= good
        lines.append(f"| {layer} | {len(per_layer[layer])} | {rel:.3e} | {cos:.3e} | {'yes' if good else 'NO'} |")
    return "\n".join(lines), ok


def run_server(args, backend: str, port: int, batch: list[list[int]], dump_dir: Path) -> list[list[int]]:
    shutil.rmtree(dump_dir, ignore_errors=True)
    flags = [*RUNS[backend], "--disable-cuda-graph", "--debug-tensor-dump-output-folder", str(dump_dir),
             "--debug-tensor-dump-layers", *map(str, args.layers), "--max-running-requests", str(len(batch))]
    with serving(args.model, port, flags, args.out / f"server_layers_{backend}.log", args.startup_timeout,
                 load_format=args.load_format, context_length=4096):
        for f in dump_dir.glob("TP0_*/Pass*.pt"):  # none expected (dump mode skips the warm-up), but never compared
            f.unlink()
        out = post(port, "/generate", {"input_ids": batch, "sampling_params": {
            "max_new_tokens": args.new_tokens, "temperature": 0, "ignore_eos": True}}, timeout=600)
        return [r["output_ids"] for r in out]


def main(argv: list[str] | None = None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="configs/models/deepseek-v2-lite-shape")
    ap.add_argument("--load-format", default="dummy", help="dummy (bundled configs) or auto (a trained checkpoint)")
    ap.add_argument("--backend", default="snapmla", choices=list(RUNS))
    ap.add_argument("--prompt-lens", type=int, nargs="+", default=[65, 300, 1000])
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--startup-timeout", type=float, default=600)
    ap.add_argument("--out", type=Path, default=Path("layers_out"))
    ap.add_argument("--layers", type=int, nargs="+", help="layers to dump (default: 0, 1, the middle one, the last; "
                    "every module output of every pass is saved, so all layers of a long prefill take many GB)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.layers:
        n = json.loads((Path(args.model) / "config.json").read_text())["num_hidden_layers"]
        args.layers = sorted({0, min(1, n - 1), n // 2, n - 1})
    kill_servers_on_exit()
    rng = random.Random(0)
    batch = [[rng.randrange(100, 20000) for _ in range(n)] for n in args.prompt_lens]
    outputs, passes = {}, {}
    for i, backend in enumerate(("flashmla", args.backend)):
        dump = args.out / f"dump_{backend}"
        outputs[backend] = run_server(args, backend, 33000 + i, batch, dump)
        passes[backend] = load_passes(dump)
    per_layer = compare(passes[args.backend], passes["flashmla"])
    text, ok = summary_table(per_layer)
    same = sum(a == b for a, b in zip(outputs[args.backend], outputs["flashmla"]))
    print(f"model {args.model}; {args.backend} vs flashmla BF16; prompts {args.prompt_lens}, {args.new_tokens} greedy "
          f"tokens; identical continuations {same}/{len(batch)}; forward passes compared: those with identical "
          f"inputs")
    print(text)
    print("all layers within rel-L2 <= 5e-2 and 1-cos <= 2e-3:", ok)
    (args.out / "compare_layers.json").write_text(json.dumps(
        {"model": args.model, "backend": args.backend, "prompt_lens": args.prompt_lens, "outputs": outputs,
         "per_layer": per_layer, "within_bounds": ok}, indent=1))


if __name__ == "__main__":
    main()
