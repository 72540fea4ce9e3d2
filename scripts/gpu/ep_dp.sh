#!/usr/bin/env bash
# Expert and data parallelism on `nvidia-h200-x2` (issue 64), from the folder scripts/gpu/stage_tp.sh
# stages: device run (kind nvidia-h200-x2), carry [".gpu-tp"]:
#   bash .gpu-tp/scripts/gpu/ep_dp.sh [ep|dp|all]
#   ep  the Qwen3-30B-A3B and Mixtral-8x7B shapes (dummy bf16 weights): one GPU, TP=2 and EP=2
#       (`--enable-expert-parallel`), batch-1 decode (`bench latency`, 128 in / 256 out) and
#       EP_OFFLINE=1 adds offline 1000 x (1024 in, 128 out) (`bench throughput`); EP_SHAPES picks
#       the shapes (Mixtral-8x7B's 93 GB of bf16 fits one H200, not one H100)
#   dp  the Llama-3.2-1B and 8B shapes: `bench serve` at rate inf (DP_PROMPTS prompts, default
#       1000, of 1024 in / 128 out) against one replica and `--data-parallel-size 2`
# The correctness checks of both are gpu-tp-tests (`ep_mixtures_match_one_gpu`, in tp.sh check)
# and the CPU tests (tests/expert_parallel.rs, tests/data_parallel.rs).
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0): it is forbidden on these hosts.
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)   # the staged folder
out=${OUT:-/tmp/pagewise-out}
work=/tmp/pagewise-gpu
what=${1:-all}
mkdir -p "$out" "$work/bin"
export NCCL_NVLS_ENABLE=0
nccl_lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))')
export LD_LIBRARY_PATH="$nccl_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee "$out/gpus.txt"
bin=$work/bin/pagewise
python3 -c 'import lzma,sys; open(sys.argv[2],"wb").write(lzma.open(sys.argv[1]).read())' "$here/pagewise.xz" "$bin"
chmod +x "$bin"
cfg=$work/ep-dp-shapes
python3 - "$cfg" <<'PY'
import json, os, sys
common = dict(hidden_act="silu", rms_norm_eps=1e-5, torch_dtype="bfloat16", bos_token_id=1, eos_token_id=2,
              attention_bias=False, mlp_bias=False, tie_word_embeddings=False)
llama3 = dict(common, architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=128256,
              max_position_embeddings=131072, rope_theta=500000.0, head_dim=None,
              rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
shapes = {
    "qwen3-30b-a3b": dict(common, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
                          vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                          moe_intermediate_size=768, num_hidden_layers=48, num_attention_heads=32,
                          num_key_value_heads=4, head_dim=128, rope_theta=1000000.0,
                          max_position_embeddings=40960, num_experts=128, num_experts_per_tok=8,
                          norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], rms_norm_eps=1e-6),
    "mixtral-8x7b": dict(common, architectures=["MixtralForCausalLM"], model_type="mixtral", vocab_size=32000,
                         hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=128, rope_theta=1000000.0,
                         max_position_embeddings=32768, num_local_experts=8, num_experts_per_tok=2,
                         sliding_window=None),
    "llama-1b": dict(llama3, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                     num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True),
    "llama-8b": dict(llama3, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=8, rope_scaling=dict(llama3["rope_scaling"], factor=8.0)),
}
for name, c in shapes.items():
    c = {k: v for k, v in c.items() if v is not None}
    os.makedirs(f"{sys.argv[1]}/{name}", exist_ok=True)
    json.dump(c, open(f"{sys.argv[1]}/{name}/config.json", "w"), indent=1)
PY
for m in qwen3-30b-a3b mixtral-8x7b llama-1b llama-8b; do
  cp "$here/tests/fixtures/llama-gqa-tied/tokenizer.json" "$cfg/$m/"
done
status=0
if [ "$what" = ep ] || [ "$what" = all ]; then
  for shape in ${EP_SHAPES:-qwen3-30b-a3b mixtral-8x7b}; do
    for split in "one:1" "tp2:2" "ep2:2 --enable-expert-parallel"; do
      name=${split%%:*} flags=${split#*:}
      tp=${flags%% *} extra=${flags#"$tp"}
      echo "== $shape $name: batch-1 decode, 128 in / 256 out"
      # shellcheck disable=SC2086
      timeout 500 "$bin" bench latency --model "$cfg/$shape" --load-format dummy --max-model-len 4096 \
        --tensor-parallel-size "$tp" $extra --batch-size 1 --input-len 128 --output-len 256 \
        --num-iters-warmup 1 --num-iters 3 --output-json "$out/$shape-$name-latency.json" \
        2> "$out/$shape-$name-latency.stderr" | tail -3 || { status=1; tail -5 "$out/$shape-$name-latency.stderr"; }
      if [ "${EP_OFFLINE:-0}" = 1 ]; then
        echo "== $shape $name: offline, 1000 x (1024 in, 128 out)"
        # shellcheck disable=SC2086
        timeout 580 "$bin" bench throughput --model "$cfg/$shape" --load-format dummy --max-model-len 4096 \
          --tensor-parallel-size "$tp" $extra --num-prompts 1000 --input-len 1024 --output-len 128 \
          --output-json "$out/$shape-$name-throughput.json" 2> "$out/$shape-$name-throughput.stderr" | tail -2 \
          || { status=1; tail -5 "$out/$shape-$name-throughput.stderr"; }
      fi
    done
  done
fi
if [ "$what" = dp ] || [ "$what" = all ]; then
  port=8400
  for shape in ${DP_SHAPES:-llama-1b llama-8b}; do
    for dp in 1 2; do
      "$bin" serve "$cfg/$shape" --load-format dummy --max-model-len 4096 --data-parallel-size $dp \
        --port $port --served-model-name "$shape" > "$out/$shape-dp$dp-serve.log" 2>&1 &
      pid=$!
      for _ in $(seq 600); do curl -sf "localhost:$port/ready" > /dev/null && break; sleep 0.5; done
      echo "== $shape DP=$dp: bench serve, ${DP_PROMPTS:-1000} prompts of 1024/128 at rate inf"
      timeout 500 "$bin" bench serve --base-url "http://127.0.0.1:$port" --model "$shape" \
        --num-prompts "${DP_PROMPTS:-1000}" --random-input-len 1024 --random-output-len 128 --ignore-eos \
        --no-progress --result-file "$out/$shape-dp$dp-serve.json" | grep -E "throughput|TTFT|TPOT|Successful" | head -8 \
        || status=1
      curl -s "localhost:$port/metrics" | grep -E "^pagewise:routed_requests_total" || true
      kill -TERM $pid; wait $pid
    done
  done
fi
exit $status
