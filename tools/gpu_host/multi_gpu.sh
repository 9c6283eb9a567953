#!/usr/bin/env bash
# On a 2-GPU Hopper host (the runtime in .gpu): the DeepSeek-V3-shaped config with
# --attention-backend snapmla vs flashmla BF16 under DP attention (--tp 2 --enable-dp-attention --dp 2) and tensor
# parallelism (--tp 2): startup, endpoints, a fixed greedy batch generated twice, pool tokens, bench_serving.
#   usage: [STARTUP_TIMEOUT=600] [WARMUP_ONLY=1] [GRAPH_BS=64] [SERVER_FLAGS="--mem-fraction-static 0.12"] \
#          [RUNS="snapmla flashmla-mhaprefill flashmla"] \
#          bash tools/gpu_host/multi_gpu.sh [NUM_PROMPTS, default 128] [layouts...]
# SERVER_FLAGS go after the layout flags (the last value of a flag wins): a small --mem-fraction-static makes the
# KV pools, not the prompt count, bound the batch (what DP attention's capacity comparison needs).
# A cold 2-GPU machine spends ~6 min before its first answer (3.5 min of FlashInfer all-reduce fusion JIT,
# then MoE Triton JIT during graph capture). So: first call WARMUP_ONLY=1 (one unmeasured snapmla server per layout
# fills the JIT caches of the machine), then the measured call immediately after, on the still-warm machine (~2.5 min
# per backend), one layout per call.
# WARMUP_ONLY always sends 16 prompts (NUM_PROMPTS applies to the measured call); pass the same GRAPH_BS and
# SERVER_FLAGS to both calls so the warm-up compiles what the measured servers will need.
set -uo pipefail
source tools/gpu_host/env.sh  # $OUT, runtime, JIT caches, plugin installed
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/gpu.txt"
N=${1:-128}; shift || true
for layout in ${@:-dp tp}; do
  case $layout in
    dp) flags="--tp 2 --enable-dp-attention --dp 2" ;;
    tp) flags="--tp 2" ;;
    *) echo "unknown layout $layout (dp or tp)"; exit 2 ;;
  esac
  echo "== layout $layout: $flags"
  # WARMUP_ONLY: one unmeasured snapmla server compiles what the first server start and first requests need
  if [ -n "${WARMUP_ONLY:-}" ]; then runs=(snapmla); n=16 warm=0 timeout=580 dir=warmup_$layout repeat=
  else runs=(${RUNS:-snapmla flashmla}); n=$N warm=4 timeout=${STARTUP_TIMEOUT:-600} dir=$layout repeat=--greedy-repeat; fi
  python3 -m benchmarks.serve_and_bench --model configs/models/deepseek-v3-shape --runs "${runs[@]}" --num-prompts $n \
    --warmup-prompts $warm --cuda-graph-max-bs ${GRAPH_BS:-64} $repeat --startup-timeout $timeout --out "$OUT/$dir" \
    --extra $flags ${SERVER_FLAGS:-} 2>&1 | grep -v "^{" | tail -6
done
