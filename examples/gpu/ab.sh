#!/usr/bin/env bash
# On the H100 host (device tool, carry .gpu and ab): A/B of CUDA decode variants in one device call. A variant is a
# copy of kernels/cuda under ab/<name>/kernels/cuda (ab/ is gitignored; e.g. `git archive TAG kernels/cuda | tar -x
# -C ab/NAME`): it is built, checked (debug_cuda, GPU tests, memcheck, racecheck) and timed; the default source last.
#   usage: bash examples/gpu/ab.sh "bench_kernels.py args" NAME...
set -uo pipefail
source examples/gpu/env.sh
BENCH=$1; shift
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
for V in "$@"; do
  echo "=================== $V"
  mkdir -p $OUT/$V
  export SNAPMLA_CUDA_SOURCE_DIR=ab/$V/kernels/cuda
  python3 -c "from sglang_snapmla import cuda_ext; cuda_ext.build(verbose=True)" > $OUT/$V/build.log 2>&1
  grep -E "registers|spill|rror" $OUT/$V/build.log | head -6
  timeout 60 python3 examples/gpu/debug_cuda.py > $OUT/$V/debug.log 2>&1; rc=$?; tail -8 $OUT/$V/debug.log
  if [ $rc -ne 0 ]; then echo "$V: debug_cuda failed rc=$rc"; continue; fi
  SNAPMLA_DECODE_IMPL=cuda timeout 200 python3 -m pytest -q -x tests/test_gpu_kernels.py > $OUT/$V/pytest.log 2>&1; rc=$?
  tail -3 $OUT/$V/pytest.log; if [ $rc -ne 0 ]; then echo "$V: pytest failed rc=$rc"; continue; fi
  for tool in memcheck racecheck; do
    SNAPMLA_DECODE_IMPL=cuda timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 python3 tests/gpu_sanitize_decode.py \
      > $OUT/$V/$tool.log 2>&1; echo "$V $tool rc=$? $(tail -1 $OUT/$V/$tool.log)"
  done
  timeout 150 python3 examples/bench_kernels.py --out $OUT/$V --no-flashinfer --cuda $BENCH 2>&1 | tee $OUT/$V/bench.log | grep -v '^{' | tail -12
done
unset SNAPMLA_CUDA_SOURCE_DIR
echo "=================== main (v6)"
mkdir -p $OUT/main
timeout 150 python3 examples/bench_kernels.py --out $OUT/main --no-flashinfer --cuda $BENCH 2>&1 | tee $OUT/main/bench.log | grep -v '^{' | tail -12
