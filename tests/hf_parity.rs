//! Parity with Hugging Face transformers on tiny random-weight models (tests/fixtures/, made by
//! tests/fixtures/make_tiny_models.py): f32 logits at every position within 1e-4 relative error,
//! and the engine's greedy continuation token for token.

mod common;

use pagewise::loader::GgufMatmul;
use pagewise::{EngineArgs, Llm, SamplingParams};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

struct Case {
    prompt: Vec<u32>,
    greedy: Vec<u32>,
    logits: Vec<Vec<f32>>,
}

fn cases(name: &str) -> Vec<Case> {
    let text = std::fs::read_to_string(format!("{FIXTURES}/{name}/expected.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ids = |x: &serde_json::Value| -> Vec<u32> {
        x.as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect()
    };
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            prompt: ids(&c["prompt"]),
            greedy: ids(&c["greedy"]),
            logits: c["logits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|row| {
                    row.as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_f64().unwrap() as f32)
                        .collect()
                })
                .collect(),
        })
        .collect()
}

fn check(name: &str) {
    let cases = cases(name);
    for case in &cases {
        let full = [case.prompt.clone(), case.greedy.clone()].concat();
        let got = common::logits_at_every_position(
            &format!("{FIXTURES}/{name}"),
            GgufMatmul::Auto,
            &full,
        );
        assert_eq!(got.len(), case.logits.len());
        let scale = case
            .logits
            .iter()
            .flatten()
            .fold(0.0f32, |m, x| m.max(x.abs()));
        let err = got
            .iter()
            .flatten()
            .zip(case.logits.iter().flatten())
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        eprintln!("{name}: rel err {:.2e}, scale {scale}", err / scale);
        assert!(
            err / scale <= 1e-4,
            "{name}: logits rel. err {} (max abs {err}, scale {scale})",
            err / scale
        );
    }

    let mut llm = Llm::new(EngineArgs {
        model: format!("{FIXTURES}/{name}"),
        ..Default::default()
    })
    .unwrap();
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: 20,
        ..Default::default()
    };
    let outs = llm
        .generate_tokens(cases.iter().map(|c| c.prompt.clone()).collect(), &params)
        .unwrap();
    for (out, case) in outs.iter().zip(&cases) {
        assert_eq!(
            out.outputs[0].token_ids, case.greedy,
            "{name}: greedy tokens for {:?}",
            case.prompt
        );
    }
}

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
