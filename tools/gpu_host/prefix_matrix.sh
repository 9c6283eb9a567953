#!/usr/bin/env bash
# On the GPU host (the runtime in .gpu): the prefix-heavy serving matrix (benchmarks/serve_prefix.py), one model
# after another, run detached in out/prefix so that it outlasts one command; `wait` follows it and copies the
# tables, JSON, plots and compressed logs to $OUT.
#   bash tools/gpu_host/prefix_matrix.sh start [MODEL...]   (default: the V2-Lite and V3 shapes)
#   bash tools/gpu_host/prefix_matrix.sh wait SECONDS       (returns when the run ends or SECONDS pass)
# BACKENDS (default: snapmla snapmla-mha flashmla flashmla-fp8), WORKLOADS (default: all), SERVER_FLAGS (default:
# --cuda-graph-max-bs 512, every backend's decode graphs above the largest burst) choose what runs.
set -uo pipefail
source tools/gpu_host/env.sh  # $OUT, runtime, JIT caches, plugin installed
DIR=out/prefix
BACKENDS=${BACKENDS:-snapmla snapmla-mha flashmla flashmla-fp8}
SERVER_FLAGS=${SERVER_FLAGS:---cuda-graph-max-bs 512}
case "${1:-}" in
  start)
    shift
    models=${*:-configs/models/deepseek-v2-lite-shape configs/models/deepseek-v3-shape}
    mkdir -p $DIR && rm -f $DIR/done
    nohup bash -c "for m in $models; do python3 -m benchmarks.serve_prefix --model \$m --backends $BACKENDS \
      ${WORKLOADS:+--workloads $WORKLOADS} --server-flags=\"$SERVER_FLAGS\" --out $DIR/\$(basename \$m) --resume; \
      done; touch $DIR/done" > $DIR/run.log 2>&1 < /dev/null &
    echo "started: $models ($BACKENDS)" ;;
  wait)
    t=0
    until [ -f $DIR/done ] || [ $t -ge "${2:-60}" ]; do sleep 10; t=$((t + 10)); done
    grep -h '^{' $DIR/run.log | python3 -c "import json,sys
for l in sys.stdin:
    r = json.loads(l); print(r['backend'], r['workload'], r.get('output_tok_s'), r.get('median_ttft_ms'))" | tail -40
    tail -3 $DIR/run.log
    [ -f $DIR/done ] && echo "DONE" || echo "still running after ${2:-60} s"
    tar -cJf "$OUT/prefix.tar.xz" $DIR ;;
  *) echo "usage: prefix_matrix.sh start [MODEL...] | wait SECONDS" >&2; exit 2 ;;
esac
