# Sourced first by every tools/gpu_host/*.sh script (GPU host, the runtime in .gpu): $OUT for the logs, the SGLang
# runtime on the path, JIT caches in an ignored folder of the checkout (a warm machine reuses them), the plugin
# installed into the runtime.
# absolute: scripts change folder (correctness.sh runs its mutant in $MUTANT_DIR) and still write here
OUT=$(realpath -m "${OUT:-/tmp/snapmla_out}"); mkdir -p "$OUT"
source tools/gpu_host/activate.sh .gpu/sglang-runtime.tar.xz
export PYTHONUNBUFFERED=1
# for scripts run by path (`python3 tests/support/gpu_sanitize_decode.py` under compute-sanitizer): the checkout and
# tests/support on the path, as pytest's configuration puts them
SUPPORT_PYTHONPATH=$PWD:$PWD/tests/support${PYTHONPATH:+:$PYTHONPATH}
# bytecode of the runtime cached across processes: every `python -m sglang.bench_serving` and server start compiled
# sglang's and torchao's sources again (~30 s per process; the SyntaxWarning torchao prints at compile
# time showed up in every bench_serving output)
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=$PWD/.gpucache/pycache
export NCCL_NVLS_ENABLE=0  # multi-GPU hosts: NVLink multicast stays off
export TRITON_CACHE_DIR=$PWD/.gpucache/triton TORCH_EXTENSIONS_DIR=$PWD/.gpucache/torch_extensions \
  FLASHINFER_WORKSPACE_BASE=$PWD/.gpucache TORCHINDUCTOR_CACHE_DIR=$PWD/.gpucache/inductor \
  XDG_CACHE_HOME=$PWD/.gpucache
# a fresh host starts from the compile caches an earlier one saved, where .gpucache-seed is carried
bash tools/gpu_host/compile_cache.sh restore || exit 1
# Wheels the bundle lacks, carried in .gpu/wheels (or in .whl, a second transfer to the same machine where the runtime
# and they exceed one): SGLang 0.5.17's MTP worker (speculative/eagle_worker_v2.py) imports
# deep_gemm for every backend, and tools/gpu_host/build-runtime.sh's bundle has none. Fetch it where a package index is reachable:
#   pip download sgl-deep-gemm==0.1.5.post1 --no-deps --python-version 3.12 --only-binary=:all: -d .gpu/wheels
if compgen -G ".gpu/wheels/*.whl" > /dev/null || compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-deps --no-index --target /tmp/sglang-runtime $(compgen -G ".gpu/wheels/*.whl"; compgen -G ".whl/*.whl") > "$OUT/pip_wheels.log" 2>&1 \
    || { cat "$OUT/pip_wheels.log"; exit 1; }
fi
# once per driver: scripts started side by side from one that has installed the plugin (SNAPMLA_PLUGIN_INSTALLED
# exported) do not run pip into the same runtime at once
if [ -z "${SNAPMLA_PLUGIN_INSTALLED:-}" ]; then
  python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > "$OUT/pip.log" 2>&1 || { cat "$OUT/pip.log"; exit 1; }
  export SNAPMLA_PLUGIN_INSTALLED=1
fi
# A file a second transfer to the host brings into .whl (pd_transfer.sh, the suite's MTP part): wait up to SECONDS for
# one matching .whl/GLOB, then 5 s more for its copy to finish; 1 when none came
#   wait_for_whl GLOB SECONDS
wait_for_whl() {
  local t=0
  until compgen -G ".whl/$1" > /dev/null; do
    [ $t -ge "${2:-0}" ] && return 1
    sleep 10; t=$((t + 10))
  done
  sleep 5
}
# The tests draw fresh random data from a base seed (tests/conftest.py): SNAPMLA_TEST_SEED, drawn here unless set,
# exported for the pytest runs a script starts and logged by it, so that a failure can be replayed:   choose_test_seed
choose_test_seed() {
  export SNAPMLA_TEST_SEED=${SNAPMLA_TEST_SEED:-$(python3 -c "import random; print(random.SystemRandom().randrange(2**31))")}
}
# The sm_90a extension built (`cuda_ext.build`; from SNAPMLA_CUDA_SOURCE_DIR where set), its log in LOG (default
# $OUT/cuda_build.log); non-zero if the build fails:   build_cuda_ext [LOG]
build_cuda_ext() {
  python3 -c "from sglang_snapmla import cuda_ext; cuda_ext.build()" > "${1:-$OUT/cuda_build.log}" 2>&1
}
# The same in the background: it compiles on the CPU while the GPU trains or serves; the caller's `wait` waits for
# it:   build_cuda_ext_meanwhile [LOG]
build_cuda_ext_meanwhile() {
  build_cuda_ext "$@" &
}
# The CPU threads each of N processes side by side gets (nproc / N, at least 1): with torch's default of one thread
# per core in every process the CPU work of the GPU tests stops advancing (docs/DEVELOPING.md, "Threads"):
#   cores_per_process N
cores_per_process() {
  local n=$(( $(nproc) / $1 ))
  echo $(( n > 0 ? n : 1 ))
}
# The small trained model (tools/train_tiny_mla.py, TRAIN_MINUTES, default 2; TRAIN_FLAGS: more of its flags, e.g.
# --mtp) in DIR unless a checkpoint is there:
#   train_checkpoint DIR HEADS [GPU]   (GPU: the one to train on, on a host whose others are busy)
train_checkpoint() {
  [ -f "$1/heldout.json" ] && return 0
  ${3:+env CUDA_VISIBLE_DEVICES=$3} python3 -m tools.train_tiny_mla --out "$1" --heads "$2" ${TRAIN_FLAGS:-} \
    --minutes "${TRAIN_MINUTES:-2}" 2>&1 | grep -v "^{" | tail -3 | tee "$OUT/train.log"
}
# The trained checkpoint DIR converted to block-FP8 weights as DeepSeek-V3/R1 ship them (tools/convert_block_fp8.py)
# into DIR-fp8 unless it is there, its conversion report copied to $OUT, and FP8 GEMMs on SGLang's Triton kernels
# (DeepGEMM's JIT off: minutes of warm-up on a fresh host):   fp8_checkpoint DIR
fp8_checkpoint() {
  [ -f "$1-fp8/config.json" ] || python3 -m tools.convert_block_fp8 --src "$1" --out "$1-fp8" | tee "$OUT/fp8_conversion.log"
  cp "$1-fp8/fp8_conversion.json" "$OUT/"
  export SGLANG_ENABLE_JIT_DEEPGEMM=0
}
# A command killed at a GPU host's time limit (SIGKILL) leaves its SGLang server running in its own process group,
# holding the GPU's memory: the host's next server then fails with CUDA out of memory. Scripts that serve in the
# foreground (fp8_serve.sh, serve.sh, nan_origin.sh) run this first. SGLang's processes are a python binary running
# the launcher (`-m sglang.launch_server`, `sglang serve`) or a worker's process title (`sglang::`), matched on the
# first words of their command line, so that no shell whose command names the launcher matches. Those whose parent is
# not a Python process (the harness that started a launcher, the launcher of a worker) have lost their starter: they
# are stopped, and said so; a launcher whose starter is alive (a detached matrix, another GPU's serve.sh) is named,
# not stopped, so that an out-of-memory start that follows has its cause in the log.
#   stop_leftover_servers
stop_leftover_servers() {
  local pid ppid kind parent left=""
  while read -r pid ppid kind; do
    parent=$(ps -o args= -p "$ppid" 2>/dev/null | awk '{print $1}')
    if ! [[ "$parent" =~ python[0-9.]*$ || "$parent" == sglang::* ]]; then
      left+="$pid "
    elif [ "$kind" = launcher ]; then
      echo "stop_leftover_servers: an SGLang server with a live parent is running: pid $pid, parent $ppid" >&2
    fi
  done < <(ps -eo pid=,ppid=,args= | awk '
    $3 ~ /python[0-9.]*$/ && (($4 == "-m" && $5 == "sglang.launch_server") || ($4 ~ /\/sglang$/ && $5 == "serve")) {
      print $1, $2, "launcher"; next }
    $3 ~ /^sglang::/ { print $1, $2, "worker" }')
  [ -z "$left" ] && return 0
  echo "stop_leftover_servers: stopping SGLang processes whose starter is gone: $left" | tee "$OUT/left_running.txt" >&2
  for pid in $left; do pkill -9 -P "$pid"; kill -9 "$pid"; done 2>/dev/null
  sleep 5
}
