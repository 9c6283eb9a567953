#!/usr/bin/env bash
# On a Hopper host: Nsight Compute report of the decode kernel for one shape (the split kernel, or the narrow
# sm_90a kernel that serves <= 32 query rows), plus text pages for reading
# elsewhere. usage: bash tools/gpu_host/profile.sh NAME B S_K H [S_Q] [--impl cuda|triton]   (writes $OUT/NAME.*)
set -uo pipefail
source tools/gpu_host/env.sh  # $OUT, runtime, JIT caches, plugin installed
name=$1; shift
# only launches inside profile_decode's NVTX range: the prebuilt library's self-check launches the kernel first
timeout 300 ncu --set full --import-source yes --nvtx --nvtx-include 'profile/' -k regex:'decode_(split|narrow)' \
  --launch-skip 1 -c 1 -f -o "$OUT/$name" \
  python3 -m tools.kernel_dev.profile_decode "$@" > "$OUT/$name.ncu.log" 2>&1; tail -3 "$OUT/$name.ncu.log"
ncu -i "$OUT/$name.ncu-rep" --page details > "$OUT/$name.details.txt" 2>&1
ncu -i "$OUT/$name.ncu-rep" --page source --csv --print-source sass > "$OUT/$name.sass.csv" 2>&1
grep -E "Duration|Memory Throughput|DRAM Throughput|Registers|Achieved Occupancy|Warp Cycles Per Issued" \
  "$OUT/$name.details.txt" | head -12
