#!/usr/bin/env bash
# pagewise against llama.cpp on mixture-of-experts shapes, side by side in one device call
# (issue 25), from the staged .gpu/ folder with the llama.cpp kit staged as .gpu/lcpp/
# (`cp -r ../shared/peers/llama.cpp .gpu/lcpp`):
#   bash .gpu/scripts/gpu/moe_peer.sh build                 # llama.cpp's CUDA build (~6 min; re-run resumes)
#   bash .gpu/scripts/gpu/moe_peer.sh qwen3-30b-a3b:24 mixtral-8x7b:8 gpt-oss-20b:24
# Each shape:layers is cut to its first N layers (whole, the F16 GGUFs of Qwen3 and Mixtral would
# not fit the machine's disk): mkgguf_moe.py writes a random GGUF of the cut shape (F16; gpt-oss
# with MXFP4 experts, as it ships), llama.cpp runs it (llama-bench tg128 / pp512, then
# llama-batched-bench 64 x (1024 in, 128 out)); pagewise runs that same GGUF where it is gpt-oss
# (batch-1 decode 128 in / 512 out, `bench throughput` 64 x (1024, 128)); the GGUF is removed, and
# pagewise runs the same cut shape with random bf16 weights (--load-format dummy), same two runs.
# Needs arch_speed.sh's shapes (/tmp/pagewise-gpu/arch-shapes): run `arch_speed.sh <shape>` first.
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/pagewise-out}
bin=/tmp/pagewise-gpu/bin/pagewise
shapes=/tmp/pagewise-gpu/arch-shapes
models=/tmp/lcpp-models
lcpp=/tmp/lcpp/llama.cpp/build/bin
mkdir -p "$out" "$models"
nccl_lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2> /dev/null)
[ -n "$nccl_lib" ] && export LD_LIBRARY_PATH="$nccl_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0

if [ "${1:-}" = build ]; then
  JOBS=16 OUT=$out/lcpp bash "$here/lcpp/run.sh" compile
  exit
fi
for arg in "$@"; do
  m=${arg%%:*} layers=${arg##*:}
  cut=/tmp/pagewise-gpu/peer-shapes/$m-$layers
  gguf=$models/$m-$layers.gguf
  mkdir -p "$cut"
  python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); c["num_hidden_layers"] = int(sys.argv[3]); json.dump(c, open(sys.argv[2], "w"))' \
    "$shapes/$m/config.json" "$cut/config.json" "$layers"
  cp "$here/tests/fixtures/llama-gqa-tied/tokenizer.json" "$cut/"
  if [ -x "$lcpp/llama-bench" ]; then
    [ -f "$gguf" ] || python3 "$here/scripts/gpu/mkgguf_moe.py" --shape "$m" --layers "$layers" --out "$gguf" \
      --kit "$here/lcpp" --gguf-py /tmp/lcpp/llama.cpp/gguf-py --threads 16
    echo "== llama.cpp, $m cut to $layers layers (F16): llama-bench"
    timeout 300 "$lcpp/llama-bench" -m "$gguf" -p 512 -n 128 -r 3 -fa 1 -ngl 99 -o md 2> "$out/lcpp-$m.stderr" \
      | tail -3 || tail -5 "$out/lcpp-$m.stderr"
    echo "== llama.cpp, $m cut to $layers layers: llama-batched-bench 64 x (1024, 128)"
    timeout 300 "$lcpp/llama-batched-bench" -m "$gguf" -c 100000 -b 2048 -ub 512 -npp 1024 -ntg 128 -npl 64 \
      -fa 1 -ngl 99 > "$out/lcpp-batched-$m.log" 2>&1
    grep -E "^\|" "$out/lcpp-batched-$m.log" || tail -5 "$out/lcpp-batched-$m.log"
    case $m in gpt-oss*)
      echo "== pagewise on that GGUF: batch-1 decode, 128 in / 512 out"
      timeout 240 "$bin" bench latency --model "$gguf" --batch-size 1 --input-len 128 --output-len 512 \
        --num-iters-warmup 1 --num-iters 3 --max-model-len 1024 2>&1 | grep -E "tok/s|rror" | tail -2
      echo "== pagewise on that GGUF: bench throughput 64 x (1024, 128)"
      timeout 300 "$bin" bench throughput --model "$gguf" --num-prompts 64 --input-len 1024 --output-len 128 \
        --max-model-len 2048 2>&1 | grep -E "req/s|tok/s|rror" | tail -3 ;;
    esac
    rm -f "$gguf"
  else
    echo "== no llama.cpp build in $lcpp (run: moe_peer.sh build)"
  fi
  echo "== pagewise, $m cut to $layers layers (bf16, dummy): batch-1 decode, 128 in / 512 out"
  timeout 240 "$bin" bench latency --model "$cut" --load-format dummy --batch-size 1 --input-len 128 \
    --output-len 512 --num-iters-warmup 1 --num-iters 3 --max-model-len 1024 2>&1 | grep -E "tok/s|rror" | tail -2
  echo "== pagewise, $m cut to $layers layers: bench throughput 64 x (1024, 128)"
  timeout 300 "$bin" bench throughput --model "$cut" --load-format dummy --num-prompts 64 --input-len 1024 \
    --output-len 128 --max-model-len 2048 2>&1 | grep -E "req/s|tok/s|rror" | tail -3
done
