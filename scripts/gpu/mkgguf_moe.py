#!/usr/bin/env python3
"""Write a random-weight F16 GGUF with the shape of a mixture of experts, for the llama.cpp peer.

    python3 mkgguf_moe.py --shape qwen3-30b-a3b|mixtral-8x7b --out FILE
        --kit DIR [--layers N] [--threads N] [--seed S]

DIR is the llama.cpp peer kit (../shared/peers/llama.cpp, staged next to this script on the GPU
machine): its mkgguf.py gives the BPE vocabulary and the random fill, and the gguf-py it
extracts (/tmp/lcpp/llama.cpp/gguf-py) writes the file. `--layers` cuts the shape to its first N
decoder layers (whole Qwen3-30B-A3B is 61 GB of F16, more than the GPU machine's disk): pagewise
then runs the same cut shape from its config, so both engines read the same bytes a token.

Layout as llama.cpp's converter writes these models at F16: merged expert tensors
`blk.N.ffn_{gate,up,down}_exps` ([experts, out, in]), the router `blk.N.ffn_gate_inp` in F32,
F32 norms; Qwen3-MoE as `qwen3moe` with its q/k norms, Mixtral as `llama` with experts.
Weights ~ N(0, 0.02), norm weights 1.0. The file is written to FILE.tmp and renamed at the end.
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
}
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
    w.add_layer_norm_rms_eps(s["rms_eps"])
    w.add_expert_count(s["n_expert"])
    w.add_expert_used_count(s["n_expert_used"])
    if s["arch"] == "qwen3moe":
        w.add_expert_feed_forward_length(s["n_ff_exp"])
    w.add_vocab_size(s["n_vocab"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
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
    for name, shape, dt, _ in plan:
        w.add_tensor_info(name, shape, np.dtype(dt), int(np.prod(shape)) * np.dtype(dt).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()

    fout = w.fout[0]
    w.write_padding(fout, fout.tell())
    gen = kit.NormalF16(a.threads, a.seed)
    buf16 = np.empty(kit.CHUNK, np.float16)
    total = 0
    for name, shape, dt, kind in plan:
        n = int(np.prod(shape))
        if kind == "ones":
            np.ones(n, dt).tofile(fout)
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
