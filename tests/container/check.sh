#!/usr/bin/env bash
# Builds the CPU image from a local Debian base with the release binary (the Dockerfile's
# `prebuilt` target) and checks it the way an operator would: SmolLM2 mounted read-only, /health and
# /ready answer, a chat completion works (plain and streamed), `podman healthcheck run` is healthy,
# the server runs as a non-root uid, and `podman stop` (SIGTERM) lets an in-flight stream finish
# and the container exit 0.
#
#   PAGEWISE_BIN=target/release/pagewise PAGEWISE_SMOLLM2_GGUF=... bash tests/container/check.sh
#
# Needs root, buildah, podman, runc and debootstrap (.ci/run installs them); see
# ../shared/CONTAINERS.md for why the flags below are what they are.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin="${PAGEWISE_BIN:-target/release/pagewise}"
gguf="${PAGEWISE_SMOLLM2_GGUF:?the SmolLM2 GGUF (scripts/fetch_smollm2.py)}"
image="localhost/pagewise:ci"
bash scripts/container/make-base.sh
mkdir -p dist
cp "$bin" dist/pagewise
buildah bud --isolation chroot --format docker --layers --target prebuilt \
  --build-arg RUNTIME_IMAGE=localhost/debian:bookworm -t "$image" -f Dockerfile . > /dev/null
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
base="http://127.0.0.1:$port"
lim=$(ulimit -Hn)
id=$(podman run -d --runtime runc --init --ulimit "nofile=$lim:$lim" --ulimit nproc=32768:32768 \
  -p "127.0.0.1:$port:8000" -v "$gguf:/models/smollm2.gguf:ro" "$image" \
  serve /models/smollm2.gguf --served-model-name smollm2 --shutdown-timeout 60)
cleanup() { podman rm -f "$id" > /dev/null 2>&1 || true; }
trap cleanup EXIT
fail() { echo "container: $*"; podman logs "$id" 2>&1 | tail -20; exit 1; }

python3 - "$base" "$id" <<'PY' || fail "the HTTP checks failed"
import json, subprocess, sys, threading, time, urllib.error, urllib.request
base, cid = sys.argv[1], sys.argv[2]

def get(path):
    try:
        with urllib.request.urlopen(base + path, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""

def post(path, body, timeout=120):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=timeout)

deadline = time.time() + 120
while get("/ready")[0] != 200:
    assert time.time() < deadline, "the container never became ready"
    time.sleep(0.5)
assert get("/health")[0] == 200, "/health"
# With the system message: without it, SmolLM2's greedy answer on the quantized CPU path is a
# near-tie that goes to French (docs/SERVING.md, "Library and models").
msgs = [{"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"}]
with post("/v1/chat/completions", {"model": "smollm2", "messages": msgs, "max_tokens": 12,
                                   "temperature": 0}) as r:
    answer = json.load(r)["choices"][0]["message"]["content"]
assert "Paris" in answer, answer
with post("/v1/chat/completions", {"model": "smollm2", "messages": msgs, "max_tokens": 8,
                                   "stream": True}) as r:
    body = r.read().decode()
assert body.rstrip().endswith("data: [DONE]") and "chat.completion.chunk" in body, body[-300:]
health = subprocess.run(["podman", "healthcheck", "run", cid], capture_output=True, text=True)
assert health.returncode == 0, f"podman healthcheck run: {health.returncode} {health.stdout} {health.stderr}"
uid = subprocess.run(["podman", "exec", cid, "id", "-u"], capture_output=True, text=True).stdout.strip()
assert uid not in ("", "0"), f"runs as uid {uid!r}"

# A stream in flight when `podman stop` sends SIGTERM must finish whole.
result = {}
def stream():
    with post("/v1/completions", {"model": "smollm2", "prompt": "Once upon a time",
                                  "max_tokens": 48, "ignore_eos": True, "stream": True}) as r:
        result["body"] = r.read().decode()
t = threading.Thread(target=stream)
t.start()
time.sleep(1.0)
stop = subprocess.run(["podman", "stop", "-t", "60", cid], capture_output=True, text=True)
t.join(120)
body = result.get("body", "")
assert body.rstrip().endswith("data: [DONE]") and '"error"' not in body, body[-400:]
assert body.count('"text":') >= 48, "the stream was cut short"
code = subprocess.run(["podman", "inspect", "--format", "{{.State.ExitCode}}", cid],
                      capture_output=True, text=True).stdout.strip()
assert code == "0", f"exit code {code!r} after SIGTERM ({stop.stderr.strip()})"
print(f"container: ready, chat ({answer.strip()[:40]!r}), stream, healthy, uid {uid}, "
      "SIGTERM let a 48-token stream finish, exit 0")
PY
