#!/usr/bin/env bash
# One eager batch-1 decode step of an issue-23/25 shape, kernel by kernel under Nsight Compute, on
# the GPU machine from the staged .gpu/ folder (after arch_speed.sh has written the shapes):
#   bash .gpu/scripts/gpu/profile_arch.sh gemma-3-12b:6 qwen3-30b-a3b:4
# Each argument is a shape and the layers to keep (a copy of the shape cut to that many layers, so
# the profile stays short); prints scripts/gpu/ncu_step.py's table and leaves the CSV in $OUT.
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/pagewise-out}
bin=/tmp/pagewise-gpu/bin/pagewise
shapes=/tmp/pagewise-gpu/arch-shapes
nccl_lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2> /dev/null)
[ -n "$nccl_lib" ] && export LD_LIBRARY_PATH="$nccl_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for arg in "$@"; do
  m=${arg%%:*} layers=${arg##*:} cut=/tmp/pagewise-gpu/profile-shapes/${arg%%:*}
  mkdir -p "$cut" "$out"
  python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); c["num_hidden_layers"] = int(sys.argv[3]); json.dump(c, open(sys.argv[2], "w"))' \
    "$shapes/$m/config.json" "$cut/config.json" "$layers"
  cp "$here/tests/fixtures/llama-gqa-tied/tokenizer.json" "$cut/"
  echo "== $m, $layers layers: the last of 2 decode steps (eager), kernel by kernel"
  timeout 300 /usr/local/cuda/bin/ncu --clock-control none --cache-control none \
    --metrics gpu__time_duration.sum --csv "$bin" bench latency --model "$cut" --load-format dummy \
    --enforce-eager --max-num-batched-tokens 512 --batch-size 1 --input-len 16 --output-len 3 \
    --num-iters-warmup 0 --num-iters 1 --max-model-len 256 > "$out/ncu-$m.csv" 2> "$out/ncu-$m.err"
  python3 "$here/scripts/gpu/ncu_step.py" "$out/ncu-$m.csv"
done
