#!/usr/bin/env bash
# On the Hopper host (the runtime in .gpu): the hierarchical cache with snapmla on the small trained checkpoint.
#  1. tools/check_serving.py --hicache: a prefix evicted from a 4 096-token device pool to host memory (and, with
#     STORAGE=1, to file storage) and loaded back gives the greedy outputs of a server that never evicted it;
#  2. the accuracy gate with the hierarchical cache on over a 16 384-token device pool, flashmla BF16 as the reference,
#     and two broken host pools (below; the gate must fail both): 32 768 tokens of other prompts between
#     the probes' first pass and their radix pass push the probes' prefixes out of the device pool, so the radix pass
#     reads them back from host memory (which holds 4 x 16 384 tokens: the probes and the evicting prompts fit);
#  3. with MATRIX=1, the multi-turn workload of benchmarks/serve_prefix.py with and without the hierarchical cache
#     (snapmla's host records moved by its record kernels, the default, and by the torch copies) on
#     a device pool below the working set (--mem-fraction-static ${FRACTION:-0.30}).
#   usage: [STORAGE=1] [MATRIX=1] [CHECK_RUNS="snapmla"] bash tools/gpu_host/hicache.sh   (CHECK_RUNS: step 1's
#   backends, default snapmla flashmla)
set -uo pipefail
source tools/gpu_host/env.sh  # $OUT, runtime, JIT caches, plugin installed
CKPT=.gpucache/tiny-mla-h${HEADS:-16}
train_checkpoint $CKPT ${HEADS:-16}
python3 -m tools.check_serving --model $CKPT --load-format auto --context-length 4096 --long-len 3584 --chunk 1024 \
  --runs ${CHECK_RUNS:-snapmla flashmla} --hicache --hicache-pool 4096 ${STORAGE:+--hicache-storage} --out "$OUT/check" 2>&1 | tail -12
# the gate passes with either way of moving records (the record kernels, the default; the torch copies) and fails two
# mutants, each a copy of the plugin: the torch copies dropping the scale bytes on load, and the record kernels' host
# offsets ignoring the layer (which the host pool's build-time check, on layer 0, cannot see)
mutant_copy() { rm -rf "$1" && mkdir -p "$1" && cp -r sglang_snapmla kernels pyproject.toml "$1"/ && ln -sfn "$1"/kernels "$1"/sglang_snapmla/kernels; }
mutant_copy /tmp/mutant-hicache
sed -i 's|    for v, (lo, hi) in zip(views, FIELDS):|    for v, (lo, hi) in list(zip(views, FIELDS))[::2]:|' /tmp/mutant-hicache/sglang_snapmla/host_pool.py
grep -q "zip(views, FIELDS))\[::2\]" /tmp/mutant-hicache/sglang_snapmla/host_pool.py \
  || { echo "hicache.sh: the mutation no longer applies (host_pool.unpack_into changed)"; exit 1; }
mutant_copy /tmp/mutant-hicache-offsets
sed -i 's|        return (self._layer_pages(host_layer).data_ptr() - self.kv_buffer.data_ptr()) // 4|        return 0|' /tmp/mutant-hicache-offsets/sglang_snapmla/host_pool.py
grep -q "^        return 0$" /tmp/mutant-hicache-offsets/sglang_snapmla/host_pool.py \
  || { echo "hicache.sh: the mutation no longer applies (host_pool._layer_words changed)"; exit 1; }
MUTANT="snapmla-hicache-scale-dropped=snapmla-hicache:PYTHONSAFEPATH=1;SNAPMLA_HICACHE_COPIES=torch;PYTHONPATH=/tmp/mutant-hicache:$PYTHONPATH"
MUTANT2="snapmla-hicache-layer-offsets=snapmla-hicache:PYTHONSAFEPATH=1;SNAPMLA_HICACHE_COPIES=kernels;PYTHONPATH=/tmp/mutant-hicache-offsets:$PYTHONPATH"
python3 -m tools.accuracy_gate --model $CKPT --runs flashmla snapmla-hicache snapmla-hicache-copies "$MUTANT" "$MUTANT2" \
  --server-flags "--max-total-tokens 16384" --evict-tokens 32768 --out "$OUT/gate" 2>&1 | tail -12
if [ -n "${MATRIX:-}" ]; then
  python3 -m benchmarks.serve_prefix --model configs/models/deepseek-v2-lite-shape --workloads multi-turn \
    --backends snapmla-hicache snapmla-hicache-copies flashmla-hicache snapmla flashmla \
    --server-flags="--cuda-graph-max-bs 512 --mem-fraction-static ${FRACTION:-0.30}" --out "$OUT/matrix" 2>&1 | tail -12
fi
