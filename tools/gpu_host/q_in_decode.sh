#!/usr/bin/env bash
# On the Hopper host (the runtime in .gpu): the 64-row decode quantizing Q itself (SNAPMLA_Q_IN_DECODE=1) -- its
# GPU tests (bit-identity with the Q-quant kernel's chain, CUDA graphs under SGLang's protocol), then its time against
# the chain behind the Q-quant kernel in one run: interleaved rounds (benchmarks/gpu/time_variants.py, short contexts
# and a long one) and the kernel table at the serving plan beside FlashMLA (benchmarks.bench_kernels --q-in-decode).
# Logs and tables under $OUT; about 6-8 min on a fresh machine.   usage: bash tools/gpu_host/q_in_decode.sh
set -uo pipefail
source tools/gpu_host/env.sh  # $OUT, runtime, JIT caches, plugin installed
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
build_cuda_ext "$OUT/cuda_build.log" || { tail -20 "$OUT/cuda_build.log"; exit 1; }
choose_test_seed; echo "SNAPMLA_TEST_SEED=$SNAPMLA_TEST_SEED"
echo "== GPU tests of Q in the decode"
timeout ${TESTS_S:-240} python3 -m pytest -q -p no:warnings -p no:xdist -o addopts=-ra tests/product/test_gpu_kernels.py \
  tests/product/test_gpu_graph_protocol.py -k "q_in_decode or graph_replay" 2>&1 \
  | tee "$OUT/pytest_q_in_decode.log" | tail -20
echo "== interleaved rounds: the chain behind the Q-quant kernel (main) and with Q in the decode"
Q1=SNAPMLA_Q_IN_DECODE=1
timeout ${ROUNDS_S:-200} python3 -m benchmarks.gpu.time_variants \
  ${ROUND_SHAPES:-h128x64x640,h128x128x640,h128x256x640,h128x128x2048,h64x128x640,h128x64x65536} \
  main main+$Q1 main main+$Q1 2>&1 | tee "$OUT/rounds.log" | grep -v "^RESULT"
echo "== kernel table at the serving plan"
timeout ${BENCH_S:-150} python3 -m benchmarks.bench_kernels --out "$OUT" --cuda --no-flashinfer --q-in-decode --heads 128 64 \
  --sq 1 --shapes ${SHAPES:-64x640 128x640 256x640 128x1280 128x2048} --context-len 163840 2>&1 \
  | tee "$OUT/bench.log" | grep -v '^{'
