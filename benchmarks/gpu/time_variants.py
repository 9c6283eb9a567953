"""Time the CUDA decode of several kernel source copies in one process (GPU host, after
`source tools/gpu_host/env.sh`):

    python3 -m benchmarks.gpu.time_variants SHAPES NAME...

SHAPES: comma-separated HxBxS_K (s_q 1), e.g. h128x64x16384,h16x128x16384; a suffix sN forces N splits
(h128x1x640s57: the count serving's static page bound gives a 640-token sequence at a 32k context), a suffix qN
sets s_q (h128x64x65536q2: two query tokens per sequence, MTP); both: h128x1x640q2s57.
NAME: `main` (kernels/cuda) or a copy of kernels/cuda under ab/NAME/kernels/cuda (gitignored), e.g. with a part of
the page loop compiled out for an ablation;
`NAME+VAR=VALUE` runs it with an environment setting (e.g. `main+SNAPMLA_PDL=0`). A name may repeat (interleaved
repetitions of an A/B): its later runs are labelled NAME#2, NAME#3. `main+TIME_COPIES=8` times with 8 input copies
in rotation (data from DRAM at small shapes, as bench_kernels.py does).
All variants are built in parallel first (each under its own extension name, sglang_snapmla/cuda_ext.py), then each
is timed in its own process (one extension per process), like benchmarks/bench_kernels.py times `ours` (CUDA graph of
20 calls, median of 15 replays, incl. Q quantization and combine). Prints a table, writes $OUT/variants.json."""

import json
import os
import subprocess
import sys
import time


def parse_shape(shape: str) -> tuple:
    """'h128x1x640q2s57' -> (heads 128, batch 1, s_k 640, s_q 2, splits 57); without a suffix s_q is 1 and the split
    count the planner's (None)."""
    dims, _, forced = shape[1:].partition("s")  # h128x1x640s57: 57 splits, as serving's static page bound gives
    dims, _, s_q = dims.partition("q")  # h128x64x65536q2: s_q 2
    h, b, sk = (int(x) for x in dims.split("x"))
    return h, b, sk, int(s_q or 1), int(forced) if forced else None


def time_one(shapes: str) -> dict:
    import torch

    from harness.kernel_timing import make_inputs, time_graph

    from sglang_snapmla import ops

    # TIME_COPIES=8: rotate over 8 input copies (the small shapes of bench_kernels.py, whose data then comes from
    # DRAM, not L2); default 1 (one copy, L2-warm at small shapes)
    copies = int(os.environ.get("TIME_COPIES", "1"))
    res = {}
    for shape in shapes.split(","):
        h, b, sk, s_q, splits = parse_shape(shape)
        inputs = make_inputs(b, sk, h, s_q, copies, "cuda")
        seqlens = torch.full((b,), sk, device="cuda", dtype=torch.int32)

        def call(i, seqlens=seqlens, splits=splits):
            x = inputs[i]
            qn, qr = x["q"][..., :512], x["q"][..., 512:]
            return lambda: ops.quantize_and_decode(qn, qr, x["kv8"], x["ks"], x["kr"], x["bt"], seqlens, 576 ** -0.5,
                                              num_splits=splits, impl="cuda")

        res[shape] = round(time_graph(call, copies), 1)
        del inputs
        torch.cuda.empty_cache()
    return res


def main():
    shapes, names = sys.argv[1], sys.argv[2:]
    if os.environ.get("TIME_VARIANTS_CHILD"):
        print("RESULT", json.dumps(time_one(shapes)))
        return
    base = {k: v for k, v in os.environ.items() if k != "SNAPMLA_CUDA_SOURCE_DIR"}
    envs = {}
    for n in names:
        source, *settings = n.split("+")
        env = base if source == "main" else dict(base, SNAPMLA_CUDA_SOURCE_DIR=f"ab/{source}/kernels/cuda")
        envs[n] = dict(env, **dict(kv.split("=", 1) for kv in settings))
    t0 = time.time()
    sources = {n.split("+")[0]: e for n, e in envs.items()}  # one build per source copy
    builds = {n: subprocess.Popen([sys.executable, "-c", "from sglang_snapmla import cuda_ext; cuda_ext.build()"],
                                  env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
              for n, e in sources.items()}
    failed = set()
    for n, p in builds.items():
        log = p.communicate()[0]
        if p.returncode:
            failed.add(n)
            print(n, "BUILD FAILED", log[-2000:])
    print(f"builds {time.time() - t0:.0f} s", flush=True)
    table = {}
    for n in names:
        if n.split("+")[0] in failed:
            continue
        r = subprocess.run([sys.executable, "-m", "benchmarks.gpu.time_variants", shapes], env=dict(envs[n], TIME_VARIANTS_CHILD="1"),
                           capture_output=True, text=True, timeout=240)
        line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")]
        label = n if n not in table else f"{n}#{sum(k.split('#')[0] == n for k in table) + 1}"
        table[label] = json.loads(line[0][len("RESULT "):]) if line else r.stderr[-1500:]
        print(label, table[label], flush=True)
    cols = shapes.split(",")
    print("| variant | " + " | ".join(cols) + " |\n|---|" + "---:|" * len(cols))
    for n, v in table.items():
        if isinstance(v, dict):
            print(f"| {n} | " + " | ".join(str(v[c]) for c in cols) + " |")
    json.dump(table, open(os.path.join(os.environ.get("OUT", "."), "variants.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
