#!/usr/bin/env bash
# On the H100 host (device tool, carry .gpu): install the plugin into the runtime, then serve + bench.
#   usage: bash examples/gpu/serve.sh [serve_and_bench.py args...]
set -uo pipefail
OUT=${OUT:-/tmp/snapmla_out}; mkdir -p "$OUT"
source .gpu/activate.sh .gpu/sglang-runtime.tar.xz
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > "$OUT/pip.log" 2>&1 || { cat "$OUT/pip.log"; exit 1; }
python3 examples/serve_and_bench.py --out "$OUT" "$@"
