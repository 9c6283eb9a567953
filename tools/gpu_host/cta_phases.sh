#!/usr/bin/env bash
# On a Hopper host: where a 64-row decode CTA's time goes, phase by phase and wave by wave
# (benchmarks/gpu/cta_phases.py, the kernel's stamped copy from tools/kernel_dev/phase_stamps.py), and what the stamps
# cost: the decode chain with the kernel against the stamped copy, two interleaved rounds
# (benchmarks/gpu/time_variants.py). Writes $OUT/cta_phases/ (table, JSON, PNG) and $OUT/variants.json.
#   usage: [STAMP_COST_SHAPES=h128x128x640,...] bash tools/gpu_host/cta_phases.sh [cta_phases args]
set -uo pipefail
source tools/gpu_host/env.sh  # $OUT, runtime, JIT caches, plugin installed
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
# the kernel itself, for the cost rounds, builds while cta_phases.py writes and builds the stamped copy (ab/stamps)
build_cuda_ext_meanwhile "$OUT/cuda_build.log"
timeout 300 python3 -m benchmarks.gpu.cta_phases --copy-dir ab --out "$OUT/cta_phases" "$@" > "$OUT/cta_phases.log" 2>&1
rc=$?; grep -v "^| h" "$OUT/cta_phases.log" | tail -8; sed -n '/^| shape/,$p' "$OUT/cta_phases.log" | tail -40
[ $rc = 0 ] || exit $rc
wait  # the kernel's own build
python3 -m benchmarks.gpu.time_variants "${STAMP_COST_SHAPES:-h128x64x640,h128x128x640,h128x256x1280,h128x128x4096}" \
  main stamps main stamps 2>&1 | tee "$OUT/stamps_cost.log" | tail -12
