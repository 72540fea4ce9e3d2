"""FP8 checkpoints of GPU shapes (head dims the GPU kernels take) for the gpu_engine FP8 test:
    python3 scripts/gpu/make_fp8_gpu_models.py OUT_DIR
Writes, from make_gpu_models.py's tiny models (made here if OUT_DIR lacks them):
- tiny-d64-fp8-channel: compressed-tensors, one scale per output channel (FP8_DYNAMIC);
- tiny-d64-fp8-tensor: compressed-tensors, one scale per tensor, static input scales;
- qwen3-d128-fp8-block: `quant_method: fp8`, 32 x 32 block scales (q/k norms: the fused path's
  plain qkv GEMV);
- qwen3moe-d128-fp8-block: the same with FP8 experts (dequantized at load) and an f32 router;
- tiny-d64-bf16: tiny-d64 with every weight rounded to bf16 (stored in f32), so that
  `--quantization fp8` quantizes the same values on the GPU (bf16) and the CPU (f32).
Each with the layouts and quantization of tests/fixtures/make_fp8_models.py; the test compares
the GPU against pagewise's own CPU run of the same directory (which
tests/fp8_checkpoints.rs checks against transformers on the CPU fixtures).
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
from make_fp8_models import BLOCK, compressed_tensors_config, quantize, quantized_names  # noqa: E402

VARIANTS = [
    # name, base, scales, static activations, format
    ("tiny-d64-fp8-channel", "tiny-d64", "channel", False, "compressed-tensors"),
    ("tiny-d64-fp8-tensor", "tiny-d64", "tensor", True, "compressed-tensors"),
    ("qwen3-d128-fp8-block", "qwen3-d128", "block", False, "fp8"),
    ("qwen3moe-d128-fp8-block", "qwen3moe-d128", "block", False, "fp8"),
]


def variant(root, name, base, scales, static, fmt):
    src, out = os.path.join(root, base), os.path.join(root, name)
    os.makedirs(out, exist_ok=True)
    for f in ["tokenizer.json", "config.json"]:
        shutil.copy(os.path.join(src, f), os.path.join(out, f))
    tensors = load_file(os.path.join(src, "model.safetensors"))
    for n in list(quantized_names(tensors, moe_router_kept=True)):
        q, s, _ = quantize(tensors[n], scales)
        stem = n[: -len(".weight")]
        tensors[n] = q
        tensors[stem + (".weight_scale_inv" if fmt == "fp8" else ".weight_scale")] = s
        if static:
            tensors[stem + ".input_scale"] = torch.tensor([0.02], dtype=torch.float32)
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    if fmt == "fp8":
        config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3",
                                         "activation_scheme": "dynamic",
                                         "weight_block_size": [BLOCK, BLOCK],
                                         "modules_to_not_convert": ["lm_head", "mlp.gate"]}
    else:
        config["quantization_config"] = compressed_tensors_config(scales, static)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    print(name, "written")


def main(root):
    makers = {"tiny-d64": make_gpu_models.tiny, "qwen3-d128": make_gpu_models.qwen3,
              "qwen3moe-d128": make_gpu_models.qwen3moe}
    for base, make in makers.items():
        if not os.path.isfile(os.path.join(root, base, "model.safetensors")):
            make(os.path.join(root, base))
    for v in VARIANTS:
        variant(root, *v)
    src, out = os.path.join(root, "tiny-d64"), os.path.join(root, "tiny-d64-bf16")
    os.makedirs(out, exist_ok=True)
    for f in ["tokenizer.json", "config.json"]:
        shutil.copy(os.path.join(src, f), os.path.join(out, f))
    tensors = {n: t.to(torch.bfloat16).float() for n, t in
               load_file(os.path.join(src, "model.safetensors")).items()}
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})


if __name__ == "__main__":
    main(sys.argv[1])
