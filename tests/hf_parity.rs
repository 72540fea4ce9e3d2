//! Parity with Hugging Face transformers on tiny random-weight models (tests/fixtures/, made by
//! tests/fixtures/make_tiny_models.py): f32 logits at every position within 1e-4 relative error,
//! and the engine's greedy continuation token for token.

mod common;

use pagewise::loader::GgufMatmul;

use common::parity::{FIXTURES, check, check_model};

#[test]
fn llama_with_gqa_tied_embeddings_and_llama3_rope_matches_transformers() {
    check("llama-gqa-tied");
}

#[test]
fn qwen2_with_qkv_bias_matches_transformers() {
    check("qwen2-bias");
}

#[test]
fn opt_with_project_in_out_matches_transformers() {
    check("opt");
}

#[test]
fn qwen3_with_per_head_qk_norm_and_wide_heads_matches_transformers() {
    check("qwen3-qknorm");
}

/// The same Qwen3 as GGUF files (tests/fixtures/make_gguf.py, laid out as llama.cpp's converter
/// does for `qwen3`): F32 gives transformers' logits and greedy tokens; Q8_0 matrices stay within
/// quantization error of them.
#[test]
fn qwen3_gguf_matches_transformers_in_f32_and_within_q8_0_error() {
    let dir = format!("{FIXTURES}/qwen3-qknorm");
    check_model("qwen3-qknorm", &format!("{dir}/model-F32.gguf"), 1e-4, true);
    // (Q8_0 rounds each weight to 1/254 of its block of 32's largest, ~0.5% a weight, which
    // these large random weights carry to ~4% of the logits' scale at the worst position.)
    check_model(
        "qwen3-qknorm",
        &format!("{dir}/model-Q8_0.gguf"),
        6e-2,
        false,
    );
}

/// The logits of `dir/model-{kind}.gguf` against those of `model-{kind}-as-F32.gguf`, which
/// holds the same weights dequantized by gguf-py (an independent implementation): within 1e-5 on
/// the dequantized path, within `default_tolerance` by default (the CPU kernels, with 8-bit
/// activations, where they take the type). Returns the default path's error.
fn decodes_as_gguf_py(dir: &str, kind: &str, default_tolerance: f64) -> f64 {
    let tokens: Vec<u32> = (0..40).map(|i| (i * 37 + 5) % 300).collect();
    let at = |file: String, matmul| common::logits_at_every_position(&file, matmul, &tokens);
    let want = at(format!("{dir}/model-{kind}-as-F32.gguf"), GgufMatmul::Auto);
    let file = format!("{dir}/model-{kind}.gguf");
    let dequantized = common::rel_err(&at(file.clone(), GgufMatmul::Dequantized), &want);
    let default = common::rel_err(&at(file, GgufMatmul::Auto), &want);
    eprintln!(
        "{kind}: rel. err. against its weights dequantized by gguf-py: dequantized \
         {dequantized:.2e}, default {default:.2e}"
    );
    assert!(dequantized < 1e-5, "{kind} dequantized: {dequantized}");
    assert!(default < default_tolerance, "{kind} default: {default}");
    default
}

/// 4- and 5-bit GGUF weights (tests/fixtures/make_gguf.py `Q4_0:F32`, `Q5_0:F32`, `Q5_1:F32`):
/// by default the CPU multiplies each with its quantized kernels.
#[test]
fn q4_0_q5_0_and_q5_1_gguf_weights_decode_as_gguf_py_decodes_them() {
    let dir = format!("{FIXTURES}/qwen3-qknorm");
    for kind in ["Q4_0", "Q5_0", "Q5_1"] {
        let err = decodes_as_gguf_py(&dir, kind, 5e-2);
        // Not the dequantized weights: the kernels quantize the activations to 8 bits.
        assert!(err > 1e-5, "{kind}: {err}, as if dequantized");
    }
}

/// F16 and BF16 GGUF matrices (tests/fixtures/make_gguf.py `F16`, `BF16`): by default the CPU
/// multiplies them on its 16-bit float kernels. F16 ones take the activations as they are, so the
/// logits are the dequantized path's (candle reading the same values) within f32 rounding, where
/// 8-bit activations would be about 1e-2 off. BF16 ones take the activations rounded to BF16, as
/// llama.cpp multiplies them: within that rounding (2^-9 of each activation; 6.7e-3 measured) of
/// the dequantized path, and not within f32 rounding. Both stay within the weights' rounding of
/// the F32 file's.
#[test]
fn f16_and_bf16_gguf_weights_multiply_as_their_dequantized_values() {
    let dir = format!("{FIXTURES}/qwen3-qknorm");
    let tokens: Vec<u32> = (0..40).map(|i| (i * 37 + 5) % 300).collect();
    let at = |file: &str, matmul| common::logits_at_every_position(file, matmul, &tokens);
    let f32_logits = at(&format!("{dir}/model-F32.gguf"), GgufMatmul::Auto);
    // (kind, most from the dequantized path, least from it, most from the F32 file)
    for (kind, most, least, rounding) in [("F16", 1e-5, 0.0, 1e-2), ("BF16", 2e-2, 1e-4, 5e-2)] {
        let file = format!("{dir}/model-{kind}.gguf");
        let dequantized = at(&file, GgufMatmul::Dequantized);
        let kernels = at(&file, GgufMatmul::Auto);
        let (err, from_f32) = (
            common::rel_err(&kernels, &dequantized),
            common::rel_err(&kernels, &f32_logits),
        );
        eprintln!(
            "{kind}: kernels against dequantized {err:.2e}, against the F32 file {from_f32:.2e}"
        );
        assert!(err < most, "{kind}: {err}");
        // (Zero only if the default also took the dequantized weights: another summation order
        // always shows.)
        assert!(
            err > least,
            "{kind}: {err}: not multiplied on the 16-bit kernels"
        );
        assert!(from_f32 > 0.0 && from_f32 < rounding, "{kind}: {from_f32}");
    }
}

/// k-quants through the loader: Q4_K_M and Q5_K_M files as llama.cpp's `llama-quantize` writes
/// them (Q4_K or Q5_K matrices, Q6_K for attn_v, ffn_down and the output head; rows of 256 and
/// 512; tests/fixtures/make_kquant_gguf.py). By default the CPU runs every type on its
/// interleaved kernels.
#[test]
fn q4_k_m_and_q5_k_m_gguf_weights_decode_as_gguf_py_decodes_them() {
    for mix in ["Q4_K_M", "Q5_K_M"] {
        let err = decodes_as_gguf_py(&format!("{FIXTURES}/qwen3-k256"), mix, 5e-2);
        assert!(err > 1e-5, "{mix}: {err}, as if dequantized");
    }
}

/// IQ4_NL and IQ4_XS files as `llama-quantize` writes them (the matrices and the embedding in
/// the type, a Q6_K head; make_kquant_gguf.py): read apart from candle's reader, multiplied on
/// our interleaved kernels by default, dequantized exactly as gguf-py dequantizes them.
#[test]
fn iq4_nl_and_iq4_xs_gguf_weights_decode_as_gguf_py_decodes_them() {
    for mix in ["IQ4_NL", "IQ4_XS"] {
        let err = decodes_as_gguf_py(&format!("{FIXTURES}/qwen3-k256"), mix, 5e-2);
        assert!(err > 1e-5, "{mix}: {err}, as if dequantized");
    }
}

/// Qwen2 with q/k/v biases as a GGUF file (`qwen2` architecture): transformers' logits and
/// greedy tokens.
#[test]
fn qwen2_gguf_with_biases_matches_transformers() {
    check_model(
        "qwen2-bias",
        &format!("{FIXTURES}/qwen2-bias/model-F32.gguf"),
        1e-4,
        true,
    );
}

#[test]
fn gpt2_with_conv1d_weights_and_learned_positions_matches_transformers() {
    check("gpt2");
}

#[test]
fn gpt_neox_with_parallel_residual_and_partial_rotary_matches_transformers() {
    check("gpt-neox");
}

#[test]
fn phi3_with_stacked_qkv_and_gate_up_matches_transformers() {
    check("phi3");
}

#[test]
fn phi3_with_longrope_scaling_matches_transformers() {
    check("phi3-longrope");
}

#[test]
fn phi3_with_partial_rotary_matches_transformers() {
    check("phi3-partial");
}

#[test]
fn gemma3_with_sliding_windows_and_two_rotary_bases_matches_transformers() {
    check("gemma3");
}

/// The same Gemma 3 as GGUF files (`gemma3`, laid out as llama.cpp's converter does: norm
/// weights stored as 1 + w, its own norm names, the layers' pattern and the score scale in the
/// metadata): F32 gives transformers' logits and greedy tokens; Q8_0 stays within quantization
/// error of them.
#[test]
fn gemma3_gguf_matches_transformers_in_f32_and_within_q8_0_error() {
    let dir = format!("{FIXTURES}/gemma3");
    check_model("gemma3", &format!("{dir}/model-F32.gguf"), 1e-4, true);
    let _ = decodes_as_gguf_py(&dir, "Q8_0", 1e-1);
}

#[test]
fn mixtral_with_top2_of_4_experts_matches_transformers() {
    check("mixtral");
}

/// gpt-oss: attention sinks, sliding windows shorter than the prompts, YaRN past the original
/// context, experts with biases and the clamped SwiGLU, from MXFP4 experts (as the checkpoints
/// ship them) and from the dequantized layout transformers saves.
#[test]
fn gpt_oss_with_sinks_windows_yarn_and_mxfp4_experts_matches_transformers() {
    check("gpt-oss");
    check_model(
        "gpt-oss",
        &format!("{FIXTURES}/gpt-oss/dequantized"),
        1e-4,
        true,
    );
}

/// The same gpt-oss as llama.cpp lays it out (`gpt-oss`; tests/fixtures/make_gptoss_gguf.py):
/// experts in ggml's MXFP4 blocks (a type candle's GGUF reader refuses; ours reads it), gate and
/// up split, sinks and biases under llama.cpp's names, YaRN and the window from its metadata:
/// transformers' logits and greedy tokens.
#[test]
fn gpt_oss_gguf_with_mxfp4_experts_matches_transformers() {
    check_model(
        "gpt-oss",
        &format!("{FIXTURES}/gpt-oss/model-MXFP4.gguf"),
        1e-4,
        true,
    );
}

#[test]
fn qwen3_moe_with_renormalized_top3_of_8_and_a_dense_layer_matches_transformers() {
    check("qwen3-moe");
}

/// The same Qwen3-MoE as GGUF files (`qwen3moe`, each layer's experts stacked in three tensors as
/// llama.cpp lays them out): F32 gives transformers' logits and greedy tokens; Q8_0 experts read
/// as gguf-py dequantizes them.
#[test]
fn qwen3_moe_gguf_matches_transformers_in_f32_and_reads_q8_0_experts() {
    let dir = format!("{FIXTURES}/qwen3-moe");
    check_model("qwen3-moe", &format!("{dir}/model-F32.gguf"), 1e-4, true);
    // (By default the CPU kernels quantize activations to 8 bits, which reorders near-tied
    // experts at a few positions: a wider bound than for dense weights.)
    let _ = decodes_as_gguf_py(&dir, "Q8_0", 1e-1);
}

/// Mixtral as a `llama` GGUF file with `expert_count` (q/k rows permuted for interleaved rotary,
/// experts stacked): transformers' logits and greedy tokens.
#[test]
fn mixtral_gguf_matches_transformers() {
    check_model(
        "mixtral",
        &format!("{FIXTURES}/mixtral/model-F32.gguf"),
        1e-4,
        true,
    );
}

/// Phi-3 as `phi3` GGUF files (q/k/v in `attn_qkv`, gate and up in `ffn_up`, as llama.cpp's
/// converter keeps them), with all of each head rotated, with Phi-4-mini's partial rotary
/// (`rope.dimension_count` below the head) and with LongRoPE (`rope_factors_short/long` tensors,
/// past the original context too): transformers' logits and greedy tokens.
#[test]
fn phi3_gguf_with_full_and_partial_rotary_and_longrope_matches_transformers() {
    for name in ["phi3", "phi3-partial", "phi3-longrope"] {
        check_model(
            name,
            &format!("{FIXTURES}/{name}/model-F32.gguf"),
            1e-4,
            true,
        );
    }
}

/// GPT-2 and GPT-NeoX as `gpt2` and `gptneox` GGUF files, laid out as llama.cpp's converter lays
/// them out (GPT-2's Conv1D weights transposed to `[out, in]`, learned positions in
/// `position_embd`; NeoX's per-head q/k/v regrouped into three blocks, partial rotary in
/// `rope.dimension_count`): F32 gives transformers' logits and greedy tokens; Q8_0 stays within
/// quantization error of them.
#[test]
fn gpt2_and_gpt_neox_gguf_match_transformers_in_f32_and_within_q8_0_error() {
    for name in ["gpt2", "gpt-neox"] {
        let dir = format!("{FIXTURES}/{name}");
        check_model(name, &format!("{dir}/model-F32.gguf"), 1e-4, true);
        check_model(name, &format!("{dir}/model-Q8_0.gguf"), 6e-2, false);
    }
}
