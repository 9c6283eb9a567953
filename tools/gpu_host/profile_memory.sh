#!/usr/bin/env bash
# On a Hopper host: where one decode launch's memory traffic goes, under Nsight Compute: DRAM bytes read and written,
# L2 sectors (all sources, and the L1/TEX ones) by hit and miss, and the local memory (register spills) that L1 does
# and does not hold. The split or narrow kernel of the second decode in profile_decode's range; the sources of another
# kernel through SNAPMLA_CUDA_SOURCE_DIR. Writes $OUT/NAME.csv (ncu's CSV, base units) and prints the metrics.
#   usage: bash tools/gpu_host/profile_memory.sh NAME B S_K H [profile_decode args]
set -uo pipefail
source tools/gpu_host/env.sh  # $OUT, runtime, JIT caches, plugin installed
name=$1; shift
metrics=dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum
for op in ld st; do
  for m in "" _lookup_hit _lookup_miss; do metrics+=,l1tex__t_sectors_pipe_lsu_mem_local_op_$op$m.sum; done
done
for src in "" srcunit_tex_; do
  for op in "" _op_read _op_write; do
    for m in "" _lookup_hit _lookup_miss; do metrics+=,lts__t_sectors_${src}aperture_device$op$m.sum; done
  done
done
# the extension built before ncu starts (a build under ncu would be profiled for minutes)
build_cuda_ext "$OUT/$name.build.log" || { tail "$OUT/$name.build.log"; exit 1; }
timeout 200 ncu --metrics "$metrics" --nvtx --nvtx-include 'profile/' -k regex:'decode_(split|narrow)' --launch-skip 1 -c 1 \
  --csv --print-units base python3 -m tools.kernel_dev.profile_decode "$@" > "$OUT/$name.csv" 2> "$OUT/$name.err"
rc=$?
grep -E '^"[0-9]' "$OUT/$name.csv" | awk -F'","' '{gsub(/"/, "", $NF); print $(NF-2), $NF}'
exit $rc
