"""`/dashboard` in a real browser: headless Chromium, driven over its DevTools protocol, loads the
page of a live `pagewise serve` (the tiny Qwen2 fixture) while requests run.

    PAGEWISE_BIN=target/release/pagewise python tests/browser/dashboard.py [--screenshot out.png]

Passes when the page goes live, its numbers move while the load runs (running sequences seen,
generated tokens rising, blocks in use), and once the load is over its numbers equal /metrics
(generated tokens, running, KV usage, prefix-cache hit rate). Saves a screenshot taken mid-load.
Then, on the tiny Gemma 3 (sliding-window layers, so a window group): the page shows the window
group's grid, its blocks in use rise during a load and fall back to /metrics' window usage.
Needs chromium on PATH (Debian's package), httpx and websocket-client.
"""

import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import httpx
import websocket

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "robustness"))
from tiny_server import BIN, ROOT, free_port, metric, start_server, wait_ready  # noqa: E402

FIELDS = ["kv-usage", "blocks-used", "blocks-cached", "blocks-free", "running", "waiting", "hit-rate",
          "tokens-per-s", "generated", "graph-share", "preemptions"]


class Browser:
    """Headless Chromium with one page, driven over the DevTools protocol."""

    def __init__(self):
        self.profile = tempfile.mkdtemp(prefix="pagewise-chromium-")
        port = free_port()
        self.proc = subprocess.Popen(
            [shutil.which("chromium") or "chromium", "--headless", "--no-sandbox", "--disable-gpu",
             "--window-size=1400,1060", "--remote-allow-origins=*", f"--remote-debugging-port={port}", f"--user-data-dir={self.profile}",
             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 30
        while True:
            try:
                pages = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=1).json()
                page = next(p for p in pages if p.get("type") == "page")
                break
            except (httpx.HTTPError, StopIteration, ValueError):
                if time.time() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("chromium did not start")
                time.sleep(0.2)
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=120, suppress_origin=True)
        self.next_id = 0

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            try:
                msg = json.loads(self.ws.recv())
            except websocket.WebSocketTimeoutException:
                # Chromium's renderer shares two busy cores with the server under load.
                raise RuntimeError(f"{method}: Chromium did not answer in 120 s") from None
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    def eval(self, expression):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return r["result"].get("value")

    def open_live(self, url):
        """Loads the dashboard at `url` and waits (20 s at most) until it shows live data."""
        self.call("Page.navigate", url=url)
        deadline = time.time() + 20
        while "live" not in (self.values() or {}).get("status", ""):
            if time.time() > deadline:
                raise RuntimeError(f"{url} never went live")
            time.sleep(0.1)

    def values(self):
        """The page's tiles: raw values (data-value) and the live status."""
        return self.eval("(() => { const v = {}; for (const id of %s) v[id] = document.getElementById(id).dataset.value;"
                         " v.status = document.getElementById('status').textContent; return v; })()" % json.dumps(FIELDS))

    def hover_first_block(self):
        """Moves the mouse over the pool's first cell; returns the tooltip's text."""
        x, y = self.eval("(() => { const r = document.getElementById('pool').getBoundingClientRect();"
                         " return [r.left + 1, r.top + 1]; })()")
        self.call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
        time.sleep(0.05)
        return self.eval("document.getElementById('tip').style.display === 'block'"
                         " ? document.getElementById('tip').textContent : null")

    def screenshot(self, path):
        data = self.call("Page.captureScreenshot", format="png")["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def close(self):
        try:
            self.ws.close()
        finally:
            self.proc.kill()
            self.proc.wait()
            shutil.rmtree(self.profile, ignore_errors=True)


def load(base, n, max_tokens, repeat, enough, done, rounds):
    """Rounds of `n` completions sharing a prefix, started 5 ms apart, until `enough` is set (at
    least one round); appends each finished round to `rounds`, then sets `done`. A fast machine
    ends one round before the page has shown much, so the watcher decides when it has seen
    enough."""
    def one(i):
        body = {"prompt": "The page table hands out blocks. " * repeat + f"request {i}",
                "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}
        r = httpx.post(base + "/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
    while True:
        threads = []
        for i in range(n):
            t = threading.Thread(target=one, args=(i,))
            t.start()
            threads.append(t)
            time.sleep(0.005)
        for t in threads:
            t.join()
        rounds.append(n)
        if enough.is_set():
            break
    done.set()


def window_group(browser, failures):
    """The tiny Gemma 3 with a window group (4 sequences: 14 window blocks): the page shows the
    group's grid, and its blocks in use rise under a load and end at /metrics' usage (0)."""
    port = free_port()
    server = subprocess.Popen(
        [BIN, "serve", os.path.join(ROOT, "tests", "fixtures", "gemma3"), "--host", "127.0.0.1",
         "--port", str(port), "--block-size", "8", "--max-num-seqs", "4", "--max-num-batched-tokens", "16",
         "--kv-cache-memory", str(3 * 40 * 8 * 2 * 32 * 2 * 4), "--max-model-len", "256"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, server, base)
        browser.open_live(base + "/dashboard")
        state = "(() => { const g = document.getElementById('window-group'); return [g.hidden, g.offsetHeight," \
                " document.getElementById('wpool').width, document.getElementById('window-counts').dataset.value," \
                " document.getElementById('window-geometry').textContent]; })()"
        hidden, height, width, _, geometry = browser.eval(state)
        if hidden or height == 0 or width == 0 or "windows of 5 tokens" not in geometry:
            failures.append(f"window group not shown: hidden {hidden}, {height}px high, canvas {width}px, {geometry!r}")

        # Requests one after the other for two seconds a thread: a tiny model's answer takes a
        # fraction of the page's refresh interval, so one request each could end unseen. Answers
        # of different lengths keep the threads out of step: requests that all end together leave
        # the engine idle, and the snapshot it publishes going idle (nothing in use) replaces the
        # periodic one before the page reads it.
        load_end = time.time() + 2.0

        def one(i):
            body = {"prompt": [1 + i, 2, 3, 4, 5, 6, 7, 8], "max_tokens": 150 + 37 * i, "ignore_eos": True,
                    "temperature": 0}
            while time.time() < load_end:
                assert httpx.post(base + "/v1/completions", json=body, timeout=120).status_code == 200
        threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        in_use = []
        while any(t.is_alive() for t in threads):
            in_use.append(int(browser.eval(state)[3] or 0))
            time.sleep(0.05)
        if max(in_use, default=0) == 0:
            failures.append(f"the window group's blocks in use never rose: {in_use[:10]}")
        deadline = time.time() + 15
        while time.time() < deadline:
            usage = metric(httpx.get(base + "/metrics").text, "pagewise:kv_window_cache_usage_perc")
            if usage == 0 and int(browser.eval(state)[3] or 0) == 0:
                break
            time.sleep(0.2)
        else:
            failures.append(f"window group after the load: page {browser.eval(state)[3]}, /metrics {usage}")
        print(f"window group: {geometry}; blocks in use during the load up to {max(in_use, default=0)}")
    finally:
        server.terminate()
        server.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--screenshot", default=os.path.join(tempfile.gettempdir(), "pagewise-dashboard.png"))
    ap.add_argument("--model", help="serve this model instead of the tiny fixture (e.g. for the README's picture)")
    ap.add_argument("--requests", type=int, default=120)
    ap.add_argument("--max-tokens", type=int, default=150)
    ap.add_argument("--prefix-repeat", type=int, default=2, help="length of the shared prompt prefix")
    ap.add_argument("--shot-delay", type=float, default=0.3, help="seconds after 8 sequences run")
    args = ap.parse_args()
    if args.model:
        port = free_port()
        server = subprocess.Popen([BIN, "serve", args.model, "--host", "127.0.0.1", "--port", str(port),
                                   "--max-num-seqs", "16"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        wait_ready(base, server, base)
    else:
        # A pool of 524,288 blocks (2 GiB of the tiny model's KV cache; the cap is max-num-seqs
        # full-length sequences): more blocks than the canvas has pixels, as on an H200.
        server, base, _ = start_server("--max-num-seqs", "32768", "--kv-cache-memory", str(2 << 30))
    browser = Browser()
    failures = []
    try:
        browser.call("Page.enable")
        browser.open_live(base + "/dashboard")
        idle = browser.values()
        blocks, pixels, agg = browser.eval(
            "[last.num_blocks, document.getElementById('pool').width * document.getElementById('pool').height,"
            " document.getElementById('agg').textContent]")
        if blocks > pixels and "one pixel =" not in agg:
            failures.append(f"{blocks} blocks on {pixels} pixels, but the canvas does not aggregate: {agg!r}")
        done, enough, rounds = threading.Event(), threading.Event(), []
        threading.Thread(target=load, args=(base, args.requests, args.max_tokens, args.prefix_repeat, enough, done,
                                            rounds), daemon=True).start()
        seen, shot, hovered = [], False, None
        give_up = time.time() + 120
        while not done.is_set():
            v = browser.values()
            seen.append(v)
            # Enough: the screenshot taken and the generated count seen at five values.
            if shot and len({v["generated"] for v in seen if v["generated"]}) >= 5 or time.time() > give_up:
                enough.set()
            if not hovered and int(v["running"] or 0) >= 2:
                hovered = browser.hover_first_block()
            if not shot and int(v["running"] or 0) >= 8:
                time.sleep(args.shot_delay)
                browser.screenshot(args.screenshot)
                shot = True
            time.sleep(0.1)
        if not shot:
            browser.screenshot(args.screenshot)
        generated = [int(v["generated"]) for v in seen if v["generated"]]
        # One block a cell: its state, ref count and sequences; several: their states counted.
        if not hovered or not (hovered.startswith("block ") and "ref count" in hovered
                               or hovered.startswith("blocks ") and "in use:" in hovered):
            failures.append(f"hovering the pool's first cell showed {hovered!r}")
        if max(int(v["running"] or 0) for v in seen) < 2:
            failures.append("the page never showed two sequences running")
        if len(set(generated)) < 3 or generated != sorted(generated):
            failures.append(f"generated tokens did not rise steadily: {generated[:5]} .. {generated[-5:]}")
        if max(int(v["blocks-used"] or 0) for v in seen) <= int(idle["blocks-used"] or 0):
            failures.append("no blocks in use shown during the load")
        # Once idle, the page's numbers are /metrics'.
        deadline, last = time.time() + 15, None
        while time.time() < deadline:
            text = httpx.get(base + "/metrics").text
            want = {
                "generated": metric(text, "vllm:generation_tokens_total"),
                "running": metric(text, "vllm:num_requests_running"),
                "kv-usage": metric(text, "vllm:kv_cache_usage_perc"),
                "hit-rate": metric(text, "vllm:prefix_cache_hits_total") / metric(text, "vllm:prefix_cache_queries_total"),
            }
            v = browser.values()
            last = {k: (float(v[k]), w) for k, w in want.items()}
            if all(abs(a - b) <= 1e-9 * max(1.0, abs(b)) for a, b in last.values()):
                break
            time.sleep(0.2)
        else:
            failures.append(f"page vs /metrics after the load: {last}")
        if last and last["generated"][1] != sum(rounds) * args.max_tokens:
            failures.append(f"/metrics counted {last['generated'][1]} tokens, not {sum(rounds) * args.max_tokens}")
        if not browser.eval("document.getElementById('window-group').hidden"):
            failures.append("a model without sliding-window layers shows a window group")
        print(f"dashboard: {blocks} blocks ({agg or 'one cell a block'}); hover: {hovered!r}; {len(rounds)} rounds of {args.requests} requests, {len(seen)} readings during the load, peak running "
              f"{max(int(v['running'] or 0) for v in seen)}, page == /metrics afterwards: {last}; "
              f"screenshot {args.screenshot}")
        if not args.model:
            window_group(browser, failures)
    finally:
        browser.close()
        server.terminate()
        server.wait(timeout=30)
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)


if __name__ == "__main__":
    main()
