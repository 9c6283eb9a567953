#!/usr/bin/env bash
# On a Hopper host: every launch of one decode (snapmla: Q-quant, split kernel, combine; FlashMLA: its kernel and
# combine), under Nsight Compute, for each shape and implementation given; one summary table of durations, grids,
# waves, DRAM throughput and occupancy per launch ($OUT/NAME.csv, $OUT/NAME.txt). Stops starting shapes after SECONDS.
#   usage: [NCU_ARGS="--clock-control none"] bash tools/gpu_host/profile_launches.sh NAME SECONDS "B S_K H [profile_decode args]"...
#   e.g.   bash tools/gpu_host/profile_launches.sh h128 240 "128 640 128 --impl cuda --context-len 32768" \
#            "128 640 128 --impl flashmla"
set -uo pipefail
source tools/gpu_host/env.sh  # $OUT, runtime, JIT caches, plugin installed
name=$1 limit=$2; shift 2
metrics=gpu__time_duration.sum,launch__grid_size,launch__block_size,launch__waves_per_multiprocessor,\
launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,\
dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed
: > "$OUT/$name.csv"
for shape in "$@"; do
  [ "$SECONDS" -ge "$limit" ] && { echo "profile_launches: $SECONDS s, not started: $shape" | tee -a "$OUT/$name.txt"; continue; }
  echo "# $shape" >> "$OUT/$name.csv"
  # the launches of the second decode in the range (the first pays any lazy set-up)
  timeout 120 ncu ${NCU_ARGS:-} --nvtx --nvtx-include 'profile/' --metrics "$metrics" --csv \
    python3 -m tools.kernel_dev.profile_decode $shape --decodes 2 > "$OUT/$name.raw.log" 2>&1
  grep -E '^"' "$OUT/$name.raw.log" >> "$OUT/$name.csv"
  grep -E "^plan:" "$OUT/$name.raw.log" | sed "s|^|# $shape: |" >> "$OUT/$name.csv"
done
python3 -m tools.kernel_dev.launch_table "$OUT/$name.csv" | tee -a "$OUT/$name.txt"
