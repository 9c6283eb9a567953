#!/usr/bin/env bash
# On the Hopper host (the runtime in .gpu): servers with --enable-torch-compile against eager ones, per backend, on the
# small trained checkpoint (tools/check_torch_compile.py; docs/ACCURACY.md, "torch.compile"). Run it on a GPU of its
# own: the batch-1 TPOTs it reports wait on the host's CPUs.
#   usage: bash tools/gpu_host/torch_compile.sh [runs...]     (default: snapmla flashmla)
set -uo pipefail
source tools/gpu_host/env.sh  # $OUT, runtime, JIT caches, plugin installed
CKPT=.gpucache/tiny-mla-h16
# the prebuilt sm_90a library (what a serving machine without nvcc loads) builds on the CPU while the model trains
python3 -m sglang_snapmla.prebuilt > "$OUT/prebuilt.log" 2>&1 &
train_checkpoint $CKPT 16
wait
RUNS=("$@")
[ ${#RUNS[@]} -gt 0 ] || RUNS=(snapmla flashmla)
# the per-run JSON lines filtered out: the two tables it ends with, whole
python3 -m tools.check_torch_compile --model $CKPT --runs "${RUNS[@]}" --out "$OUT/compile" 2>&1 | grep -v "^{"
