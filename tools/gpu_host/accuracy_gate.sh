#!/usr/bin/env bash
# On the Hopper host (the runtime in .gpu): the serving-scale accuracy gate (tools/accuracy_gate.py) on the
# small trained checkpoint: flashmla BF16 (reference), SGLang's FP8 flashmla, snapmla, snapmla with the Triton decode, and snapmla with the
# capture-view bug put back (tools/gpu_host/mutant.sh; the gate must fail it).
#   usage: bash tools/gpu_host/accuracy_gate.sh [runs...; `mutant` names the capture-view bug's server]     (default: all five; results accumulate in .gpucache/gate,
#          so a call cut by the time limit is continued by the next call on the same warm machine)
#   FP8_WEIGHTS=1: the checkpoint converted to block-FP8 weights first (tools/convert_block_fp8.py, as DeepSeek-V3/R1
#          ship them), every backend served on those identical weights (FP8 GEMMs on SGLang's Triton kernels);
#          results in .gpucache/gate-fp8
set -uo pipefail
source tools/gpu_host/env.sh  # $OUT, runtime, JIT caches, plugin installed
source tools/gpu_host/mutant.sh
CKPT=.gpucache/tiny-mla-h${HEADS:-16}
build_cuda_ext_meanwhile
train_checkpoint $CKPT ${HEADS:-16}
wait
cp $CKPT/train_log.json "$OUT/"
GATE=.gpucache/gate
if [ -n "${FP8_WEIGHTS:-}" ]; then
  fp8_checkpoint $CKPT
  CKPT=$CKPT-fp8 GATE=.gpucache/gate-fp8
fi
RUNS=("$@")
# the mutant's server: PYTHONSAFEPATH=1, or `python -m sglang.launch_server` would import the plugin from the working
# directory (this checkout) before PYTHONPATH
MUTANT_RUN="snapmla-capture-view-bug=snapmla:PYTHONSAFEPATH=1;PYTHONPATH=$MUTANT_PYTHONPATH"
[ ${#RUNS[@]} -gt 0 ] || RUNS=(flashmla flashmla-fp8 snapmla "$MUTANT_RUN" snapmla-triton)
for i in "${!RUNS[@]}"; do [ "${RUNS[$i]}" = mutant ] && RUNS[$i]=$MUTANT_RUN; done  # `mutant`: the capture-view bug
python3 -m tools.accuracy_gate --model $CKPT --runs "${RUNS[@]}" --out $GATE 2>&1 | tail -12
cp $GATE/accuracy_gate.json "$OUT/"
tar czf "$OUT/gate_server_logs.tgz" -C $GATE $(cd $GATE && ls *.log)
