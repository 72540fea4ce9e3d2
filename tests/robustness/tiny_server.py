"""`pagewise serve` on the tiny Qwen2 fixture (no download), for the robustness scripts beside this
file: start one on a free port, wait until it is ready, read its metrics."""

import os
import re
import socket
import subprocess
import time

import httpx

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("PAGEWISE_BIN", os.path.join(ROOT, "target", "release", "pagewise"))
TINY = os.path.join(ROOT, "tests", "fixtures", "qwen2-bias")
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url, proc, what):
    """Polls `url`/ready until it answers 200; fails if `proc` exits or a minute passes."""
    deadline = time.time() + 60
    while True:
        try:
            if httpx.get(url + "/ready", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.time() > deadline or proc.poll() is not None:
            raise RuntimeError(f"{what} did not become ready")
        time.sleep(0.1)


def start_server(*flags, env=None, stderr=subprocess.DEVNULL):
    """A ready server with `flags` after the model: (process, base URL, port)."""
    port = free_port()
    proc = subprocess.Popen(
        [BIN, "serve", TINY, "--chat-template", CHATML, "--served-model-name", "tiny",
         "--host", "127.0.0.1", "--port", str(port), *flags],
        stdout=subprocess.DEVNULL, stderr=stderr, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, proc, base)
    except RuntimeError:
        proc.kill()
        raise
    return proc, base, port


def metric(text, name):
    """Sum of a metric's samples in a Prometheus text page, or None when it has none."""
    pattern = rf"^{re.escape(name)}{{[^}}]*}} ([0-9.e+-]+)$"
    values = [float(v) for v in re.findall(pattern, text, re.M)]
    return sum(values) if values else None
