# Sourced after tools/gpu_host/env.sh: Mooncake's transfer engine for PD disaggregation (`mooncake_tcp`), which the
# runtime bundle lacks. It travels in .whl (carry it), packed from the CUDA 13 wheel where a package index is
# reachable, only what `mooncake.engine` loads (the whole wheel, ~50 MB, does not fit beside the runtime):
#   pip download mooncake-transfer-engine-cuda13==0.3.14 --no-deps --python-version 3.12 --only-binary=:all: -d /tmp/mc
#   unzip -q /tmp/mc/*.whl -d /tmp/mc/x && cd /tmp/mc/x && tar cJf $REPO/.whl/mooncake-engine-tcp.tar.xz \
#     mooncake/{__init__.py,engine.so,engine.pyi,libasio.so,libetcd_wrapper.so} \
#     mooncake_transfer_engine_cuda13.libs/{libyaml-cpp,libjsoncpp,libglog,libgflags}-*
# engine.so also links libibverbs, libmlx5, libnuma and libcurl (the GPU hosts have them), even for TCP.
#   usage: pd_transfer_ready [seconds to wait for .whl]  -> 0 when `import mooncake.engine` works
pd_transfer_ready() {
  wait_for_whl mooncake-engine-tcp.tar.xz "${1:-0}" \
    || { echo "pd_transfer.sh: no .whl/mooncake-engine-tcp.tar.xz"; return 1; }
  tar xJf .whl/mooncake-engine-tcp.tar.xz -C /tmp/sglang-runtime || return 1
  if ldd /tmp/sglang-runtime/mooncake/engine.so | grep "not found" | grep -v -E 'libcuda\.so|libcudart\.so'; then
    echo "pd_transfer.sh: mooncake's engine.so lacks the libraries above on this host"; return 1
  fi
  python3 -c "import torch, mooncake.engine; print('mooncake.engine', mooncake.engine.__file__)"
}
