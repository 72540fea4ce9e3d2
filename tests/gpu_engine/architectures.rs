//! The architectures beyond Llama on the GPU against transformers (part of the gpu_engine test
//! binary): Qwen3, Gemma 3, Qwen3-MoE and gpt-oss.

use candle_core::DType;
use pagewise::loader::GgufMatmul;

use super::common::{self, rel_err};
use super::{assert_decode_near_the_cpu, gpu, model, top1_agreement};

/// Qwen3 (q/k norms, head dim 128), Gemma 3 (head dim 256; a 48-token window on its local
/// layers, in prefill and decode steps) and Qwen3-MoE (experts; eager steps) on the GPU against
/// transformers (scripts/gpu/make_gpu_models.py): float32 prefill logits within 1e-4, bfloat16
/// top-1 on at least 99% of the positions where transformers' margin is decisive, and bf16
/// decode steps near the CPU's float32 logits.
#[test]
fn qwen3_gemma3_qwen3_moe_and_gpt_oss_on_the_gpu_match_transformers() {
    for name in ["qwen3-d128", "gemma3-d256", "qwen3moe-d128", "gptoss-d64"] {
        matches_transformers_on_the_gpu(name);
    }
}

fn matches_transformers_on_the_gpu(name: &str) {
    let path = model(name);
    let common::HfReference {
        tokens,
        logits: hf,
        logits_bf16: hf_bf16,
    } = common::hf_reference(&path);
    // Top-1 agreement counted over every position of both sequences: (ours, transformers' own
    // bf16, decisive positions).
    let mut top1 = (0, 0, 0);
    for (s, seq) in tokens.iter().enumerate() {
        let on = |dtype| {
            common::logits_at_every_position_on(&path, GgufMatmul::Auto, seq, &gpu(), dtype)
        };
        let (f32_gpu, bf16_gpu) = (on(DType::F32), on(DType::BF16));
        let e32 = rel_err(&f32_gpu, &hf[s]);
        let (agree, decisive) = top1_agreement(&bf16_gpu, &hf[s]);
        let (theirs, _) = top1_agreement(&hf_bf16[s], &hf[s]);
        let (e16, theirs_e16) = (rel_err(&bf16_gpu, &hf[s]), rel_err(&hf_bf16[s], &hf[s]));
        eprintln!(
            "{name}, sequence {s}: f32 GPU rel. err. {e32:.2e}; bf16 {e16:.2e}, top-1 \
             {agree}/{decisive} (transformers' own bf16: {theirs_e16:.2e}, {theirs})"
        );
        assert!(e32 < 1e-4, "{name} f32 on the GPU: {e32}");
        top1 = (top1.0 + agree, top1.1 + theirs, top1.2 + decisive);
    }
    // (A mixture of experts in bf16 swaps near-tied experts now and then, transformers' own bf16
    // as well: the bar is 99% or what transformers' bf16 reaches, if lower.)
    let (agree, theirs, decisive) = top1;
    assert!(
        agree * 100 >= decisive * 99 || agree >= theirs,
        "{name} bf16 top-1 {agree}/{decisive} (transformers' bf16: {theirs})"
    );
    // (Gemma's run past its local layers' 48-token window.)
    let steps = if name.starts_with("gemma3") { 100 } else { 40 };
    let seqs: Vec<Vec<u32>> = tokens.iter().map(|t| t[..steps].to_vec()).collect();
    let got = common::logits_decoding_step_by_step(&path, &seqs, &gpu(), DType::BF16);
    let fused = common::fused_decode_rows(&path, &gpu(), DType::BF16, None);
    let label = format!("{name}, {steps} bf16 decode steps of 2 rows (fused up to {fused} rows)");
    assert_decode_near_the_cpu(&label, &path, &seqs, &got);
    // Dense Qwen3 and Gemma 3 take the fused decode kernels (src/model/decode_fused.rs).
    if matches!(name, "qwen3-d128" | "gemma3-d256") {
        assert_eq!(fused, 2, "{name}: every step must take the fused path");
    }
}
