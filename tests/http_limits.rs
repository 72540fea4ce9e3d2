//! Every request field is bounded by what the engine can hold: one request can never take the
//! server down. Each case is a 400 in the OpenAI envelope (vLLM's wording where vLLM has one), and
//! the server goes on serving afterwards.

mod common;

use common::server::*;
use pagewise::request::{MAX_LOGIT_BIAS, MAX_STOP_STRINGS};
use serde_json::{Value, json};

/// A 400 naming `param`, with `needle` in its message.
async fn assert_400(base: &str, path: &str, body: Value, param: &str, needle: &str) {
    let (status, reply) = post(base, path, body.clone()).await;
    assert_eq!(status, 400, "{body} -> {reply}");
    assert_error(&reply, "invalid_request_error", needle);
    assert_eq!(reply["error"]["param"], param, "{reply}");
}

async fn assert_still_serving(base: &str) {
    let (status, reply) = post(
        base,
        "/v1/completions",
        json!({"prompt": "hi", "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, 200, "{reply}");
    let health = reqwest::get(format!("{base}/health")).await.unwrap();
    assert_eq!(health.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_and_best_of_are_bounded_by_max_num_seqs() {
    let (base, _) = start_with(vec![], 0, 4).await;
    let c = "/v1/completions";
    // The reproducer: this used to allocate a billion sequences and get the process killed.
    let huge = json!({"prompt": "hi", "max_tokens": 1, "n": 1_000_000_000u64});
    assert_400(&base, c, huge, "n", "at most 4 at once").await;
    let five = json!({"prompt": "hi", "max_tokens": 1, "n": 5});
    assert_400(&base, c, five, "n", "--max-num-seqs").await;
    let batch = json!({"prompt": ["a", "b", "c"], "max_tokens": 1, "n": 2});
    assert_400(&base, c, batch, "n", "6 sequences").await;
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "n": 5});
    assert_400(&base, "/v1/chat/completions", chat, "n", "at most 4").await;
    let zero = json!({"prompt": "hi", "max_tokens": 1, "n": 0});
    assert_400(&base, c, zero, "n", "at least 1").await;
    let best_of = json!({"prompt": "hi", "max_tokens": 1, "n": 1, "best_of": 3});
    assert_400(&base, c, best_of, "best_of", "best_of").await;

    let four = json!({"prompt": "hi", "max_tokens": 1, "n": 4, "best_of": 4});
    let (status, reply) = post(&base, c, four).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["choices"].as_array().unwrap().len(), 4);
    assert_still_serving(&base).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_tokens_near_the_integer_limit_is_a_context_length_error() {
    let (base, _) = start(vec![]).await;
    for max_tokens in [u64::MAX, u64::MAX - 1, u64::MAX / 2 + 1, 1 << 40] {
        let body = json!({"prompt": "hi", "max_tokens": max_tokens});
        let (status, reply) = post(&base, "/v1/completions", body).await;
        assert_eq!(status, 400, "{max_tokens}: {reply}");
        assert_error(&reply, "invalid_request_error", "maximum context length");
        let chat = json!({"messages": [{"role": "user", "content": "hi"}],
                          "max_completion_tokens": max_tokens});
        let (status, reply) = post(&base, "/v1/chat/completions", chat).await;
        assert_eq!(status, 400, "{max_tokens}: {reply}");
        assert_error(&reply, "invalid_request_error", "maximum context length");
    }
    // min_tokens rides on max_tokens: huge values are refused too.
    let body = json!({"prompt": "hi", "max_tokens": 2, "min_tokens": u64::MAX});
    assert_400(&base, "/v1/completions", body, "min_tokens", "min_tokens").await;
    assert_still_serving(&base).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_logit_bias_and_logprobs_are_bounded() {
    let (base, _) = start(vec![]).await;
    let c = "/v1/completions";
    let many: Vec<String> = (0..=MAX_STOP_STRINGS).map(|i| format!("s{i}")).collect();
    let body = json!({"prompt": "hi", "max_tokens": 1, "stop": many});
    assert_400(&base, c, body, "stop", "at most 64 strings").await;
    let long = "x".repeat(5000);
    let body = json!({"prompt": "hi", "max_tokens": 1, "stop": long});
    assert_400(&base, c, body, "stop", "bytes long").await;
    let ids: Vec<u32> = vec![1; 5000];
    let body = json!({"prompt": "hi", "max_tokens": 1, "stop_token_ids": ids});
    assert_400(&base, c, body, "stop_token_ids", "at most").await;
    let bias: serde_json::Map<String, Value> = (0..=MAX_LOGIT_BIAS)
        .map(|i| (i.to_string(), json!(1.0)))
        .collect();
    let body = json!({"prompt": "hi", "max_tokens": 1, "logit_bias": bias});
    assert_400(&base, c, body, "logit_bias", "at most 1024 entries").await;
    let body = json!({"prompt": "hi", "max_tokens": 1, "logprobs": 21});
    assert_400(&base, c, body, "logprobs", "at most 20").await;

    let chat = "/v1/chat/completions";
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let body = json!({"messages": msgs, "max_tokens": 1, "logprobs": true, "top_logprobs": 21});
    assert_400(&base, chat, body, "top_logprobs", "at most 20").await;
    let body = json!({"messages": msgs, "max_tokens": 1, "top_logprobs": 3});
    assert_400(&base, chat, body, "top_logprobs", "`logprobs` must be set").await;
    let body = json!({"messages": msgs, "max_tokens": 1, "logprobs": true, "top_logprobs": 20});
    let (status, reply) = post(&base, chat, body).await;
    assert_eq!(status, 200, "{reply}");
    assert_still_serving(&base).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_need_known_roles_and_a_bounded_count() {
    let (base, _) = start(vec![]).await;
    let chat = "/v1/chat/completions";
    let body = json!({"messages": [{"role": "user", "content": "hi"}, {"role": "wizard", "content": "x"}]});
    assert_400(
        &base,
        chat,
        body,
        "messages[1].role",
        "Invalid value: 'wizard'",
    )
    .await;
    let body = json!({"messages": [{"content": "no role"}]});
    assert_400(
        &base,
        chat,
        body,
        "messages[0].role",
        "Missing required parameter",
    )
    .await;
    let body = json!({"messages": ["just a string"]});
    assert_400(&base, chat, body, "messages[0]", "expected an object").await;
    let body = json!({"messages": [{"role": "user", "content": 42}]});
    assert_400(&base, chat, body, "messages[0].content", "Invalid type").await;
    let too_many: Vec<Value> = (0..3000)
        .map(|_| json!({"role": "user", "content": ""}))
        .collect();
    let body = json!({"messages": too_many});
    assert_400(&base, chat, body, "messages", "array too long").await;
    // Every role OpenAI knows is accepted.
    for role in [
        "system",
        "developer",
        "user",
        "assistant",
        "tool",
        "function",
    ] {
        let body = json!({"messages": [{"role": role, "content": "x"}], "max_tokens": 1});
        let (status, reply) = post(&base, chat, body).await;
        assert_eq!(status, 200, "{role}: {reply}");
    }
    assert_still_serving(&base).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parts_and_fields_the_model_cannot_honour_are_refused_by_name() {
    let (base, _) = start(vec![]).await;
    let chat = "/v1/chat/completions";
    let image = json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}});
    let body = json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}]});
    assert_400(
        &base,
        chat,
        body,
        "messages[0].content[1].type",
        "type 'image_url' are not supported",
    )
    .await;
    let body = json!({"messages": [{"role": "user", "content": [{"text": "no type"}]}]});
    assert_400(&base, chat, body, "messages[0].content[0].type", "Missing").await;
    let body = json!({"messages": [{"role": "user", "content": [{"type": "text", "text": 7}]}]});
    assert_400(
        &base,
        chat,
        body,
        "messages[0].content[0].text",
        "string 'text'",
    )
    .await;
    let body =
        json!({"messages": [{"role": "user", "content": "hi"}], "modalities": ["text", "audio"]});
    assert_400(&base, chat, body, "modalities", "text only").await;
    let c = "/v1/completions";
    let body = json!({"prompt": "def f(", "suffix": "    return x", "max_tokens": 2});
    assert_400(&base, c, body, "suffix", "insertion").await;
    let body = json!({"prompt": [1, 99_999_999], "max_tokens": 2});
    assert_400(&base, c, body, "prompt", "out of vocabulary").await;

    // Text parts, and an assistant's refusal part, are read as their text: the same prompt as
    // the plain strings.
    let plain = json!({"messages": [
        {"role": "user", "content": "Say no."},
        {"role": "assistant", "content": "I can't."},
        {"role": "user", "content": "Why?\nTell me."}],
        "max_tokens": 1, "temperature": 0});
    let parts = json!({"messages": [
        {"role": "user", "content": [{"type": "text", "text": "Say no."}]},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't."}]},
        {"role": "user", "content": [{"type": "text", "text": "Why?"}, {"type": "text", "text": "Tell me."}]}],
        "max_tokens": 1, "temperature": 0});
    let (s1, r1) = post(&base, chat, plain).await;
    let (s2, r2) = post(&base, chat, parts).await;
    assert_eq!((s1, s2), (200, 200), "{r1} {r2}");
    assert_eq!(r1["usage"]["prompt_tokens"], r2["usage"]["prompt_tokens"]);

    // A negative seed (vLLM takes any 64-bit integer) is its two's-complement bits.
    let seeded =
        |seed: Value| json!({"prompt": "Once", "max_tokens": 8, "temperature": 1.0, "seed": seed});
    let (s1, r1) = post(&base, c, seeded(json!(-1))).await;
    let (s2, r2) = post(&base, c, seeded(json!(u64::MAX))).await;
    assert_eq!((s1, s2), (200, 200), "{r1} {r2}");
    assert_eq!(r1["choices"][0]["text"], r2["choices"][0]["text"]);
    assert_still_serving(&base).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_describes_the_routes_and_the_limits() {
    let (base, _) = start_with(vec![], 0, 4).await;
    let doc = get_json(&base, "/openapi.json").await;
    assert_eq!(doc["openapi"], "3.1.0");
    for path in [
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/models",
        "/tokenize",
        "/detokenize",
        "/health",
        "/ready",
        "/metrics",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} missing");
    }
    let completions = &doc["paths"]["/v1/completions"]["post"];
    for status in ["200", "400", "429", "503"] {
        assert!(completions["responses"][status].is_object(), "{status}");
    }
    let schemas = &doc["components"]["schemas"];
    // Generated from the Rust types, with the served model's limits added.
    let props = &schemas["CompletionRequest"]["properties"];
    assert_eq!(props["n"]["maximum"], 4);
    assert_eq!(props["max_tokens"]["maximum"], 256);
    assert_eq!(schemas["PromptInput"]["anyOf"][2]["items"]["maximum"], 319);
    assert_eq!(
        schemas["ChatRequest"]["properties"]["messages"]["maxItems"],
        2048
    );
    let roles = &schemas["Role"];
    assert!(roles.to_string().contains("developer"), "{roles}");
    assert!(schemas["ChatCompletionResponse"]["properties"]["usage"].is_object());
    assert!(schemas["ErrorDetail"]["properties"]["type"].is_object());
    let stored = &doc["paths"]["/v1/responses/{id}"];
    assert!(stored["get"]["responses"]["404"].is_object(), "{stored}");
    assert!(stored["delete"]["responses"]["200"].is_object(), "{stored}");
    let responses = &schemas["ResponsesRequest"]["properties"];
    assert_eq!(responses["max_output_tokens"]["maximum"], 256);
    assert!(schemas["OutputItem"].to_string().contains("function_call"));
    // Anthropic's routes document Anthropic's error shape.
    let messages = doc["paths"]["/v1/messages"]["post"]["responses"]["400"].to_string();
    assert!(messages.contains("AnthropicErrorBody"), "{messages}");
    let model = &schemas["MessagesRequest"]["properties"]["model"];
    assert_eq!(model["enum"], serde_json::json!(["tiny"]), "{model}");
}
