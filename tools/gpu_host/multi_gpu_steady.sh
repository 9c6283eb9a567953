#!/usr/bin/env bash
# On a 2-, 4- or 8-GPU Hopper host (the runtime in .gpu): sustained serving (benchmarks/serve_steady.py) of the
# DeepSeek-V3-shaped config under a parallel layout, snapmla against flashmla BF16 and flashmla FP8, the same
# requests for each, one server after another on the same GPUs; the steady window sums the DP ranks.
#   usage: [ON_GPUS=2,3] [TAG=name] bash tools/gpu_host/multi_gpu_steady.sh dp2|dp4|dp8|tp2 [serve_steady args, e.g.
#          --backends snapmla flashmla]   (TAG: the outputs' name, default the layout; a second run beside another
#          passes its own TAG and --port)
# --mem-fraction-static 0.14 leaves each rank a pool that binds (a few hundred thousand tokens beside the 8-layer
# shape's weights on an 80 GB GPU), so 4 turnovers of the pool take minutes, not hours. 4, not serve_steady's 3 or
# the single-GPU runs' 2.5: the steady window opens once a first fill's worth of requests has been admitted again and
# closes when the queue empties, and the workload is sized from the first backend's pool; at 2.5 fills of snapmla's
# pools on 2 x H100 the window was 7 s for snapmla and under 1 s for SGLang FP8, whose pools hold 1.12x the tokens.
set -uo pipefail
source tools/gpu_host/env.sh  # $OUT, runtime, JIT caches, plugin installed
layout=${1:?usage: multi_gpu_steady.sh dp2|dp4|dp8|tp2 [serve_steady args]}; shift
source tools/gpu_host/layouts.sh
flags=$(layout_flags $layout) || exit 2
gpus=${ON_GPUS:-$(layout_gpus $layout)}  # ON_GPUS: other GPUs of a larger host, e.g. 2,3
tag=${TAG:-$layout}
CUDA_VISIBLE_DEVICES=$gpus python3 -m benchmarks.serve_steady --model configs/models/deepseek-v3-shape \
  --server-flags "$flags" --mem-fraction-static 0.14 --max-running-requests 1024 --turnovers 4 --no-stream \
  --out .gpucache/steady_$tag "$@" 2>&1 | tail -12 | tee "$OUT/steady_$tag.txt"
python3 -m benchmarks.server_log_stats --startup .gpucache/steady_$tag/server_*.log > "$OUT/startup_steady_$tag.txt"
mkdir -p "$OUT/steady_$tag" && cp .gpucache/steady_$tag/serve_steady.{json,png} "$OUT/steady_$tag/"
