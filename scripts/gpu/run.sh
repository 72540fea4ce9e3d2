#!/usr/bin/env bash
# Runs on the GPU machine from the staged .gpu/ folder (see scripts/gpu/build.sh):
#   bash .gpu/run.sh tests    kernel tests, then the GPU engine tests
#   bash .gpu/run.sh serve    `pagewise serve` on the GPU, answered with curl
#   bash .gpu/run.sh kernels  kernel tests and the decode bandwidth table only
#   bash .gpu/run.sh scoreboard  the H200 scoreboard (scripts/gpu/scoreboard.sh)
#   bash .gpu/run.sh quick    tiny-model engine tests, decode kernel tests, 1B batch-1 latency
#   bash .gpu/run.sh bench    kernel bandwidth + `pagewise bench` runs
#   bash .gpu/run.sh all      both (default)
#   bash .gpu/run.sh long start|wait ...  a serving run longer than one call (scripts/gpu/long_serve.sh)
#   bash .gpu/run.sh verify   the default paths against the older ones they replaced (WMMA prefill,
#                             K/V after the wait, one graph context): tests with the older, speed of each
#   bash .gpu/run.sh verify-offline  8B offline throughput with each prefill kernel
#   bash .gpu/run.sh fused    the fused decode path (GEMV kernels with the norms folded in, default)
#                             against PAGEWISE_DECODE_FUSED=0: kernel and engine tests, then
#                             batch-1 latency, each way
#   bash .gpu/run.sh profile  one eager batch-1 decode step kernel by kernel under Nsight Compute
#                             (PROFILE_MODELS="llama-8b llama-1b" by default; scripts/gpu/ncu_step.py)
#   bash .gpu-gguf/run.sh gguf  the quantized-GGUF engine test (staged by scripts/gpu/stage_gguf.sh)
# Logs go to $OUT (the device tool brings them back); a summary is printed last.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/pagewise-out}
work=/tmp/pagewise-gpu
mkdir -p "$out" "$work/bin"
what=${1:-all}
# The binaries are built with NCCL (tensor parallelism): its library comes from the
# nvidia-nccl-cu13 wheel of the machine's Python.
nccl_lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2> /dev/null)
[ -n "$nccl_lib" ] && export LD_LIBRARY_PATH="$nccl_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"

for f in pagewise kernel-tests prefill-tests sampling-tests fused-tests rope-tests gpu-engine-tests; do
  [ -f "$here/$f.xz" ] || continue
  [ -x "$work/bin/$f" ] || python3 -c 'import lzma,sys; open(sys.argv[2],"wb").write(lzma.open(sys.argv[1]).read())' "$here/$f.xz" "$work/bin/$f"
  chmod +x "$work/bin/$f"
done
export PAGEWISE_GPU_MODELS=$work/models
if [ "$what" != kernels ] && [ "$what" != scoreboard ] && [ "$what" != quick ] && [ "$what" != gguf ] && [ "$what" != long ] && [ "$what" != verify-offline ] && [ "$what" != profile ] && [ ! -f "$PAGEWISE_GPU_MODELS/llama-1b/hf_logits.safetensors" ]; then
  (cd "$here" && python3 scripts/gpu/make_gpu_models.py "$PAGEWISE_GPU_MODELS") > "$out/make-models.log" 2>&1 \
    || { tail -20 "$out/make-models.log"; exit 1; }
fi
status=0
if [ "$what" = tests ] || [ "$what" = kernels ] || [ "$what" = all ]; then
  "$work/bin/kernel-tests" --test-threads=1 > "$out/kernel-tests.log" 2>&1 || status=1
  "$work/bin/prefill-tests" --test-threads=1 --nocapture > "$out/prefill-tests.log" 2>&1 || status=1
  "$work/bin/sampling-tests" --test-threads=1 > "$out/sampling-tests.log" 2>&1 || status=1
  "$work/bin/fused-tests" --test-threads=1 > "$out/fused-tests.log" 2>&1 || status=1
  "$work/bin/rope-tests" --test-threads=1 >> "$out/fused-tests.log" 2>&1 || status=1
  # (the quantized-GGUF test needs its model staged apart: `gguf` mode)
  [ "$what" = kernels ] || "$work/bin/gpu-engine-tests" --test-threads=1 --nocapture --skip quantized_gguf > "$out/gpu-engine-tests.log" 2>&1 || status=1
  # The same engine tests on the older paths kept for comparisons (WMMA prefill, decode K/V read
  # after the wait, one graph context, cuBLAS and the separate kernels for decode steps).
  [ "$what" = kernels ] || PAGEWISE_DECODE_EARLY_KV=0 PAGEWISE_PREFILL_MMA=0 PAGEWISE_GRAPH_CONTEXTS=none \
    PAGEWISE_DECODE_FUSED=0 "$work/bin/gpu-engine-tests" --test-threads=1 --nocapture \
    --skip quantized_gguf > "$out/gpu-engine-tests-older-paths.log" 2>&1 || status=1
  grep -hE "^test |test result|rel\. err|top-1|preemptions|KV blocks|panicked|^  |^(BF16|F16)" \
    "$out/kernel-tests.log" "$out/prefill-tests.log" "$out/sampling-tests.log" "$out/fused-tests.log" "$out/gpu-engine-tests.log" \
    "$out"/gpu-engine-tests-older-paths.log 2> /dev/null
fi
if [ "$what" = serve ] || [ "$what" = all ]; then
  # The server on the GPU, end to end: /ready, a completion and a streamed chat-less completion.
  "$work/bin/pagewise" serve "$PAGEWISE_GPU_MODELS/tiny-d64" --device cuda:0 --port 8077 > "$out/serve.log" 2>&1 &
  pid=$!
  for _ in $(seq 120); do curl -sf localhost:8077/ready > /dev/null && break; sleep 0.5; done
  curl -sf localhost:8077/v1/completions -H 'content-type: application/json' \
    -d '{"model":"'"$PAGEWISE_GPU_MODELS/tiny-d64"'","prompt":"Hello","max_tokens":8,"temperature":0}' \
    | tee "$out/serve-completion.json" || status=1
  echo
  curl -sfN localhost:8077/v1/completions -H 'content-type: application/json' \
    -d '{"model":"'"$PAGEWISE_GPU_MODELS/tiny-d64"'","prompt":"Hello","max_tokens":4,"temperature":0.8,"seed":1,"stream":true}' \
    | tail -3 || status=1
  curl -sf localhost:8077/metrics | grep -E "^vllm:(kv_cache_usage_perc|generation_tokens_total)" || status=1
  kill -TERM $pid; wait $pid || status=1
  grep -E "KV cache allocated|GPU memory after" "$out/serve.log" | tail -2
fi
if [ "$what" = bench ] || [ "$what" = kernels ] || [ "$what" = all ]; then
  "$work/bin/kernel-tests" --ignored --nocapture --test-threads=1 decode_bandwidth > "$out/decode-bandwidth.log" 2>&1 || status=1
  grep -E "^\||at once" "$out/decode-bandwidth.log"
  echo "== with PAGEWISE_DECODE_EARLY_KV=0 (no K/V copied before the wait on the kernel before)"
  PAGEWISE_DECODE_EARLY_KV=0 "$work/bin/kernel-tests" --ignored --nocapture --test-threads=1 decode_bandwidth 2>&1 \
    | grep -E "^\| [0-9]"
  # The GEMV kernel against cuBLAS at the 1B and 8B batch-1 projection shapes.
  "$work/bin/fused-tests" --ignored --nocapture --test-threads=1 gemv_bandwidth 2>&1 | grep -E "^\|" || status=1
  # The same table with the CUDA-core kernel where the tensor-core one applies (comparison).
  [ -n "${PAGEWISE_BW_COMPARE_CORE:-}" ] && PAGEWISE_DECODE_CORE=1 "$work/bin/kernel-tests" --ignored --nocapture \
    --test-threads=1 decode_bandwidth 2>&1 | grep -E "^\| [0-9]"
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  pw() { "$work/bin/pagewise" "$@" 2>> "$out/bench-stderr.log"; }
  m1b="$PAGEWISE_GPU_MODELS/llama-1b"
  echo "== 1B batch-1 latency, 128 in / 512 out"
  pw bench latency --model "$m1b" --batch-size 1 --input-len 128 --output-len 512 --num-iters-warmup 1 --num-iters 3 \
    --output-json "$out/latency-1b.json" | tail -4 || status=1
  echo "== 1B throughput, 200 x (1024 in, 128 out)"
  pw bench throughput --model "$m1b" --num-prompts 200 --input-len 1024 --output-len 128 \
    --output-json "$out/throughput-1b.json" | tail -4 || status=1
fi
if [ "$what" = quick ]; then
  # A short check within little device time: the tiny-model engine tests, decode kernel tests and
  # batch-1 latency on the 1B shape.
  (cd "$here" && python3 scripts/gpu/make_gpu_models.py "$PAGEWISE_GPU_MODELS" tiny) > "$out/make-models.log" 2>&1 || status=1
  "$work/bin/kernel-tests" --test-threads=1 2>&1 | grep -E "^test |test result" || status=1
  for t in fused-tests rope-tests; do
    "$work/bin/$t" --test-threads=1 2>&1 | grep -E "^test |test result|panicked" || status=1
  done
  # (the KV-sizing test needs the 1B model and the GGUF test its staged file: `tests` / `gguf`)
  "$work/bin/gpu-engine-tests" --test-threads=1 --nocapture gpu_ seeded batched cuda_graph \
    --skip quantized_gguf --skip sized_by_gpu_memory 2>&1 \
    | grep -E "^test |test result|rel\. err|preemptions|panicked" || status=1
  SCOREBOARD_MODELS=llama-1b SCOREBOARD_PARTS=latency SCOREBOARD_NO_HF=1 \
    PAGEWISE_BIN="$work/bin/pagewise" bash "$here/scripts/gpu/scoreboard.sh" 2>&1 | grep -E "tok/s|latency" || status=1
fi
if [ "$what" = gguf ]; then
  # The quantized-GGUF test, staged alone by scripts/gpu/stage_gguf.sh.
  mkdir -p "$PAGEWISE_GPU_MODELS" && cp "$here/smollm2-4l.gguf" "$PAGEWISE_GPU_MODELS/"
  "$work/bin/gpu-engine-tests" --test-threads=1 --nocapture quantized_gguf 2>&1 \
    | grep -E "^test |test result|rel\. err|engine on|panicked|WARN" || status=1
fi
if [ "$what" = verify ]; then
  # The default paths against the older ones kept for comparisons: PAGEWISE_PREFILL_MMA=0 (WMMA
  # prefill), PAGEWISE_DECODE_EARLY_KV=0 (K/V read after the rope kernel ends) and
  # PAGEWISE_GRAPH_CONTEXTS=none (one graph per batch bucket). Kernel tests, the engine's GPU
  # tests on the older paths (`tests` runs them on the defaults), then each one's speed.
  older=(PAGEWISE_PREFILL_MMA=0 PAGEWISE_DECODE_EARLY_KV=0 PAGEWISE_GRAPH_CONTEXTS=none)
  for t in kernel-tests prefill-tests sampling-tests fused-tests rope-tests; do
    "$work/bin/$t" --test-threads=1 --nocapture 2>&1 | grep -E "^test |test result|panicked|rel\. err" || status=1
  done
  env "${older[@]}" "$work/bin/gpu-engine-tests" --test-threads=1 --nocapture --skip quantized_gguf 2>&1 \
    | grep -E "^test |test result|rel\. err|top-1|panicked" || status=1
  "$work/bin/prefill-tests" --ignored --nocapture --test-threads=1 prefill_speed 2>&1 | grep -E "TFLOP|panicked"
  for early in 1 0; do
    echo "== decode bandwidth, PAGEWISE_DECODE_EARLY_KV=$early"
    PAGEWISE_DECODE_EARLY_KV=$early PAGEWISE_BW_CASES="1x8192 8x8192 64x2048 1x512" "$work/bin/kernel-tests" \
      --ignored --nocapture --test-threads=1 decode_bandwidth 2>&1 | grep -E "^\| [0-9]"
  done
  SCOREBOARD_MODELS=none SCOREBOARD_PARTS=none SCOREBOARD_NO_HF=1 PAGEWISE_BIN="$work/bin/pagewise" \
    bash "$here/scripts/gpu/scoreboard.sh" > /dev/null 2>&1   # (writes the shapes' configs)
  shapes=/tmp/pagewise-gpu/shapes
  for mv in llama-1b:default llama-1b:older llama-8b:default llama-8b:older; do
    m=${mv%%:*} v=${mv##*:}
    (
      [ "$v" = older ] && export "${older[@]}"
      echo "== $m batch-1 decode, 128 in / 512 out, $v paths"
      timeout 120 "$work/bin/pagewise" bench latency --model "$shapes/$m" --load-format dummy \
        --batch-size 1 --input-len 128 --output-len 512 --num-iters-warmup 1 --num-iters 3 \
        2>> "$out/bench-stderr.log" | tail -3
    )
  done
fi
if [ "$what" = fused ]; then
  for t in fused-tests rope-tests; do
    "$work/bin/$t" --test-threads=1 2>&1 | grep -E "^test |test result|panicked|off by" || status=1
  done
  for f in 1 0; do
    echo "== engine tests, PAGEWISE_DECODE_FUSED=$f"
    PAGEWISE_DECODE_FUSED=$f "$work/bin/gpu-engine-tests" --test-threads=1 --nocapture --skip quantized_gguf 2>&1 \
      | grep -E "^test |test result|rel\. err|top-1|panicked" || status=1
  done
  SCOREBOARD_MODELS=none SCOREBOARD_PARTS=none SCOREBOARD_NO_HF=1 PAGEWISE_BIN="$work/bin/pagewise" \
    bash "$here/scripts/gpu/scoreboard.sh" > /dev/null 2>&1   # (writes the shapes' configs)
  for mf in llama-1b:1 llama-1b:0 llama-8b:1 llama-8b:0; do
    m=${mf%%:*} f=${mf##*:}
    echo "== $m batch-1 decode, 128 in / 512 out, PAGEWISE_DECODE_FUSED=$f"
    PAGEWISE_DECODE_FUSED=$f timeout 120 "$work/bin/pagewise" bench latency --model "/tmp/pagewise-gpu/shapes/$m" \
      --load-format dummy --batch-size 1 --input-len 128 --output-len 512 --num-iters-warmup 1 --num-iters 3 \
      2>> "$out/bench-stderr.log" | tail -3
  done
  grep -E "capture failed" "$out/bench-stderr.log" | head -3
fi
if [ "$what" = verify-offline ]; then
  # 8B offline throughput with each prefill kernel.
  SCOREBOARD_MODELS=none SCOREBOARD_PARTS=none SCOREBOARD_NO_HF=1 PAGEWISE_BIN="$work/bin/pagewise" \
    bash "$here/scripts/gpu/scoreboard.sh" > /dev/null 2>&1   # (writes the shapes' configs)
  for mma in 0 1; do
    echo "== 8B offline, 1000 x (1024 in, 128 out), PAGEWISE_PREFILL_MMA=$mma"
    PAGEWISE_PREFILL_MMA=$mma timeout 250 "$work/bin/pagewise" bench throughput \
      --model /tmp/pagewise-gpu/shapes/llama-8b --load-format dummy --num-prompts 1000 --input-len 1024 \
      --output-len 128 --output-json "$out/throughput-8b-mma$mma.json" 2>> "$out/bench-stderr.log" | tail -2 || status=1
  done
fi
if [ "$what" = profile ]; then
  SCOREBOARD_MODELS=none SCOREBOARD_PARTS=none SCOREBOARD_NO_HF=1 PAGEWISE_BIN="$work/bin/pagewise" \
    bash "$here/scripts/gpu/scoreboard.sh" > /dev/null 2>&1   # (writes the shapes' configs)
  for m in ${PROFILE_MODELS:-llama-8b llama-1b}; do
    echo "== $m: the last of 2 decode steps (eager), kernel by kernel"
    timeout 300 /usr/local/cuda/bin/ncu --clock-control none --cache-control none \
      --metrics gpu__time_duration.sum --csv "$work/bin/pagewise" bench latency \
      --model "/tmp/pagewise-gpu/shapes/$m" --load-format dummy --enforce-eager \
      --max-num-batched-tokens 512 --batch-size 1 --input-len 128 --output-len 3 \
      --num-iters-warmup 0 --num-iters 1 > "$out/ncu-$m.csv" 2> "$out/ncu-$m.err" || status=1
    python3 "$here/scripts/gpu/ncu_step.py" "$out/ncu-$m.csv" || status=1
  done
fi
if [ "$what" = long ]; then
  PAGEWISE_BIN="$work/bin/pagewise" bash "$here/scripts/gpu/long_serve.sh" "${@:2}" || status=$?
fi
if [ "$what" = scoreboard ]; then
  PAGEWISE_BIN="$work/bin/pagewise" bash "$here/scripts/gpu/scoreboard.sh" || status=1
fi
exit $status
