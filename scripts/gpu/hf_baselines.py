"""Hugging Face transformers baselines for the scoreboard, on the same GPU in the same call as our
runs (scripts/gpu/scoreboard.sh). Random weights, bf16, the shapes of benches (1B, 8B configs).

    python3 scripts/gpu/hf_baselines.py CONFIG_DIR... > hf.json

Per model: batch-1 decode tok/s, 128 prompt tokens, eager `generate` and with a static cache;
offline throughput of `generate` over padded batches of
64 prompts of 1024 tokens, 128 new tokens each (req/s), on 128 prompts. Prints one JSON line per
measurement. Static cache: `generate` with cache_implementation="static", which compiles the
decoding forward itself (torch.compile, mode "reduce-overhead": CUDA graphs). The warm-up run uses
the same lengths as the timed one: the static cache is sized by them, and a different size means a
recompilation inside the timed run (which is what made the first attempt, on 2026-11-29, slower
than eager). A failure is recorded as an "error" row. `HF_BASELINE_DEVICE=cpu` runs the script's
logic on a CPU (no compilation there) as a dry run. `HF_BASELINE_ROWS=static` (or `eager`) runs
only those rows.
"""

import json
import os
import sys
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM

torch.backends.cuda.matmul.allow_tf32 = True
DEVICE = os.environ.get("HF_BASELINE_DEVICE", "cuda")


# Which rows to run: "eager", "static" or both (default).
ROWS = os.environ.get("HF_BASELINE_ROWS", "eager static").split()


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def model_for(path):
    cfg = AutoConfig.from_pretrained(path)
    with torch.device(DEVICE):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    return model.eval(), cfg


def decode_rate(model, cfg, new_tokens, **kw):
    ids = torch.randint(0, cfg.vocab_size, (1, 128), device=DEVICE)
    args = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, **kw)
    model.generate(ids, **args)  # warm-up (and compilation), at the timed lengths
    sync()
    t = time.perf_counter()
    model.generate(ids, **args)
    sync()
    return new_tokens / (time.perf_counter() - t)


def throughput(model, cfg, prompts=128, batch=64):
    done, t = 0, None
    for i in range(0, prompts, batch):
        ids = torch.randint(0, cfg.vocab_size, (batch, 1024), device=DEVICE)
        if t is None:
            model.generate(ids[:2, :64], max_new_tokens=4, do_sample=False)
            sync()
            t = time.perf_counter()
        model.generate(ids, max_new_tokens=128, min_new_tokens=128, do_sample=False)
        done += batch
    sync()
    return done / (time.perf_counter() - t)


for path in sys.argv[1:]:
    name = path.rstrip("/").split("/")[-1]
    model, cfg = model_for(path)
    with torch.no_grad():
        if "eager" in ROWS:
            r = decode_rate(model, cfg, 64)
            print(json.dumps({"model": name, "what": "batch-1 decode, eager", "tok_s": r}),
                  flush=True)
            r = throughput(model, cfg)
            print(json.dumps({"model": name, "what": "offline 1024/128, eager generate, batch 64",
                              "req_s": r}), flush=True)
        # Static cache: recent transformers compile the decoding forward inside `generate` itself
        # (wrapping model.forward in torch.compile(mode="reduce-overhead") broke, see above). A
        # failure is recorded, not fatal, so the eager rows still land.
        what = "batch-1 decode, static cache + torch.compile (transformers' own)"
        # The compiled row for the models named in HF_BASELINE_STATIC_FOR (default "1b": the 8B
        # takes longer to compile than a scoreboard call spares).
        static_for = os.environ.get("HF_BASELINE_STATIC_FOR", "1b").split()
        if "static" in ROWS and any(s in name for s in static_for):
            try:
                model.generation_config.cache_implementation = "static"
                r = decode_rate(model, cfg, 256)
                print(json.dumps({"model": name, "what": what, "tok_s": r}), flush=True)
            except Exception as e:  # noqa: BLE001 - any failure is reported in the results
                print(json.dumps({"model": name, "what": what, "error": str(e)[:300]}), flush=True)
    del model
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
