#!/usr/bin/env bash
# On the Hopper host (the runtime in .gpu): a snapmla server on a machine without a CUDA compiler, as a serving image
# prepared ahead runs. `python -m sglang_snapmla.prepare` fills the compile caches with the soak server's flags (nvcc
# present), then the toolkit's bin folder is hidden (emptied in a private mount namespace; where none can be made,
# nvcc renamed away and restored on exit) and tools/soak.py runs its server on those caches with CUDA_HOME set as the
# preparation printed. Passes when the soak passes and the server's log names the
# prebuilt sm_90a decode. Logs under $OUT/no_compiler.
#   usage: [SOAK_SECONDS=300] bash tools/gpu_host/no_compiler.sh
set -uo pipefail
source tools/gpu_host/env.sh  # $OUT, runtime, JIT caches, plugin installed
CKPT=.gpucache/tiny-mla-h${HEADS:-16}
train_checkpoint $CKPT ${HEADS:-16}
D=$OUT/no_compiler; mkdir -p $D
# the soak's server: its own flags, and those harness.server and tools/soak.py add (prepared with the same set)
POOL="--max-total-tokens 65536 --max-running-requests 256"
python3 -m sglang_snapmla.prepare --model-path $CKPT --load-format auto --context-length 4096 --mem-fraction-static 0.80 \
  --grammar-backend none --enable-metrics $POOL --server-log $D/prepare_server.log 2>&1 | tee $D/prepare.log
cuda_home=$(sed -n 's/^and set CUDA_HOME=\([^ ]*\) where.*/\1/p' $D/prepare.log)
[ -n "$cuda_home" ] || { echo "no_compiler.sh: the preparation failed"; exit 1; }
nvcc=$(readlink -f "$cuda_home/bin/nvcc")
PATH=$(echo "$PATH" | tr : '\n' | grep -v -x "$(dirname "$(command -v nvcc 2>/dev/null || echo /none/x)")" | paste -sd:)
soak="CUDA_HOME=$cuda_home python3 -m tools.soak --start snapmla --model $CKPT --port ${SOAK_PORT:-21700} \
  --seconds ${SOAK_SECONDS:-300} --server-flags '$POOL' --out $D/soak"
check="{ command -v nvcc || echo 'no nvcc on PATH'; $cuda_home/bin/nvcc --version 2>&1 | head -1; } | tee $D/compiler.txt"
if unshare --mount --propagation private true 2>/dev/null; then
  # the toolkit's bin folder emptied in a mount namespace of this soak only: other work on the host keeps its nvcc
  echo "toolkit bin $(dirname "$nvcc") hidden in a private mount namespace" | tee $D/hiding.txt
  unshare --mount --propagation private bash -c "mount -t tmpfs none $(dirname "$nvcc") && $check && $soak"
else
  # no mount namespace here: the toolkit's nvcc renamed away on the host (nothing else may compile meanwhile)
  echo "nvcc renamed on the host" | tee $D/hiding.txt
  mv "$nvcc" "$nvcc.hidden" && trap 'mv "$nvcc.hidden" "$nvcc"' EXIT
  bash -c "$check && $soak"
fi
rc=$?
grep -h "SnapMLA decode:" $D/soak/*.log | head -1 | tee $D/decode.txt
grep -q "sm_90a CUDA kernel, prebuilt library" $D/decode.txt || { echo "no_compiler.sh: not the prebuilt sm_90a decode"; rc=1; }
echo "no_compiler.sh: exit $rc"; exit $rc
