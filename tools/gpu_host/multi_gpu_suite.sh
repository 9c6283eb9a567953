#!/usr/bin/env bash
# On a 4-GPU Hopper host (the runtime in .gpu, Mooncake in .whl: pd_transfer.sh): the multi-GPU measurements of
# docs/ACCURACY.md and docs/BENCHMARKS.md in one run, the GPUs kept busy.
#   GPUs 0,1 : sustained serving under DP attention, V3 shape (multi_gpu_steady.sh dp2), alone on its GPUs
#   GPUs 2,3 : the 128-head checkpoint trained, then the accuracy gate under DP attention (multi_gpu_gate.sh dp2)
#              beside the prefill/decode pair (pd_pair.sh: prefill on GPU 2, decode on GPU 3); both compare
#              outputs, not times, so they share the GPUs
#   then all : the gate at dp4, then sustained serving at dp4
#   usage: [RUNS="flashmla flashmla-fp8 snapmla mutant"] [WAIT_FOR_WHL=s] bash tools/gpu_host/multi_gpu_suite.sh
# Each part writes its table to $OUT (steady_*.txt, gate_*.txt, pd_pair.txt) and its output to $OUT/suite_*.log.
set -uo pipefail
source tools/gpu_host/env.sh  # $OUT, runtime, JIT caches, plugin installed
export RUNS=${RUNS:-flashmla flashmla-fp8 snapmla mutant}
CKPT=.gpucache/tiny-mla-h128
ON_GPUS=0,1 bash tools/gpu_host/multi_gpu_steady.sh dp2 > "$OUT/suite_steady_dp2.log" 2>&1 &
steady=$!
if [ ! -f $CKPT/heldout.json ]; then
  CUDA_VISIBLE_DEVICES=2 python3 -m tools.train_tiny_mla --out $CKPT --heads 128 --minutes 2 2>&1 \
    | grep -v "^{" | tail -3 | tee "$OUT/train.log"
fi
ON_GPUS=2,3 bash tools/gpu_host/multi_gpu_gate.sh dp2 > "$OUT/suite_gate_dp2.log" 2>&1 &
gate=$!
sleep 30  # each script installs the plugin first (env.sh): not at the same moment
ON_GPUS=2,3 WAIT_FOR_WHL=${WAIT_FOR_WHL:-600} bash tools/gpu_host/pd_pair.sh > "$OUT/suite_pd_pair.log" 2>&1
wait $gate $steady
bash tools/gpu_host/multi_gpu_gate.sh dp4 > "$OUT/suite_gate_dp4.log" 2>&1
bash tools/gpu_host/multi_gpu_steady.sh dp4 > "$OUT/suite_steady_dp4.log" 2>&1
echo "suite done"
