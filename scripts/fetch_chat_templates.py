"""Fetches the real chat templates of the model families pagewise serves (Llama 3.x, Qwen2.5, Qwen3,
Gemma, Phi-3.5, Mistral, gpt-oss, SmolLM3) for the chat-template tests, caches them, and prints the
cache directory.

The templates are the copies llama.cpp keeps in models/templates/, taken from the pinned
llama-cpp-python sdist on PyPI (downloaded from the index's simple page, sha256-checked, never
built or installed: `pip download` of an sdist would build its metadata, cmake included). They are
third-party files, so they are fetched rather than committed. The cache is
$PAGEWISE_CACHE_DIR/chat-templates, by default ~/.cache/pagewise/chat-templates.
tests/fixtures/make_chat_templates.py renders them with transformers; tests/chat_templates.rs
renders them with pagewise and compares.
"""

import hashlib
import os
import re
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request

VERSION = "0.3.36"
INDEX = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
PREFIX = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/models/templates/"
TEMPLATES = [
    "meta-llama-Llama-3.1-8B-Instruct",
    "meta-llama-Llama-3.2-3B-Instruct",
    "Qwen-Qwen2.5-7B-Instruct",
    "Qwen-Qwen3-0.6B",
    "google-gemma-2-2b-it",
    "google-gemma-4-31B-it",
    "microsoft-Phi-3.5-mini-instruct",
    "mistralai-Mistral-Nemo-Instruct-2407",
    "Mistral-Small-3.2-24B-Instruct-2506",
    "openai-gpt-oss-120b",
    "HuggingFaceTB-SmolLM3-3B",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    root = os.environ.get("PAGEWISE_CACHE_DIR") or os.path.expanduser("~/.cache/pagewise")
    cache = os.path.join(root, "chat-templates")
    stamp = os.path.join(cache, f"llama-cpp-python-{VERSION}")
    if os.path.isfile(stamp) and all(os.path.isfile(os.path.join(cache, f"{t}.jinja")) for t in TEMPLATES):
        print(cache)
        return
    with tempfile.TemporaryDirectory() as tmp:
        name = f"llama_cpp_python-{VERSION}.tar.gz"
        page = urllib.request.urlopen(f"{INDEX}/llama-cpp-python/", timeout=120).read().decode()
        links = [u for u in re.findall(r'href="([^"]+)"', page) if u.split("#")[0].endswith("/" + name)]
        if not links:
            sys.exit(f"{name} is not on {INDEX}/llama-cpp-python/")
        url = urllib.parse.urljoin(f"{INDEX}/llama-cpp-python/", links[0].split("#")[0])
        sdist = os.path.join(tmp, name)
        with urllib.request.urlopen(url, timeout=600) as r, open(sdist, "wb") as f:
            while chunk := r.read(1 << 20):
                f.write(chunk)
        got = sha256(sdist)
        if got != SHA256:
            sys.exit(f"sha256 mismatch for llama-cpp-python=={VERSION}: {got}")
        os.makedirs(cache, exist_ok=True)
        wanted = {PREFIX + t + ".jinja": t for t in TEMPLATES}
        with tarfile.open(sdist) as tar:
            for member in tar:
                name = wanted.pop(member.name, None)
                if name is not None:
                    data = tar.extractfile(member).read()
                    with open(os.path.join(cache, f"{name}.jinja"), "wb") as f:
                        f.write(data)
        if wanted:
            sys.exit(f"not in llama-cpp-python=={VERSION}: {sorted(wanted.values())}")
        open(stamp, "w").close()
    print(cache)


if __name__ == "__main__":
    main()
