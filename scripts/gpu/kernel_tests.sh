#!/usr/bin/env bash
# Builds the CUDA kernel tests here (no GPU needed to build) into .gpu/, for the device tool to run:
#   scripts/gpu/kernel_tests.sh            # here: build and stage
#   device run, carry [".gpu"]: .gpu/run-kernel-tests.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
CUDA_HOME=$(scripts/cuda/setup_toolkit.sh)
export CUDA_HOME PATH="$CUDA_HOME/bin:$PATH" CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
export LIBRARY_PATH="$CUDA_HOME/lib64/stubs:$CUDA_HOME/lib64"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/pagewise/target-cuda}"
bin=$(cargo test -p pagewise-kernels --release --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "paged_attention" in m["target"]["name"]:
        print(m["executable"])')
mkdir -p .gpu
cp "$bin" .gpu/kernel-tests
strip .gpu/kernel-tests
cat > .gpu/run-kernel-tests.sh <<'RUN'
#!/usr/bin/env bash
set -eu
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
"$(dirname "$0")/kernel-tests" --test-threads=1 2>&1 | tee "${OUT:-/tmp}/kernel-tests.log"
RUN
chmod +x .gpu/run-kernel-tests.sh
ls -la .gpu/kernel-tests
