"""Makes the GPU test models on the accelerator machine (they are too big to carry, so they are
built where they run) and Hugging Face transformers' reference logits for them.

    python3 scripts/gpu/make_gpu_models.py OUT_DIR [tiny]   (tiny: only the tiny model)

OUT_DIR/tiny-d64     Llama-family model with GPU head dims (hidden 256, 4 heads, 2 KV heads,
                     head_dim 64, 2 layers), vocab 320 with the byte-level tokenizer of
                     tests/fixtures/llama-gqa-tied. Used for GPU-vs-CPU parity and batch invariance.
OUT_DIR/phi4mini-d64 Phi-3 with Phi-4-mini's partial rotary (3/4 of each head; hidden 256, 4 heads,
                     2 KV heads, head_dim 64, 2 layers, vocab 320): the unfused GPU route.
OUT_DIR/qwen3-d128   Qwen3 (an RMSNorm on each q and k head before rotary) with the GPU's head dim
                     128 (hidden 256, 8 heads, 2 KV heads, 2 layers, vocab 320), float32, and
                     its hf_logits.safetensors as below (2 sequences of 128 tokens).
OUT_DIR/gemma3-d256  Gemma 3 text with head dim 256 (hidden 256, 4 heads, 2 KV heads, 3 layers:
                     local, global, local with a 48-token window, shorter than the sequences),
                     float32, (1 + w) norms drawn around one, and its hf_logits.safetensors (2
                     sequences of 128 tokens).
OUT_DIR/qwen3moe-d128 Qwen3-MoE (8 experts of 128, top 2, renormalized, a router six times the
                     initial scale; head dim 128, hidden 256, 2 layers), float32, and its
                     hf_logits.safetensors.
OUT_DIR/gptoss-d64   gpt-oss (8 experts of 128, top 2, biases, the clamped SwiGLU; attention with
                     biases and sinks, head dim 64, hidden 256, 8/2 heads; 3 layers: sliding,
                     full, sliding with a 48-token window; YaRN factor 8 over an original context
                     of 32), float32, experts dequantized, and its hf_logits.safetensors (eager
                     attention, the implementation with sinks).
OUT_DIR/llama-1b     Random-weight Llama-3.2-1B shape (16 layers, hidden 2048, 32/8 heads, d64,
                     vocab 128256, tied embeddings, llama3 rope scaling), saved in bfloat16.
OUT_DIR/llama-1b/hf_logits.safetensors
                     transformers' logits [seqs, tokens, vocab] for random token ids `tokens`
                     [seqs, tokens]: `logits` run in float32 from the bf16 weights (the
                     reference), `logits_bf16` run in bfloat16 (how far bf16 alone moves them).
"""

import os
import shutil
import sys

import torch
from safetensors.torch import save_file
from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, GptOssConfig, GptOssForCausalLM, LlamaConfig,
                          LlamaForCausalLM, Phi3Config,
                          Phi3ForCausalLM, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "..", "..", "tests", "fixtures", "llama-gqa-tied")


def save(model, cfg, path):
    model.save_pretrained(path, safe_serialization=True)
    for f in ("tokenizer.json",):
        shutil.copy(os.path.join(FIXTURE, f), os.path.join(path, f))


def tiny(path):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=320, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                      max_position_embeddings=1024, eos_token_id=256, bos_token_id=None,
                      pad_token_id=None, initializer_range=0.1, tie_word_embeddings=True,
                      rope_theta=10000.0)
    save(LlamaForCausalLM(cfg).float(), cfg, path)


def phi4mini(path):
    torch.manual_seed(5)
    cfg = Phi3Config(vocab_size=320, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                     original_max_position_embeddings=1024, eos_token_id=256, bos_token_id=None,
                     pad_token_id=None, initializer_range=0.1, tie_word_embeddings=False,
                     rope_theta=10000.0, rope_scaling=None, sliding_window=None,
                     partial_rotary_factor=0.75)
    save(Phi3ForCausalLM(cfg).float(), cfg, path)


def reference_logits(cls, path, vocab, seqs, tokens, **load):
    """transformers' logits for random ids, from the saved checkpoint in float32 and bfloat16."""
    ids = torch.randint(0, vocab, (seqs, tokens), generator=torch.Generator().manual_seed(2))
    out = {"tokens": ids.to(torch.int64)}
    for key, dtype in (("logits_bf16", torch.bfloat16), ("logits", torch.float32)):
        model = cls.from_pretrained(path, dtype=dtype, **load).cuda().eval()
        with torch.no_grad():
            out[key] = model(ids.cuda()).logits.float().cpu().contiguous()
        del model
    save_file(out, os.path.join(path, "hf_logits.safetensors"))


def qwen3(path):
    torch.manual_seed(3)
    cfg = Qwen3Config(vocab_size=320, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=2, head_dim=128,
                      max_position_embeddings=1024, eos_token_id=256, bos_token_id=None,
                      pad_token_id=None, initializer_range=0.1, tie_word_embeddings=True,
                      rope_theta=1000000.0, rms_norm_eps=1e-6)
    model = Qwen3ForCausalLM(cfg).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)  # (ones by default: the q/k norms' scales would go untested)
    save(model, cfg, path)
    reference_logits(Qwen3ForCausalLM, path, cfg.vocab_size, seqs=2, tokens=128)


def gemma3(path):
    torch.manual_seed(6)
    cfg = Gemma3TextConfig(vocab_size=320, hidden_size=256, intermediate_size=512, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=256,
                           query_pre_attn_scalar=256, sliding_window=48,
                           layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                           max_position_embeddings=1024, eos_token_id=256, bos_token_id=None,
                           pad_token_id=None, initializer_range=0.1, tie_word_embeddings=True,
                           rope_theta=1000000.0, rope_local_base_freq=10000.0, rms_norm_eps=1e-6)
    model = Gemma3ForCausalLM(cfg).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(-0.5, 0.5)  # (zeros by default: 1 + w would be one everywhere)
    save(model, cfg, path)
    reference_logits(Gemma3ForCausalLM, path, cfg.vocab_size, seqs=2, tokens=128)


def qwen3moe(path):
    torch.manual_seed(7)
    cfg = Qwen3MoeConfig(vocab_size=320, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=2, head_dim=128,
                         num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128,
                         norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                         max_position_embeddings=1024, eos_token_id=256, bos_token_id=None,
                         pad_token_id=None, initializer_range=0.1, tie_word_embeddings=True,
                         rope_theta=1000000.0, rms_norm_eps=1e-6)
    model = Qwen3MoeForCausalLM(cfg).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            if name.endswith("mlp.gate.weight"):
                # A decided router, as trained ones are: at the initial scale the experts'
                # probabilities are near uniform and bf16 rounding alone reorders them.
                p.mul_(6.0)
    save(model, cfg, path)
    reference_logits(Qwen3MoeForCausalLM, path, cfg.vocab_size, seqs=2, tokens=128)


def gptoss(path):
    torch.manual_seed(8)
    cfg = GptOssConfig(vocab_size=320, hidden_size=256, intermediate_size=128, num_hidden_layers=3,
                       num_attention_heads=8, num_key_value_heads=2, head_dim=64, num_local_experts=8,
                       num_experts_per_tok=2, sliding_window=48,
                       layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                       rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 8.0,
                                        "beta_fast": 32.0, "beta_slow": 1.0,
                                        "original_max_position_embeddings": 32, "truncate": False},
                       max_position_embeddings=256, eos_token_id=256, bos_token_id=None,
                       pad_token_id=None, initializer_range=0.1, tie_word_embeddings=False,
                       rms_norm_eps=1e-5, attention_bias=True)
    model = GptOssForCausalLM(cfg).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            if "bias" in name:
                p.normal_(0.0, 0.1)
            if name.endswith(".sinks"):
                p.normal_(0.0, 1.0)
            if name.endswith("router.weight"):
                p.mul_(6.0)  # a decided router (see qwen3moe)
            if name.endswith("experts.gate_up_proj"):
                # Small: at 0.25 (where the clamp at 7 bites) the model is chaotic, transformers'
                # own bf16 agreeing with its f32 on 88% of the decisive positions; at 0.03, 97%.
                # (The clamp is tested by the kernel tests and the CPU fixture.)
                p.normal_(0.0, 0.03)
    save(model, cfg, path)
    reference_logits(GptOssForCausalLM, path, cfg.vocab_size, seqs=2, tokens=128,
                     attn_implementation="eager")


def llama_1b(path, seqs=4, tokens=256):
    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                      num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                      head_dim=64, max_position_embeddings=131072, rms_norm_eps=1e-5,
                      rope_theta=500000.0, tie_word_embeddings=True, eos_token_id=128001,
                      bos_token_id=128000, pad_token_id=None,
                      rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 8192})
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    save(model, cfg, path)
    del model
    # Both runs load the saved checkpoint the way users do, so the rotary inverse frequencies are
    # computed afresh in float32 (`.to(bfloat16)` on a live model would round them too).
    reference_logits(LlamaForCausalLM, path, cfg.vocab_size, seqs, tokens)


if __name__ == "__main__":
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    tiny(os.path.join(out, "tiny-d64"))
    phi4mini(os.path.join(out, "phi4mini-d64"))
    qwen3(os.path.join(out, "qwen3-d128"))
    gemma3(os.path.join(out, "gemma3-d256"))
    qwen3moe(os.path.join(out, "qwen3moe-d128"))
    gptoss(os.path.join(out, "gptoss-d64"))
    if sys.argv[2:] != ["tiny"]:
        llama_1b(os.path.join(out, "llama-1b"))
    print("models written to", out)
