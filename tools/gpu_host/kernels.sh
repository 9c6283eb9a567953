#!/usr/bin/env bash
# On the H100 host (the runtime in .gpu): kernel tests, memcheck, kernel benchmark. Logs under $OUT.
#   usage: [PYTEST_PATHS=tests/...] [NO_BENCH=1] bash tools/gpu_host/kernels.sh [--cuda] [bench args...]
# Another version of the CUDA decode (A/B in one run): run it again with SNAPMLA_CUDA_SOURCE_DIR=<a copy of
# kernels/cuda> and its own OUT=<folder>; it builds under its own extension name (sglang_snapmla/cuda_ext.py).
set -uo pipefail
source tools/gpu_host/env.sh  # $OUT, runtime, JIT caches, plugin installed
python3 -c "import sglang_snapmla.ops" || exit 1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
# GATE_DONE=1: tools/gpu_host/ab.sh already built and debug-ran this source (GATE_ONLY=1) in this call
if [[ " $* " == *" --cuda "* ]] && [ -z "${GATE_DONE:-}" ]; then
  echo "== build the sm_90a extension"
  /usr/bin/time -f "build %e s" python3 -c "from sglang_snapmla import cuda_ext; cuda_ext.build(verbose=True)" \
    > "$OUT/cuda_build.log" 2>&1; tail -3 "$OUT/cuda_build.log"; grep -E "registers|spill" "$OUT/cuda_build.log" | head -4
  echo "== CUDA decode error localization"
  timeout 90 python3 -m tools.kernel_dev.debug_cuda 2>&1 | tee "$OUT/debug_cuda.log"
  # a kernel that hangs or faults here would hang every test after it: stop this source's checks
  rc=${PIPESTATUS[0]}; [ "$rc" != 0 ] && { echo "debug_cuda rc=$rc: CUDA decode broken, checks stopped"; exit 3; }
  [ -n "${GATE_ONLY:-}" ] && exit 0  # tools/gpu_host/ab.sh: build + debug run first, the long checks after the timing
fi
echo "== pytest (${PYTEST_PATHS:=tests} on the GPU)"
# -q hides the header that names the tests' base seed: it is chosen here and logged
choose_test_seed
{ echo "SNAPMLA_TEST_SEED=$SNAPMLA_TEST_SEED"; timeout 300 python3 -m pytest -q -x -p no:xdist -o addopts=-ra $PYTEST_PATHS 2>&1; } \
  | tee "$OUT/pytest_gpu.log" | tail -15
[ -n "${CUDA_ONLY:-}" ] || {
echo "== compute-sanitizer memcheck"
PYTHONPATH=$SUPPORT_PYTHONPATH timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tests/support/gpu_sanitize_decode.py 2>&1 \
  | tee "$OUT/memcheck.log" | tail -4; echo "memcheck rc=${PIPESTATUS[0]}"; }
if [[ " $* " == *" --cuda "* ]]; then  # the sm_90a kernel: memcheck and racecheck on the same small decode
  for tool in memcheck racecheck; do
    echo "== compute-sanitizer $tool (SNAPMLA_DECODE_IMPL=cuda)"
    PYTHONPATH=$SUPPORT_PYTHONPATH SNAPMLA_DECODE_IMPL=cuda timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 \
      python3 tests/support/gpu_sanitize_decode.py 2>&1 | tee "$OUT/cuda_$tool.log" | tail -4; echo "$tool rc=${PIPESTATUS[0]}"
  done
fi
[ -n "${NO_BENCH:-}" ] && exit 0  # checks only (tools/gpu_host/ab.sh with SHAPES=...: one timing call for all variants)
echo "== kernel benchmark"
timeout 400 python3 -m benchmarks.bench_kernels --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log" | grep -v '^{'
