#!/usr/bin/env bash
# On the Hopper host: the GPU tests in several pytest processes at once, as tools/gpu_host/cuda_mutants.sh runs them,
# with torch's default CPU threads (one per core in every process) and with each process's share of the cores.
# test_gpu_graph_protocol's batch-140 CUDA cases compute their spec on the CPU (snapmla_decode_reference over 140
# sequences), which is where oversubscribed threads stop a process. Four processes at once (default threads, then
# OMP_NUM_THREADS = nproc / 4), then one alone; faulthandler prints every stack of a test running past 45 s; ps and
# nvidia-smi every 10 s. Logs and summary.txt under $OUT/threads.
#   usage: bash tools/gpu_host/pytest_threads.sh
set -uo pipefail
source tools/gpu_host/env.sh
R=$OUT/threads; mkdir -p "$R"
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc; } > "$R/gpu.txt"
choose_test_seed; echo "SNAPMLA_TEST_SEED=$SNAPMLA_TEST_SEED" > "$R/seed.txt"
t0=$(date +%s)
build_cuda_ext "$R/build.log"
echo "build rc=$? $(( $(date +%s) - t0 )) s" >> "$R/build.log"
monitor() {
  while true; do
    { date +%T; ps -eo pid,pcpu,nlwp,stat,etimes,args --sort=-pcpu | grep "[p]ytest" | cut -c1-110
      nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader; } >> "$R/$1.monitor"
    sleep 10
  done
}
phase() {  # NAME THREADS (empty: torch's default) PROCESSES TIMEOUT
  local name=$1 thr=$2 n=$3 to=$4 pids=() t mon
  monitor "$name" & mon=$!
  t=$(date +%s)
  for i in $(seq "$n"); do
    ( [ -n "$thr" ] && export OMP_NUM_THREADS=$thr
      SNAPMLA_DECODE_IMPL=cuda timeout "$to" python3 -m pytest -q -p no:xdist -p no:cacheprovider -o addopts= \
        -o faulthandler_timeout=45 --durations=0 tests/product/test_gpu_graph_protocol.py -k "140 and cuda" \
        > "$R/$name.$i.log" 2>&1
      echo "rc=$? after $(( $(date +%s) - t )) s" >> "$R/$name.$i.log" ) &
    pids+=($!)
  done
  wait "${pids[@]}"; kill "$mon"
  echo "$name: $(grep -h '^rc=' "$R/$name".*.log | tr '\n' ' ')" | tee -a "$R/summary.txt"
}
phase four_default "" 4 130
phase four_omp4 "$(cores_per_process 4)" 4 130
phase solo "" 1 80
tar -C "$OUT" -cJf "$OUT/threads.tar.xz" threads  # the device returns a few files: the logs as one
