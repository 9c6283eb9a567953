#!/usr/bin/env bash
# On the H100 host (device tool, carry .gpu): install the plugin into the runtime, then serve + bench.
#   usage: bash examples/gpu/serve.sh [serve_and_bench.py args...]
#          bash examples/gpu/serve.sh --check [check_serving.py args...]
#          bash examples/gpu/serve.sh --matrix [serve_matrix.py args...]   # issue 5's throughput matrix
#          bash examples/gpu/serve.sh --layers [compare_layers.py args...] # layer-by-layer vs flashmla (issue 4)
set -uo pipefail
OUT=${OUT:-/tmp/snapmla_out}; mkdir -p "$OUT"
source .gpu/activate.sh .gpu/sglang-runtime.tar.xz
export PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0  # multi-GPU hosts: NVLink multicast stays off (device tool's KINDS.md)
# JIT caches (Triton, FlashInfer, Inductor) in an ignored folder of the checkout: a warm machine reuses them.
export TRITON_CACHE_DIR=$PWD/.gpucache/triton FLASHINFER_WORKSPACE_BASE=$PWD/.gpucache \
  TORCHINDUCTOR_CACHE_DIR=$PWD/.gpucache/inductor XDG_CACHE_HOME=$PWD/.gpucache
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > "$OUT/pip.log" 2>&1 || { cat "$OUT/pip.log"; exit 1; }
script=examples/serve_and_bench.py
if [ "${1:-}" = "--check" ]; then script=examples/check_serving.py; shift; fi  # correctness scenarios
if [ "${1:-}" = "--matrix" ]; then script=examples/serve_matrix.py; shift; fi  # workloads x backends
if [ "${1:-}" = "--layers" ]; then script=examples/compare_layers.py; shift; fi  # attention outputs vs flashmla
python3 $script --out "$OUT" "$@"
