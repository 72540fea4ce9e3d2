#!/usr/bin/env bash
# llama.cpp's CPU matmul per GGUF type (scripts/bench/ggml_matmul.c), the peer of pagewise-cpu's
# `bandwidth` test (issue 62): run both in one sitting and compare the tables row by row.
#
#   scripts/bench/ggml_matmul.sh [THREADS]
#
# Env: LCPP_DIR (the peer kit's CPU build: $LCPP_DIR/llama.cpp/build-cpu; default /tmp/lcpp),
# OUT (where the binary goes; /tmp/ggml-matmul).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SRC=${LCPP_DIR:-/tmp/lcpp}/llama.cpp
BUILD=$SRC/build-cpu
OUT=${OUT:-/tmp/ggml-matmul}
mkdir -p "$OUT"
[ -d "$BUILD" ] || { echo "no CPU build in $BUILD: run the peer kit's 'run.sh cpu-build' first" >&2; exit 1; }
libs=$(dirname "$(find "$BUILD" -name 'libggml-cpu*.so' | head -1)")
cc -O2 -o "$OUT/ggml_matmul" "$HERE/ggml_matmul.c" -I"$SRC/ggml/include" \
  -L"$libs" -Wl,-rpath,"$libs" -lggml -lggml-base -lggml-cpu -lm
"$OUT/ggml_matmul" "${1:-2}"
