#!/usr/bin/env bash
# The JIT caches a GPU host fills in .gpucache (Triton's kernels, FlashInfer's nvcc builds with their ninja state,
# torch's NVRTC kernels, a decode built with nvcc), carried from one host to the next as one archive. A fresh H200's
# first server of the 61-layer block-FP8 TP 8 shape spends ~130 s of its decode-graph capture and ~110 s of its first
# load compiling (docs/BENCHMARKS.md, "Soak with bad ids"); a host that starts from the archive has those kernels
# on disk (what that saves a start is not yet measured). The bytecode cache (.gpucache/pycache) stays out: the runtime's own, large, and rebuilt in seconds.
#   bash tools/gpu_host/compile_cache.sh save      .gpucache -> $OUT/compile-cache.tar.xz (the device returns files of
#                                                  up to 16 MiB: a larger archive fails here, naming its largest parts)
#   bash tools/gpu_host/compile_cache.sh restore   .gpucache-seed/compile-cache.tar.xz (carried) -> .gpucache, once a
#                                                  host (env.sh runs it); nothing without a seed
# Here: copy a call's compile-cache.tar.xz into .gpucache-seed/ (ignored) and name .gpucache-seed in the next call's
# carry. Modification times are kept: ninja then finds FlashInfer's objects newer than the runtime's sources.
set -uo pipefail
LIMIT=$((16 * 1024 * 1024))
SEED=.gpucache-seed/compile-cache.tar.xz
case "${1:-}" in
  save)
    OUT=$(realpath -m "${OUT:-/tmp/snapmla_out}"); mkdir -p "$OUT"
    [ -d .gpucache ] || { echo "compile_cache: no .gpucache here to save" >&2; exit 1; }
    tar -C .gpucache --exclude=./pycache --exclude=./.seeded -cf - . | xz -T0 -6 > "$OUT/compile-cache.tar.xz"
    size=$(stat -c %s "$OUT/compile-cache.tar.xz")
    if [ "$size" -gt "$LIMIT" ]; then
      echo "compile_cache: the archive is $size bytes, above the 16 MiB a device call returns; its largest parts:" >&2
      du -s --block-size=1 .gpucache/* .gpucache/.cache/* 2>/dev/null | grep -v /pycache | sort -rn | head -8 >&2
      rm -f "$OUT/compile-cache.tar.xz"
      exit 1
    fi
    echo "compile_cache: saved $OUT/compile-cache.tar.xz ($size bytes)"
    ;;
  restore)
    [ -f "$SEED" ] || exit 0
    [ -e .gpucache/.seeded ] && exit 0
    mkdir -p .gpucache
    xz -dc "$SEED" | tar -C .gpucache -xf - || { echo "compile_cache: $SEED did not unpack" >&2; exit 1; }
    touch .gpucache/.seeded
    echo "compile_cache: .gpucache seeded from $SEED ($(stat -c %s "$SEED") bytes)"
    ;;
  *)
    echo "usage: bash tools/gpu_host/compile_cache.sh save|restore" >&2
    exit 2
    ;;
esac
