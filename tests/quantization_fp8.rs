//! `--quantization fp8` on the CPU: a 16-bit checkpoint's decoder projections rounded to e4m3
//! with one scale per output channel, against transformers running the same rounding
//! (tests/fixtures/make_fp8_models.py writes llama-gqa-tied/expected-quantization-fp8.json), and
//! the checkpoints it does not take, each refused by name. (On a GPU the e4m3 weights are kept:
//! tests/gpu_engine/fp8.rs.)

mod common;

use candle_core::{DType, Device};
use common::parity::{FIXTURES, cases, cases_in};
use pagewise::loader::{GgufMatmul, Quantization};
use pagewise::{EngineArgs, Llm, SamplingParams};

fn rel_err(got: &[Vec<f32>], want: &[Vec<f32>]) -> f32 {
    let scale = want.iter().flatten().fold(0f32, |m, x| m.max(x.abs()));
    let err = got
        .iter()
        .flatten()
        .zip(want.iter().flatten())
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    err / scale
}

#[test]
fn quantization_fp8_rounds_each_projection_per_channel_as_the_reference_does() {
    let path = format!("{FIXTURES}/llama-gqa-tied");
    let quantized = cases_in("llama-gqa-tied", "expected-quantization-fp8.json");
    let plain = cases("llama-gqa-tied");
    for (case, unquantized) in quantized.iter().zip(&plain) {
        let full = [case.prompt.clone(), case.greedy.clone()].concat();
        let got = common::logits_at_every_position_quantized(
            &path,
            (GgufMatmul::Auto, Some(Quantization::Fp8)),
            &full,
            &Device::Cpu,
            DType::F32,
        );
        let err = rel_err(&got, &case.logits);
        eprintln!("--quantization fp8: rel. err. {err:.2e}");
        assert!(err <= 1e-4, "--quantization fp8 logits off by {err}");
        // (The reference moved from the unquantized model's: a flag that quantized nothing
        // could not pass.)
        if unquantized.greedy == case.greedy {
            assert!(rel_err(&got, &unquantized.logits) > 1e-3);
        }
    }
    let mut llm = Llm::new(EngineArgs {
        model: path,
        quantization: Some(Quantization::Fp8),
        ..Default::default()
    })
    .unwrap();
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: 20,
        ..Default::default()
    };
    let outs = llm
        .generate_tokens(
            quantized.iter().map(|c| c.prompt.clone()).collect(),
            &params,
        )
        .unwrap();
    for (out, case) in outs.iter().zip(&quantized) {
        assert_eq!(out.outputs[0].token_ids, case.greedy, "{:?}", case.prompt);
    }
}

fn refusal(model: &str) -> String {
    Llm::new(EngineArgs {
        model: format!("{FIXTURES}/{model}"),
        quantization: Some(Quantization::Fp8),
        ..Default::default()
    })
    .err()
    .unwrap_or_else(|| panic!("--quantization fp8 on {model} must be refused"))
    .to_string()
}

#[test]
fn quantization_fp8_refuses_what_it_does_not_quantize_by_name() {
    let moe = refusal("qwen3-moe");
    assert!(
        moe.contains("--quantization fp8") && moe.contains("mixtures of experts"),
        "{moe}"
    );
    let awq = refusal("llama-awq");
    assert!(
        awq.contains("quantized already") && awq.to_lowercase().contains("awq"),
        "{awq}"
    );
    let gguf = refusal("spm/tokenizer-prefix.gguf");
    assert!(
        gguf.contains("--quantization") && gguf.contains("GGUF"),
        "{gguf}"
    );
    // An FP8 checkpoint is FP8 already: the flag changes nothing there.
    Llm::new(EngineArgs {
        model: format!("{FIXTURES}/llama-fp8-channel"),
        quantization: Some(Quantization::Fp8),
        ..Default::default()
    })
    .unwrap();
}
