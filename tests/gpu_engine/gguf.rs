//! GGUF k-quant files on the GPU (part of the gpu_engine test binary): the committed Q4_K_M and
//! Q5_K_M files of tests/fixtures/qwen3-k256 (written by llama.cpp's `llama-quantize`: Q4_K or
//! Q5_K matrices, Q6_K for attn_v, ffn_down and the head) keep their codes on the GPU, run on the
//! decode GEMVs (fused, inside CUDA graphs) and stay near the CPU's float32 logits of the same
//! weights as gguf-py dequantizes them (the `-as-F32.gguf` beside each file).

use candle_core::{DType, Device};
use pagewise::loader::GgufMatmul;
use pagewise::model::layers::Linear;

use super::batching::{bf16_eager_and_graphs, graph_replays_equal_eager};
use super::common::{self, rel_err};
use super::fp8::first_q_proj;
use super::{gpu, top1_agreement};

/// The fixture file `name` of qwen3-k256, from the checkout the test runs in (the device tool
/// runs it in a copy of the repository) or the one it was built from.
fn fixture(name: &str) -> String {
    let here = format!("tests/fixtures/qwen3-k256/{name}");
    match std::path::Path::new(&here).exists() {
        true => here,
        false => format!("{}/{here}", env!("CARGO_MANIFEST_DIR")),
    }
}

#[test]
fn gguf_k_quants_keep_their_codes_on_the_gpu_and_match_the_dequantized_weights() {
    let seqs: Vec<Vec<u32>> = (0..2u32)
        .map(|s| (0..40).map(|i| (i * 37 + s * 101 + 3) % 250).collect())
        .collect();
    for mix in ["Q4_K_M", "Q5_K_M"] {
        let path = fixture(&format!("model-{mix}.gguf"));
        let exact = fixture(&format!("model-{mix}-as-F32.gguf"));
        assert!(
            matches!(first_q_proj(&path, None), Linear::Affine(_)),
            "{mix}: the q projection must stay codes on the GPU"
        );
        let want: Vec<Vec<Vec<f32>>> = seqs
            .iter()
            .map(|s| {
                common::logits_at_every_position_on(
                    &exact,
                    GgufMatmul::Auto,
                    s,
                    &Device::Cpu,
                    DType::F32,
                )
            })
            .collect();
        for (i, s) in seqs.iter().enumerate() {
            let got = common::logits_at_every_position_on(
                &path,
                GgufMatmul::Auto,
                s,
                &gpu(),
                DType::BF16,
            );
            let err = rel_err(&got, &want[i]);
            let (agree, decisive) = top1_agreement(&got, &want[i]);
            eprintln!(
                "{mix}: bf16 prefill on the GPU, rel. err. {err:.2e}, top-1 {agree}/{decisive}"
            );
            assert!(err < 5e-2, "{mix} prefill: {err}");
            assert!(
                agree as f64 >= 0.95 * decisive as f64,
                "{mix}: {agree}/{decisive}"
            );
        }
        let fused = common::fused_decode_rows(&path, &gpu(), DType::BF16, None);
        assert!(
            fused >= 1,
            "{mix}: decode steps must take the fused kernels"
        );
        let got =
            common::logits_decoding_step_by_step_quantized(&path, &seqs, &gpu(), DType::BF16, None);
        for (i, g) in got.iter().enumerate() {
            let err = rel_err(g, &want[i]);
            eprintln!(
                "{mix}, decode (fused up to {fused} rows), sequence {i}: rel. err. {err:.2e}"
            );
            assert!(err < 5e-2, "{mix} decode, sequence {i}: {err}");
        }
    }
}

#[test]
fn gguf_k_quant_graphs_equal_eager_runs() {
    let (mut eager, mut graphs) = bf16_eager_and_graphs(fixture("model-Q4_K_M.gguf"));
    let replays = graph_replays_equal_eager(&mut eager, &mut graphs, &[1, 3]);
    eprintln!("GGUF Q4_K_M: (graph replays, steps) per run: {replays:?}");
    assert!(
        replays[0].0 > 0,
        "no decode step replayed a graph: {replays:?}"
    );
}
