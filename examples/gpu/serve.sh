#!/usr/bin/env bash
# On the H100 host (device tool, carry .gpu): install the plugin into the runtime, then serve + bench.
#   usage: bash examples/gpu/serve.sh [serve_and_bench.py args...]
#          bash examples/gpu/serve.sh --check [check_serving.py args...]
#          bash examples/gpu/serve.sh --matrix [serve_matrix.py args...]   # issue 5's throughput matrix
#          bash examples/gpu/serve.sh --layers [compare_layers.py args...] # layer-by-layer vs flashmla (issue 4)
set -uo pipefail
source examples/gpu/env.sh  # $OUT, runtime, JIT caches, plugin installed
script=examples/serve_and_bench.py
if [ "${1:-}" = "--check" ]; then script=examples/check_serving.py; shift; fi  # correctness scenarios
if [ "${1:-}" = "--matrix" ]; then script=examples/serve_matrix.py; shift; fi  # workloads x backends
if [ "${1:-}" = "--layers" ]; then script=examples/compare_layers.py; shift; fi  # attention outputs vs flashmla
python3 $script --out "$OUT" "$@"
