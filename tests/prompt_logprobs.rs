//! Prompt logprobs (vLLM's `SamplingParams.prompt_logprobs`, the completions API's `echo` with
//! `logprobs`): how evaluation harnesses score text. A prompt's logprobs must be the ones
//! decoding gave the same tokens, through chunked prefill and a prefix cache that already holds
//! the prompt; the HTTP shapes follow OpenAI's and vLLM's.

mod common;

use common::server::*;
use pagewise::sampler::SeededRng;
use pagewise::{EngineArgs, Llm, SamplingParams};
use serde_json::{Value, json};

const MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/llama-gqa-tied");

#[test]
fn a_prompts_logprobs_are_those_decoding_gave_its_tokens() {
    let mut rng = SeededRng::new(7, 0);
    let prompt: Vec<u32> = (0..11).map(|_| (rng.next_u64() % 250) as u32 + 1).collect();
    let greedy = SamplingParams {
        temperature: 0.0,
        max_tokens: 20,
        ignore_eos: true,
        logprobs: Some(3),
        ..Default::default()
    };
    let mut solo = Llm::new(EngineArgs {
        model: MODEL.into(),
        ..Default::default()
    })
    .unwrap();
    let decoded = solo.generate_tokens(vec![prompt.clone()], &greedy).unwrap();
    let decoded = &decoded[0].outputs[0];
    let decoded_lps = decoded.logprobs.as_ref().unwrap();

    // Chunks of 16 tokens, and the whole text already in the prefix cache: the prompt's rows are
    // computed anyway.
    let mut engine = Llm::new(EngineArgs {
        model: MODEL.into(),
        block_size: 8,
        max_num_batched_tokens: Some(16),
        ..Default::default()
    })
    .unwrap();
    let text = [prompt.clone(), decoded.token_ids.clone()].concat();
    let plain = SamplingParams {
        max_tokens: 1,
        ..Default::default()
    };
    let first = engine.generate_tokens(vec![text.clone()], &plain).unwrap();
    assert_eq!(first[0].prompt_logprobs, None);
    let scored = SamplingParams {
        prompt_logprobs: Some(3),
        ..plain
    };
    let out = engine.generate_tokens(vec![text.clone()], &scored).unwrap();
    let lps = out[0].prompt_logprobs.as_ref().expect("asked for");
    assert_eq!(lps.len(), text.len());
    assert!(lps[0].is_none());
    assert!(lps[1..].iter().all(Option::is_some));
    for (j, want) in decoded_lps.iter().enumerate() {
        let got = lps[prompt.len() + j].as_ref().unwrap();
        assert!(
            (got.logprob - want.logprob).abs() < 1e-3,
            "token {j}: {got:?} against {want:?}"
        );
        assert_eq!(got.rank, want.rank, "token {j}");
        let ids = |l: &pagewise::sampler::Logprobs| l.top.iter().map(|t| t.0).collect::<Vec<_>>();
        assert_eq!(ids(got), ids(want), "token {j}");
    }
    // Greedy tokens are the most likely.
    assert!(
        lps[prompt.len()..]
            .iter()
            .all(|l| l.as_ref().unwrap().rank == 1)
    );
}

/// A chunk of `text` that the tiny model's tokenizer splits into several tokens.
const TEXT: &str = "Hello world, how are you";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_with_logprobs_scores_the_prompt_as_openai_and_vllm_do() {
    let (base, _) = start(vec![]).await;
    let c = "/v1/completions";
    let (status, r) = post(
        &base,
        c,
        json!({"prompt": TEXT, "max_tokens": 3, "echo": true, "logprobs": 2, "temperature": 0}),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    let n_prompt = r["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    assert!(n_prompt > 2, "{r}");
    let choice = &r["choices"][0];
    assert!(choice["text"].as_str().unwrap().starts_with(TEXT));
    let lp = &choice["logprobs"];
    let logprobs = lp["token_logprobs"].as_array().unwrap();
    assert_eq!(logprobs.len(), n_prompt + 3, "{lp}");
    assert!(
        logprobs[0].is_null() && lp["top_logprobs"][0].is_null(),
        "{lp}"
    );
    assert!(logprobs[1..].iter().all(Value::is_f64), "{lp}");
    assert_eq!(lp["text_offset"][0], 0);

    // Only the prompt (`max_tokens` 0), with vLLM's `prompt_logprobs` beside it: the same numbers.
    let body =
        json!({"prompt": TEXT, "max_tokens": 0, "echo": true, "logprobs": 1, "prompt_logprobs": 1});
    let (status, only) = post(&base, c, body).await;
    assert_eq!(status, 200, "{only}");
    let choice = &only["choices"][0];
    assert_eq!(choice["text"], TEXT);
    assert_eq!(only["usage"]["completion_tokens"], 0);
    let echoed = choice["logprobs"]["token_logprobs"].as_array().unwrap();
    assert_eq!(echoed.len(), n_prompt);
    assert_eq!(echoed[..], logprobs[..n_prompt]);
    let vllm = choice["prompt_logprobs"].as_array().unwrap();
    assert_eq!(vllm.len(), n_prompt);
    assert!(vllm[0].is_null());
    let ids = common_ids(&base, TEXT).await;
    for i in 1..n_prompt {
        let entry = &vllm[i][ids[i].to_string()];
        assert_eq!(entry["logprob"], echoed[i], "{}", vllm[i]);
        assert!(entry["rank"].as_u64().unwrap() >= 1);
    }

    // Streamed: the first chunk carries the prompt's logprobs.
    let body = json!({"prompt": TEXT, "max_tokens": 3, "echo": true, "logprobs": 2, "temperature": 0, "stream": true});
    let chunks = sse(&base, c, body).await;
    let first: Value = serde_json::from_str(&chunks[0]).unwrap();
    let streamed = &first["choices"][0]["logprobs"]["token_logprobs"];
    assert_eq!(streamed.as_array().unwrap()[..], logprobs[..n_prompt + 1]);

    // Chat: the rendered prompt's logprobs in the response.
    let chat = json!({"messages": [{"role": "user", "content": TEXT}], "max_tokens": 1, "prompt_logprobs": 0});
    let (status, r) = post(&base, "/v1/chat/completions", chat).await;
    assert_eq!(status, 200, "{r}");
    let prompt = r["prompt_logprobs"].as_array().unwrap();
    assert_eq!(
        prompt.len() as u64,
        r["usage"]["prompt_tokens"].as_u64().unwrap()
    );
    assert!(prompt[0].is_null() && prompt[1].is_object());

    // Refused: a stream has no place for `prompt_logprobs`; `max_tokens` 0 without `echo`.
    let body = json!({"prompt": TEXT, "max_tokens": 2, "prompt_logprobs": 1, "stream": true});
    let (status, r) = post(&base, c, body).await;
    assert_eq!(
        (status, &r["error"]["param"]),
        (400, &json!("prompt_logprobs")),
        "{r}"
    );
    let (status, r) = post(&base, c, json!({"prompt": TEXT, "max_tokens": 0})).await;
    assert_eq!(
        (status, &r["error"]["param"]),
        (400, &json!("max_tokens")),
        "{r}"
    );
}

/// The token ids of `text` as the server tokenizes a completion prompt.
async fn common_ids(base: &str, text: &str) -> Vec<u64> {
    let (_, r) = post(base, "/tokenize", json!({"prompt": text})).await;
    r["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}
