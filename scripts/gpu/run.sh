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
#   bash .gpu/run.sh dashboard  what a /dashboard viewer costs: `bench serve` at rate inf on the 1B
#                             shape (256 sequences, no prefix caching so every run does the same
#                             work), without and with a viewer, alternating (off on on off) x 2
#   bash .gpu/run.sh structured  what constrained decoding costs: `bench throughput` on the 8B shape with
#                             SmolLM2's 49k vocabulary (staged by build.sh), 64 prompts of 512/512 at
#                             once, free vs half JSON-schema constrained, alternating (free half half free)
#   bash .gpu/run.sh fp8      the FP8 kernel (weights and KV cache) and engine tests, then batch-1 latency and offline
#                             throughput of the 1B and 8B shapes in bf16 and --quantization fp8
#   bash .gpu/run.sh int4     the 4-bit kernel and engine tests, the 4-bit GEMV bandwidth table, then
#                             batch-1 latency of the 1B and 8B shapes and 8B offline throughput in
#                             bf16 and as AWQ (dummy 4-bit weights, groups of 128); INT4_PARTS=experts
#                             (opt-in): the experts-as-codes kernel tests and the experts' bandwidth table
#   bash .gpu/run.sh spec     speculative decoding: the GPU engine tests (n-gram and a draft model,
#                             greedy output unchanged), then the 8B shape at batch 1 without and
#                             with the 1B shape drafting k = 2, 4, 7 (random weights: acceptance
#                             near 0, so each step's forward is the cost of verifying k + 1 tokens;
#                             the draft phase is the 1B's k passes)
#   bash .gpu/run.sh recheck  `tests`, then the scoreboard's batch-1 and offline rows (no serving,
#                             no transformers baselines): the check after a change to the GPU path;
#                             each part runs when its binary is staged (a call carries one:
#                             .gpu-kernel-tests, .gpu-gpu-engine-tests, .gpu-pagewise; stage_one.sh)
#   bash .gpu/run.sh startup  launch of `pagewise serve` to /ready answering, three launches of the 8B
#                             shape (--load-format dummy; STARTUP_MODELS), with the engine's own
#                             "ready in" line (where the time went)
#   bash .gpu/run.sh profile  one eager batch-1 decode step kernel by kernel under Nsight Compute
#                             (PROFILE_MODELS="llama-8b llama-1b" by default; scripts/gpu/ncu_step.py)
#   bash .gpu-gguf/run.sh gguf  the quantized-GGUF engine test (staged by scripts/gpu/stage_gguf.sh)
#   bash .gpu/run.sh gguf-gpu  GGUF codes on the GPU: the affine-code kernel tests and their GEMV
#                             bandwidth table (kernel-tests' affine::), then the GGUF k-quant engine tests
#                             (gpu-engine-tests); each part runs when its binary is staged
#                             (scripts/gpu/gguf_peer.sh: the same files against llama.cpp)
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

# (Unpacked each call: a warm machine keeps /tmp between calls, and a binary staged since must
# replace the one there.)
for f in pagewise kernel-tests gpu-engine-tests; do
  [ -f "$here/$f.xz" ] || continue
  python3 -c 'import lzma,sys; open(sys.argv[2],"wb").write(lzma.open(sys.argv[1]).read())' "$here/$f.xz" "$work/bin/$f"
  chmod +x "$work/bin/$f"
done
export PAGEWISE_GPU_MODELS=$work/models
# The test models (the modes that need them and make their own are left out).
needs_models=1
case $what in
  kernels | scoreboard | quick | gguf | long | profile | dashboard | structured | fp8 | int4 | spec | gguf-gpu | startup) needs_models=0 ;;
  recheck) [ -f "$here/gpu-engine-tests.xz" ] || needs_models=0 ;;   # (a call staging one binary)
esac
if [ $needs_models = 1 ] && [ ! -f "$PAGEWISE_GPU_MODELS/llama-1b/hf_logits.safetensors" ]; then
  (cd "$here" && python3 scripts/gpu/make_gpu_models.py "$PAGEWISE_GPU_MODELS") > "$out/make-models.log" 2>&1 \
    || { tail -20 "$out/make-models.log"; exit 1; }
fi
# gpt-oss in llama.cpp's layout: gptoss-d64 with its experts quantized to MXFP4, written by the
# gguf-py of the llama.cpp kit (staged by build.sh as lcpp/).
gptoss=$PAGEWISE_GPU_MODELS/gptoss-d64
if [ -d "$gptoss" ] && [ ! -f "$gptoss/model-MXFP4.gguf" ] && [ -f "$here/lcpp/lcpp.tar.xz" ]; then
  mkdir -p "$work/ggufpy" && tar -xJf "$here/lcpp/lcpp.tar.xz" -C "$work/ggufpy" --wildcards '*/gguf-py/*' \
    && PYTHONPATH=$work/ggufpy/llama.cpp/gguf-py python3 "$here/../tests/fixtures/make_gptoss_gguf.py" "$gptoss" \
      >> "$out/make-models.log" 2>&1 || tail -5 "$out/make-models.log"
fi
# The same with its experts quantized to MXFP4 as gpt-oss's safetensors ship them.
if [ -d "$gptoss" ] && [ ! -f "$gptoss-mxfp4/model.safetensors" ]; then
  python3 "$here/../tests/fixtures/make_gptoss_mxfp4.py" "$gptoss" "$gptoss-mxfp4" >> "$out/make-models.log" 2>&1 \
    || tail -5 "$out/make-models.log"
fi
status=0
# The kernels' tests are one binary; its modules are the kernel families (kernels/tests/gpu.rs).
kt=$work/bin/kernel-tests
if [ "$what" = tests ] || [ "$what" = kernels ] || [ "$what" = all ] || [ "$what" = recheck ]; then
  # (Each binary when staged: a call carries one, scripts/gpu/stage_one.sh.)
  if [ -f "$here/kernel-tests.xz" ]; then "$kt" --test-threads=1 --nocapture > "$out/kernel-tests.log" 2>&1 || status=1; fi
  # (the quantized-GGUF test needs its model staged apart: `gguf` mode)
  if [ "$what" != kernels ] && [ -f "$here/gpu-engine-tests.xz" ]; then
    # The FP8 and 4-bit checkpoints the engine tests load, made from the test models above.
    for maker in make_fp8_gpu_models make_int_gpu_models; do
      python3 "$here/../scripts/gpu/$maker.py" "$PAGEWISE_GPU_MODELS" >> "$out/make-models.log" 2>&1 \
        || { tail -20 "$out/make-models.log"; status=1; }
    done
    "$work/bin/gpu-engine-tests" --test-threads=1 --nocapture --skip quantized_gguf > "$out/gpu-engine-tests.log" 2>&1 || status=1
  fi
  grep -hE "^test |test result|rel\. err|top-1|preemptions|KV blocks|panicked|^  |^(BF16|F16)" \
    "$out/kernel-tests.log" "$out/gpu-engine-tests.log" 2> /dev/null
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
  "$kt" --ignored --nocapture --test-threads=1 paged_attention::decode_bandwidth > "$out/decode-bandwidth.log" 2>&1 || status=1
  grep -E "^\||at once" "$out/decode-bandwidth.log"
  # The GEMV kernel against cuBLAS at the 1B and 8B batch-1 projection shapes.
  "$kt" --ignored --nocapture --test-threads=1 fused::gemv_bandwidth 2>&1 | grep -E "^\|" || status=1
  # The experts of one decode token at the Mixtral and Qwen3-MoE shapes.
  "$kt" --ignored --nocapture --test-threads=1 moe::bandwidth::moe_bandwidth 2>&1 | grep -E "^\||panicked" || status=1
  "$kt" --ignored --nocapture --test-threads=1 moe_mma::mma_bandwidth 2>&1 | grep -E "^\||panicked" || status=1
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
  "$kt" --test-threads=1 paged_attention:: fused:: rope:: moe:: moe_mma:: 2>&1 \
    | grep -E "^test |test result|panicked" || status=1
  # (the KV-sizing test needs the 1B model and the GGUF test its staged file: `tests` / `gguf`)
  "$work/bin/gpu-engine-tests" --test-threads=1 --nocapture gpu_ seeded batched cuda_graph \
    --skip quantized_gguf --skip sized_by_gpu_memory 2>&1 \
    | grep -E "^test |test result|rel\. err|preemptions|panicked" || status=1
  SCOREBOARD_MODELS=llama-1b SCOREBOARD_PARTS=latency SCOREBOARD_NO_HF=1 \
    PAGEWISE_BIN="$work/bin/pagewise" bash "$here/scripts/gpu/scoreboard.sh" 2>&1 | grep -E "tok/s|latency" || status=1
fi
if [ "$what" = fp8 ]; then
  "$kt" --test-threads=1 fp8:: 2>&1 | grep -E "^test |test result|panicked" || status=1   # (kv_fp8:: too)
  python3 "$here/../scripts/gpu/make_fp8_gpu_models.py" "$PAGEWISE_GPU_MODELS" > "$out/make-models.log" 2>&1 \
    || { tail -20 "$out/make-models.log"; status=1; }
  "$work/bin/gpu-engine-tests" --test-threads=1 --nocapture fp8 2>&1 \
    | grep -E "^test |test result|rel\. err|panicked" || status=1
  "$kt" --ignored --nocapture --test-threads=1 fp8::fp8_gemv_bandwidth 2>&1 | grep -E "^\||panicked" || status=1
  PAGEWISE_FP8_BLOCKS=1 "$kt" --ignored --nocapture --test-threads=1 fp8::fp8_gemv_bandwidth 2>&1 \
    | grep -E "^\| [18]|panicked" || status=1
  "$kt" --ignored --nocapture --test-threads=1 fp8::fp8_gemm_speed 2>&1 | grep -E "^\||panicked" || status=1
  SCOREBOARD_MODELS=none SCOREBOARD_PARTS=none SCOREBOARD_NO_HF=1 PAGEWISE_BIN="$work/bin/pagewise" \
    bash "$here/scripts/gpu/scoreboard.sh" > /dev/null 2>&1   # (writes the shapes' configs)
  for m in ${FP8_MODELS:-llama-8b llama-1b}; do
    for q in bf16 fp8; do
      flag=; [ "$q" = fp8 ] && flag="--quantization fp8"
      echo "== $m $q batch-1 latency, 128 in / 512 out"
      timeout 150 "$work/bin/pagewise" bench latency --model "/tmp/pagewise-gpu/shapes/$m" --load-format dummy $flag \
        --batch-size 1 --input-len 128 --output-len 512 --num-iters-warmup 1 --num-iters 3 \
        --output-json "$out/$m-$q-latency.json" 2>> "$out/bench-stderr.log" | tail -2 || status=1
    done
  done
  for q in ${FP8_THROUGHPUT:-bf16 fp8}; do
    [ "$q" = none ] && continue
    flag=; [ "$q" = fp8 ] && flag="--quantization fp8"
    echo "== llama-8b $q offline, 1000 x (1024 in, 128 out)"
    timeout 180 "$work/bin/pagewise" bench throughput --model /tmp/pagewise-gpu/shapes/llama-8b --load-format dummy $flag \
      --num-prompts 1000 --input-len 1024 --output-len 128 --output-json "$out/llama-8b-$q-throughput.json" \
      2>> "$out/bench-stderr.log" | tail -1 || status=1
  done
fi
# (INT4_PARTS picks parts, "kernels engine bench" by default, "experts" on request: the tracked tree
# leaves room for one staged binary a call, so a session may run them in separate calls.)
int4_part() { case " ${INT4_PARTS:-kernels engine bench} " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
if [ "$what" = int4 ] && int4_part kernels; then
  "$kt" --test-threads=1 int4:: 2>&1 | grep -E "^test |test result|panicked" || status=1
  "$kt" --ignored --nocapture --test-threads=1 int4::int4_gemv_bandwidth 2>&1 | grep -E "^\||panicked" || status=1
fi
if [ "$what" = int4 ] && int4_part experts; then
  "$kt" --test-threads=1 moe::affine:: 2>&1 | grep -E "^test |test result|panicked" || status=1
  "$kt" --ignored --nocapture --test-threads=1 moe::bandwidth::moe_bandwidth 2>&1 | grep -E "^\||panicked" || status=1
fi
if [ "$what" = int4 ] && int4_part engine; then
  python3 "$here/../scripts/gpu/make_int_gpu_models.py" "$PAGEWISE_GPU_MODELS" > "$out/make-models.log" 2>&1 \
    || { tail -20 "$out/make-models.log"; status=1; }
  "$work/bin/gpu-engine-tests" --test-threads=1 --nocapture int4 2>&1 \
    | grep -E "^test |test result|rel\. err|replays|panicked" || status=1
fi
if [ "$what" = int4 ] && int4_part bench; then
  SCOREBOARD_MODELS=none SCOREBOARD_PARTS=none SCOREBOARD_NO_HF=1 PAGEWISE_BIN="$work/bin/pagewise" \
    bash "$here/scripts/gpu/scoreboard.sh" > /dev/null 2>&1   # (writes the shapes' configs)
  for m in llama-8b llama-1b; do
    # The shape as an AWQ checkpoint's config: 4 bits, groups of 128, zero points.
    shapes=/tmp/pagewise-gpu/shapes
    rm -rf "$shapes/$m-awq" && cp -r "$shapes/$m" "$shapes/$m-awq"
    python3 -c 'import json,sys; p=sys.argv[1]+"/config.json"; c=json.load(open(p)); c["quantization_config"]={"quant_method":"awq","bits":4,"group_size":128,"version":"gemm","zero_point":True}; json.dump(c,open(p,"w"))' "$shapes/$m-awq"
  done
  for m in ${INT4_MODELS:-llama-8b llama-1b}; do
    for q in bf16 awq; do
      dir=$m; [ "$q" = awq ] && dir=$m-awq
      echo "== $m $q batch-1 latency, 128 in / 512 out"
      timeout 150 "$work/bin/pagewise" bench latency --model "/tmp/pagewise-gpu/shapes/$dir" --load-format dummy \
        --batch-size 1 --input-len 128 --output-len 512 --num-iters-warmup 1 --num-iters 3 \
        --output-json "$out/$m-$q-latency.json" 2>> "$out/bench-stderr.log" | tail -2 || status=1
    done
  done
  for q in ${INT4_THROUGHPUT:-bf16 awq}; do
    [ "$q" = none ] && continue
    dir=llama-8b; [ "$q" = awq ] && dir=llama-8b-awq
    echo "== llama-8b $q offline, 1000 x (1024 in, 128 out)"
    timeout 180 "$work/bin/pagewise" bench throughput --model "/tmp/pagewise-gpu/shapes/$dir" --load-format dummy \
      --num-prompts 1000 --input-len 1024 --output-len 128 --output-json "$out/llama-8b-$q-throughput.json" \
      2>> "$out/bench-stderr.log" | tail -1 || status=1
  done
fi
if [ "$what" = gguf-gpu ] && [ -x "$kt" ]; then
  "$kt" --test-threads=1 affine:: --skip moe:: 2>&1 | grep -E "^test |test result|panicked" || status=1
  "$kt" --ignored --nocapture --test-threads=1 affine::affine_gemv_bandwidth 2>&1 | grep -E "^\||panicked" || status=1
fi
if [ "$what" = gguf-gpu ] && [ -x "$work/bin/gpu-engine-tests" ]; then
  # (SmolLM2's 4 blocks too, when staged beside: scripts/gpu/stage_gguf.sh.)
  skip=(--skip quantized_gguf)
  [ -f "$here/smollm2-4l.gguf" ] && mkdir -p "$PAGEWISE_GPU_MODELS" && cp "$here/smollm2-4l.gguf" "$PAGEWISE_GPU_MODELS/" && skip=()
  "$work/bin/gpu-engine-tests" --test-threads=1 --nocapture gguf "${skip[@]}" 2>&1 \
    | grep -E "^test |test result|rel\. err|replays|panicked" || status=1
fi
if [ "$what" = spec ]; then
  [ -d "$PAGEWISE_GPU_MODELS/tiny-d64" ] || (cd "$here" && python3 scripts/gpu/make_gpu_models.py \
    "$PAGEWISE_GPU_MODELS" tiny) > "$out/make-models.log" 2>&1 || { tail -20 "$out/make-models.log"; status=1; }
  "$work/bin/gpu-engine-tests" --test-threads=1 --nocapture speculation 2>&1 \
    | grep -E "^test |test result|accepted|panicked" || status=1
  SCOREBOARD_MODELS=none SCOREBOARD_PARTS=none SCOREBOARD_NO_HF=1 PAGEWISE_BIN="$work/bin/pagewise" \
    bash "$here/scripts/gpu/scoreboard.sh" > /dev/null 2>&1   # (writes the shapes' configs)
  shapes=/tmp/pagewise-gpu/shapes
  for k in 0 2 4 7; do
    flag=(); [ "$k" = 0 ] || flag=(--speculative-config "{\"model\":\"$shapes/llama-1b\",\"num_speculative_tokens\":$k}")
    echo "== llama-8b batch 1, 128 in / 256 out, draft k=$k"
    timeout 150 "$work/bin/pagewise" bench latency --model "$shapes/llama-8b" --load-format dummy \
      --batch-size 1 --input-len 128 --output-len 256 --num-iters-warmup 1 --num-iters 3 "${flag[@]}" \
      2>> "$out/bench-stderr.log" | grep -E "tok/s|speculative|per step" || status=1
  done
fi
if [ "$what" = gguf ]; then
  # The quantized-GGUF test, staged alone by scripts/gpu/stage_gguf.sh.
  mkdir -p "$PAGEWISE_GPU_MODELS" && cp "$here/smollm2-4l.gguf" "$PAGEWISE_GPU_MODELS/"
  "$work/bin/gpu-engine-tests" --test-threads=1 --nocapture quantized_gguf 2>&1 \
    | grep -E "^test |test result|rel\. err|engine on|panicked|WARN" || status=1
fi
if [ "$what" = dashboard ]; then
  SCOREBOARD_MODELS=none SCOREBOARD_PARTS=none SCOREBOARD_NO_HF=1 PAGEWISE_BIN="$work/bin/pagewise" \
    bash "$here/scripts/gpu/scoreboard.sh" > /dev/null 2>&1   # (writes the shapes' configs)
  m=/tmp/pagewise-gpu/shapes/llama-1b
  "$work/bin/pagewise" serve "$m" --load-format dummy --port 8300 --max-num-seqs 256 \
    --no-enable-prefix-caching > "$out/dashboard-serve.log" 2>&1 &
  pid=$!
  for _ in $(seq 240); do curl -sf localhost:8300/ready > /dev/null && break; sleep 0.5; done
  for round in 1 2; do
    for v in off on on off; do
      viewer=
      if [ "$v" = on ]; then
        (curl -sN localhost:8300/dashboard/events | wc -c > "$out/dashboard-bytes-$round.txt") &
        viewer=$!
        sleep 1
      fi
      echo "== round $round, viewer $v"
      timeout 200 "$work/bin/pagewise" bench serve --base-url http://127.0.0.1:8300 --model "$m" --num-prompts 1000 \
        --random-input-len 1024 --random-output-len 128 --request-rate inf --ignore-eos --no-progress \
        --result-file "/tmp/dashboard-$v-$round.json" 2>> "$out/bench-stderr.log" | grep -E "throughput|Successful" | head -3
      [ -n "$viewer" ] && { pkill -f "dashboard/events"; wait "$viewer"; echo "viewer received $(cat "$out/dashboard-bytes-$round.txt") bytes"; }
    done
  done
  curl -s localhost:8300/dashboard | grep -c "pagewise · page table"
  kill -TERM $pid; wait $pid
fi
if [ "$what" = structured ]; then
  SCOREBOARD_MODELS=none SCOREBOARD_PARTS=none SCOREBOARD_NO_HF=1 PAGEWISE_BIN="$work/bin/pagewise" \
    bash "$here/scripts/gpu/scoreboard.sh" > /dev/null 2>&1   # (writes the shapes' configs)
  m=/tmp/pagewise-gpu/shapes/llama-8b-49k
  mkdir -p "$m" && cp /tmp/pagewise-gpu/shapes/llama-8b/config.json "$m/"
  python3 -c 'import lzma,sys; open(sys.argv[2],"wb").write(lzma.open(sys.argv[1]).read())' \
    "$here/bench/tokenizer.json.xz" "$m/tokenizer.json"
  for frac in 0 0.5 0.5 0; do
    echo "== JSON-schema fraction $frac"
    timeout 300 "$work/bin/pagewise" bench throughput --model "$m" --load-format dummy --max-num-seqs 64 \
      --num-prompts 64 --input-len 512 --output-len 512 --json-schema-fraction "$frac" \
      --output-json "$out/structured-$frac.json" 2>> "$out/bench-stderr.log" | tail -2
  done
fi
if [ "$what" = recheck ] && [ -f "$here/pagewise.xz" ]; then
  SCOREBOARD_PARTS="latency throughput" SCOREBOARD_NO_HF=1 PAGEWISE_BIN="$work/bin/pagewise" \
    bash "$here/scripts/gpu/scoreboard.sh" || status=1
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
if [ "$what" = startup ]; then
  SCOREBOARD_MODELS=none SCOREBOARD_PARTS=none SCOREBOARD_NO_HF=1 PAGEWISE_BIN="$work/bin/pagewise" \
    bash "$here/scripts/gpu/scoreboard.sh" > /dev/null 2>&1   # (writes the shapes' configs)
  for m in ${STARTUP_MODELS:-llama-8b}; do
    for i in 1 2 3; do
      log=$out/startup-$m-$i.log
      t0=$(date +%s%N)
      "$work/bin/pagewise" serve "/tmp/pagewise-gpu/shapes/$m" --load-format dummy --port 8079 > "$log" 2>&1 &
      pid=$!
      until curl -sf localhost:8079/ready > /dev/null; do
        kill -0 $pid 2> /dev/null || { echo "$m: the server exited"; tail -5 "$log"; status=1; break; }
        sleep 0.01
      done
      t1=$(date +%s%N)
      echo "$m launch $i: $(( (t1 - t0) / 1000000 )) ms to /ready; $(grep -o 'ready in.*' "$log" | head -1)"
      kill -TERM $pid 2> /dev/null; wait $pid
    done
  done
fi
if [ "$what" = long ]; then
  PAGEWISE_BIN="$work/bin/pagewise" bash "$here/scripts/gpu/long_serve.sh" "${@:2}" || status=$?
fi
if [ "$what" = scoreboard ]; then
  PAGEWISE_BIN="$work/bin/pagewise" bash "$here/scripts/gpu/scoreboard.sh" || status=1
fi
exit $status
