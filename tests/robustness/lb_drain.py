"""Two replicas behind a real HAProxy (deploy/haproxy.cfg); one is stopped with SIGTERM under load.

    PAGEWISE_BIN=target/release/pagewise python tests/robustness/lb_drain.py

Starts two `pagewise serve` replicas on the tiny Qwen2 fixture and HAProxy with the shipped config
(its ports replaced by free ones), drives streaming and non-streaming requests through the
balancer from 16 clients, sends SIGTERM to the first replica while requests are in flight on it,
and keeps the load going until that replica has drained and exited. Passes when not one request
failed (every answer a 200, every stream ending in [DONE] without an error event), the stopped
replica exited 0 after serving requests, and the other replica served the rest. Needs haproxy on
PATH and httpx.
"""

import asyncio
import os
import random
import signal
import subprocess
import sys
import time

import httpx

from tiny_server import ROOT, free_port, metric, start_server, wait_ready

async def client(http, base, rng, stop_at, counts, failures):
    while time.time() < stop_at:
        stream = rng.random() < 0.5
        body = {"model": "tiny", "prompt": "x" * rng.randint(1, 20), "max_tokens": rng.randint(50, 230),
                "ignore_eos": True, "stream": stream}
        try:
            if stream:
                async with http.stream("POST", base + "/v1/completions", json=body) as r:
                    if r.status_code != 200:
                        await r.aread()
                        failures.append(f"stream: {r.status_code} {r.text[:200]}")
                        continue
                    last = None
                    async for line in r.aiter_lines():
                        if line.startswith("data: "):
                            last = line[6:]
                            if '"error"' in last:
                                failures.append(f"error event: {last[:200]}")
                    if last != "[DONE]":
                        failures.append(f"stream ended with {last!r}")
            else:
                r = await http.post(base + "/v1/completions", json=body)
                if r.status_code != 200:
                    failures.append(f"json: {r.status_code} {r.text[:200]}")
                    continue
            counts[0] += 1
        except httpx.HTTPError as e:
            failures.append(f"transport: {e!r}")


async def drive(base, replicas, seconds):
    rng = random.Random(7)
    counts, failures = [0], []
    stop_at = time.time() + seconds
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        tasks = [asyncio.create_task(client(http, base, random.Random(rng.random()), stop_at, counts, failures))
                 for _ in range(16)]
        # Let both replicas take load, then stop the first one while requests run on it.
        await asyncio.sleep(seconds / 4)
        while True:
            text = (await http.get(replicas[0][1] + "/metrics")).text
            in_flight = metric(text, "vllm:num_requests_running") or 0
            if in_flight >= 2 or time.time() > stop_at - seconds / 4:
                break
        replicas[0][0].send_signal(signal.SIGTERM)
        first_served = metric(text, "vllm:request_success_total") or 0
        stopped_at = time.time()
        while replicas[0][0].poll() is None:
            await asyncio.sleep(0.05)
        drained_in = time.time() - stopped_at
        await asyncio.gather(*tasks)
    return counts[0], failures, first_served, in_flight, drained_in


def main():
    procs = []
    try:
        replicas = []
        for _ in range(2):
            p, url, port = start_server("--shutdown-timeout", "30")
            procs.append(p)
            replicas.append((p, url, port))
        lb_port = free_port()
        with open(os.path.join(ROOT, "deploy", "haproxy.cfg")) as f:
            cfg = f.read()
        cfg = cfg.replace("bind 127.0.0.1:8080", f"bind 127.0.0.1:{lb_port}")
        cfg = cfg.replace("127.0.0.1:8001", f"127.0.0.1:{replicas[0][2]}")
        cfg = cfg.replace("127.0.0.1:8002", f"127.0.0.1:{replicas[1][2]}")
        cfg_path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"pagewise-haproxy-{lb_port}.cfg")
        with open(cfg_path, "w") as f:
            f.write(cfg)
        lb = subprocess.Popen(["haproxy", "-db", "-f", cfg_path], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE)
        procs.append(lb)
        base = f"http://127.0.0.1:{lb_port}"
        wait_ready(base, lb, "haproxy")
        time.sleep(1.5)  # both servers through `rise 2` checks
        start = time.time()
        ok, failures, first_served, in_flight, drained_in = asyncio.run(drive(base, replicas, 8.0))
        elapsed = time.time() - start
        code = replicas[0][0].returncode
        second_served = metric(httpx.get(replicas[1][1] + "/metrics").text,
                               "vllm:request_success_total") or 0
        if code != 0:
            failures.append(f"the stopped replica exited {code}")
        if first_served == 0 or in_flight == 0:
            failures.append("the stopped replica had no load when it was stopped")
        print(f"lb_drain: {ok} requests in {elapsed:.1f} s through HAProxy, replica 1 served "
              f"{first_served:.0f} before SIGTERM, had {in_flight:.0f} sequences running then, "
              f"drained in {drained_in:.2f} s (exit {code}), "
              f"replica 2 served {second_served:.0f}; failed: {len(failures)}")
        for f in failures[:20]:
            print("  " + f)
        sys.exit(1 if failures else 0)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


if __name__ == "__main__":
    main()
