#!/usr/bin/env bash
# On the H100 host (the runtime in .gpu, the variants in ab/): A/B of CUDA decode variants in one run. A variant is a
# copy of kernels/cuda under ab/<name>/kernels/cuda (ab/ is gitignored; e.g. `git archive TAG kernels/cuda | tar -x
# -C ab/NAME`). Each variant goes through tools/gpu_host/kernels.sh (build, debug_cuda, GPU tests, memcheck,
# racecheck, benchmark) with its own OUT; then the default source (kernels/cuda) is benchmarked in the same call.
#   usage: bash tools/gpu_host/ab.sh "bench_kernels.py args" NAME...
# Shorter (two or three variants in one 600 s call): SHAPES=h128x64x16384,h128x1x640s57 bash tools/gpu_host/ab.sh "" NAME...
# checks every variant without its FlashMLA benchmark, then times all of them and main with time_variants.py.
set -uo pipefail
OUT=${OUT:-/tmp/snapmla_out}
BENCH=$1; shift
if [ -n "${SHAPES:-}" ]; then
  # build + debug run of every variant first (a hanging kernel is dropped in 90 s), then the timing, then the GPU
  # tests and sanitizers of the variants that passed (the long part: what is left of the 600 s goes to it)
  PASSED=()
  for V in "$@"; do
    echo "=================== $V (build, debug run)"
    SNAPMLA_CUDA_SOURCE_DIR=ab/${V%%+*}/kernels/cuda OUT=$OUT/$V GATE_ONLY=1 bash tools/gpu_host/kernels.sh --cuda \
      && PASSED+=("$V")
  done
  (source tools/gpu_host/env.sh; timeout 300 python3 -m benchmarks.gpu.time_variants "$SHAPES" main "${PASSED[@]}")
  for V in "${PASSED[@]}"; do
    echo "=================== $V (checks)"
    SNAPMLA_CUDA_SOURCE_DIR=ab/${V%%+*}/kernels/cuda OUT=$OUT/$V NO_BENCH=1 CUDA_ONLY=1 GATE_DONE=1 \
      PYTEST_PATHS=${PYTEST_PATHS:-tests/product/test_gpu_kernels.py} bash tools/gpu_host/kernels.sh --cuda
  done
  exit
fi
for V in "$@"; do
  echo "=================== $V"
  SNAPMLA_CUDA_SOURCE_DIR=ab/$V/kernels/cuda OUT=$OUT/$V PYTEST_PATHS=${PYTEST_PATHS:-tests/product/test_gpu_kernels.py} \
    bash tools/gpu_host/kernels.sh --no-flashinfer --cuda $BENCH
done
echo "=================== default source (kernels/cuda)"
OUT=$OUT/main; source tools/gpu_host/env.sh
timeout 400 python3 -m benchmarks.bench_kernels --out "$OUT" --no-flashinfer --cuda $BENCH 2>&1 | tee "$OUT/bench.log" \
  | grep -v '^{'
