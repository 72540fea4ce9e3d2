//! Parity with Hugging Face transformers on the tiny fixtures (tests/fixtures/<name>/expected.json):
//! logits at every position within a relative bound, and the engine's greedy continuation.
#![allow(dead_code)]

use pagewise::loader::GgufMatmul;
use pagewise::{EngineArgs, Llm, SamplingParams};

pub const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

pub struct Case {
    pub prompt: Vec<u32>,
    pub greedy: Vec<u32>,
    pub logits: Vec<Vec<f32>>,
}

pub fn cases(name: &str) -> Vec<Case> {
    cases_in(name, "expected.json")
}

/// The cases of fixture `name`'s reference file `file`.
pub fn cases_in(name: &str, file: &str) -> Vec<Case> {
    let text = std::fs::read_to_string(format!("{FIXTURES}/{name}/{file}")).unwrap();
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

pub fn check(name: &str) {
    check_model(name, &format!("{FIXTURES}/{name}"), 1e-4, true);
}

/// Fixture `name`'s expected logits (within `tol` of their scale) and, when `greedy`, its greedy
/// tokens, from the model at `path` (the fixture's folder, or a GGUF copy of it).
pub fn check_model(name: &str, path: &str, tol: f32, greedy: bool) {
    let cases = cases(name);
    for case in &cases {
        let full = [case.prompt.clone(), case.greedy.clone()].concat();
        let got = super::logits_at_every_position(path, GgufMatmul::Auto, &full);
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
        eprintln!("{path}: rel err {:.2e}, scale {scale}", err / scale);
        assert!(
            err / scale <= tol,
            "{name}: logits rel. err {} (max abs {err}, scale {scale})",
            err / scale
        );
    }

    if !greedy {
        return;
    }
    let mut llm = Llm::new(EngineArgs {
        model: path.to_string(),
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
