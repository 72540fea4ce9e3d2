#!/usr/bin/env bash
# Kernel and engine tests, decode bandwidth and batch-1 latency with a feature switch on and off,
# in one device call: `bash .gpu/scripts/gpu/adhoc.sh [SWITCH]` (default PAGEWISE_DECODE_CLUSTER;
# VALUES="1 0" the switch's values, the tests run with the first; BW_CASES the decode bandwidth
# cases).
# For comparing a new path against the one it replaces on one machine (machines differ by ~2%).
here=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/pagewise-out}; work=/tmp/pagewise-gpu
switch=${1:-PAGEWISE_DECODE_CLUSTER}
export PAGEWISE_GPU_MODELS=$work/models
bash "$here/run.sh" none > /dev/null 2>&1   # unpacks the binaries, makes the test models
values=${VALUES:-1 0}
for t in kernel-tests sampling-tests fused-tests rope-tests; do
  env "$switch=${values%% *}" "$work/bin/$t" --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED"
done
env "$switch=${values%% *}" "$work/bin/gpu-engine-tests" --test-threads=1 --nocapture --skip quantized_gguf 2>&1 \
  | grep -E "test result|panicked|FAILED" | tail -5
for v in $values; do
  echo "== decode bandwidth, $switch=$v"
  env "$switch=$v" PAGEWISE_BW_CASES="${BW_CASES:-1x512 1x2048 8x512 8x2048 64x512 64x2048 1x8192}" \
    "$work/bin/kernel-tests" --ignored --nocapture --test-threads=1 decode_bandwidth 2>&1 | grep -E "^\| [0-9]|panicked"
done
SCOREBOARD_MODELS=none SCOREBOARD_PARTS=none SCOREBOARD_NO_HF=1 PAGEWISE_BIN="$work/bin/pagewise" \
  bash "$here/scripts/gpu/scoreboard.sh" > /dev/null 2>&1   # (writes the shapes' configs)
for m in llama-1b llama-8b; do for v in $values; do
  echo "== $m batch-1 decode, 128 in / 512 out, $switch=$v"
  env "$switch=$v" timeout 120 "$work/bin/pagewise" bench latency --model "/tmp/pagewise-gpu/shapes/$m" \
    --load-format dummy --batch-size 1 --input-len 128 --output-len 512 --num-iters-warmup 1 --num-iters 3 \
    2>> "$out/bench-stderr.log" | tail -2
done; done
grep -E "capture failed|WARN" "$out/bench-stderr.log" | grep -v "chat template" | head -3
