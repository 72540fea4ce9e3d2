#!/usr/bin/env bash
# The H200 scoreboard (benches/RESULTS.md), run on the GPU machine by `bash .gpu/run.sh scoreboard`:
# random weights (--load-format dummy), bf16, Llama-3.2-1B and Llama-3.1-8B shapes; batch-1 decode,
# offline throughput, serving at several request rates with `pagewise bench serve`, then the
# transformers baselines (scripts/gpu/hf_baselines.py). Each run is bounded so the call fits the
# device tool's 10 minutes. SCOREBOARD_MODELS, SCOREBOARD_PARTS (latency throughput serve hfserve)
# and SCOREBOARD_RATES (rate:prompts ...) narrow it; SCOREBOARD_NO_HF=1 skips the batch-1 and
# offline baselines. The part `hfserve` (not run by default: it is slow) serves the same shapes
# with transformers (scripts/gpu/hf_server.py) and measures them with the same `bench serve` at
# SCOREBOARD_HF_RATES (default "inf:100 16:100 4:100 1:100").
# Raw results stay in /tmp/pagewise-scoreboard-NAME; $OUT/NAME.json merges them (the device tool
# brings back only a few files), and a summary is printed. NAME is SCOREBOARD_NAME (default
# scoreboard); give two runs on two GPUs (CUDA_VISIBLE_DEVICES) different names and
# SCOREBOARD_PORT / SCOREBOARD_HF_PORT (default 8100 / 8200).
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)   # the staged .gpu folder
bin=${PAGEWISE_BIN:-/tmp/pagewise-gpu/bin/pagewise}
name=${SCOREBOARD_NAME:-scoreboard}
out=/tmp/pagewise-$name
final=${OUT:-/tmp/pagewise-out}/$name.json
port=${SCOREBOARD_PORT:-8100} hf_port=${SCOREBOARD_HF_PORT:-8200}
cfg=/tmp/pagewise-gpu/shapes
mkdir -p "$out" "$(dirname "$final")" "$cfg/llama-1b" "$cfg/llama-8b"
python3 - "$cfg" <<'PY'
import json, sys
base = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu", vocab_size=128256,
            max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0, bos_token_id=128000,
            eos_token_id=128001, torch_dtype="bfloat16", attention_bias=False, mlp_bias=False,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
shapes = {"llama-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                           num_key_value_heads=8, head_dim=64, tie_word_embeddings=True),
          "llama-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                           num_key_value_heads=8, head_dim=128, tie_word_embeddings=False)}
for name, s in shapes.items():
    json.dump({**base, **s}, open(f"{sys.argv[1]}/{name}/config.json", "w"), indent=1)
PY
for m in llama-1b llama-8b; do cp "$here/tests/fixtures/llama-gqa-tied/tokenizer.json" "$cfg/$m/"; done

run() { local t=$1; shift; timeout "$t" "$@" 2>> "$out/stderr.log"; }
parts=${SCOREBOARD_PARTS:-latency throughput serve}
has() { [[ " $parts " == *" $1 "* ]]; }
# serve_rates PORT PREFIX RATE:PROMPTS...: `bench serve` against the server on PORT at each rate.
serve_rates() {
  local port=$1 prefix=$2 spec rate n limit; shift 2
  for spec in "$@"; do
    rate=${spec%%:*} n=${spec##*:}
    echo "== $prefix: $n prompts of 1024/128 at request rate $rate"
    # The arrivals alone take n / rate seconds; four minutes more for the last requests.
    limit=300
    [ "$rate" != inf ] && limit=$(( n / rate + 240 ))
    run "$limit" "$bin" bench serve --base-url "http://127.0.0.1:$port" --model "$m" --num-prompts "$n" \
      --random-input-len 1024 --random-output-len 128 --request-rate "$rate" --ignore-eos --no-progress \
      --result-file "$out/$prefix-$rate.json" | grep -E "throughput|TTFT|TPOT|ITL|Successful" | head -12
  done
}
for m in ${SCOREBOARD_MODELS:-llama-1b llama-8b}; do
  d="$cfg/$m"
  if has latency; then
    echo "== $m: batch-1 decode, 128 in / 512 out"
    run 120 "$bin" bench latency --model "$d" --load-format dummy --batch-size 1 --input-len 128 --output-len 512 \
      --num-iters-warmup 1 --num-iters 3 --output-json "$out/$m-latency.json" | tail -2
  fi
  if has throughput; then
    echo "== $m: offline, 1000 x (1024 in, 128 out)"
    run 180 "$bin" bench throughput --model "$d" --load-format dummy --num-prompts 1000 --input-len 1024 --output-len 128 \
      --output-json "$out/$m-throughput.json" | tail -1
  fi
  if has serve; then
    "$bin" serve "$d" --load-format dummy --port "$port" --served-model-name "$m" > "$out/$m-serve.log" 2>&1 &
    pid=$!
    for _ in $(seq 240); do curl -sf "localhost:$port/ready" > /dev/null && break; sleep 0.5; done
    serve_rates "$port" "$m-serve" ${SCOREBOARD_RATES:-inf:1000 16:500 4:100}
    kill -TERM $pid; wait $pid
    # (a chart needs a TrueType font, which the GPU machine lacks: draw it here with `bench plot`)
    ls "$out/$m"-serve-*.json > /dev/null 2>&1 && \
      "$bin" bench plot "$out/$m"-serve-*.json --out "$(dirname "$final")/$m-sweep.png" 2> /dev/null
  fi
  if has hfserve; then
    python3 "$here/scripts/gpu/hf_server.py" "$d" --port "$hf_port" > "$out/$m-hf-server.log" 2>&1 &
    pid=$!
    for _ in $(seq 600); do curl -sf "localhost:$hf_port/ready" > /dev/null && break; sleep 0.5; done
    serve_rates "$hf_port" "$m-hf-serve" ${SCOREBOARD_HF_RATES:-inf:100 16:100 4:100 1:100}
    kill -TERM $pid; wait $pid
  fi
done
if [ -z "${SCOREBOARD_NO_HF:-}" ]; then
  echo "== transformers baselines"
  timeout 360 python3 "$here/scripts/gpu/hf_baselines.py" $(for m in ${SCOREBOARD_MODELS:-llama-1b llama-8b}; do echo "$cfg/$m"; done) \
    > "$out/hf.jsonl" 2> "$out/hf.err"; tail -3 "$out/hf.err"
fi
python3 - "$out" "$final" <<'PY'
import glob, json, os, sys
raw, final = sys.argv[1], sys.argv[2]
merged = {}
for f in sorted(glob.glob(f"{raw}/*.json")):
    merged[os.path.basename(f)[:-5]] = json.load(open(f))
hf = f"{raw}/hf.jsonl"
merged["hf"] = [json.loads(l) for l in open(hf)] if os.path.exists(hf) else []
json.dump(merged, open(final, "w"), indent=1)
for k, v in merged.items():
    if k == "hf":
        for row in v: print(row)
    elif "serve" in k:
        print(k, {m: (round(v[m]["median_ms"], 1), round(v[m]["p99_ms"], 1)) for m in ("ttft", "tpot", "itl")},
              "req/s", round(v["request_throughput"], 2), "done", v["completed"], "failed", v["failed"])
        st = v.get("server_steps")
        if st:
            host = st["schedule_ms"] + st["prepare_ms"] + st["update_ms"]
            print("   server engine per step (ms): host (schedule + prepare + update)", round(host, 3),
                  "forward", round(st["forward_ms"], 3), "sample", round(st["sample_ms"], 3),
                  "text", round(st["text_ms"], 3), "over", st["steps"], "steps")
    else:
        print(k, {a: b for a, b in v.items() if not isinstance(b, dict)})
PY
