#!/usr/bin/env bash
# On the GPU host (the runtime in .gpu): the prefix-heavy serving matrix (benchmarks/serve_prefix.py), one model
# after another, run detached in out/prefix so that it outlasts one command; `wait` follows it and copies the
# tables, JSON, plots and compressed logs to $OUT.
#   bash tools/gpu_host/prefix_matrix.sh start [MODEL[:BACKEND,...]...]   (runs in this order; default: the V2-Lite
#                                                                          and V3 shapes with BACKENDS)
#   bash tools/gpu_host/prefix_matrix.sh wait SECONDS       (returns when the run ends or SECONDS pass)
# BACKENDS (default: snapmla flashmla flashmla-fp8 snapmla-mha), WORKLOADS (default: all), SERVER_FLAGS (default:
# --cuda-graph-max-bs 512, every backend's decode graphs above the largest burst) choose what runs. GPUS (e.g. 0,1,2 on
# a 4-GPU host) runs a model's backends side by side, the i-th on the i-th GPU, and merges their tables.
set -uo pipefail
source tools/gpu_host/env.sh  # $OUT, runtime, JIT caches, plugin installed
DIR=out/prefix
BACKENDS=${BACKENDS:-snapmla flashmla flashmla-fp8 snapmla-mha}
SERVER_FLAGS=${SERVER_FLAGS:---cuda-graph-max-bs 512}
case "${1:-}" in
  start)
    shift
    runs=""
    for item in ${*:-configs/models/deepseek-v2-lite-shape configs/models/deepseek-v3-shape}; do
      model=${item%%:*}; backends=$BACKENDS; [ "$item" != "$model" ] && backends=${item#*:}
      out=$DIR/$(basename $model)
      common="--model $model ${WORKLOADS:+--workloads $WORKLOADS} --server-flags='$SERVER_FLAGS' --resume"
      if [ -z "${GPUS:-}" ]; then
        runs+="python3 -m benchmarks.serve_prefix $common --backends ${backends//,/ } --out $out; "
      else  # one backend per GPU, side by side (each its own port range), then one table
        gpus=(${GPUS//,/ }); i=0; parts=""; runs+="("
        for b in ${backends//,/ }; do
          runs+="CUDA_VISIBLE_DEVICES=${gpus[$i]} python3 -m benchmarks.serve_prefix $common --backends $b --port $((20000 + 1000 * i)) --out ${out}_$b > $DIR/$(basename $model)_$b.log 2>&1 & "
          parts+=" ${out}_$b/serve_prefix.json"; i=$((i + 1))
        done
        runs+="wait); python3 -m benchmarks.serve_prefix --merge$parts --out $out; "
      fi
    done
    mkdir -p $DIR && rm -f $DIR/done
    # setsid: detached from the starting command's process group, whose end would end it too
    setsid nohup bash -c "$runs touch $DIR/done" > $DIR/run.log 2>&1 < /dev/null &
    echo "started: $runs" ;;
  wait)
    t=0
    until [ -f $DIR/done ] || [ $t -ge "${2:-60}" ]; do sleep 10; t=$((t + 10)); done
    grep -h '^{' $DIR/*.log | python3 -c "import json,sys
for l in sys.stdin:
    r = json.loads(l); print(r['backend'], r['workload'], r.get('output_tok_s'), r.get('median_ttft_ms'))" | tail -40
    tail -3 $DIR/run.log
    [ -f $DIR/done ] && echo "DONE" || echo "still running after ${2:-60} s"
    tar -cJf "$OUT/prefix.tar.xz" $DIR ;;
  *) echo "usage: prefix_matrix.sh start [MODEL...] | wait SECONDS" >&2; exit 2 ;;
esac
