#!/usr/bin/env bash
# On the Hopper host (the runtime in .gpu): snapmla against SGLang's own FP8 MLA cache (flashmla --kv-cache-dtype
# fp8_e4m3) on a trained checkpoint reparameterized to realistic activation magnitudes (tools/fp8_outlier_sweep.py).
#   usage: HEADS=128 bash tools/gpu_host/fp8_sweep.sh [extra tools.fp8_outlier_sweep flags]
#          HEADS="64 128" bash tools/gpu_host/fp8_sweep.sh ...   (several checkpoints: trained one after another, then
#                                                                  their sweeps side by side on the same GPU)
# Trains each checkpoint (TRAIN_MINUTES, default 2, alone on the GPU) unless .gpucache holds it; results accumulate in
# .gpucache/sweep-h$HEADS (a run already measured is kept), and land with the logs in $OUT.
# It runs longer than a host's command limit: start it detached and read the results from .gpucache later:
#   setsid nohup bash tools/gpu_host/fp8_sweep.sh > .gpucache/fp8_sweep.log 2>&1 &
# or call it again on the same warm machine: it resumes from .gpucache.
set -uo pipefail
source tools/gpu_host/env.sh  # $OUT, runtime, JIT caches, plugin installed
HEADS=${HEADS:-128}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
build_cuda_ext_meanwhile .gpucache/cuda_build.log
for h in $HEADS; do train_checkpoint .gpucache/tiny-mla-h$h $h; done
wait
# per checkpoint one sweep, each on its own port range (a sweep's run i serves on its port + PORT_STRIDE x i,
# harness/server.py's 100: 1000 apart leaves room for 10 runs); within a sweep the runs after the reference side by
# side too (--concurrent: their pools are of a fixed size)
i=0
for h in $HEADS; do
  python3 -m tools.fp8_outlier_sweep --model .gpucache/tiny-mla-h$h --out .gpucache/sweep-h$h --kernel-level \
    --concurrent --port $((24000 + 1000 * i)) "$@" > "$OUT/fp8_sweep_h$h.log" 2>&1 &
  i=$((i + 1))
done
wait
mkdir -p .gpucache/results
for h in $HEADS; do
  SWEEP=.gpucache/sweep-h$h
  echo "== $h heads"; grep -v "^{" "$OUT/fp8_sweep_h$h.log" | tail -40
  [ -f $SWEEP/fp8_outlier_sweep.json ] || { echo "sweep h$h: no results (its log: $OUT/fp8_sweep_h$h.log)"; continue; }
  cp $SWEEP/fp8_outlier_sweep.json .gpucache/results/fp8_outlier_sweep_h$h.json
  cp $SWEEP/fp8_outlier_sweep.png .gpucache/results/fp8_outlier_sweep_h$h.png
  cp .gpucache/tiny-mla-h$h/train_log.json .gpucache/results/train_log_h$h.json
  tar cJf .gpucache/results/sweep_server_logs_h$h.tar.xz -C $SWEEP $(cd $SWEEP && ls *.log)
  echo "sweep h$h done"
done
cp .gpucache/results/* "$OUT/" 2>/dev/null
