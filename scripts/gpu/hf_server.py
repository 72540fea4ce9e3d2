"""A plain OpenAI-compatible completions server over Hugging Face transformers: the baseline for
the scoreboard's serving rows, measured by the same `pagewise bench serve` as our server.

    python3 scripts/gpu/hf_server.py MODEL_DIR [--port 8200] [--max-batch 64]

It does what a transformers user without a serving engine would: requests queue up; whenever the
model is free, it takes up to --max-batch of them (oldest first), pads their prompts on the left
and runs one eager `generate` for the batch until its longest request is done (static batching:
a request arriving meanwhile waits for the next batch). Each new token is streamed to its request
as it is made (a streamer sees the whole batch at every step). Greedy decoding; `temperature`
and the like are ignored. A request stops at its `max_tokens`, or at the model's EOS token unless
`ignore_eos` is set.

Weights: MODEL_DIR's model.safetensors when there is one, else random weights from its
config.json (the scoreboard's shapes), bf16 on CUDA, f32 on the CPU (`--device cpu`, a dry run).
Prompts: token ids, or text when MODEL_DIR has a tokenizer.json. Endpoints: GET /ready (200 once
the model is loaded), POST /v1/completions (streamed with `"stream": true`, with a usage chunk
at the end when `stream_options.include_usage` is set, as OpenAI's API does).
"""

import argparse
import asyncio
import json
import os
import queue
import threading
import time
import uuid

import torch
from aiohttp import web
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.generation.streamers import BaseStreamer

try:
    from tokenizers import Tokenizer
except ImportError:  # text prompts are then refused; token-id prompts still work
    Tokenizer = None


class Request:
    """One completion request and the asyncio queue its handler reads tokens from."""

    def __init__(self, ids, max_tokens, ignore_eos, loop):
        self.ids, self.max_tokens, self.ignore_eos = ids, max_tokens, ignore_eos
        self.loop, self.events = loop, asyncio.Queue()
        self.made, self.done = 0, False

    def send(self, item):
        self.loop.call_soon_threadsafe(self.events.put_nowait, item)

    def finish(self, reason):
        if not self.done:
            self.done = True
            self.send(("end", reason, None))


class BatchStreamer(BaseStreamer):
    """Hands each step's tokens of a batched `generate` to the batch's requests."""

    def __init__(self, batch, eos):
        self.batch, self.eos, self.prompt_seen = batch, eos, False

    def put(self, value):
        if not self.prompt_seen:  # generate's first call carries the prompts
            self.prompt_seen = True
            return
        for req, token in zip(self.batch, value.reshape(-1).tolist()):
            if req.done:
                continue
            if not req.ignore_eos and token in self.eos:
                req.finish("stop")
                continue
            req.made += 1
            if req.made < req.max_tokens:
                req.send(("token", token, None))
            else:  # the last token carries the finish reason, as OpenAI's stream does
                req.done = True
                req.send(("token", token, "length"))

    def end(self):
        for req in self.batch:
            req.finish("length")


class Engine:
    """The model and the thread that serves the queue in static batches."""

    def __init__(self, path, device, max_batch):
        cfg = AutoConfig.from_pretrained(path)
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        if os.path.exists(os.path.join(path, "model.safetensors")):
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
        else:
            with torch.device(device):
                model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
        self.model, self.device, self.max_batch = model.eval(), device, max_batch
        self.vocab = cfg.vocab_size
        eos = cfg.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        tok = os.path.join(path, "tokenizer.json")
        self.tokenizer = Tokenizer.from_file(tok) if Tokenizer and os.path.exists(tok) else None
        self.waiting = queue.Queue()
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            batch = [self.waiting.get()]
            while len(batch) < self.max_batch:
                try:
                    batch.append(self.waiting.get_nowait())
                except queue.Empty:
                    break
            try:
                self.generate(batch)
            except Exception as e:  # a failed batch fails its requests, not the server
                for req in batch:
                    req.send(("error", f"{type(e).__name__}: {e}", None))
                    req.finish("error")

    @torch.inference_mode()
    def generate(self, batch):
        longest = max(len(r.ids) for r in batch)
        ids = torch.zeros((len(batch), longest), dtype=torch.long)
        mask = torch.zeros((len(batch), longest), dtype=torch.long)
        for i, r in enumerate(batch):  # left padding
            ids[i, longest - len(r.ids):] = torch.tensor(r.ids)
            mask[i, longest - len(r.ids):] = 1
        new = max(r.max_tokens for r in batch)
        self.model.generate(ids.to(self.device), attention_mask=mask.to(self.device), do_sample=False,
                            max_new_tokens=new, min_new_tokens=new, pad_token_id=0,
                            streamer=BatchStreamer(batch, self.eos))

    def text(self, token):
        return self.tokenizer.decode([token]) if self.tokenizer else ""


def error(message, status=400):
    body = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": status}}
    return web.json_response(body, status=status)


async def completions(request):
    engine = request.app["engine"]
    try:
        body = await request.json()
    except json.JSONDecodeError as e:
        return error(f"the body is not JSON: {e}")
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        if engine.tokenizer is None:
            return error("this server has no tokenizer: send the prompt as token ids")
        ids = engine.tokenizer.encode(prompt).ids
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        ids = prompt
    else:
        return error("prompt must be a string or a non-empty list of token ids")
    if any(t < 0 or t >= engine.vocab for t in ids):
        return error("a prompt token id is out of vocabulary")
    max_tokens = body.get("max_tokens", 16)
    if not isinstance(max_tokens, int) or max_tokens < 1:
        return error("max_tokens must be a positive integer")
    req = Request(ids, max_tokens, bool(body.get("ignore_eos", False)), asyncio.get_running_loop())
    engine.waiting.put(req)
    rid, created, model = f"cmpl-{uuid.uuid4().hex}", int(time.time()), body.get("model", "")

    def chunk(text, reason):
        return {"id": rid, "object": "text_completion", "created": created, "model": model,
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}]}

    usage = lambda: {"prompt_tokens": len(ids), "completion_tokens": req.made,
                     "total_tokens": len(ids) + req.made}
    if not body.get("stream", False):
        text, reason = [], None
        while reason is None:
            kind, value, reason = await req.events.get()
            if kind == "token":
                text.append(engine.text(value))
            elif kind == "error":
                return error(value, 500)
            else:
                reason = value
        return web.json_response({**chunk("".join(text), reason), "usage": usage()})
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    send = lambda data: resp.write(f"data: {json.dumps(data)}\n\n".encode())
    while True:
        kind, value, reason = await req.events.get()
        if kind == "token":
            await send(chunk(engine.text(value), reason))
            if reason:
                break
        elif kind == "error":
            await send({"error": {"message": value, "type": "internal_error", "code": 500}})
        else:
            await send(chunk("", value))
            break
    if (body.get("stream_options") or {}).get("include_usage"):
        await send({"id": rid, "object": "text_completion", "created": created, "model": model,
                    "choices": [], "usage": usage()})
    await resp.write(b"data: [DONE]\n\n")
    return resp


async def ready(request):
    return web.Response(text="ready")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--port", type=int, default=8200)
    p.add_argument("--max-batch", type=int, default=64, help="most requests in one generate call")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    app = web.Application(client_max_size=64 << 20)
    app["engine"] = Engine(args.model, args.device, args.max_batch)
    app.add_routes([web.get("/ready", ready), web.post("/v1/completions", completions)])
    web.run_app(app, host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
