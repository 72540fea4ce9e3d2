#!/usr/bin/env bash
# Builds the GPU probes (benches/probes/README.md) into OUT_DIR (default benches/probes/bin, ignored
# by git), with the toolkit scripts/cuda/setup_toolkit.sh finds, for the H200 (sm_90):
#   bash benches/probes/build.sh [OUT_DIR]
# then copy OUT_DIR into .gpu/ and run `.gpu/<probe> [args]` on the GPU machine.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/bin}
mkdir -p "$out"
cuda=${CUDA_HOME:-$(bash "$here/../../scripts/cuda/setup_toolkit.sh")}
for probe in gemv_stream persistent_layer gemv_int4; do
  "$cuda/bin/nvcc" -arch=sm_90 -O3 -std=c++17 -c "$here/$probe.cu" -o "$out/$probe.o"
  g++ "$out/$probe.o" -L"$cuda/lib64" -lcudart_static -ldl -lpthread -lrt -o "$out/$probe"
  rm "$out/$probe.o"
done
echo "built: $out/gemv_stream $out/persistent_layer $out/gemv_int4"
