#!/usr/bin/env bash
# On the H100 host (device tool, carry .gpu): A/B of CUDA decode versions in one call, each checked before it is timed
# against the same FlashMLA baselines. A version is a copy of kernels/cuda in an untracked (not ignored) folder of the
# checkout, e.g. from a branch:  mkdir -p ab/v5 && git archive cuda-v5-pingpong kernels/cuda | tar -x -C ab/v5
#   usage: bash examples/gpu/ab_kernels.sh [shipped] [ab/v5/kernels/cuda ...] [-- bench_kernels.py args]
# "shipped" is the checkout's kernels/cuda. Per version: build (registers/spills), debug_cuda.py, the GPU kernel tests,
# compute-sanitizer memcheck and racecheck, the kernel benchmark; logs under $OUT/<version>. A version whose debug run
# fails or hangs (60 s) is not tested or timed further.
set -uo pipefail
source examples/gpu/env.sh  # $OUT, runtime, JIT caches, plugin installed
versions=(); while [ $# -gt 0 ] && [ "$1" != "--" ]; do versions+=("$1"); shift; done; [ "${1:-}" = "--" ] && shift
bench_args=("$@"); [ ${#bench_args[@]} -eq 0 ] && bench_args=(--heads 128 64 16 --sq 1 2 --shapes 64x65536 128x16384 1x640)
for v in "${versions[@]:-shipped}"; do
  name=$(echo "$v" | tr '/' '_'); mkdir -p "$OUT/$name"
  if [ "$v" = shipped ]; then unset SNAPMLA_CUDA_SOURCE_DIR; else export SNAPMLA_CUDA_SOURCE_DIR=$PWD/$v; fi
  echo "=== $v: build"
  python3 -c "from sglang_snapmla import cuda_ext; cuda_ext.build(verbose=True)" > "$OUT/$name/build.log" 2>&1 \
    || { tail -20 "$OUT/$name/build.log"; continue; }
  grep -E "registers|spill" "$OUT/$name/build.log" | head -2
  echo "=== $v: debug_cuda"
  timeout 60 python3 examples/gpu/debug_cuda.py > "$OUT/$name/debug_cuda.log" 2>&1; rc=$?; tail -6 "$OUT/$name/debug_cuda.log"
  [ $rc = 0 ] || { echo "$v: debug_cuda rc=$rc, skipped"; continue; }
  echo "=== $v: GPU tests"
  SNAPMLA_DECODE_IMPL=cuda timeout 150 python3 -m pytest -q -x tests/test_gpu_kernels.py 2>&1 | tail -2
  for tool in memcheck racecheck; do
    SNAPMLA_DECODE_IMPL=cuda timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 \
      python3 tests/gpu_sanitize_decode.py > "$OUT/$name/$tool.log" 2>&1; tail -1 "$OUT/$name/$tool.log"
  done
  echo "=== $v: benchmark"
  timeout 300 python3 examples/bench_kernels.py --out "$OUT/$name" --no-flashinfer --cuda "${bench_args[@]}" 2>&1 \
    | grep -v '^{' | tail -22
done
