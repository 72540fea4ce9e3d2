#!/usr/bin/env bash
# A serving benchmark longer than one device call (1000 prompts at 1 req/s take ~17 minutes).
# `start` launches `pagewise serve` and `pagewise bench serve` in a session of their own (setsid),
# so they outlive the call; `wait` polls for the results in the calls after it. The device tool
# gives an idle machine back ~30 s after a call ends, so issue the calls back to back:
#   bash .gpu/run.sh long start llama-1b 1 1000    (MODEL: a scoreboard shape or a model path)
#   bash .gpu/run.sh long wait 560                 (again until it prints every result)
# Several runs can go at once, one per GPU of a multi-GPU machine, each with its own port:
#   LONG_SERVE_GPU=0 LONG_SERVE_PORT=8101 bash .gpu/run.sh long start llama-1b 1 1000
#   LONG_SERVE_GPU=1 LONG_SERVE_PORT=8102 bash .gpu/run.sh long start llama-8b 1 1000
# Each run lives in /tmp/pagewise-long/MODEL-serve-RATE-N/; `wait` waits for all of them and
# copies each finished run's result JSON and logs to $OUT.
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)   # the staged .gpu folder
bin=${PAGEWISE_BIN:-/tmp/pagewise-gpu/bin/pagewise}
root=/tmp/pagewise-long
out=${OUT:-/tmp/pagewise-out}
port=${LONG_SERVE_PORT:-8101}
gpu=${LONG_SERVE_GPU:-0}   # the GPU index this run's server sees as cuda:0
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
    run=$name-serve-$rate-$n
    dir=$root/$run
    rm -rf "$dir" && mkdir -p "$dir"
    CUDA_VISIBLE_DEVICES=$gpu setsid bash -c '
      bin=$1 path=$2 name=$3 rate=$4 n=$5 dir=$6 port=$7 input_len=$8 output_len=$9 extra=${10} run=${11}
      load=(); [ -d "$path" ] && [ ! -e "$path/model.safetensors" ] && load=(--load-format dummy)
      "$bin" serve "$path" "${load[@]}" --port "$port" --served-model-name "$name" > "$dir/serve.log" 2>&1 &
      server=$!
      for _ in $(seq 480); do curl -sf "localhost:$port/ready" > /dev/null && break; sleep 0.5; done
      "$bin" bench serve --base-url "http://127.0.0.1:$port" --model "$name" --num-prompts "$n" \
        --random-input-len "$input_len" --random-output-len "$output_len" --request-rate "$rate" --ignore-eos \
        --no-progress --result-file "$dir/$run.json" $extra > "$dir/bench.log" 2>&1
      echo $? > "$dir/status"
      kill -TERM $server; wait $server
    ' _ "$bin" "$path" "$name" "$rate" "$n" "$dir" "$port" "$input_len" "$output_len" "$extra" "$run" \
      < /dev/null > /dev/null 2>&1 &
    echo "started $run on GPU $gpu, port $port"
    ;;
  wait)
    limit=${2:-560}
    runs=$(ls -d "$root"/*/ 2> /dev/null)
    [ -n "$runs" ] || { echo "nothing started" >&2; exit 2; }
    for _ in $(seq "$limit"); do
      pending=0
      for d in $runs; do [ -f "$d/status" ] || pending=1; done
      [ $pending = 0 ] && break
      sleep 1
    done
    status=0
    for d in $runs; do
      run=$(basename "$d")
      if [ ! -f "$d/status" ]; then
        echo "still running: $run, started $(( $(date +%s) - $(stat -c %Y "$d") )) s ago"
        continue
      fi
      mkdir -p "$out/$run"
      cp "$d"/*.json "$d"/*.log "$out/$run/" 2> /dev/null
      echo "== $run (exit $(cat "$d/status"))"
      grep -E "requests|throughput|TTFT|TPOT|ITL|E2E|server engine" "$d/bench.log"
      [ "$(cat "$d/status")" = 0 ] || status=1
    done
    exit $status
    ;;
  *)
    echo "usage: $0 start MODEL RATE PROMPTS | wait [SECONDS]" >&2
    exit 2
    ;;
esac
