#!/usr/bin/env python3
"""Write a random-weight GGUF with the shape of a mixture of experts, for the llama.cpp peer.

    python3 mkgguf_moe.py --shape qwen3-30b-a3b|mixtral-8x7b|gpt-oss-20b|gpt-oss-120b --out FILE
        --kit DIR [--layers N] [--threads N] [--seed S]

DIR is the llama.cpp peer kit (../shared/peers/llama.cpp, staged next to this script on the GPU
machine): its mkgguf.py gives the BPE vocabulary and the random fill, and the gguf-py it
extracts (/tmp/lcpp/llama.cpp/gguf-py) writes the file. `--layers` cuts the shape to its first N
decoder layers (whole Qwen3-30B-A3B is 61 GB of F16, more than the GPU machine's disk): pagewise
then runs the same cut shape from its config, so both engines read the same bytes a token.

Layout as llama.cpp's converter writes these models at F16: merged expert tensors
`blk.N.ffn_{gate,up,down}_exps` ([experts, out, in]), the router `blk.N.ffn_gate_inp` in F32,
F32 norms; Qwen3-MoE as `qwen3moe` with its q/k norms, Mixtral as `llama` with experts.
gpt-oss as `gpt-oss`, the way ggml-org ships it: experts in MXFP4 (random codes, scales 2^-8 to
2^-6), the other matrices F16, its biases, sinks and post-attention norm in F32, YaRN and the
128-token sliding window in the metadata. Weights ~ N(0, 0.02), norm weights 1.0, biases and
sinks 0. The file is written to FILE.tmp and renamed at the end.
"""
import argparse
import importlib.util
import os
import time

import numpy as np

SHAPES = {
    "qwen3-30b-a3b": dict(arch="qwen3moe", name="Qwen3-30B-A3B random", n_embd=2048, n_layer=48,
                          n_head=32, n_head_kv=4, head_dim=128, n_ff=6144, n_ff_exp=768,
                          n_expert=128, n_expert_used=8, n_vocab=151936, rope_theta=1e6,
                          rms_eps=1e-6, qk_norm=True),
    "mixtral-8x7b": dict(arch="llama", name="Mixtral-8x7B random", n_embd=4096, n_layer=32,
                         n_head=32, n_head_kv=8, head_dim=128, n_ff=14336, n_ff_exp=14336,
                         n_expert=8, n_expert_used=2, n_vocab=32000, rope_theta=1e6,
                         rms_eps=1e-5, qk_norm=False),
    "gpt-oss-20b": dict(arch="gpt-oss", name="gpt-oss-20b random", n_embd=2880, n_layer=24,
                        n_head=64, n_head_kv=8, head_dim=64, n_ff=2880, n_ff_exp=2880,
                        n_expert=32, n_expert_used=4, n_vocab=201088, rope_theta=150000.0,
                        rms_eps=1e-5, qk_norm=False),
}
SHAPES["gpt-oss-120b"] = dict(SHAPES["gpt-oss-20b"], name="gpt-oss-120b random", n_layer=36, n_expert=128)
MXFP4_RUN = 32  # values a block, stored as 1 scale byte + 16 bytes of codes
CTX_TRAIN = 32768


def load_kit(kit):
    spec = importlib.util.spec_from_file_location("mkgguf", os.path.join(kit, "mkgguf.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def tensor_plan(s):
    E, V, D = s["n_embd"], s["n_vocab"], s["head_dim"]
    X, F = s["n_expert"], s["n_ff_exp"]
    q, kv = s["n_head"] * D, s["n_head_kv"] * D
    f16, f32 = np.float16, np.float32
    if s["arch"] == "gpt-oss":
        return gptoss_plan(s)
    # numpy (row-major) shapes, i.e. [out, in]; gguf-py reverses them into ggml's ne[]
    plan = [("token_embd.weight", (V, E), f16, "normal")]
    for i in range(s["n_layer"]):
        b = f"blk.{i}."
        plan += [(b + "attn_norm.weight", (E,), f32, "ones"),
                 (b + "attn_q.weight", (q, E), f16, "normal"),
                 (b + "attn_k.weight", (kv, E), f16, "normal"),
                 (b + "attn_v.weight", (kv, E), f16, "normal"),
                 (b + "attn_output.weight", (E, q), f16, "normal")]
        if s["qk_norm"]:
            plan += [(b + "attn_q_norm.weight", (D,), f32, "ones"),
                     (b + "attn_k_norm.weight", (D,), f32, "ones")]
        plan += [(b + "ffn_norm.weight", (E,), f32, "ones"),
                 (b + "ffn_gate_inp.weight", (X, E), f32, "normal"),
                 (b + "ffn_gate_exps.weight", (X, F, E), f16, "normal"),
                 (b + "ffn_up_exps.weight", (X, F, E), f16, "normal"),
                 (b + "ffn_down_exps.weight", (X, E, F), f16, "normal")]
    plan += [("output_norm.weight", (E,), f32, "ones"),
             ("output.weight", (V, E), f16, "normal")]
    return plan


def gptoss_plan(s):
    """gpt-oss's tensors: MXFP4 experts given by their byte shape [experts, out, in / 32 * 17]."""
    E, V, D = s["n_embd"], s["n_vocab"], s["head_dim"]
    X, F = s["n_expert"], s["n_ff_exp"]
    q, kv = s["n_head"] * D, s["n_head_kv"] * D
    f16, f32, u8 = np.float16, np.float32, np.uint8
    runs = lambda k: k // MXFP4_RUN * 17  # noqa: E731
    plan = [("token_embd.weight", (V, E), f16, "normal")]
    for i in range(s["n_layer"]):
        b = f"blk.{i}."
        plan += [(b + "attn_norm.weight", (E,), f32, "ones"),
                 (b + "attn_q.weight", (q, E), f16, "normal"), (b + "attn_q.bias", (q,), f32, "zeros"),
                 (b + "attn_k.weight", (kv, E), f16, "normal"), (b + "attn_k.bias", (kv,), f32, "zeros"),
                 (b + "attn_v.weight", (kv, E), f16, "normal"), (b + "attn_v.bias", (kv,), f32, "zeros"),
                 (b + "attn_output.weight", (E, q), f16, "normal"),
                 (b + "attn_output.bias", (E,), f32, "zeros"),
                 (b + "attn_sinks.weight", (s["n_head"],), f32, "zeros"),
                 (b + "post_attention_norm.weight", (E,), f32, "ones"),
                 (b + "ffn_gate_inp.weight", (X, E), f32, "normal"),
                 (b + "ffn_gate_inp.bias", (X,), f32, "zeros"),
                 (b + "ffn_gate_exps.weight", (X, F, runs(E)), u8, "mxfp4"),
                 (b + "ffn_gate_exps.bias", (X, F), f32, "zeros"),
                 (b + "ffn_up_exps.weight", (X, F, runs(E)), u8, "mxfp4"),
                 (b + "ffn_up_exps.bias", (X, F), f32, "zeros"),
                 (b + "ffn_down_exps.weight", (X, E, runs(F)), u8, "mxfp4"),
                 (b + "ffn_down_exps.bias", (X, E), f32, "zeros")]
    plan += [("output_norm.weight", (E,), f32, "ones"),
             ("output.weight", (V, E), f16, "normal")]
    return plan


def write_mxfp4(fout, shape, rng):
    """Random MXFP4 blocks, a row of blocks at a time: codes uniform, scale bytes 119..121."""
    rows, width = int(np.prod(shape[:-1])), shape[-1]
    step = max(1, (64 << 20) // width)
    for r in range(0, rows, step):
        n = min(step, rows - r)
        blocks = np.frombuffer(rng.bytes(n * width), np.uint8).reshape(n, width // 17, 17).copy()
        blocks[:, :, 0] = 119 + blocks[:, :, 0] % 3
        blocks.tofile(fout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES))
    ap.add_argument("--out", required=True)
    ap.add_argument("--kit", required=True, help="the llama.cpp peer kit's folder (its mkgguf.py)")
    ap.add_argument("--gguf-py", default=None, help="llama.cpp/gguf-py dir")
    ap.add_argument("--layers", type=int, default=None, help="keep the first N decoder layers")
    ap.add_argument("--threads", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    kit = load_kit(a.kit)
    gguf = kit.import_gguf(a.gguf_py)
    s = dict(SHAPES[a.shape])
    if a.layers:
        s["n_layer"] = a.layers
    t0 = time.time()

    tmp = a.out + ".tmp"
    w = gguf.GGUFWriter(tmp, s["arch"])
    w.add_type("model")
    w.add_name(s["name"])
    w.add_context_length(CTX_TRAIN)
    w.add_embedding_length(s["n_embd"])
    w.add_block_count(s["n_layer"])
    w.add_feed_forward_length(s["n_ff"])
    w.add_head_count(s["n_head"])
    w.add_head_count_kv(s["n_head_kv"])
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_rope_dimension_count(s["head_dim"])
    w.add_rope_freq_base(s["rope_theta"])
    if s["arch"] == "gpt-oss":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(32.0)
        w.add_rope_scaling_orig_ctx_len(4096)
        w.add_sliding_window(128)
    w.add_layer_norm_rms_eps(s["rms_eps"])
    w.add_expert_count(s["n_expert"])
    w.add_expert_used_count(s["n_expert_used"])
    if s["arch"] in ("qwen3moe", "gpt-oss"):
        w.add_expert_feed_forward_length(s["n_ff_exp"])
    w.add_vocab_size(s["n_vocab"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE if s["arch"] == "gpt-oss" else gguf.LlamaFileType.MOSTLY_F16)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    tokens, ttypes, merges, first_special = kit.build_bpe_vocab(s["n_vocab"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types(ttypes)
    w.add_token_merges(merges)
    w.add_bos_token_id(first_special + 0)
    w.add_eos_token_id(first_special + 9)
    w.add_add_bos_token(True)
    w.add_chat_template(kit.LLAMA3_CHAT_TEMPLATE)

    plan = tensor_plan(s)
    for name, shape, dt, kind in plan:
        raw = gguf.GGMLQuantizationType.MXFP4 if kind == "mxfp4" else None
        w.add_tensor_info(name, shape, np.dtype(dt), int(np.prod(shape)) * np.dtype(dt).itemsize, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()

    fout = w.fout[0]
    w.write_padding(fout, fout.tell())
    gen = kit.NormalF16(a.threads, a.seed)
    buf16 = np.empty(kit.CHUNK, np.float16)
    total = 0
    rng = np.random.default_rng(a.seed)
    for name, shape, dt, kind in plan:
        n = int(np.prod(shape))
        if kind == "ones":
            np.ones(n, dt).tofile(fout)
        elif kind == "zeros":
            np.zeros(n, dt).tofile(fout)
        elif kind == "mxfp4":
            write_mxfp4(fout, shape, rng)
        elif dt == np.float16:
            done = 0
            while done < n:
                m = min(kit.CHUNK, n - done)
                gen.fill(buf16[:m])
                buf16[:m].tofile(fout)
                done += m
        else:  # a small F32 matrix (the router)
            (np.random.default_rng(a.seed + total).standard_normal(n, np.float32) * 0.02).tofile(fout)
        nbytes = n * np.dtype(dt).itemsize
        w.write_padding(fout, nbytes)
        total += nbytes
    w.close()
    os.replace(tmp, a.out)
    print(f"mkgguf_moe: wrote {a.out}: {s['n_layer']} layers, {len(plan)} tensors, "
          f"{total / 2**30:.2f} GiB, {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
