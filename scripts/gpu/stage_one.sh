#!/usr/bin/env bash
# Stages one binary of .gpu/ (after scripts/gpu/build.sh) in its own folder, .gpu-NAME, with the
# scripts and run.sh: the tracked tree takes ~45 MB of the device call's 64 MiB carry, so a call
# carries one staged binary. Then, for example:
#   scripts/gpu/stage_one.sh kernel-tests       device run, carry [".gpu-kernel-tests"]:
#     INT4_PARTS=kernels bash .gpu-kernel-tests/run.sh int4
#   scripts/gpu/stage_one.sh gpu-engine-tests   INT4_PARTS=engine bash .gpu-gpu-engine-tests/run.sh int4
#   scripts/gpu/stage_one.sh pagewise           INT4_PARTS=bench bash .gpu-pagewise/run.sh int4
# (Within one warm machine the unpacked binaries stay in /tmp/pagewise-gpu/bin between calls.)
set -euo pipefail
cd "$(dirname "$0")/../.."
for name in "$@"; do
  [ -f ".gpu/$name.xz" ] || { echo "no .gpu/$name.xz: run scripts/gpu/build.sh" >&2; exit 1; }
  rm -rf ".gpu-$name" && mkdir ".gpu-$name"
  cp -r .gpu/scripts .gpu/tests ".gpu-$name/"
  cp scripts/gpu/run.sh ".gpu-$name/run.sh"
  cp ".gpu/$name.xz" ".gpu-$name/"
  # The engine tests' gpt-oss MXFP4 GGUF is written by the llama.cpp kit's gguf-py: its tarball
  # (2.7 MB) cut down to gguf-py (0.1 MB), which is what run.sh takes from it.
  if [ "$name" = gpu-engine-tests ] && [ -f .gpu/lcpp/lcpp.tar.xz ]; then
    tmp=$(mktemp -d) && tar -xJf .gpu/lcpp/lcpp.tar.xz -C "$tmp" --wildcards '*/gguf-py/*'
    mkdir ".gpu-$name/lcpp" && tar -cJf ".gpu-$name/lcpp/lcpp.tar.xz" -C "$tmp" . && rm -rf "$tmp"
  fi
  du -sh ".gpu-$name"
done
