#!/usr/bin/env bash
# On the Hopper host (the runtime in .gpu): tools/soak.py against a server of the small trained checkpoint with a
# pool small enough to force retractions, per backend in turn (default: snapmla flashmla). SERVER_FLAGS adds server
# flags (e.g. "--tp 2 --enable-dp-attention --dp 2"), SOAK_SECONDS sets the soak's length (default 300), SOAK_PORT the
# first server's port (default 31700; soaks side by side on one host each take their own), SOAK_ARGS more tools.soak
# options (e.g. "--min-retractions 1" with SERVER_FLAGS="--schedule-conservativeness 0.05"), SOAK_MODEL a bundled config
# served on dummy weights instead of the checkpoint (configs/models/deepseek-v3-fp8-tp8: the deployment draw; on a host
# that has not served it, SOAK_ARGS="--warmup-seconds 120" lets its first batches compile outside the checks),
# SOAK_FINISH_BY the seconds each backend's whole run may take, its server's start included (tools.soak --finish-by:
# the measured load is shortened to fit, e.g. 540 under a 600 s command limit). FP8 GEMMs run on SGLang's Triton
# kernels unless DEEPGEMM=1: with deep_gemm in the runtime, DeepGEMM's JIT pre-compiles each GEMM shape for all M
# at its first use (the TP 8 shape's first decode-graph capture: 247 s on a fresh H200, 129 s without DeepGEMM). Per backend the table, soak.json and the
# server log under $OUT/soak_BACKEND.
#   usage: bash tools/gpu_host/soak.sh [backend...]
set -uo pipefail
source tools/gpu_host/env.sh  # $OUT, runtime, JIT caches, plugin installed
export SGLANG_ENABLE_JIT_DEEPGEMM=${DEEPGEMM:-0}
if [ -n "${SOAK_MODEL:-}" ]; then
  # near-flat dummy logits: the probes after a prefix hit are another computation (tools/soak.py's docstring)
  MODEL="--model $SOAK_MODEL --load-format dummy --context-length 32768 --flush-before-probes-after"
else
  CKPT=.gpucache/tiny-mla-h${HEADS:-16}
  train_checkpoint $CKPT ${HEADS:-16}
  MODEL="--model $CKPT"
fi
port=${SOAK_PORT:-31700}
for backend in ${@:-snapmla flashmla}; do
  # other backends get no out-of-range ids: SGLang sends them to the GPU and the server dies (sglang PR #8383)
  case $backend in snapmla*) ids="" ;; *) ids="--without-out-of-range-ids" ;; esac
  python3 -m tools.soak --start "$backend" $MODEL --port $port --seconds "${SOAK_SECONDS:-300}" $ids ${SOAK_ARGS:-} \
    ${SOAK_FINISH_BY:+--finish-by $SOAK_FINISH_BY} \
    --server-flags "--max-total-tokens 65536 --max-running-requests 256 ${SERVER_FLAGS:-}" --out "$OUT/soak_$backend"
  echo "$backend: soak exit $?"
  port=$((port + 10))
done
