#!/usr/bin/env bash
# On a 2-, 4- or 8-GPU Hopper host (the runtime in .gpu): the serving-scale accuracy gate (tools/accuracy_gate.py) under
# SGLang's parallel layouts, on the 128-head trained checkpoint. Per layout, served at once on the layout's GPUs
# (--concurrent): flashmla BF16 at that layout (the reference), snapmla, and snapmla with the capture-view bug put
# back (tools/gpu_host/mutant.sh; the gate must fail it).
#   tp2: --tp 2    dp2: --tp 2 --enable-dp-attention --dp 2    dp4: --tp 4 --enable-dp-attention --dp 4
#   dp8: --tp 8 --enable-dp-attention --dp 8
# With 4 GPUs tp2 and dp2 run side by side (GPUs 0,1 and 2,3), then dp4 (and dp8 with 8); with 2, one after the other.
#   usage: [RUNS="flashmla snapmla mutant"] [ON_GPUS=2,3] bash tools/gpu_host/multi_gpu_gate.sh [layouts, default: all
#          that fit]   (ON_GPUS: one layout on other GPUs of a larger host)
# Results accumulate in .gpucache/gate_<layout>/ (a call cut by the time limit is continued by the next call on the
# same warm machine); each layout's table goes to $OUT/gate_<layout>.txt.
set -uo pipefail
source tools/gpu_host/env.sh  # $OUT, runtime, JIT caches, plugin installed
source tools/gpu_host/mutant.sh
source tools/gpu_host/layouts.sh
GPUS=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/gpu.txt"
CKPT=.gpucache/tiny-mla-h128
build_cuda_ext_meanwhile
train_checkpoint $CKPT 128 0
wait
# the runs' servers share each GPU: SGLang sizes a pool from the memory free at that server's start x the fraction,
# and 0.3 of it is far more than the capped pool (tools/accuracy_gate.py, POOL_TOKENS) and the small model need;
# SGLang's start compares free memory across a server's TP ranks, which servers starting side by side skew, so that
# check warns instead of stopping
export SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK=0
MUTANT_RUN="snapmla-capture-view-bug=snapmla:PYTHONSAFEPATH=1;PYTHONPATH=$MUTANT_PYTHONPATH"
runs=()
for r in ${RUNS:-flashmla snapmla mutant}; do [ "$r" = mutant ] && runs+=("$MUTANT_RUN") || runs+=("$r"); done

gate() {  # layout, GPU list, first port
  local flags
  flags=$(layout_flags $1) || return 2
  CUDA_VISIBLE_DEVICES=$2 python3 -m tools.accuracy_gate --model $CKPT --runs "${runs[@]}" --concurrent \
    --port $3 --startup-timeout 900 --server-flags "$flags --mem-fraction-static 0.3" --out .gpucache/gate_$1 \
    > "$OUT/gate_$1.txt" 2>&1
  tail -8 "$OUT/gate_$1.txt"
  python3 -m benchmarks.server_log_stats --startup .gpucache/gate_$1/server_*.log > "$OUT/startup_gate_$1.txt"
  cp .gpucache/gate_$1/accuracy_gate.json "$OUT/accuracy_gate_$1.json"
  tar czf "$OUT/gate_$1_server_logs.tgz" -C .gpucache/gate_$1 $(cd .gpucache/gate_$1 && ls *.log)
}

layouts=${*:-tp2 dp2 $([ "$GPUS" -ge 4 ] && echo dp4) $([ "$GPUS" -ge 8 ] && echo dp8)}
if [ "$GPUS" -ge 4 ] && [[ " $layouts " == *" tp2 "* ]] && [[ " $layouts " == *" dp2 "* ]]; then
  gate tp2 0,1 23000 & gate dp2 2,3 24000 & wait
  layouts=${layouts//tp2/}; layouts=${layouts//dp2/}
fi
for layout in $layouts; do
  gate $layout ${ON_GPUS:-$(layout_gpus $layout)} 25000
done
