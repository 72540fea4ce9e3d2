#!/usr/bin/env bash
# A serving benchmark longer than one device call (1000 prompts at 1 req/s take ~17 minutes).
# `start` launches `pagewise serve` and `pagewise bench serve` in a session of their own (setsid),
# so they outlive the call; `wait` polls for the result in the calls after it. The device tool
# gives an idle machine back ~30 s after a call ends, so issue the calls back to back:
#   bash .gpu/run.sh long start llama-1b 1 1000    (MODEL: a scoreboard shape or a model path)
#   bash .gpu/run.sh long wait 560                 (again until it prints the result)
# Results: /tmp/pagewise-long/MODEL-serve-RATE-N.json, copied to $OUT when done.
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)   # the staged .gpu folder
bin=${PAGEWISE_BIN:-/tmp/pagewise-gpu/bin/pagewise}
dir=/tmp/pagewise-long
out=${OUT:-/tmp/pagewise-out}
port=${LONG_SERVE_PORT:-8101}
input_len=${LONG_SERVE_INPUT_LEN:-1024} output_len=${LONG_SERVE_OUTPUT_LEN:-128}
extra=${LONG_SERVE_BENCH_ARGS:-}   # more `bench serve` flags (e.g. --random-vocab-size N)

case "${1:-}" in
  start)
    [ $# -eq 4 ] || { echo "usage: $0 start MODEL RATE PROMPTS" >&2; exit 2; }
    model=$2 rate=$3 n=$4
    path=$model
    if [ ! -e "$path" ]; then
      # A scoreboard shape: scoreboard.sh writes the shapes' configs before anything else.
      SCOREBOARD_MODELS=none SCOREBOARD_PARTS=none SCOREBOARD_NO_HF=1 PAGEWISE_BIN="$bin" \
        bash "$here/scripts/gpu/scoreboard.sh" > /dev/null 2>&1
      path=/tmp/pagewise-gpu/shapes/$model
    fi
    [ -e "$path" ] || { echo "no model at $path" >&2; exit 2; }
    name=$(basename "$model")
    rm -rf "$dir" && mkdir -p "$dir"
    echo "$name-serve-$rate-$n" > "$dir/name"
    setsid bash -c '
      bin=$1 path=$2 name=$3 rate=$4 n=$5 dir=$6 port=$7 input_len=$8 output_len=$9 extra=${10}
      load=(); [ -d "$path" ] && [ ! -e "$path/model.safetensors" ] && load=(--load-format dummy)
      "$bin" serve "$path" "${load[@]}" --port "$port" --served-model-name "$name" > "$dir/serve.log" 2>&1 &
      server=$!
      for _ in $(seq 480); do curl -sf "localhost:$port/ready" > /dev/null && break; sleep 0.5; done
      "$bin" bench serve --base-url "http://127.0.0.1:$port" --model "$name" --num-prompts "$n" \
        --random-input-len "$input_len" --random-output-len "$output_len" --request-rate "$rate" --ignore-eos \
        --no-progress --result-file "$dir/$name-serve-$rate-$n.json" $extra > "$dir/bench.log" 2>&1
      echo $? > "$dir/status"
      kill -TERM $server; wait $server
    ' _ "$bin" "$path" "$name" "$rate" "$n" "$dir" "$port" "$input_len" "$output_len" "$extra" \
      < /dev/null > /dev/null 2>&1 &
    echo "started $(cat "$dir/name")"
    ;;
  wait)
    limit=${2:-560}
    [ -f "$dir/name" ] || { echo "nothing started" >&2; exit 2; }
    for _ in $(seq "$limit"); do [ -f "$dir/status" ] && break; sleep 1; done
    if [ ! -f "$dir/status" ]; then
      echo "still running: $(cat "$dir/name"), started $(( $(date +%s) - $(stat -c %Y "$dir/name") )) s ago"
      exit 0
    fi
    mkdir -p "$out"
    cp "$dir"/*.json "$out/" 2> /dev/null
    grep -E "requests|throughput|TTFT|TPOT|ITL|E2E|server engine" "$dir/bench.log"
    exit "$(cat "$dir/status")"
    ;;
  *)
    echo "usage: $0 start MODEL RATE PROMPTS | wait [SECONDS]" >&2
    exit 2
    ;;
esac
