#!/usr/bin/env bash
# Block-FP8 per-GPU shapes (configs/models/*-fp8-*) served on one GPU host: benchmarks.serve_and_bench with the runs
# given (snapmla, flashmla BF16, SGLang's FP8 cache, ...) on the same dummy weights (SNAPMLA_DUMMY_WEIGHTS=deployment,
# set by harness.server for block-FP8 configs). FP8 GEMMs run on SGLang's Triton kernels unless DEEPGEMM=1 (DeepGEMM's
# JIT then compiles at server start). Everything lands in $OUT/NAME.tar.xz (server logs, bench texts, JSON, plot, the
# startup lines: dummy-weight log, KV-scale check, pool size, graph capture).
#   usage: bash tools/gpu_host/fp8_serve.sh NAME SECONDS [serve_and_bench.py args...]
# SECONDS bounds serve_and_bench alone: leave the host's command limit ~60 s more for the runtime's unpacking on a
# fresh host and the tar (a 600 s limit: 510 at most), or that limit kills everything before $OUT/NAME.tar.xz exists.
set -uo pipefail
source tools/gpu_host/env.sh
stop_leftover_servers  # a server whose starter was killed holds the GPU's memory
name=$1 seconds=$2; shift 2
export SGLANG_ENABLE_JIT_DEEPGEMM=${DEEPGEMM:-0}
res=/tmp/fp8_serve/$name; mkdir -p "$res"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > "$res/gpu.txt"
python3 -c "import sglang; print('sglang', sglang.__version__)" >> "$res/gpu.txt"
# SIGTERM at the limit: serve_and_bench stops its server and keeps the runs it finished
timeout -s TERM "$seconds" python3 -m benchmarks.serve_and_bench --out "$res" "$@" 2>&1 | tee "$res/serve_and_bench.out"
grep -H -E "snapmla dummy weights|Load weight end|KV Cache is allocated|max_total_num_tokens|Capture cuda graph end|Traceback|Error" \
  "$res"/server_*.log > "$res/startup_lines.txt" 2>/dev/null
tar -C /tmp/fp8_serve -cJf "$OUT/$name.tar.xz" "$name"
cat "$res/startup_lines.txt" | cut -c1-300 | head -40
