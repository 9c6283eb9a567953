#!/usr/bin/env bash
# On the Hopper host (the runtime in .gpu): the serving-correctness checks of both decode implementations --
# SGLang's CUDA-graph protocol with real graphs, SGLang's attention test kits, stale pool bytes, keyless rows, the
# non-finite policy, the kernel tests -- then the same graph-protocol test with the capture-view bug put back (it must fail), then memcheck and
# racecheck over a stale pool. Logs under $OUT. Exits non-zero if any check fails (pytest failing or running past
# PYTEST_TIMEOUT, the mutant passing, a sanitizer error). About 6-9 min on an H200: longer than one device command,
# so run it detached.   usage: bash tools/gpu_host/correctness.sh
set -uo pipefail
failed=()
source tools/gpu_host/env.sh  # $OUT, runtime, JIT caches, plugin installed
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
build_cuda_ext "$OUT/cuda_build.log" || { tail -20 "$OUT/cuda_build.log"; exit 1; }
grep -E "registers|spill" "$OUT/cuda_build.log" | head -4
choose_test_seed
echo "== pytest on the GPU (SNAPMLA_TEST_SEED=$SNAPMLA_TEST_SEED)"
timeout ${PYTEST_TIMEOUT:-900} python3 -m pytest -q -p no:warnings -p no:xdist -o addopts=-ra --durations=20 ${PYTEST_PATHS:-tests/product/test_gpu_graph_protocol.py tests/product/test_sglang_attention_kits.py \
  tests/product/test_serving_safety.py tests/product/test_gpu_kernels.py tests/product/test_kernels.py} 2>&1 | tee "$OUT/pytest_gpu.log" | tail -34
rc=${PIPESTATUS[0]}; [ $rc = 0 ] || failed+=("pytest rc=$rc (124: past PYTEST_TIMEOUT)")
echo "== mutation: the decode's block-table bound from the view's width (the capture-view bug) must fail the test"
source tools/gpu_host/mutant.sh
(cd $MUTANT_DIR && PYTHONPATH=$MUTANT_PYTHONPATH python3 -c "import sglang_snapmla.ops as o; print(\"mutant:\", o.__file__)" && PYTHONPATH=$MUTANT_PYTHONPATH timeout 200 python3 -m pytest -q -p no:warnings -p no:xdist -o addopts=-ra \
  tests/product/test_gpu_graph_protocol.py -k "cuda and decode" 2>&1 | tee "$OUT/mutation.log" | grep -E "passed|failed" | tail -2)
grep -qE "[0-9]+ failed" "$OUT/mutation.log" || failed+=("the mutant was not caught")
for tool in memcheck racecheck; do
  for impl in triton cuda; do
    [ $tool = racecheck ] && [ $impl = triton ] && continue
    PYTHONPATH=$SUPPORT_PYTHONPATH SNAPMLA_DECODE_IMPL=$impl timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 \
      python3 tests/support/gpu_sanitize_decode.py > "$OUT/${tool}_$impl.log" 2>&1
    rc=$?; echo "$tool $impl rc=$rc $(tail -1 "$OUT/${tool}_$impl.log")"
    [ $rc = 0 ] || failed+=("$tool $impl rc=$rc")
  done
done
[ ${#failed[@]} = 0 ] || { echo "FAILED: ${failed[*]}"; exit 1; }
echo "all correctness checks passed"
