"""Soak test: many mixed requests against a real `pagewise serve`, then check that nothing leaked.

    PAGEWISE_BIN=target/release/pagewise python tests/robustness/soak.py --requests 2000

Starts the binary on the tiny Qwen2 fixture (no download), then drives `--requests` requests from
`--concurrency` clients: completions and chat, streamed and not, random `n`, `stop` and
`max_tokens`; one in five clients disconnects at a random point (mid-stream, or before a JSON
answer arrives); one in twenty requests is too large on purpose (a prompt past the context, or `n`
past --max-num-seqs) and must get a 400. A small --max-num-queued-requests makes some requests
get 429 under load. Passes when:
  - the only errors are the intended 400s and 429 (no 5xx, no error event inside a stream, every
    stream that was read to its end ends with [DONE]);
  - afterwards /metrics shows 0 running, 0 waiting and 0 KV-cache usage, and /health is 200;
  - resident memory grew by less than 10% from the first 10% of requests to the end (both read
    with the server at rest, see `drive`), after a warm-up of --warmup requests of the same mix
    (default 4,000): on this 22 MiB process glibc's heap grows ~2 MiB over the first several
    thousand requests and then stays flat (+0.4 MiB from 10,000 to 40,000 requests), which a
    baseline taken inside the warm-up would read as a 10% leak.
Needs httpx (pip install httpx==0.28.1). Prints one summary line; exits 1 on a failure.
"""

import argparse
import asyncio
import os
import random
import signal
import subprocess
import sys
import time

import httpx

from tiny_server import metric, start_server

MAX_NUM_SEQS = 16
WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "then", "ran", "far", "away", "!", "42"]


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def threads(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return 0


class Stats:
    def __init__(self):
        self.by_status = {}
        self.failures = []
        self.disconnected = 0
        self.rejected_on_purpose = 0

    def count(self, status):
        self.by_status[status] = self.by_status.get(status, 0) + 1

    def fail(self, what):
        if len(self.failures) < 20:
            self.failures.append(what)
        else:
            self.failures.append("...")


def make_request(rng):
    """(path, body, expect_400, disconnect_after) for one random request."""
    chat = rng.random() < 0.5
    stream = rng.random() < 0.5
    words = rng.randint(1, 20)
    text = " ".join(rng.choice(WORDS) for _ in range(words))
    body = {"max_tokens": rng.randint(1, 48), "temperature": rng.choice([0, 0.7, 1.0]),
            "n": rng.choice([1, 1, 1, 2, 3]), "stream": stream, "seed": rng.randint(0, 1000)}
    if rng.random() < 0.3:
        body["stop"] = rng.sample(WORDS, rng.randint(1, 3))
    if rng.random() < 0.2:
        body["ignore_eos"] = True
    expect_400 = rng.random() < 0.05
    if expect_400:
        if rng.random() < 0.5:
            text = " ".join(["hello world"] * 200)  # far past the 256-token context
        else:
            body["n"] = MAX_NUM_SEQS + rng.randint(1, 1000)
    if chat:
        path = "/v1/chat/completions"
        body["messages"] = [{"role": "user", "content": text}]
    else:
        path = "/v1/completions"
        body["prompt"] = text
    disconnect = None
    if rng.random() < 0.2:
        disconnect = rng.randint(0, 8) if stream else rng.uniform(0.0, 0.05)
    return path, body, expect_400, disconnect


async def one(client, base, rng, stats):
    path, body, expect_400, disconnect = make_request(rng)
    url = base + path
    try:
        if body["stream"]:
            async with client.stream("POST", url, json=body) as r:
                stats.count(r.status_code)
                if r.status_code != 200:
                    await r.aread()
                    check_status(r.status_code, expect_400, stats, r.text)
                    return
                if expect_400:
                    stats.fail(f"oversized request accepted: {body.get('n')}")
                events = 0
                last = None
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    last = line[6:]
                    if '"error"' in last:
                        stats.fail(f"error event: {last[:200]}")
                    events += 1
                    if disconnect is not None and events >= disconnect:
                        stats.disconnected += 1
                        return  # leaving the block closes the connection mid-stream
                if last != "[DONE]":
                    stats.fail(f"stream ended without [DONE]: {last!r}")
        else:
            task = asyncio.ensure_future(client.post(url, json=body))
            if disconnect is not None:
                await asyncio.sleep(disconnect)
                if not task.done():
                    task.cancel()
                    stats.disconnected += 1
                    try:
                        await task
                    except asyncio.CancelledError:
                        pass
                    return
            r = await task
            stats.count(r.status_code)
            check_status(r.status_code, expect_400, stats, r.text)
    except httpx.HTTPError as e:
        stats.fail(f"transport error: {e!r}")


def check_status(status, expect_400, stats, text):
    if status == 200 and not expect_400:
        return
    if status == 400 and expect_400:
        stats.rejected_on_purpose += 1
        return
    if status == 429:
        return
    stats.fail(f"unexpected {status} (expected {'400' if expect_400 else '200/429'}): {text[:300]}")


async def settle(client, base, stats, what):
    """Waits until no sequence runs or waits and no block is held; returns the /metrics page."""
    deadline = time.time() + 30
    while True:
        metrics = (await client.get(base + "/metrics")).text
        running = metric(metrics, "vllm:num_requests_running")
        waiting = metric(metrics, "vllm:num_requests_waiting")
        usage = metric(metrics, "vllm:kv_cache_usage_perc")
        if running == 0 and waiting == 0 and usage == 0:
            return metrics
        if time.time() > deadline:
            stats.fail(f"{what}: running {running}, waiting {waiting}, kv usage {usage}")
            return metrics
        await asyncio.sleep(0.1)


async def drive(base, pid, args, stats):
    """Runs the first 10% of the requests, lets the server settle and reads its RSS, runs the
    rest, settles and reads it again: both readings at rest, so they compare retained memory,
    not what the requests in flight at that instant held."""
    rng = random.Random(args.seed)
    limits = httpx.Limits(max_connections=args.concurrency)
    timeout = httpx.Timeout(120.0)
    rngs = [random.Random(rng.random()) for _ in range(args.requests)]
    first = args.requests // 10
    done = 0
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        async def run(batch):
            queue = asyncio.Queue()
            for r in batch:
                queue.put_nowait(r)

            async def worker():
                nonlocal done
                while not queue.empty():
                    await one(client, base, queue.get_nowait(), stats)
                    done += 1
                    if args.trace_rss and done % max(1, args.requests // 20) == 0:
                        print(f"  {done} requests: RSS {rss_kib(pid)} KiB, {threads(pid)} threads",
                              flush=True)
            await asyncio.gather(*(worker() for _ in range(args.concurrency)))

        if args.warmup:
            warm = random.Random(args.seed + 1)
            await run([random.Random(warm.random()) for _ in range(args.warmup)])
            await settle(client, base, stats, "after the warm-up")
            done = 0
        await run(rngs[:first])
        await settle(client, base, stats, "after the first 10%")
        rss_early = rss_kib(pid)
        await run(rngs[first:])
        # Everything settles: no sequence left, no block held.
        await settle(client, base, stats, "after the run")
        health = await client.get(base + "/health")
        if health.status_code != 200:
            stats.fail(f"/health answered {health.status_code} after the run")
    return rss_early, rss_kib(pid)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=4000,
                    help="requests of the same mix first, not counted: glibc's heap settles over the "
                         "first several thousand (benches/RESULTS.md)")
    ap.add_argument("--trace-rss", action="store_true", help="print RSS every 5%% of the run")
    args = ap.parse_args()
    # glibc's default of one malloc arena per thread keeps each arena's high-water mark: a few MiB
    # of growth that is not a leak but, on a 25 MiB process, looks like 20%. Two arenas is the
    # setting we recommend for deployment too (Dockerfile).
    env = dict(os.environ, MALLOC_ARENA_MAX=os.environ.get("MALLOC_ARENA_MAX", "2"))
    proc, base, _ = start_server("--max-num-seqs", str(MAX_NUM_SEQS),
                                 "--max-num-queued-requests", "48", env=env, stderr=subprocess.PIPE)
    try:
        stats = Stats()
        start = time.time()
        rss_early, rss_end = asyncio.run(drive(base, proc.pid, args, stats))
        elapsed = time.time() - start
        growth = (rss_end - rss_early) / rss_early
        if growth >= 0.10:
            stats.fail(f"resident memory grew {growth:.1%} ({rss_early} -> {rss_end} KiB)")
        if proc.poll() is not None:
            stats.fail(f"the server exited with {proc.returncode}")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=30)
        else:
            code = proc.returncode
    if code != 0:
        stats.fail(f"the server exited {code} after SIGTERM: {proc.stderr.read().decode()[-1000:]}")
    statuses = ", ".join(f"{k}: {v}" for k, v in sorted(stats.by_status.items()))
    print(f"soak: {args.warmup} warm-up + {args.requests} requests in {elapsed:.1f} s ({(args.warmup + args.requests) / elapsed:.1f} req/s), "
          f"concurrency {args.concurrency}; statuses {{{statuses}}}; {stats.disconnected} disconnects; "
          f"{stats.rejected_on_purpose} rejected on purpose; RSS {rss_early} -> {rss_end} KiB "
          f"({growth:+.1%}); failures: {len(stats.failures)}")
    for f in stats.failures:
        print("  " + f)
    sys.exit(1 if stats.failures else 0)


if __name__ == "__main__":
    main()
