#!/usr/bin/env bash
# Builds the CUDA binaries here (no GPU needed) and stages them in .gpu/ for one device call:
#   scripts/gpu/build.sh
#   device run, carry [".gpu"]:  bash .gpu/run.sh [tests|bench|all]
# Staged: the release `pagewise` binary, the kernels' tests (one binary) and the GPU engine tests
# (stripped and xz-compressed: 15-21 MB each, so a call carries one of them, scripts/gpu/stage_one.sh),
# the model-making script, tokenizer fixture and run.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
CUDA_HOME=$(scripts/cuda/setup_toolkit.sh)
export CUDA_HOME PATH="$CUDA_HOME/bin:$PATH" CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
export LIBRARY_PATH="$CUDA_HOME/lib64/stubs:$CUDA_HOME/lib64"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/pagewise/target-cuda}"

# Prints the executables of a cargo build's JSON messages whose target name matches $1.
executables() {
  python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])' "$1"
}

# NCCL included (tensor parallelism): the staged scripts put the GPU machine's libnccl.so.2 (the
# nvidia-nccl-cu13 wheel) on LD_LIBRARY_PATH.
cargo build --release --features nccl --bin pagewise
kernel_json=$(cargo test -p pagewise-kernels --release --features nccl --no-run --message-format=json)
kernel_tests=$(executables gpu <<< "$kernel_json")
engine_tests=$(cargo test --release --features nccl --test gpu_engine --no-run --message-format=json | executables gpu_engine)

rm -rf .gpu && mkdir -p .gpu/scripts/gpu .gpu/tests/fixtures/llama-gqa-tied
for pair in "$CARGO_TARGET_DIR/release/pagewise:pagewise" "$kernel_tests:kernel-tests" "$engine_tests:gpu-engine-tests"; do
  src=${pair%%:*} name=${pair##*:}
  cp "$src" ".gpu/$name"
  strip ".gpu/$name"
  xz -T2 -9e ".gpu/$name"
done
cp scripts/gpu/make_gpu_models.py scripts/gpu/arch_speed.sh scripts/gpu/ncu_step.py scripts/gpu/profile_arch.sh scripts/gpu/run.sh scripts/gpu/scoreboard.sh scripts/gpu/hf_baselines.py scripts/gpu/hf_server.py scripts/gpu/long_serve.sh scripts/gpu/moe_peer.sh scripts/gpu/mkgguf_moe.py scripts/gpu/gguf_peer.sh .gpu/scripts/gpu/
cp tests/fixtures/llama-gqa-tied/tokenizer.json .gpu/tests/fixtures/llama-gqa-tied/
cp scripts/gpu/run.sh .gpu/run.sh
# The llama.cpp peer kit, for moe_peer.sh (writable: its run.sh extracts next to itself).
kit=../shared/peers/llama.cpp
[ -d "$kit" ] && rm -rf .gpu/lcpp && cp -r "$kit" .gpu/lcpp && chmod -R u+w .gpu/lcpp
# A real 49k vocabulary (SmolLM2's) for the `structured` benchmark's dummy-weight shape, when the
# GGUF and gguf-py are at hand (pip install --target /tmp/ggufpy gguf==0.17.1).
gguf=${PAGEWISE_SMOLLM2_GGUF:-$HOME/.cache/pagewise/models/SmolLM2-135M-Instruct.Q4_1.gguf}
if [ -f "$gguf" ] && PYTHONPATH=${GGUFPY:-/tmp/ggufpy} python3 -c "import gguf" 2> /dev/null; then
  mkdir -p .gpu/bench
  PYTHONPATH=${GGUFPY:-/tmp/ggufpy} python3 scripts/gpu/gguf_tokenizer.py "$gguf" .gpu/bench/tokenizer.json \
    && xz -9 .gpu/bench/tokenizer.json
fi
du -sh .gpu
