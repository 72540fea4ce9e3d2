#!/usr/bin/env bash
# pagewise against llama.cpp on the GPU with k-quant GGUF files (issue 61), side by side in one
# device call, from a staged folder holding the pagewise binary (as run.sh unpacks it) and the
# llama.cpp kit as lcpp/ (`cp -r ../shared/peers/llama.cpp <folder>/lcpp`):
#   bash <folder>/scripts/gpu/gguf_peer.sh build           # llama.cpp's CUDA build (~6 min; re-run resumes)
#   bash <folder>/scripts/gpu/gguf_peer.sh llama-8b Q4_K_M  # [shape] [type ...]
#   bash <folder>/scripts/gpu/gguf_peer.sh prepare llama-8b Q4_K_M  # only write the files (a call of its own
#                                                   # while the machine stays warm: the kit needs
#                                                   # only its run.sh and mkgguf.py once built)
# The kit writes the shape's random F16 GGUF, `llama-quantize` makes each type from it, and both
# engines run the same file: llama-bench tg512 (batch 1, flash attention, all layers on the GPU)
# against `pagewise bench latency` 128 in / 512 out, then llama-batched-bench 64 x (1024 in, 128
# out) against `pagewise bench throughput` on 64 such prompts.
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/pagewise-out}
bin=/tmp/pagewise-gpu/bin/pagewise
models=/tmp/lcpp-models
lcpp=/tmp/lcpp/llama.cpp/build/bin
mkdir -p "$out" "$models"
nccl_lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2> /dev/null)
[ -n "$nccl_lib" ] && export LD_LIBRARY_PATH="$nccl_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0
if [ ! -x "$bin" ] && [ -f "$here/pagewise.xz" ]; then
  mkdir -p "$(dirname "$bin")"
  python3 -c 'import lzma,sys; open(sys.argv[2],"wb").write(lzma.open(sys.argv[1]).read())' "$here/pagewise.xz" "$bin"
  chmod +x "$bin"
fi

if [ "${1:-}" = build ]; then
  JOBS=16 OUT=$out/lcpp bash "$here/lcpp/run.sh" compile
  exit
fi
prepare=0
[ "${1:-}" = prepare ] && { prepare=1; shift; }
shape=${1:-llama-8b}
shift
[ -x "$lcpp/llama-quantize" ] || { echo "== no llama.cpp build in $lcpp (run: gguf_peer.sh build)"; exit 1; }
[ -f "$models/$shape.gguf" ] || SHAPES=$shape OUT=$out/lcpp bash "$here/lcpp/run.sh" models > /dev/null
for ty in "${@:-Q4_K_M}"; do
  gguf=$models/$shape-$ty.gguf
  [ -f "$gguf" ] || "$lcpp/llama-quantize" "$models/$shape.gguf" "$gguf" "$ty" 16 > "$out/quantize-$ty.log" 2>&1 \
    || { tail -5 "$out/quantize-$ty.log"; continue; }
  echo "== $shape $ty: $(du -h "$gguf" | cut -f1)"
  [ "$prepare" = 1 ] && continue
  echo "== llama.cpp: llama-bench tg512"
  timeout 200 "$lcpp/llama-bench" -m "$gguf" -p 0 -n 512 -r 3 -fa 1 -ngl 99 -o md 2> "$out/lcpp-$ty.stderr" \
    | grep -E "tg|model" || tail -5 "$out/lcpp-$ty.stderr"
  echo "== pagewise: batch 1, 128 in / 512 out"
  timeout 200 "$bin" bench latency --model "$gguf" --batch-size 1 --input-len 128 --output-len 512 \
    --num-iters-warmup 1 --num-iters 3 --max-model-len 1024 --output-json "$out/pagewise-$ty-latency.json" \
    2> "$out/pagewise-$ty.stderr" | tail -2 || tail -5 "$out/pagewise-$ty.stderr"
  grep -iE "dequantized at load" "$out/pagewise-$ty.stderr" | head -3
  [ "${PEER_BATCHED:-1}" = 1 ] || continue
  echo "== llama.cpp: llama-batched-bench 64 x (1024, 128)"
  timeout 240 "$lcpp/llama-batched-bench" -m "$gguf" -c 100000 -b 2048 -ub 512 -npp 1024 -ntg 128 -npl 64 \
    -fa 1 -ngl 99 > "$out/lcpp-batched-$ty.log" 2>&1
  grep -E "^\|" "$out/lcpp-batched-$ty.log" | tail -2 || tail -5 "$out/lcpp-batched-$ty.log"
  echo "== pagewise: bench throughput 64 x (1024, 128)"
  timeout 240 "$bin" bench throughput --model "$gguf" --num-prompts 64 --input-len 1024 --output-len 128 \
    --max-model-len 2048 2>> "$out/pagewise-$ty.stderr" | grep -E "req/s|tok/s|rror" | tail -3
done
