#!/usr/bin/env bash
# Tensor parallelism on `nvidia-h200-x2`, from the staged folder (scripts/gpu/build.sh, then
# scripts/gpu/stage_tp.sh): device run (kind nvidia-h200-x2), carry [".gpu-tp"]:
#   bash .gpu-tp/scripts/gpu/tp.sh [check|bench|all]
#   check  the two-GPU NCCL parity test (gpu-tp-tests), scripts/gpu/tp_check.py (servers: TP=1
#          against TP=2 and two "nodes", batch invariance, preemption, prefix caching, failures)
#          and the OpenAI SDK suite against a TP=2 server
#   bench  TP_BENCH parts (default "latency"): latency = `pagewise bench latency` at batch 1
#          (128 in / 256 out), Llama-3.1-8B shape at TP=1 and TP=2, Llama-3.1-70B shape at TP=2
#          (dummy bf16 weights), TP=2 each way (one-shot all-reduce, and NCCL alone); more = 70B TP=2 offline throughput (1000 x (1024, 128)) and
#          `bench serve` at 1 req/s (30 prompts) and 4 req/s (100); peer = llama.cpp on the same two
#          GPUs (the kit of ../shared/peers/llama.cpp, staged as lcpp/: random F16 GGUF of the 8B
#          shape, llama-bench tg128 with -sm layer and -sm row) next to our 8B TP=1 and TP=2
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0): it is forbidden on these hosts.
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)   # the staged .gpu folder
out=${OUT:-/tmp/pagewise-out}
work=/tmp/pagewise-gpu
what=${1:-all}
mkdir -p "$out" "$work/bin"
export NCCL_NVLS_ENABLE=0
nccl_lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))')
export LD_LIBRARY_PATH="$nccl_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee "$out/gpus.txt"
nvidia-smi topo -m > "$out/topo.txt" 2>&1
ls "$nccl_lib" | head -3
for f in pagewise gpu-tp-tests; do
  [ -f "$here/$f.xz" ] || continue
  python3 -c 'import lzma,sys; open(sys.argv[2],"wb").write(lzma.open(sys.argv[1]).read())' "$here/$f.xz" "$work/bin/$f"
  chmod +x "$work/bin/$f"
done
bin=$work/bin/pagewise
export PAGEWISE_GPU_MODELS=$work/models
status=0
if [ "$what" = check ] || [ "$what" = all ]; then
  [ -f "$PAGEWISE_GPU_MODELS/llama-1b/hf_logits.safetensors" ] || \
    (cd "$here" && python3 scripts/gpu/make_gpu_models.py "$PAGEWISE_GPU_MODELS") > "$out/make-models.log" 2>&1 \
    || { tail -20 "$out/make-models.log"; exit 1; }
  # gpt-oss with MXFP4 experts, as its checkpoints ship them (for tp_gpt_oss_matches_tp1).
  [ -f "$PAGEWISE_GPU_MODELS/gptoss-d64-mxfp4/model.safetensors" ] || python3 "$here/tests/fixtures/make_gptoss_mxfp4.py" \
    "$PAGEWISE_GPU_MODELS/gptoss-d64" "$PAGEWISE_GPU_MODELS/gptoss-d64-mxfp4" >> "$out/make-models.log" 2>&1 \
    || tail -5 "$out/make-models.log"
  echo "== NCCL parity (two GPUs in one process)"
  "$work/bin/gpu-tp-tests" --test-threads=1 --nocapture > "$out/gpu-tp-tests.log" 2>&1 || status=1
  grep -hE "^test |test result|rel\. err|panicked" "$out/gpu-tp-tests.log"
  echo "== servers (scripts/gpu/tp_check.py)"
  timeout 400 python3 "$here/scripts/gpu/tp_check.py" "$bin" "$PAGEWISE_GPU_MODELS" "$out" || status=1
  echo "== OpenAI SDK suite against TP=2 servers"
  python3 -m pip install --quiet --no-index --find-links "$here/wheels" --target /tmp/sdk openai pytest > "$out/sdk-install.log" 2>&1
  PYTHONPATH=/tmp/sdk PAGEWISE_BIN=$bin PAGEWISE_SDK_TINY=$PAGEWISE_GPU_MODELS/tiny-d64 \
    PAGEWISE_SDK_SERVE_ARGS="--tensor-parallel-size 2 --max-model-len 256" \
    timeout 150 python3 -m pytest -q "$here/tests/openai_sdk" -p no:cacheprovider > "$out/sdk.log" 2>&1 || status=1
  tail -3 "$out/sdk.log"
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  cfg=$work/shapes
  mkdir -p "$cfg/llama-8b" "$cfg/llama-70b"
  python3 - "$cfg" <<'PY'
import json, sys
base = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu", vocab_size=128256,
            max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0, bos_token_id=128000,
            eos_token_id=128001, torch_dtype="bfloat16", attention_bias=False, mlp_bias=False,
            tie_word_embeddings=False, head_dim=128,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
shapes = {"llama-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                           num_attention_heads=32, num_key_value_heads=8),
          "llama-70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                            num_attention_heads=64, num_key_value_heads=8)}
for name, s in shapes.items():
    json.dump({**base, **s}, open(f"{sys.argv[1]}/{name}/config.json", "w"), indent=1)
PY
  for m in llama-8b llama-70b; do cp "$here/tests/fixtures/llama-gqa-tied/tokenizer.json" "$cfg/$m/"; done
  lat() { # lat NAME TP MODEL [FLAGS...]
    local name=$1 tp=$2 model=$3; shift 3
    echo "== $name: batch-1 decode, 128 in / 256 out, TP=$tp $*"
    timeout 420 "$bin" bench latency --model "$cfg/$model" --load-format dummy --max-model-len 4096 \
      --tensor-parallel-size "$tp" --max-num-seqs 16 --batch-size 1 --input-len 128 --output-len 256 \
      --num-iters-warmup 1 --num-iters 3 --output-json "$out/$name.json" "$@" 2> "$out/$name.stderr" | tail -3 \
      || { status=1; tail -5 "$out/$name.stderr"; }
  }
  parts=" ${TP_BENCH:-latency} "
  if [[ $parts == *" latency "* ]]; then
    lat llama-8b-tp1-latency 1 llama-8b
    lat llama-8b-tp2-latency 2 llama-8b
    lat llama-8b-tp2-nccl-latency 2 llama-8b --disable-custom-all-reduce
    lat llama-70b-tp2-latency 2 llama-70b
    lat llama-70b-tp2-nccl-latency 2 llama-70b --disable-custom-all-reduce
  fi
  if [[ $parts == *" peer "* ]] && [ -f "$here/lcpp/run.sh" ]; then
    echo "== llama.cpp on both GPUs (build, then random F16 8B GGUF)"
    JOBS=32 SHAPES=llama-8b OUT=$out/lcpp timeout 420 bash "$here/lcpp/run.sh" build > "$out/lcpp-build.log" 2>&1 \
      || { status=1; tail -5 "$out/lcpp-build.log"; }
    lb=/tmp/lcpp/llama.cpp/build/bin/llama-bench
    for sm in layer row; do
      echo "== llama.cpp llama-8b F16, -sm $sm, both GPUs: tg128"
      timeout 240 "$lb" -m /tmp/lcpp-models/llama-8b.gguf -p 0 -n 128 -r 3 -fa 1 -ngl 99 -sm "$sm" -o md \
        2> "$out/lcpp-$sm.stderr" | tail -3 || tail -3 "$out/lcpp-$sm.stderr"
    done
    lat llama-8b-tp1-latency-peer 1 llama-8b
    lat llama-8b-tp2-latency-peer 2 llama-8b
  fi
  if [[ $parts == *" more "* ]]; then
    echo "== llama-70b TP=2: offline, 1000 x (1024 in, 128 out)"
    timeout 900 "$bin" bench throughput --model "$cfg/llama-70b" --load-format dummy --max-model-len 4096 \
      --tensor-parallel-size 2 --num-prompts 1000 --input-len 1024 --output-len 128 \
      --output-json "$out/llama-70b-tp2-throughput.json" 2> "$out/llama-70b-tp2-throughput.stderr" | tail -2
    port=8300
    "$bin" serve "$cfg/llama-70b" --load-format dummy --max-model-len 4096 --tensor-parallel-size 2 \
      --port $port --served-model-name llama-70b > "$out/llama-70b-tp2-serve.log" 2>&1 &
    pid=$!
    for _ in $(seq 600); do curl -sf "localhost:$port/ready" > /dev/null && break; sleep 0.5; done
    for spec in 1:30 4:100; do
      rate=${spec%%:*} n=${spec##*:}
      echo "== llama-70b TP=2: bench serve, $n prompts of 1024/128 at $rate req/s"
      timeout $(( n / rate + 240 )) "$bin" bench serve --base-url "http://127.0.0.1:$port" --model llama-70b \
        --num-prompts "$n" --random-input-len 1024 --random-output-len 128 --request-rate "$rate" --ignore-eos \
        --no-progress --result-file "$out/llama-70b-tp2-serve-$rate.json" | grep -E "throughput|TTFT|TPOT|Successful" | head -8
    done
    kill -TERM $pid; wait $pid
  fi
fi
exit $status
