#!/usr/bin/env bash
# Builds (with NCCL) and stages only what scripts/gpu/tp.sh and ep_dp.sh need in .gpu-tp/: the release
# binary, the two-GPU NCCL test, the scripts, the tokenizer fixture, the OpenAI SDK suite and
# its wheels, well inside the 64 MiB a device call carries:
#   scripts/gpu/stage_tp.sh
#   device run (kind nvidia-h200-x2), carry [".gpu-tp"]:  bash .gpu-tp/scripts/gpu/tp.sh [check|bench|all]
set -euo pipefail
cd "$(dirname "$0")/../.."
CUDA_HOME=$(scripts/cuda/setup_toolkit.sh)
export CUDA_HOME PATH="$CUDA_HOME/bin:$PATH" CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
export LIBRARY_PATH="$CUDA_HOME/lib64/stubs:$CUDA_HOME/lib64"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/pagewise/target-cuda}"
cargo build --release --features nccl --bin pagewise
tp_tests=$(cargo test --release --features nccl --test gpu_tensor_parallel --no-run --message-format=json \
  | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "gpu_tensor_parallel":
        print(m["executable"])')
rm -rf .gpu-tp && mkdir -p .gpu-tp/scripts/gpu .gpu-tp/tests/fixtures/llama-gqa-tied .gpu-tp/tests/openai_sdk
for pair in "$CARGO_TARGET_DIR/release/pagewise:pagewise" "$tp_tests:gpu-tp-tests"; do
  cp "${pair%%:*}" ".gpu-tp/${pair##*:}"
  strip ".gpu-tp/${pair##*:}"
  xz -T2 -3 ".gpu-tp/${pair##*:}"
done
python3 -m pip download --quiet --disable-pip-version-check --dest .gpu-tp/wheels \
  --python-version 3.12 --only-binary=:all: --platform manylinux2014_x86_64 \
  --platform manylinux_2_17_x86_64 --platform any 'openai==3.57.0' 'pytest==9.2.0'
cp scripts/gpu/tp.sh scripts/gpu/tp_check.py scripts/gpu/ep_dp.sh scripts/gpu/make_gpu_models.py .gpu-tp/scripts/gpu/
cp tests/fixtures/llama-gqa-tied/tokenizer.json .gpu-tp/tests/fixtures/llama-gqa-tied/
cp tests/fixtures/make_gptoss_mxfp4.py tests/fixtures/make_tiny_models.py .gpu-tp/tests/fixtures/
cp tests/openai_sdk/test_openai_sdk.py .gpu-tp/tests/openai_sdk/
du -sh .gpu-tp
