#!/usr/bin/env bash
# On the H100 host (the runtime in .gpu): train the small MLA model, then the trained-model accuracy evaluation.
#   usage: bash tools/gpu_host/accuracy.sh [train minutes, default 4]
#          HEADS=128 bash tools/gpu_host/accuracy.sh 2   # the 128-head checkpoint (shared with accuracy_gate.sh)
#          EVAL_RUNS="flashmla snapmla" ...             # the served runs (default: flashmla BF16, SGLang's FP8
#                                                       # flashmla, snapmla, triton as the BF16 floor)
#          LAYERWISE=0 ...                              # skip the per-layer table on the model's activations
#          CHECK=1 bash tools/gpu_host/accuracy.sh 2   # instead of the evaluation: prefix-cache / chunked-prefill
#                                                    # identity (tools/check_serving.py) on the trained model
#          FP8_WEIGHTS=1 ...                          # the evaluation on the checkpoint converted to block-FP8
#                                                    # weights (env.sh's fp8_checkpoint), every backend on those
#                                                    # identical weights; no per-layer table (it reads BF16 weights)
# One call: the checkpoint (~120 MB) stays on the machine (.gpucache/tiny-mla-h$HEADS, reused while the machine stays
# warm), only reports come back in $OUT.
set -uo pipefail
source tools/gpu_host/env.sh  # $OUT, runtime, JIT caches, plugin installed
HEADS=${HEADS:-16}
CKPT=.gpucache/tiny-mla-h$HEADS
if [ -f $CKPT/train_log.json ] && [ -z "${RETRAIN:-}" ]; then  # a warm machine kept the checkpoint of an earlier call (e.g. one that timed out)
  echo "reusing the checkpoint in $CKPT"
else
  python3 -m tools.train_tiny_mla --out $CKPT --heads $HEADS --minutes "${1:-4}" 2>&1 | grep -v "^{" | tee "$OUT/train.log"
fi
cp $CKPT/train_log.json "$OUT/"
EVAL=.gpucache/eval-h$HEADS
if [ -n "${FP8_WEIGHTS:-}" ]; then
  fp8_checkpoint $CKPT
  CKPT=$CKPT-fp8 EVAL=$EVAL-fp8 LAYERWISE=0
fi
if [ "${CHECK:-0}" = 1 ]; then
  python3 -m tools.check_serving --model $CKPT --runs snapmla flashmla --load-format auto --context-length 4096 \
    --long-len 3584 --chunk 1024 --out /tmp/check 2>&1 | tail -9
  cp /tmp/check/check_serving.json "$OUT/"; exit 0
fi
if [ "${LAYERWISE:-1}" = 1 ]; then
  echo "== layerwise error on real activations (configs A-D, SnapMLA, BF16, and the shipped kernels)"
  python3 -m study.accuracy --checkpoint $CKPT --windows 8 --window-len 1024 --kernel --no-progress \
    --out "$OUT/layerwise" 2>&1 | tail -12
fi
echo "== through the server: perplexity, greedy agreement, drift"
# --resume: a call cut off by the time limit is continued by the next call on the same warm machine
python3 -m tools.eval_trained_model --model $CKPT --runs ${EVAL_RUNS:-flashmla flashmla-fp8 snapmla triton} \
  --out $EVAL --resume 2>&1 | tail -8
cp $EVAL/eval_trained_model.json "$OUT/"
tar czf "$OUT/eval_server_logs.tgz" -C $EVAL $(cd $EVAL && ls *.log)  # <= 8 files
