#!/usr/bin/env bash
# On a 4-GPU Hopper host (the runtime in .gpu; Mooncake's engine and the deep_gemm wheel in .whl, which may arrive in
# a second transfer to the same machine: pd_transfer.sh, env.sh): the multi-GPU measurements of docs/ACCURACY.md and
# docs/BENCHMARKS.md in one run, the GPUs kept busy.
#   GPUs 0,1 : sustained serving under DP attention, V3 shape (multi_gpu_steady.sh dp2), alone on its GPUs
#   GPUs 2,3 : the 128-head checkpoint trained; the accuracy gate under DP attention (multi_gpu_gate.sh dp2) beside
#              the prefill/decode pair (pd_pair.sh: prefill on GPU 2, decode on GPU 3), both comparing outputs, not
#              times; then MTP under DP attention serving a sustained load (V3 shape with its NEXTN layer, dummy
#              weights: graphs and memory, not acceptance)
#   then all : the gate at dp4, then sustained serving at dp4
# On a 2-GPU host the parts run one after another on GPUs 0,1 and the dp4 parts are refused (named in
# suite_refused.txt).
#   usage: [RUNS="flashmla flashmla-fp8 snapmla mutant"] [PARTS="steady2 gate2 pd mtp2 gate4 steady4"]
#          [WAIT_FOR_WHL=s] bash tools/gpu_host/multi_gpu_suite.sh
# Each part writes its table to $OUT (steady_*.txt, gate_*.txt, pd_pair.txt) and its output to $OUT/suite_*.log;
# $OUT/suite.tgz holds them all at the end (few files come back from the host).
set -uo pipefail
source tools/gpu_host/env.sh  # $OUT, runtime, JIT caches, plugin installed
export RUNS=${RUNS:-flashmla flashmla-fp8 snapmla mutant}
parts=" ${PARTS:-steady2 gate2 pd mtp2 gate4 steady4} "
has() { [[ "$parts" == *" $1 "* ]]; }
CKPT=.gpucache/tiny-mla-h128
ngpu=$(nvidia-smi -L | wc -l)
if [ "$ngpu" -ge 4 ]; then second=2,3 bg="&"; else
  second=0,1 bg=""  # one pair of GPUs: the parts in turn
  for p in gate4 steady4; do
    has $p && echo "$p: refused, $ngpu GPUs on this host" | tee -a "$OUT/suite_refused.txt"
  done
  parts=${parts/ gate4 / }; parts=${parts/ steady4 / }
fi
has steady2 && eval 'ON_GPUS=0,1 bash tools/gpu_host/multi_gpu_steady.sh dp2 > "$OUT/suite_steady_dp2.log" 2>&1' $bg
{ has gate2 || has pd || has gate4; } && train_checkpoint $CKPT 128 ${second%,*}
has gate2 && eval 'ON_GPUS=$second bash tools/gpu_host/multi_gpu_gate.sh dp2 > "$OUT/suite_gate_dp2.log" 2>&1' $bg
sleep 30  # each script installs the plugin first (env.sh): not at the same moment
has pd && ON_GPUS=$second WAIT_FOR_WHL=${WAIT_FOR_WHL:-600} bash tools/gpu_host/pd_pair.sh \
  > "$OUT/suite_pd_pair.log" 2>&1
if has mtp2; then
  wait_for_whl "sgl_deep_gemm*.whl" ${WAIT_FOR_WHL:-600} \
    || echo "mtp2: no deep_gemm wheel in .whl" | tee -a "$OUT/suite_refused.txt"
  # the draft's weights count against the static fraction: at 0.14 SGLang finds no memory for the KV cache
  ON_GPUS=$second TAG=dp2_mtp bash tools/gpu_host/multi_gpu_steady.sh dp2 --backends snapmla-mtp --turnovers 1.5 \
    --port 31000 --mem-fraction-static 0.2 > "$OUT/suite_steady_dp2_mtp.log" 2>&1
fi
wait
has gate4 && bash tools/gpu_host/multi_gpu_gate.sh dp4 > "$OUT/suite_gate_dp4.log" 2>&1
has steady4 && bash tools/gpu_host/multi_gpu_steady.sh dp4 > "$OUT/suite_steady_dp4.log" 2>&1
tar czf "$OUT/suite.tgz" -C "$OUT" --exclude=suite.tgz .
echo "suite done"
