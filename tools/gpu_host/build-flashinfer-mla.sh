#!/bin/bash
# Build flashinfer-mla.tar.xz: FlashInfer 0.7.4's batched MLA decode alone -- `flashinfer.mla` and the modules it
# imports, and the sm_90 MLA sources and headers its JIT compiles -- for bench_kernels' per-token FP8 column
# (`ckv_scale_arr`) on an offline GPU host. The whole wheel is 101 MB (717 MB unpacked) and its top-level package
# imports CuTe-DSL, cuda-tile and NCCL bindings that the runtime (build-runtime.sh) lacks; this bundle is ~5 MB, with
# a top-level __init__ that imports nothing, and needs only torch and the runtime's apache-tvm-ffi.
# Run where pip works. Usage: build-flashinfer-mla.sh OUT_DIR   -> OUT_DIR/flashinfer-mla.tar.xz
# On the GPU host: tools/gpu_host/flashinfer_mla.sh unpacks it and runs the benchmark with it.
set -euo pipefail
OUT=${1:?usage: build-flashinfer-mla.sh OUT_DIR}
VERSION=0.7.4
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
python3 -m pip download -q --no-deps "flashinfer-python==$VERSION" -d "$W/whl"
(cd "$W" && python3 -m zipfile -e whl/flashinfer_python-*.whl wheel)
S=$W/wheel/flashinfer D=$W/site/flashinfer
mkdir -p "$D/data/csrc" "$D/data/cutlass/tools/util"
# what `import flashinfer.mla` loads (sys.modules after the import, with CuTe-DSL, cuda-tile and NCCL hidden)
for m in api_logging artifacts autotune_cache autotuner compilation_context cute_dsl fi_trace jit mla tllm_utils trace \
         utils version _build_meta; do
  if [ -d "$S/$m" ]; then cp -r "$S/$m" "$D/"; else cp "$S/$m.py" "$D/"; fi
done
# what the fa3 MLA JIT compiles (jit/attention/modules.py: gen_batch_mla_module) and its include paths (jit/env.py)
cp -r "$S/data/include" "$S/data/cccl" "$S/data/spdlog" "$D/data/"
cp -r "$S/data/cutlass/include" "$D/data/cutlass/"
cp -r "$S/data/cutlass/tools/util/include" "$D/data/cutlass/tools/util/"
cp "$S"/data/csrc/batch_mla_sm90_*.cu "$S"/data/csrc/batch_mla_config.jinja "$S"/data/csrc/*.h "$S"/data/csrc/*.cuh \
  "$D/data/csrc/"
printf '"""FlashInfer %s, its batched MLA decode only (tools/gpu_host/build-flashinfer-mla.sh)."""\nfrom .version import __version__\n' \
  "$VERSION" > "$D/__init__.py"
find "$W/site" -name __pycache__ -prune -exec rm -rf {} +
tar --sort=name -cf - -C "$W/site" . | xz -T1 -9e > "$OUT/flashinfer-mla.tar.xz"
ls -la "$OUT/flashinfer-mla.tar.xz"
