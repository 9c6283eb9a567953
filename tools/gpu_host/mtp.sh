#!/usr/bin/env bash
# On the Hopper host (the runtime in .gpu, the deep_gemm wheel in .whl or .gpu/wheels: SGLang 0.5.17's draft worker
# imports it): the small model trained with its MTP layer (tools/train_tiny_mla.py --mtp; HEADS, default 16;
# TRAIN_MINUTES), then speculative decoding with that layer as the draft against each backend without it
# (benchmarks/serve_mtp.py; results accumulate in .gpucache/serve_mtp*, so a call cut by the time limit is continued
# by the next call on the same warm machine).
#   usage: bash tools/gpu_host/mtp.sh [runs...]   (default: snapmla snapmla-mtp flashmla flashmla-mtp)
#   FP8_WEIGHTS=1: the checkpoint converted to block-FP8 weights first (the MTP layer too, as DeepSeek-V3 ships it)
set -uo pipefail
source tools/gpu_host/env.sh  # $OUT, runtime, JIT caches, plugin installed
CKPT=.gpucache/tiny-mla-mtp-h${HEADS:-16}
build_cuda_ext_meanwhile
TRAIN_FLAGS=--mtp train_checkpoint $CKPT ${HEADS:-16}
wait
cp $CKPT/train_log.json "$OUT/train_log_mtp_h${HEADS:-16}.json"
RESULTS=.gpucache/serve_mtp_h${HEADS:-16}
if [ -n "${FP8_WEIGHTS:-}" ]; then
  fp8_checkpoint $CKPT
  CKPT=$CKPT-fp8 RESULTS=$RESULTS-fp8
fi
RUNS=("$@")
[ ${#RUNS[@]} -gt 0 ] || RUNS=(snapmla snapmla-mtp flashmla flashmla-mtp)
python3 -m benchmarks.serve_mtp --model $CKPT --runs "${RUNS[@]}" --out $RESULTS 2>&1 | tail -40
cp $RESULTS/serve_mtp.json $RESULTS/serve_mtp_ids.json $RESULTS/serve_mtp.png "$OUT/" 2>/dev/null
tar czf "$OUT/serve_mtp_server_logs.tgz" -C $RESULTS $(cd $RESULTS && ls *.log)
