#!/usr/bin/env bash
# On the Hopper host (the runtime in .gpu): the serving-scale accuracy gate (tools/accuracy_gate.py) on the
# small trained checkpoint: flashmla BF16 (reference), SGLang's FP8 flashmla, snapmla, snapmla with the Triton decode, and snapmla with the
# capture-view bug put back (tools/gpu_host/mutant.sh; the gate must fail it).
#   usage: bash tools/gpu_host/accuracy_gate.sh [runs...; `mutant` names the capture-view bug's server]     (default: all five; results accumulate in .gpucache/gate,
#          so a call cut by the time limit is continued by the next call on the same warm machine)
set -uo pipefail
source tools/gpu_host/env.sh  # $OUT, runtime, JIT caches, plugin installed
source tools/gpu_host/mutant.sh
CKPT=.gpucache/tiny-mla-h${HEADS:-16}
# the sm_90a extension builds on the CPU while the model trains on the GPU
python3 -c "from sglang_snapmla import cuda_ext; cuda_ext.build()" > "$OUT/cuda_build.log" 2>&1 &
train_checkpoint $CKPT ${HEADS:-16}
wait
cp $CKPT/train_log.json "$OUT/"
RUNS=("$@")
# the mutant's server: PYTHONSAFEPATH=1, or `python -m sglang.launch_server` would import the plugin from the working
# directory (this checkout) before PYTHONPATH
MUTANT_RUN="snapmla-capture-view-bug=snapmla:PYTHONSAFEPATH=1;PYTHONPATH=$MUTANT_PYTHONPATH"
[ ${#RUNS[@]} -gt 0 ] || RUNS=(flashmla flashmla-fp8 snapmla "$MUTANT_RUN" snapmla-triton)
for i in "${!RUNS[@]}"; do [ "${RUNS[$i]}" = mutant ] && RUNS[$i]=$MUTANT_RUN; done  # `mutant`: the capture-view bug
python3 -m tools.accuracy_gate --model $CKPT --runs "${RUNS[@]}" --out .gpucache/gate 2>&1 | tail -12
cp .gpucache/gate/accuracy_gate.json "$OUT/"
tar czf "$OUT/gate_server_logs.tgz" -C .gpucache/gate $(cd .gpucache/gate && ls *.log)
