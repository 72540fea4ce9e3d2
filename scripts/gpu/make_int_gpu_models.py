"""4-bit integer checkpoints of GPU shapes (head dims the GPU kernels take) for the gpu_engine
4-bit test:
    python3 scripts/gpu/make_int_gpu_models.py OUT_DIR
Writes, from make_gpu_models.py's tiny models (made here if OUT_DIR lacks them), with
tests/fixtures/make_int_models.py's packers (groups of 32):
- tiny-d64-awq: AutoAWQ GEMM, zero points (kept 4-bit on the GPU);
- qwen3-d128-gptq: GPTQ v1, asymmetric, features in order (kept 4-bit; q/k norms: the fused
  path's plain qkv GEMV);
- qwen3-d128-gptq-act-order: the same with desc_act (features out of their groups' order:
  dequantized at load);
- tiny-d64-w4a16: compressed-tensors pack-quantized, asymmetric (when compressed-tensors is
  installed);
- qwen3moe-d128-awq, qwen3moe-d128-gptq8: the mixture of experts as AutoAWQ GEMM and as GPTQ
  8-bit per channel (its experts kept as codes for the expert kernels, router kept dense).
The test compares the GPU against pagewise's own CPU run of the same directory (which
tests/int_checkpoints.rs checks against transformers on the CPU fixtures).
"""

import json
import os
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "fixtures"))
import make_gpu_models  # noqa: E402
from make_fp8_models import quantized_names  # noqa: E402
from make_int_models import CONFIGS, GROUP, awq_layer, gptq_layer, w4a16_layer  # noqa: E402

VARIANTS = [
    # name, base, kind, act order
    ("tiny-d64-awq", "tiny-d64", "awq", False),
    ("qwen3-d128-gptq", "qwen3-d128", "gptq4", False),
    ("qwen3-d128-gptq-act-order", "qwen3-d128", "gptq4", True),
    ("tiny-d64-w4a16", "tiny-d64", "w4a16", False),
    ("qwen3moe-d128-awq", "qwen3moe-d128", "awq", False),
    ("qwen3moe-d128-gptq8", "qwen3moe-d128", "gptq8", False),
]


def variant(root, name, base, kind, act_order, gen):
    src, out = os.path.join(root, base), os.path.join(root, name)
    tensors = load_file(os.path.join(src, "model.safetensors"))
    for n in list(quantized_names(tensors, moe_router_kept=True)):
        w = tensors.pop(n)
        if kind == "awq":
            packed, _ = awq_layer(w)
        elif kind == "gptq4":
            packed, _ = gptq_layer(w, 4, GROUP, symmetric=False, act_order=act_order, gen=gen)
        elif kind == "gptq8":
            packed, _ = gptq_layer(w, 8, None, symmetric=True, act_order=False, gen=gen)
        else:
            packed, _ = w4a16_layer(w)
        stem = n[: -len(".weight")]
        for k, v in packed.items():
            tensors[f"{stem}.{k}"] = v
    os.makedirs(out, exist_ok=True)
    shutil.copy(os.path.join(src, "tokenizer.json"), os.path.join(out, "tokenizer.json"))
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = dict(CONFIGS[kind])
    if kind == "gptq4":
        config["quantization_config"]["desc_act"] = act_order
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    print(name, "written")


def main(root):
    makers = {"tiny-d64": make_gpu_models.tiny, "qwen3-d128": make_gpu_models.qwen3,
              "qwen3moe-d128": make_gpu_models.qwen3moe}
    for base, make in makers.items():
        if not os.path.isfile(os.path.join(root, base, "model.safetensors")):
            make(os.path.join(root, base))
    gen = torch.Generator().manual_seed(0)
    for name, base, kind, act_order in VARIANTS:
        if kind == "w4a16":
            try:
                import compressed_tensors  # noqa: F401
            except ImportError:
                print(name, "skipped: compressed-tensors is not installed")
                continue
        variant(root, name, base, kind, act_order, gen)


if __name__ == "__main__":
    main(sys.argv[1])
