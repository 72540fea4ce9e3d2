#!/usr/bin/env bash
# Where a CPU decode step's time goes (issue 62): `pagewise bench latency` on a short prompt and a
# long output (so decode steps dominate), sampled by `perf record` on every thread, then each
# symbol's self time put into one of a few kinds (the weight kernels, activation quantization,
# attention, candle's element-wise ops and copies, allocation, the thread team's waiting,
# sampling, the kernel) with the top symbols under them.
#
#   scripts/bench/cpu_step_profile.sh MODEL.gguf [OUTPUT_LEN]
#
# Env: PAGEWISE (the binary; default target/release/pagewise), THREADS (2), OUT
# (/tmp/cpu-step-profile: the perf data and reports). Needs `perf` (linux-perf) and a release build
# with symbols (the release profile keeps them).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PAGEWISE=${PAGEWISE:-$HERE/target/release/pagewise}
THREADS=${THREADS:-2}
OUT=${OUT:-/tmp/cpu-step-profile}
model=$1
output_len=${2:-256}
mkdir -p "$OUT"
export RAYON_NUM_THREADS=$THREADS

# Two runs, OUTPUT_LEN and three times as many tokens: the difference of their samples is what
# 2 x OUTPUT_LEN decode steps cost (loading, warm-up and prefill cancel out).
for n in "$output_len" $((3 * output_len)); do
  perf record -q -F 4000 -o "$OUT/perf-$n.data" -- "$PAGEWISE" bench latency --model "$model" \
    --batch-size 1 --input-len 8 --output-len "$n" --num-iters-warmup 0 --num-iters 1 \
    --max-model-len 1024 > "$OUT/bench-$n.log" 2>&1
  grep "decode alone" "$OUT/bench-$n.log" || tail -5 "$OUT/bench-$n.log"
  perf report -q -n -i "$OUT/perf-$n.data" --no-children --sort symbol --stdio 2> /dev/null \
    > "$OUT/symbols-$n.txt"
done

rate=$(grep -oE "decode alone [0-9.]+" "$OUT/bench-$((3 * output_len)).log" | grep -oE "[0-9.]+$")
python3 - "$OUT/symbols-$output_len.txt" "$OUT/symbols-$((3 * output_len)).txt" "$rate" "$THREADS" <<'PY'
import re, sys
kinds = [
    ("weight kernels (pagewise_cpu dot products)", r"pagewise_cpu::.*(dot|tile|kernel|gemv|rows)|dot_q|halves"),
    ("activation quantization", r"quantiz"),
    ("attention", r"attention|attend|paged|softmax_row"),
    ("sampling", r"sampler|sample|argmax|top_k|top_p"),
    ("candle element-wise and copies", r"candle_core|candle_nn|copy_strided|binary_map|unary_map|rms_norm|rope"),
    ("allocation and memory", r"malloc|free|memcpy|memset|memmove|_int_|mmap|munmap|brk"),
    ("thread team and waiting", r"pagewise_cpu::team|rayon|crossbeam|futex|sched_yield|spin|park|wait|std::thread|pause"),
    ("kernel (page faults, scheduling)", r"^\[k\]"),
]
def samples(path):
    out = {}
    for line in open(path):
        m = re.match(r"\s*[0-9.]+%\s+([0-9]+)\s+(\[.\])\s+(.*)$", line)
        if m:
            key = m.group(2) + " " + m.group(3).strip()
            out[key] = out.get(key, 0) + int(m.group(1))
    return out
short, long_ = samples(sys.argv[1]), samples(sys.argv[2])
step_us, threads = 1e6 / float(sys.argv[3]), int(sys.argv[4])
diff = {k: long_.get(k, 0) - short.get(k, 0) for k in set(short) | set(long_)}
total = sum(v for v in diff.values() if v > 0)
by_kind, tops = {}, {}
for name, n in diff.items():
    if n <= 0:
        continue
    kind = next((k for k, rx in kinds if re.search(rx, name, re.I)), "other")
    by_kind[kind] = by_kind.get(kind, 0) + n
    tops.setdefault(kind, []).append((n, name[4:]))
# (Samples become time through the measured step: perf's rate is not exact.)
us = lambda n: n / total * step_us * threads
print(f"decode step {step_us:.0f} µs ({threads} threads: {step_us * threads:.0f} µs of CPU time)")
print("| kind | µs of CPU a step | share | top symbols |")
print("|---|---|---|---|")
for kind, n in sorted(by_kind.items(), key=lambda kv: -kv[1]):
    top = ", ".join(f"{s[:56]} {us(c):.0f}" for c, s in sorted(tops[kind], reverse=True)[:3])
    print(f"| {kind} | {us(n):.0f} | {100 * n / total:.1f}% | {top} |")
PY
