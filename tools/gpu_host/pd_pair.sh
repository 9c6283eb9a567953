#!/usr/bin/env bash
# On a 2-GPU Hopper host (or one GPU, prefill and decode side by side): a prefill/decode pair of snapmla servers over
# Mooncake's TCP transport against one snapmla server (tools/check_pd_pair.py), on the 128-head trained checkpoint, or
# with dummy weights on a bundled config (MODEL=configs/models/... LOAD_FORMAT=dummy). Needs .whl (pd_transfer.sh).
#   usage: [ON_GPUS=0,1] [MODEL=...] [LOAD_FORMAT=auto|dummy] bash tools/gpu_host/pd_pair.sh
set -uo pipefail
source tools/gpu_host/env.sh  # $OUT, runtime, JIT caches, plugin installed
source tools/gpu_host/pd_transfer.sh
pd_transfer_ready "${WAIT_FOR_WHL:-0}" 2>&1 | tee "$OUT/pd_transfer.txt"
[ "${PIPESTATUS[0]}" = 0 ] || exit 1
gpus=${ON_GPUS:-0,1}
CKPT=.gpucache/tiny-mla-h128
[ -z "${MODEL:-}" ] && train_checkpoint $CKPT 128 ${gpus%%,*}
CUDA_VISIBLE_DEVICES=$gpus python3 -m tools.check_pd_pair --model "${MODEL:-$CKPT}" --load-format "${LOAD_FORMAT:-auto}" \
  --gpus $(echo $gpus | tr ',' '\n' | wc -l) --out .gpucache/pd_pair 2>&1 | tail -12 | tee "$OUT/pd_pair.txt"
cp .gpucache/pd_pair/pd_pair.json "$OUT/" 2>/dev/null
tar czf "$OUT/pd_pair_server_logs.tgz" -C .gpucache/pd_pair $(cd .gpucache/pd_pair && ls *.log)
