#!/usr/bin/env bash
# pagewise against llama.cpp on the CPU, side by side, same GGUF files, same threads (issue 62).
#
#   scripts/bench/cpu_vs_llamacpp.sh [--batched] FILE.gguf ...
#
# For each file: `pagewise bench latency` (batch 1, 128 in / 64 out: prefill and decode alone)
# then llama.cpp's `llama-bench -p 128 -n 64` (through the peer kit's run.sh cpu-bench); with
# --batched also 32 x (128 in, 64 out): `pagewise bench throughput` against
# `llama-batched-bench -npl 32`. One line per file on stdout, the raw logs under $OUT.
# With DEPTH=N, decode only, after a context of N tokens: `pagewise bench latency --input-len N`
# (decode alone: the 64 tokens from position N on) against `llama-bench -n 64 -d N` (tg64 @ dN).
# Env: PAGEWISE (the binary; default target/release/pagewise), KIT (the peer kit's folder;
# default ../shared/peers/llama.cpp), THREADS (2), OUT (/tmp/cpu-vs-llamacpp), DEPTH (0),
# LCPP_BIN (the llama.cpp CPU build's bin/, for DEPTH; default /tmp/lcpp/llama.cpp/build-cpu/bin).
# Make the files with scripts/bench/mkgguf_dense.py (or the kit's `run.sh models`) and
# llama-quantize; run it on an idle machine.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PAGEWISE=${PAGEWISE:-$HERE/target/release/pagewise}
KIT=${KIT:-$HERE/../shared/peers/llama.cpp}
THREADS=${THREADS:-2}
OUT=${OUT:-/tmp/cpu-vs-llamacpp}
BATCHED=0
if [ "${1:-}" = "--batched" ]; then BATCHED=1; shift; fi
mkdir -p "$OUT"
export RAYON_NUM_THREADS=$THREADS

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "-" }'; }

DEPTH=${DEPTH:-0}
LCPP_BIN=${LCPP_BIN:-/tmp/lcpp/llama.cpp/build-cpu/bin}

for model in "$@"; do
  name=$(basename "$model" .gguf)
  if [ "$DEPTH" -gt 0 ]; then
    log=$OUT/$name.pagewise-d$DEPTH.log
    "$PAGEWISE" bench latency --model "$model" --batch-size 1 --input-len "$DEPTH" --output-len 64 \
      --num-iters-warmup 1 --num-iters 3 --max-model-len $((DEPTH + 128)) > "$log" 2>&1
    ours_tg=$(grep "decode alone" "$log" | sed -E 's/.*decode alone ([0-9.]+) tok\/s.*/\1/')
    "$LCPP_BIN/llama-bench" -m "$model" -p 0 -n 64 -d "$DEPTH" -t "$THREADS" -r 3 -o md \
      > "$OUT/$name.llama-d$DEPTH.log" 2>&1
    theirs_tg=$(grep -E "\| +tg64 @ d$DEPTH " "$OUT/$name.llama-d$DEPTH.log" | sed -E 's/.*\| +([0-9.]+) ± .*/\1/' | tail -1)
    printf '%s | decode after %s tokens %s / %s tok/s: %s\n' "$name" "$DEPTH" "$ours_tg" "$theirs_tg" \
      "$(ratio "$ours_tg" "$theirs_tg")"
    continue
  fi
  log=$OUT/$name.pagewise.log
  "$PAGEWISE" bench latency --model "$model" --batch-size 1 --input-len 128 --output-len 64 \
    --num-iters-warmup 1 --num-iters 3 --max-model-len 512 > "$log" 2>&1
  line=$(grep "decode alone" "$log")
  ours_pp=$(sed -E 's/.*prefill ([0-9.]+) tok\/s.*/\1/' <<< "$line")
  ours_tg=$(sed -E 's/.*decode alone ([0-9.]+) tok\/s.*/\1/' <<< "$line")
  THREADS=$THREADS OUT=$OUT bash "$KIT/run.sh" cpu-bench "$model" > "$OUT/$name.llama.log" 2>&1
  theirs_pp=$(grep -E "\| +pp128 " "$OUT/$name.llama.log" | sed -E 's/.*\| +([0-9.]+) ± .*/\1/' | tail -1)
  theirs_tg=$(grep -E "\| +tg64 " "$OUT/$name.llama.log" | sed -E 's/.*\| +([0-9.]+) ± .*/\1/' | tail -1)
  printf '%s | decode %s / %s tok/s: %s | prefill %s / %s: %s' "$name" "$ours_tg" "$theirs_tg" \
    "$(ratio "$ours_tg" "$theirs_tg")" "$ours_pp" "$theirs_pp" "$(ratio "$ours_pp" "$theirs_pp")"
  if [ "$BATCHED" = 1 ]; then
    "$PAGEWISE" bench throughput --model "$model" --num-prompts 32 --input-len 128 --output-len 64 \
      --max-model-len 512 > "$OUT/$name.pagewise-32.log" 2>&1
    ours_s=$(grep -oE "prompts in [0-9.]+ s" "$OUT/$name.pagewise-32.log" | grep -oE "[0-9.]+")
    NPL=32 THREADS=$THREADS OUT=$OUT bash "$KIT/run.sh" cpu-batched "$model" > "$OUT/$name.llama-32.log" 2>&1
    theirs_s=$(grep -E "^\| +128 \| +64 \| +32 " "$OUT/$name.llama-32.log" | awk -F'|' '{gsub(/ /, "", $10); print $10}' | tail -1)
    printf ' | 32 x (128, 64) %s / %s s: %s' "$ours_s" "$theirs_s" "$(ratio "$theirs_s" "$ours_s")"
  fi
  echo
done
