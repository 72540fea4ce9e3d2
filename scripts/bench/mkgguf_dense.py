#!/usr/bin/env python3
"""Write a random-weight F16 GGUF with the shape of a small dense model, for the CPU comparison
against llama.cpp (issue 62): `llama-quantize` then makes its Q4_K_M, Q5_K_M and Q8_0 files.

    python3 mkgguf_dense.py --shape qwen2.5-0.5b|gemma3-270m --out FILE --kit DIR
        [--threads N] [--seed S]

DIR is the llama.cpp peer kit (../shared/peers/llama.cpp): its mkgguf.py gives the BPE
vocabulary and the random fill, and the gguf-py it extracts (/tmp/lcpp/llama.cpp/gguf-py, after
`run.sh cpu-build`) writes the file. The Llama-3.2-1B shape is the kit's own (`SHAPES=llama-1b
bash run.sh models`).

Layout as llama.cpp's converter writes these models at F16: Qwen2 as `qwen2` with q/k/v biases;
Gemma 3 as `gemma3` with its q/k norms, the norms after attention and after the MLP, a 512-token
window on five layers of six. Both tie the embedding and the head. Weights ~ N(0, 0.02), norm
weights 1.0, biases 0. The file is written to FILE.tmp and renamed at the end.
"""
import argparse
import importlib.util
import os
import time

import numpy as np

SHAPES = {
    "qwen2.5-0.5b": dict(arch="qwen2", name="Qwen2.5-0.5B random", n_embd=896, n_layer=24,
                         n_head=14, n_head_kv=2, head_dim=64, n_ff=4864, n_vocab=151936,
                         rope_theta=1e6, rms_eps=1e-6),
    "gemma3-270m": dict(arch="gemma3", name="Gemma-3-270M random", n_embd=640, n_layer=18,
                        n_head=4, n_head_kv=1, head_dim=256, n_ff=2048, n_vocab=262144,
                        rope_theta=1e6, rms_eps=1e-6, window=512),
}
CTX_TRAIN = 32768


def load_kit(kit):
    spec = importlib.util.spec_from_file_location("mkgguf", os.path.join(kit, "mkgguf.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def tensor_plan(s):
    """(name, numpy shape [out, in], dtype, fill) of every tensor."""
    E, V, D, F = s["n_embd"], s["n_vocab"], s["head_dim"], s["n_ff"]
    q, kv = s["n_head"] * D, s["n_head_kv"] * D
    f16, f32 = np.float16, np.float32
    gemma = s["arch"] == "gemma3"
    plan = [("token_embd.weight", (V, E), f16, "normal")]
    for i in range(s["n_layer"]):
        b = f"blk.{i}."
        plan += [(b + "attn_norm.weight", (E,), f32, "ones"),
                 (b + "attn_q.weight", (q, E), f16, "normal"),
                 (b + "attn_k.weight", (kv, E), f16, "normal"),
                 (b + "attn_v.weight", (kv, E), f16, "normal")]
        if gemma:
            plan += [(b + "attn_q_norm.weight", (D,), f32, "ones"),
                     (b + "attn_k_norm.weight", (D,), f32, "ones")]
        else:
            plan += [(b + "attn_q.bias", (q,), f32, "zeros"),
                     (b + "attn_k.bias", (kv,), f32, "zeros"),
                     (b + "attn_v.bias", (kv,), f32, "zeros")]
        plan.append((b + "attn_output.weight", (E, q), f16, "normal"))
        if gemma:
            plan.append((b + "post_attention_norm.weight", (E,), f32, "ones"))
        plan += [(b + "ffn_norm.weight", (E,), f32, "ones"),
                 (b + "ffn_gate.weight", (F, E), f16, "normal"),
                 (b + "ffn_up.weight", (F, E), f16, "normal"),
                 (b + "ffn_down.weight", (E, F), f16, "normal")]
        if gemma:
            plan.append((b + "post_ffw_norm.weight", (E,), f32, "ones"))
    plan.append(("output_norm.weight", (E,), f32, "ones"))
    return plan


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES))
    ap.add_argument("--out", required=True)
    ap.add_argument("--kit", required=True, help="the llama.cpp peer kit's folder (its mkgguf.py)")
    ap.add_argument("--gguf-py", default=None, help="llama.cpp/gguf-py dir")
    ap.add_argument("--threads", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    kit = load_kit(a.kit)
    gguf = kit.import_gguf(a.gguf_py)
    s = SHAPES[a.shape]
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
    w.add_rope_freq_base(s["rope_theta"])
    w.add_layer_norm_rms_eps(s["rms_eps"])
    if "window" in s:
        w.add_sliding_window(s["window"])
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
        elif kind == "zeros":
            np.zeros(n, dt).tofile(fout)
        else:
            done = 0
            while done < n:
                m = min(kit.CHUNK, n - done)
                gen.fill(buf16[:m])
                buf16[:m].tofile(fout)
                done += m
        nbytes = n * np.dtype(dt).itemsize
        w.write_padding(fout, nbytes)
        total += nbytes
    w.close()
    os.replace(tmp, a.out)
    print(f"mkgguf_dense: wrote {a.out}: {len(plan)} tensors, {total / 2**30:.2f} GiB, "
          f"{time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
