#!/usr/bin/env bash
# On the Hopper host (the runtime in .gpu): snapmla against SGLang's own FP8 MLA cache (flashmla --kv-cache-dtype
# fp8_e4m3) on a trained checkpoint reparameterized to realistic activation magnitudes (tools/fp8_outlier_sweep.py).
#   usage: HEADS=128 bash tools/gpu_host/fp8_sweep.sh [extra tools.fp8_outlier_sweep flags]
# Trains the checkpoint (TRAIN_MINUTES, default 2) unless .gpucache holds it; results accumulate in
# .gpucache/sweep-h$HEADS (a run already measured is kept), and land with the log in $OUT.
# It runs longer than a host's command limit: start it detached and read the results from .gpucache later:
#   setsid nohup bash tools/gpu_host/fp8_sweep.sh > .gpucache/fp8_sweep.log 2>&1 &
set -uo pipefail
source tools/gpu_host/env.sh  # $OUT, runtime, JIT caches, plugin installed
HEADS=${HEADS:-128}
CKPT=.gpucache/tiny-mla-h$HEADS
SWEEP=.gpucache/sweep-h$HEADS
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
# the sm_90a extension builds on the CPU while the model trains on the GPU
python3 -c "from sglang_snapmla import cuda_ext; cuda_ext.build()" > .gpucache/cuda_build.log 2>&1 &
train_checkpoint $CKPT $HEADS
wait
# the runs after the reference side by side on the GPU (--concurrent: their pools are of a fixed size)
python3 -m tools.fp8_outlier_sweep --model $CKPT --out $SWEEP --kernel-level --concurrent "$@"
mkdir -p .gpucache/results
cp $SWEEP/fp8_outlier_sweep.json .gpucache/results/fp8_outlier_sweep_h$HEADS.json
cp $SWEEP/fp8_outlier_sweep.png .gpucache/results/fp8_outlier_sweep_h$HEADS.png
cp $CKPT/train_log.json .gpucache/results/train_log_h$HEADS.json
tar cJf .gpucache/results/sweep_server_logs_h$HEADS.tar.xz -C $SWEEP $(cd $SWEEP && ls *.log)
cp .gpucache/results/* "$OUT/" 2>/dev/null
echo "sweep h$HEADS done"
