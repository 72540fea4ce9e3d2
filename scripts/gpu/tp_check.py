"""End-to-end checks of tensor parallelism through `pagewise serve` on two GPUs (scripts/gpu/tp.sh).

    python3 tp_check.py BIN MODELS_DIR OUT_DIR

With the tiny GPU model (tiny-d64: 4 heads, 2 KV heads) and the random Llama-3.2-1B shape
(llama-1b), it starts servers and compares their greedy tokens (token-id prompts, 5 top logprobs):
  - TP=1 against TP=2 (one node, the worker started by rank 0) and against a two-"node" TP=2 (two
    processes, one GPU each through CUDA_VISIBLE_DEVICES, NCCL off its P2P and shared-memory
    paths): tokens identical up to any divergence at a near-tie (top-2 margin under 0.05 at TP=1);
  - TP=2 batch invariance: 16 requests at once against each alone;
  - TP=2 preemption: a cache too small for 16 long requests at once (preemptions counted);
  - TP=2 prefix caching: a repeated prompt (cache hits counted) gives the same tokens;
  - failures: a rank that never joins is an error within the join timeout; a worker killed
    mid-stream makes /health 503 and the server exit non-zero;
  - gpt-oss (gptoss-d64-mxfp4) and Gemma 3 (gemma3-d256): TP=2 against TP=1 past their sliding
    windows (the window group and gpt-oss's MXFP4 expert slices under TP).
Prints one line per check and writes tp_check.json. Exit status 1 if any check failed.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

BIN, MODELS, OUT = sys.argv[1], sys.argv[2], sys.argv[3]
LOGS = "/tmp/pagewise-tp-logs"   # bundled into OUT/tp-logs.tar.gz at the end
os.makedirs(LOGS, exist_ok=True)
MARGIN = 0.1  # a top-1 margin below this (in logprob) is a near-tie bf16 may flip
results = {}
failed = []


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, name, model, *args, env=None, wait=True):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(os.path.join(LOGS, f"{name}.log"), "w")
        cmd = [BIN, "serve", model, "--served-model-name", "m", "--host", "127.0.0.1",
               "--port", str(self.port), *args]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})})
        if wait:
            self.wait_ready()

    def wait_ready(self, limit=300):
        deadline = time.time() + limit
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: see {self.log.name}")
            try:
                with urllib.request.urlopen(self.url + "/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError("server not ready")

    def post(self, path, body, timeout=300):
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())

    def metric(self, name):
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name) and not line.startswith("#"):
                    return float(line.split()[-1])
        return None

    def stop(self):
        """SIGTERM; returns (exit status, seconds to exit)."""
        start = time.time()
        code = self.proc.poll()
        if code is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                code = self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                code = "killed after 60 s"
        self.log.close()
        return code, time.time() - start


def complete(server, prompt, max_tokens=24):
    r = server.post("/v1/completions", {"model": "m", "prompt": prompt, "max_tokens": max_tokens,
                                        "temperature": 0, "ignore_eos": True, "logprobs": 5})
    lp = r["choices"][0]["logprobs"]
    return {"text": r["choices"][0]["text"], "tokens": lp["tokens"],
            "top": lp["top_logprobs"], "chosen": lp["token_logprobs"]}


def prompts(n, length=40, vocab=250, seed=1):
    return [[(seed * 7919 + i * 104729 + j * 613) % vocab for j in range(length)] for i in range(n)]


def compare(name, want, got, strict=False):
    """Greedy outputs must agree token for token, up to a divergence where `want`'s top-1 margin
    is under MARGIN (bf16 rounding in another order may flip a near-tie; everything after a flip
    is a different continuation and is not compared). `strict`: any divergence fails."""
    same, margins, bad, worst = 0, [], 0, 0.0
    for w, g in zip(want, got):
        for k, (a, b) in enumerate(zip(w["tokens"], g["tokens"])):
            if a != b:
                top = sorted(w["top"][k].values(), reverse=True)
                margin = top[0] - top[1] if len(top) > 1 else 9.0
                margins.append(round(margin, 3))
                bad += margin >= MARGIN or strict
                break
            same += 1
            worst = max(worst, abs(w["chosen"][k] - g["chosen"][k]))
    ok = bad == 0 and same > 0
    record(name, ok, f"{same} tokens identical before any divergence; {len(margins)} divergence(s) "
                     f"at top-1 margins {margins} ({bad} at or above {MARGIN}); max |logprob diff| "
                     f"{worst:.3f}")


def record(name, ok, detail):
    results[name] = {"ok": ok, "detail": detail}
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
    if not ok:
        failed.append(name)


def concurrent(server, ps, max_tokens):
    outs = [None] * len(ps)

    def one(i):
        outs[i] = complete(server, ps[i], max_tokens)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(ps))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outs


nccl_net = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}
for m in ["tiny-d64", "llama-1b"]:
    model = os.path.join(MODELS, m)
    ps = prompts(6)
    s1 = Server(f"{m}-tp1", model, "--max-model-len", "512")
    want = [complete(s1, p) for p in ps]
    many, long_ps = prompts(16, seed=3), prompts(16, seed=5)
    if m == "tiny-d64":
        # The single-GPU reference for batch invariance (the same check at TP=1).
        alone1 = [complete(s1, p, 32) for p in many]
        compare(f"{m}: (reference) TP=1 batch invariance, 16 at once vs alone", alone1,
                concurrent(s1, many, 32))
    s1.stop()
    s2 = Server(f"{m}-tp2", model, "--max-model-len", "512", "--tensor-parallel-size", "2")
    workers = subprocess.run(["pgrep", "-P", str(s2.proc.pid)], capture_output=True, text=True).stdout.split()
    got = [complete(s2, p) for p in ps]
    compare(f"{m}: TP=2 greedy tokens equal TP=1", want, got)
    if m == "tiny-d64":
        alone = [complete(s2, p, 32) for p in many]
        compare(f"{m}: TP=2 batch invariance, 16 at once vs alone", alone, concurrent(s2, many, 32))
        hits0 = s2.metric("vllm:prefix_cache_hits_total") or 0
        again = complete(s2, ps[0])
        hits1 = s2.metric("vllm:prefix_cache_hits_total") or 0
        record(f"{m}: TP=2 prefix cache", again["tokens"] == got[0]["tokens"] and hits1 > hits0,
               f"hits {hits0:.0f} -> {hits1:.0f}, tokens {'same' if again['tokens'] == got[0]['tokens'] else 'differ'}")
        long_alone = [complete(s2, p, 200) for p in long_ps]
    code, took = s2.stop()
    alive = [w for w in workers if os.path.exists(f"/proc/{w}")]
    record(f"{m}: SIGTERM stops a TP=2 server and its worker", code == 0 and not alive and took < 30,
           f"exit {code} after {took:.1f} s, worker {workers} {'still running' if alive else 'gone'}")
    if m == "tiny-d64":
        # Preemption: 16 sequences of 40 + 200 tokens with room for ~6 at once (1 KV head a
        # rank, bf16), against the same TP=2 engine running each alone.
        model_cfg = json.load(open(os.path.join(model, "config.json")))
        per_token = 2 * model_cfg["num_hidden_layers"] * 1 * model_cfg.get("head_dim", 64) * 2
        s2 = Server(f"{m}-tp2-preempt", model, "--max-model-len", "512", "--tensor-parallel-size", "2",
                    "--kv-cache-memory", str(per_token * 240 * 6))
        together = concurrent(s2, long_ps, 200)
        pre = s2.metric("vllm:num_preemptions_total") or 0
        record(f"{m}: TP=2 preempts under a small cache", pre > 0, f"{pre:.0f} preemptions")
        # A preempted sequence is recomputed by a prefill, which rounds differently from the
        # decode steps it replaces.
        compare(f"{m}: TP=2 under preemption equals TP=2 alone", long_alone, together)
        s2.stop()
    # Two "nodes" on one host: one process per GPU, meeting over TCP, NCCL over its network path.
    port = str(free_port())
    common = ["--max-model-len", "512", "--tensor-parallel-size", "2", "--nnodes", "2",
              "--master-addr", "127.0.0.1", "--master-port", port]
    n1 = Server(f"{m}-node1", model, *common, "--node-rank", "1", "--headless",
                env={"CUDA_VISIBLE_DEVICES": "1", **nccl_net}, wait=False)
    n0 = Server(f"{m}-node0", model, *common, "--node-rank", "0",
                env={"CUDA_VISIBLE_DEVICES": "0", **nccl_net})
    got = [complete(n0, p) for p in ps]
    compare(f"{m}: two-node TP=2 greedy tokens equal TP=1", want, got)
    code, took = n0.stop()
    try:
        n1.proc.wait(timeout=30)
        record(f"{m}: node 0 stops on SIGTERM and the headless node with it",
               n1.proc.returncode == 0 and code == 0 and took < 30,
               f"node 0 exit {code} after {took:.1f} s, node 1 exit {n1.proc.returncode}")
    except subprocess.TimeoutExpired:
        record(f"{m}: node 0 stops on SIGTERM and the headless node with it", False,
               f"node 0 exit {code} after {took:.1f} s, node 1 still running after 30 s more")
        n1.proc.kill()
    n1.log.close()

# The models with sliding windows: gpt-oss with MXFP4 experts (gptoss-d64-mxfp4, made by tp.sh)
# and Gemma 3 (gemma3-d256, head dim 256). TP=2 against TP=1 on prompts past their 48-token
# windows, where every step sends the worker the window group's slots and tables (and gpt-oss's
# ranks keep their slices of the MXFP4 experts); and the window group present at TP=2.
for m in ["gptoss-d64-mxfp4", "gemma3-d256"]:
    model = os.path.join(MODELS, m)
    if not os.path.isdir(model):
        record(f"{m}: model present", False, f"{model} is missing (tp.sh makes it)")
        continue
    ps = prompts(6, length=100)
    s1 = Server(f"{m}-tp1", model, "--max-model-len", "512")
    want = [complete(s1, p, 64) for p in ps]
    s1.stop()
    s2 = Server(f"{m}-tp2", model, "--max-model-len", "512", "--tensor-parallel-size", "2")
    got = [complete(s2, p, 64) for p in ps]
    compare(f"{m}: TP=2 greedy tokens equal TP=1 past the window", want, got)
    s2.stop()
    # The cache's layout is logged once ("KV cache allocated ... window_blocks=N" with a group).
    plain = [re.sub(r"\x1b\[[0-9;]*m", "", l) for l in open(s2.log.name)]  # no ANSI colours
    allocated = [l for l in plain if "KV cache allocated" in l]
    record(f"{m}: TP=2 has its window group", any("window_blocks=" in l for l in allocated),
           allocated[0].strip()[-160:] if allocated else "no 'KV cache allocated' line")

# A rank that never joins: node 0 of two, alone, with a 10 s join timeout.
model = os.path.join(MODELS, "tiny-d64")
start = time.time()
lonely = Server("never-joins", model, "--tensor-parallel-size", "2", "--nnodes", "2", "--master-port",
                str(free_port()), "--tp-join-timeout", "10", wait=False)
try:
    lonely.proc.wait(timeout=60)
    took = time.time() - start
    text = open(lonely.log.name).read()
    record("a rank that never joins fails startup in bounded time",
           lonely.proc.returncode != 0 and "did not join" in text and took < 40,
           f"exit {lonely.proc.returncode} after {took:.1f} s: " +
           next((l for l in text.splitlines() if "did not join" in l), "no message")[-160:])
except subprocess.TimeoutExpired:
    record("a rank that never joins fails startup in bounded time", False, "still running after 60 s")
    lonely.proc.kill()
lonely.log.close()

# A worker killed mid-stream: /health turns 503 and the server exits non-zero.
s2 = Server("worker-killed", model, "--max-model-len", "512", "--tensor-parallel-size", "2")
workers = subprocess.run(["pgrep", "-P", str(s2.proc.pid)], capture_output=True, text=True).stdout.split()
stream_done = {}


def long_stream():
    try:
        s2.post("/v1/completions", {"model": "m", "prompt": [1, 2, 3], "max_tokens": 400,
                                    "ignore_eos": True, "temperature": 0}, timeout=120)
        stream_done["status"] = 200
    except urllib.error.HTTPError as e:
        stream_done["status"] = e.code
    except Exception as e:  # noqa: BLE001
        stream_done["status"] = repr(e)


t = threading.Thread(target=long_stream)
t.start()
time.sleep(1.0)
start = time.time()
for w in workers:
    os.kill(int(w), signal.SIGKILL)
health = None
deadline = time.time() + 30
while time.time() < deadline and s2.proc.poll() is None:
    try:
        with urllib.request.urlopen(s2.url + "/health", timeout=2) as r:
            health = r.status
    except urllib.error.HTTPError as e:
        health = e.code
        break
    except OSError:
        break
    time.sleep(0.2)
try:
    s2.proc.wait(timeout=60)
except subprocess.TimeoutExpired:
    s2.proc.kill()
t.join(timeout=60)
took = time.time() - start
record("a worker killed mid-serving: unhealthy, then exit non-zero",
       bool(workers) and s2.proc.returncode not in (0, None) and took < 60,
       f"worker pids {workers}, /health {health}, request {stream_done.get('status')}, "
       f"server exit {s2.proc.returncode} after {took:.1f} s")
s2.log.close()

json.dump(results, open(os.path.join(OUT, "tp_check.json"), "w"), indent=1)
subprocess.run(["tar", "czf", os.path.join(OUT, "tp-logs.tar.gz"), "-C", LOGS, "."])
print(f"{len(results) - len(failed)}/{len(results)} checks passed")
sys.exit(1 if failed else 0)
