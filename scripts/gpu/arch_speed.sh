#!/usr/bin/env bash
# Batch-1 decode speed of the architectures of issue 23 at their common sizes, with random weights
# (--load-format dummy, bf16), on the GPU machine from the staged .gpu/ folder:
#   bash .gpu/scripts/gpu/arch_speed.sh [shape ...]   (default: all four)
#   CONTEXTS="1024 8192 32768" bash .gpu/scripts/gpu/arch_speed.sh gemma-3-12b   (decode against context)
#   BATCHES="16 32" bash .gpu/scripts/gpu/arch_speed.sh gpt-oss-20b   (decode against batch size)
#   QUANTS="bf16 awq" bash .gpu/scripts/gpu/arch_speed.sh qwen3-30b-a3b   (bf16, then the shape with an AWQ
#     checkpoint's config: 4-bit codes in groups of 128 with zero points, experts included)
# Shapes: qwen3-8b, mistral-7b, phi-4, gemma-3-12b (the text model); the mixtures of experts
# mixtral-8x7b, qwen3-30b-a3b, gpt-oss-20b and gpt-oss-120b (MXFP4 experts, as gpt-oss ships them; not in
# the default list). Prints each `bench latency` summary and the weight bytes, so effective bandwidth =
# bytes x tok/s. PAGEWISE_BIN=path runs another build (an A/B in one call: the other commit's
# binary, unpacked next to the staged one).
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
bin=${PAGEWISE_BIN:-/tmp/pagewise-gpu/bin/pagewise}
mkdir -p "$(dirname "$bin")"
[ -x "$bin" ] || python3 -c 'import lzma,sys; open(sys.argv[2],"wb").write(lzma.open(sys.argv[1]).read())' "$here/pagewise.xz" "$bin"
chmod +x "$bin"
nccl_lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2> /dev/null)
[ -n "$nccl_lib" ] && export LD_LIBRARY_PATH="$nccl_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0
cfg=/tmp/pagewise-gpu/arch-shapes
python3 - "$cfg" <<'PY'
import json, os, sys
llama = dict(hidden_act="silu", rms_norm_eps=1e-5, torch_dtype="bfloat16", bos_token_id=1, eos_token_id=2,
             attention_bias=False, mlp_bias=False, tie_word_embeddings=False)
shapes = {
    "qwen3-8b": dict(llama, architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=151936,
                     hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, rope_theta=1000000.0, max_position_embeddings=40960,
                     rms_norm_eps=1e-6),
    "mistral-7b": dict(llama, architectures=["MistralForCausalLM"], model_type="mistral", vocab_size=32768,
                       hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=8, head_dim=128, rope_theta=1000000.0, max_position_embeddings=32768,
                       sliding_window=None),
    "phi-4": dict(llama, architectures=["Phi3ForCausalLM"], model_type="phi3", vocab_size=100352,
                  hidden_size=5120, intermediate_size=17920, num_hidden_layers=40, num_attention_heads=40,
                  num_key_value_heads=10, rope_theta=250000.0, max_position_embeddings=16384,
                  original_max_position_embeddings=16384, rope_scaling=None, sliding_window=None),
    "gemma-3-12b": dict(architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", vocab_size=262208,
                        hidden_size=3840, intermediate_size=15360, num_hidden_layers=48, num_attention_heads=16,
                        num_key_value_heads=8, head_dim=256, query_pre_attn_scalar=256, sliding_window=1024,
                        sliding_window_pattern=6, rope_theta=1000000.0, rope_local_base_freq=10000.0,
                        rope_scaling={"rope_type": "linear", "factor": 8.0}, max_position_embeddings=131072,
                        rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
                        torch_dtype="bfloat16", bos_token_id=2, eos_token_id=1),
    # Mixtures of experts (issue 25): their parameters, and what a batch-1 step reads (the chosen
    # experts only).
    "mixtral-8x7b": dict(llama, architectures=["MixtralForCausalLM"], model_type="mixtral", vocab_size=32000,
                         hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=128, rope_theta=1000000.0, max_position_embeddings=32768,
                         num_local_experts=8, num_experts_per_tok=2, sliding_window=None),
    "qwen3-30b-a3b": dict(llama, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", vocab_size=151936,
                          hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=48,
                          num_attention_heads=32, num_key_value_heads=4, head_dim=128, rope_theta=1000000.0,
                          max_position_embeddings=40960, num_experts=128, num_experts_per_tok=8,
                          norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], rms_norm_eps=1e-6),
    "gpt-oss-20b": dict(llama, architectures=["GptOssForCausalLM"], model_type="gpt_oss", vocab_size=201088,
                        hidden_size=2880, intermediate_size=2880, num_hidden_layers=24, num_attention_heads=64,
                        num_key_value_heads=8, head_dim=64, num_local_experts=32, num_experts_per_tok=4,
                        sliding_window=128, rope_theta=150000.0, max_position_embeddings=131072,
                        rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                      "original_max_position_embeddings": 4096, "truncate": False},
                        attention_bias=True, eos_token_id=200002, bos_token_id=199998),
}
shapes["gpt-oss-120b"] = dict(shapes["gpt-oss-20b"], num_hidden_layers=36, num_local_experts=128)
def params(c, active=False):
    h, i, l = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    d = c.get("head_dim") or h // c["num_attention_heads"]
    attn = h * d * (2 * c["num_attention_heads"] + 2 * c["num_key_value_heads"])
    head = 0 if c.get("tie_word_embeddings") else c["vocab_size"] * h
    experts = c.get("num_local_experts") or c.get("num_experts")
    if experts:
        inner = c.get("moe_intermediate_size", i)
        mlp = (c["num_experts_per_tok"] if active else experts) * 3 * h * inner + h * experts
    else:
        mlp = 3 * h * i
    return l * (attn + mlp) + c["vocab_size"] * h + head
for name, c in shapes.items():
    os.makedirs(f"{sys.argv[1]}/{name}", exist_ok=True)
    json.dump(c, open(f"{sys.argv[1]}/{name}/config.json", "w"), indent=1)
    # Bytes a decode step reads: every matrix once (the embedding row is negligible, a tied head
    # is read as the head).
    embed = 0 if c.get("tie_word_embeddings") else c["vocab_size"] * c["hidden_size"]
    read = 2 * (params(c, active=True) - embed)
    if c["model_type"] == "gpt_oss":  # MXFP4 experts: 17 bytes a run of 32 where bf16 takes 64
        read -= (2 - 17 / 32) * c["num_hidden_layers"] * c["num_experts_per_tok"] * 3 * c["hidden_size"] * c["intermediate_size"]
    print(f"{name}: {params(c) / 1e9:.2f} B parameters, {read / 1e9:.2f} GB read a step")
PY
for shape in ${@:-qwen3-8b mistral-7b phi-4 gemma-3-12b}; do
 cp "$here/tests/fixtures/llama-gqa-tied/tokenizer.json" "$cfg/$shape/"
 for q in ${QUANTS:-bf16}; do
  m=$shape
  if [ "$q" = awq ]; then
    m=$shape-awq
    rm -rf "${cfg:?}/$m" && cp -r "$cfg/$shape" "$cfg/$m"
    python3 -c 'import json,sys; p=sys.argv[1]+"/config.json"; c=json.load(open(p)); c["quantization_config"]={"quant_method":"awq","bits":4,"group_size":128,"version":"gemm","zero_point":True,"modules_to_not_convert":["gate"]}; json.dump(c,open(p,"w"))' "$cfg/$m"
  fi
  if [ -n "${BATCHES:-}" ]; then
    # Decode speed against batch size: BATCHES="16 32", 128 in / 128 out each.
    for b in $BATCHES; do
      echo "== $m: batch-$b decode, 128 in / 128 out"
      timeout 240 "$bin" bench latency --model "$cfg/$m" --load-format dummy --batch-size "$b" --input-len 128 \
        --output-len 128 --num-iters-warmup 1 --num-iters 2 --max-model-len 512 2>&1 | grep -E "tok/s|rror" | tail -2
    done
    continue
  fi
  if [ -n "${CONTEXTS:-}" ]; then
    # Decode speed against context length: CONTEXTS="1024 8192 32768", 64 tokens after each.
    for c in $CONTEXTS; do
      echo "== $m: batch-1 decode after $c prompt tokens"
      timeout 280 "$bin" bench latency --model "$cfg/$m" --load-format dummy --batch-size 1 --input-len "$c" \
        --output-len 64 --num-iters-warmup 0 --num-iters 1 --max-model-len $((c + 64)) 2>&1 | grep -E "tok/s|rror" | tail -2
    done
    continue
  fi
  echo "== $m: batch-1 decode, 128 in / 512 out"
  timeout 240 "$bin" bench latency --model "$cfg/$m" --load-format dummy --batch-size 1 --input-len 128 \
    --output-len 512 --num-iters-warmup 1 --num-iters 3 --max-model-len 1024 2>&1 | grep -E "tok/s|per step|rror" | tail -3
 done
done
