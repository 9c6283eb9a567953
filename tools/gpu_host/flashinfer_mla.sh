#!/usr/bin/env bash
# On the GPU host (the runtime in .gpu, and .gpu/flashinfer-mla.tar.xz from build-flashinfer-mla.sh): the kernel
# benchmark with FlashInfer 0.7.4's MLA decode in place of the runtime's FlashInfer, so that its FP8 cache with
# per-token scales is timed beside FlashMLA BF16 / FP8 and snapmla, with its error against BF16.
#   usage: bash tools/gpu_host/flashinfer_mla.sh [bench_kernels.py args...]   (e.g. --cuda --heads 16 128 --sq 1)
set -uo pipefail
source tools/gpu_host/env.sh  # $OUT, runtime, JIT caches, plugin installed
FI=$PWD/.gpucache/flashinfer-mla
if [ ! -f "$FI/.ok" ]; then
  mkdir -p "$FI" && tar -xJf .gpu/flashinfer-mla.tar.xz -C "$FI" && touch "$FI/.ok" || exit 1
fi
# ahead of the runtime on the path: `import flashinfer` is this one in the benchmark's process
PYTHONPATH=$FI:$PYTHONPATH python3 -c "import flashinfer, flashinfer.mla; print('FlashInfer', flashinfer.__version__)" \
  || exit 1
PYTHONPATH=$FI:$PYTHONPATH timeout 560 python3 -m benchmarks.bench_kernels --out "$OUT" --flashinfer-per-token "$@" 2>&1 \
  | tee "$OUT/bench.log" | grep -v '^{'
