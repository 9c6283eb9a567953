#!/usr/bin/env bash
# On the Hopper host (the runtime in .gpu): mutation testing of the sm_90a decode. Each mutant of
# tools/kernel_dev/cuda_mutants.py (one bug in a copy of kernels/cuda) is built as its own extension
# (SNAPMLA_CUDA_SOURCE_DIR), builds side by side on the CPUs, then the CUDA-decode tests run against it (-x, the
# Triton cases deselected), JOBS mutants at a time on the GPU. The unmutated copy runs the same way (started first)
# and must pass, so that a caught mutant means its bug, not the setup. Outcomes and the table under
# $OUT/cuda_mutants, each mutant's pytest log in its logs.tar.xz.
#   usage: bash tools/gpu_host/cuda_mutants.sh [NAME...]
#   JOBS: mutants at a time (default 4; each pytest gets nproc / JOBS CPU threads, docs/DEVELOPING.md, "Threads");
#   MUTANT_TIMEOUT: s per mutant's tests (default 240); SECONDS_LEFT: s
#   for the whole test phase (default 300: a mutant not started by then is reported "not run"); PYTEST_PATHS: the tests
set -uo pipefail
source tools/gpu_host/env.sh  # $OUT, runtime, JIT caches, plugin installed
res=$OUT/cuda_mutants; dir=/tmp/cuda_mutants
rm -rf "$dir" && mkdir -p "$dir" "$res"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$res/gpu.txt"
mkdir -p "$dir/logs" && cp -r kernels/cuda "$dir/unmutated"
{ echo "$dir/unmutated"; python3 -m tools.kernel_dev.cuda_mutants write "$dir" "$@"; } > "$dir/list.txt" || exit 1
choose_test_seed
echo "SNAPMLA_TEST_SEED=$SNAPMLA_TEST_SEED" | tee "$res/seed.txt"
start=$(date +%s)
build() {
  SNAPMLA_CUDA_SOURCE_DIR=$1 build_cuda_ext "$1/build.log" && touch "$1/built"
}
export -f build build_cuda_ext
xargs -P "${BUILD_JOBS:-16}" -I{} bash -c 'build {}' < "$dir/list.txt"
echo "built $(ls "$dir"/*/built | wc -l) of $(wc -l < "$dir/list.txt") in $(( $(date +%s) - start )) s"
export JOBS=${JOBS:-4} DEADLINE=$(( $(date +%s) + ${SECONDS_LEFT:-300} ))
# the CPU's cores shared out: with torch's default of one thread per core in each of JOBS processes, the
# graph-protocol cases' spec on the CPU (140 sequences at batch 140) stops advancing (tools/gpu_host/pytest_threads.sh)
export THREADS=$(cores_per_process "$JOBS")
export PATHS=${PYTEST_PATHS:-tests/product/test_gpu_kernels.py tests/product/test_gpu_graph_protocol.py \
tests/product/test_serving_safety.py tests/product/test_sglang_attention_kits.py}
run_one() {
  local d=$1 name outcome detail="" rc t0
  name=$(basename "$d")
  if [ ! -f "$d/built" ]; then
    outcome="build failed"; detail=$(grep -m1 -E "error" "$d/build.log" | cut -c1-120)
  elif [ "$(date +%s)" -ge "$DEADLINE" ]; then
    outcome="not run"
  else
    t0=$(date +%s)
    OMP_NUM_THREADS=$THREADS SNAPMLA_CUDA_SOURCE_DIR=$d SNAPMLA_DECODE_IMPL=cuda timeout "${MUTANT_TIMEOUT:-240}" \
      python3 -m pytest -x -q -p no:warnings -p no:xdist -p no:cacheprovider -o addopts= $PATHS -k "not triton" > "$d/pytest.log" 2>&1
    rc=$?
    case $rc in 0) outcome=survived ;; 1) outcome=caught ;; 124) outcome="timed out" ;; *) outcome="pytest rc=$rc" ;; esac
    detail=$(grep -m1 -oE "^FAILED [^ ]+" "$d/pytest.log" | cut -c8-)
    detail="${detail:-$(tail -1 "$d/pytest.log" | cut -c1-100)} ($(( $(date +%s) - t0 )) s)"
  fi
  printf "%s\t%s\t%s\n" "$name" "$outcome" "$detail" > "$d/outcome"
  echo "$name: $outcome $detail"
}
export -f run_one
xargs -P "$JOBS" -I{} bash -c 'run_one {}' < "$dir/list.txt"
for d in $(cat "$dir/list.txt"); do
  cat "$d/outcome"
  [ -f "$d/pytest.log" ] && cp "$d/pytest.log" "$dir/logs/$(basename "$d").pytest.log"
done > "$res/outcomes.tsv"
tar -C "$dir" -cJf "$res/logs.tar.xz" logs
python3 -m tools.kernel_dev.cuda_mutants summarize "$res/outcomes.tsv" "$res/cuda_mutants" | tee "$res/table.md"
grep -q $'^unmutated\tsurvived' "$res/outcomes.tsv" || { echo "the unmutated copy did not pass its tests: no outcome counts"; exit 1; }
