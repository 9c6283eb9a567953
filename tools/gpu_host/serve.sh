#!/usr/bin/env bash
# On the H100 host (the runtime in .gpu): install the plugin into the runtime, then serve + bench.
#   usage: bash tools/gpu_host/serve.sh [serve_and_bench.py args...]
#          bash tools/gpu_host/serve.sh --check [check_serving.py args...]
#          bash tools/gpu_host/serve.sh --matrix [serve_matrix.py args...]   # the throughput matrix
#          bash tools/gpu_host/serve.sh --steady [serve_steady.py args...]   # sustained throughput, pool full
#          bash tools/gpu_host/serve.sh --layers [compare_layers.py args...] # layer-by-layer vs flashmla
set -uo pipefail
source tools/gpu_host/env.sh  # $OUT, runtime, JIT caches, plugin installed
stop_leftover_servers  # a server whose starter was killed holds the GPU's memory
module=benchmarks.serve_and_bench
if [ "${1:-}" = "--check" ]; then module=tools.check_serving; shift; fi  # correctness scenarios
if [ "${1:-}" = "--matrix" ]; then module=benchmarks.serve_matrix; shift; fi  # workloads x backends
if [ "${1:-}" = "--steady" ]; then module=benchmarks.serve_steady; shift; fi  # the steady window of a long run
if [ "${1:-}" = "--layers" ]; then module=tools.compare_layers; shift; fi  # attention outputs vs flashmla
python3 -m $module --out "$OUT" "$@"
