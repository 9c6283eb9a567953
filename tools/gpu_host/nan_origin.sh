#!/usr/bin/env bash
# On the GPU host (the runtime in .gpu): where a dummy-weight model's outputs first turn non-finite, per backend
# (tools/nan_origin.py serve: SGLang's per-operator tensor dump, eager, one probe request). Block-FP8 configs get the
# deployment draw (harness.server) and Triton's FP8 GEMMs (DeepGEMM's JIT off: its warm-up would outlast the call).
# The table prints; $OUT/NAME.tar.xz keeps the server logs, the report JSON and each run's excerpt of its first
# non-finite pass (the dumps themselves, hundreds of MB a pass, stay on the host).
#   usage: bash tools/gpu_host/nan_origin.sh NAME SECONDS --model MODEL --runs RUN... [tools.nan_origin serve args]
set -uo pipefail
source tools/gpu_host/env.sh
stop_leftover_servers  # a server whose starter was killed holds the GPU's memory
name=$1 seconds=$2; shift 2
export SGLANG_ENABLE_JIT_DEEPGEMM=${DEEPGEMM:-0}
res=/tmp/nan_origin/$name; mkdir -p "$res"
timeout -s TERM "$seconds" python3 -m tools.nan_origin serve --out "$res" "$@" 2>&1 | tee "$res/nan_origin.out"
tar -C /tmp/nan_origin --exclude "$name/dump_*" -cJf "$OUT/$name.tar.xz" "$name"
