//! The HTTP API against a real server on 127.0.0.1:0 with a real HTTP client: every endpoint, SSE
//! framing, error shapes, API keys, CORS and request ids.

mod common;

use common::server::*;
use pagewise::server::ServerOptions;
use pagewise::{EngineArgs, Llm, SamplingParams};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_and_chat_plain_and_streaming() {
    let (base, _) = start(vec![]).await;
    let prompt = "Hello there";
    let offline = Llm::new(engine_args())
        .unwrap()
        .generate(
            &[prompt],
            &SamplingParams {
                temperature: 0.0,
                max_tokens: 8,
                ignore_eos: true,
                ..Default::default()
            },
        )
        .unwrap();
    let want = &offline[0].outputs[0].text;

    let (status, body) = post(&base, "/v1/completions", json!({"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": true})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "text_completion");
    assert_eq!(&body["choices"][0]["text"], want);
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    let usage = &body["usage"];
    assert_eq!(usage["completion_tokens"], 8);
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(usage["prompt_tokens"].as_u64().unwrap() + 8)
    );

    // A list of prompts, n = 2, echo and logprobs.
    let (status, body) = post(&base, "/v1/completions", json!({"prompt": ["a", "b"], "n": 2, "max_tokens": 3, "echo": true, "logprobs": 2, "seed": 1})).await;
    assert_eq!(status, 200, "{body}");
    let choices = body["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    assert!(choices[2]["text"].as_str().unwrap().starts_with('b'));
    assert_eq!(
        // (The echoed prompt's first token has none: nothing precedes it.)
        choices[0]["logprobs"]["top_logprobs"][1]
            .as_object()
            .unwrap()
            .len(),
        2
    );

    // `text_offset` counts the characters of the choice's text before each token, the echoed
    // prompt included, streamed or not.
    let offsets_req =
        json!({"prompt": "abc", "max_tokens": 6, "echo": true, "logprobs": 1, "n": 2, "seed": 3});
    let (status, body) = post(&base, "/v1/completions", offsets_req.clone()).await;
    assert_eq!(status, 200, "{body}");
    for c in body["choices"].as_array().unwrap() {
        let lp = &c["logprobs"];
        // (The echoed prompt's tokens lead.)
        let mut at = 0;
        for (t, o) in lp["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .zip(lp["text_offset"].as_array().unwrap())
        {
            assert_eq!(o.as_u64(), Some(at as u64), "{lp}");
            at += t.as_str().unwrap().chars().count();
        }
    }
    let mut streamed = offsets_req;
    streamed["stream"] = json!(true);
    let mut sent = [0usize; 2];
    let mut offsets = 0;
    for data in sse(&base, "/v1/completions", streamed).await {
        let Ok(chunk) = serde_json::from_str::<Value>(&data) else {
            continue;
        };
        for c in chunk["choices"].as_array().unwrap() {
            let (i, text) = (
                c["index"].as_u64().unwrap() as usize,
                c["text"].as_str().unwrap(),
            );
            if let Some(o) = c["logprobs"]["text_offset"].as_array() {
                assert_eq!(o[0].as_u64(), Some(sent[i] as u64), "{chunk}");
                offsets += 1;
            }
            sent[i] += text.chars().count();
        }
    }
    assert_eq!(offsets, 12);

    // 20 alternatives are 20 keys: ids the tokenizer has no entry for (this model has 320
    // embedding rows for 257 tokens) are `token_id:N`, never a shared empty string.
    let (status, body) = post(
        &base,
        "/v1/completions",
        json!({"prompt": "abc", "max_tokens": 4, "temperature": 0, "logprobs": 20}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    for top in body["choices"][0]["logprobs"]["top_logprobs"]
        .as_array()
        .unwrap()
    {
        let keys = top.as_object().unwrap();
        assert_eq!(keys.len(), 20, "{top}");
        assert!(!keys.contains_key(""), "{top}");
    }

    // Streaming: one chunk per token, finish_reason only on the last, usage chunk, then [DONE].
    let events = sse(&base, "/v1/completions", json!({"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}})).await;
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks.len(), 9, "8 tokens + usage");
    let text: String = chunks[..8]
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(&text, want);
    assert!(
        chunks[..7]
            .iter()
            .all(|c| c["choices"][0]["finish_reason"].is_null())
    );
    assert_eq!(chunks[7]["choices"][0]["finish_reason"], "length");
    assert_eq!(chunks[8]["choices"], json!([]));
    assert_eq!(chunks[8]["usage"]["completion_tokens"], 8);
    assert!(chunks.iter().all(|c| c["id"] == chunks[0]["id"]));

    // Chat, plain and streaming.
    let messages = json!([{"role": "user", "content": "Hi"}]);
    let (status, body) = post(&base, "/v1/chat/completions", json!({"messages": messages, "max_completion_tokens": 5, "temperature": 0, "logprobs": true, "top_logprobs": 3})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert_eq!(
        body["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    let events = sse(
        &base,
        "/v1/chat/completions",
        json!({"messages": messages, "max_tokens": 5, "temperature": 0, "stream": true}),
    )
    .await;
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks[1]["choices"][0]["delta"].get("role").is_none());
    let streamed: String = chunks
        .iter()
        .map(|c| c["choices"][0]["delta"]["content"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        streamed,
        body["choices"][0]["message"]["content"].as_str().unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn utility_endpoints() {
    let (base, _) = start(vec![]).await;
    let client = reqwest::Client::new();
    for path in ["/health", "/ready"] {
        assert_eq!(
            client
                .get(format!("{base}{path}"))
                .send()
                .await
                .unwrap()
                .status(),
            200
        );
    }
    let v = get_json(&base, "/version").await;
    assert!(v["version"].is_string());
    let models = get_json(&base, "/v1/models").await;
    assert_eq!(models["data"][0]["id"], "tiny");
    assert_eq!(models["data"][0]["max_model_len"], 256);
    let (_, tok) = post(&base, "/tokenize", json!({"prompt": "héllo"})).await;
    assert_eq!(tok["count"], 6);
    let (_, detok) = post(&base, "/detokenize", json!({"tokens": tok["tokens"]})).await;
    assert_eq!(detok["prompt"], "héllo");
    let r = client
        .get(format!("{base}/health"))
        .header("x-request-id", "abc-123")
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["x-request-id"], "abc-123");
    let r = client.get(format!("{base}/health")).send().await.unwrap();
    assert!(!r.headers()["x-request-id"].is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_is_openai_shaped() {
    let (base, _) = start(vec![]).await;
    let client = reqwest::Client::new();
    let send = |req: reqwest::RequestBuilder| async move {
        let r = req.send().await.unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    };
    let url = format!("{base}/v1/completions");
    let (s, b) = send(
        client
            .post(&url)
            .header("content-type", "application/json")
            .body("{not json"),
    )
    .await;
    assert_eq!(s, 400);
    assert_error(&b, "invalid_request_error", "");
    let (s, b) = send(client.post(&url).body("{}")).await;
    assert_eq!(s, 415);
    assert_error(&b, "invalid_request_error", "Content-Type");
    let (s, b) = send(client.post(&url).json(&json!({"max_tokens": 3}))).await;
    assert_eq!(s, 400, "missing prompt");
    assert_error(&b, "invalid_request_error", "prompt");
    let (s, b) = post(
        &base,
        "/v1/completions",
        json!({"model": "nope", "prompt": "x"}),
    )
    .await;
    assert_eq!(s, 404);
    assert_error(&b, "not_found_error", "`nope` does not exist");
    let (s, b) = post(
        &base,
        "/v1/completions",
        json!({"prompt": "x", "temperature": -1}),
    )
    .await;
    assert_eq!(s, 400);
    assert_eq!(b["error"]["param"], "temperature");
    let (s, b) = post(
        &base,
        "/v1/completions",
        json!({"prompt": "x".repeat(300), "max_tokens": 10}),
    )
    .await;
    assert_eq!(s, 400);
    assert_error(
        &b,
        "invalid_request_error",
        "This model's maximum context length is 256 tokens. However, you requested",
    );
    let (s, b) = post(&base, "/v1/chat/completions", json!({"messages": []})).await;
    assert_eq!(s, 400);
    assert_error(&b, "invalid_request_error", "messages");
    let (s, b) = send(client.get(format!("{base}/v1/nothing"))).await;
    assert_eq!(s, 404);
    assert_error(&b, "not_found_error", "/v1/nothing");
    let (s, b) = send(client.get(&url)).await;
    assert_eq!(s, 405);
    assert_error(&b, "invalid_request_error", "GET");
    let big = "x".repeat(33 << 20);
    let (s, b) = send(
        client
            .post(&url)
            .header("content-type", "application/json")
            .body(big),
    )
    .await;
    assert_eq!(s, 413);
    assert_error(&b, "invalid_request_error", "too large");
    // Unknown fields are accepted.
    let (s, _) = post(
        &base,
        "/v1/completions",
        json!({"prompt": "x", "max_tokens": 1, "some_new_openai_field": {"a": 1}}),
    )
    .await;
    assert_eq!(s, 200);
}

/// What the server does not honour (`auto` tool choice without a parser, the legacy functions
/// API) is a 400 naming the field: never a 200 with free text the client would take for a call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unhonoured_tool_calls_are_refused() {
    let (base, _) = start(vec![]).await;
    let chat = |extra: Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]);
    let refused = [
        (
            "/v1/chat/completions",
            chat(json!({"functions": [{"name": "get_weather"}]})),
            "function_call",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"tools": tools})),
            "tool_choice",
        ),
    ];
    for (path, body, field) in refused {
        let (status, got) = post(&base, path, body.clone()).await;
        assert_eq!(status, 400, "{body}: {got}");
        assert_eq!(got["error"]["param"], field, "{got}");
        assert_eq!(got["error"]["type"], "invalid_request_error", "{got}");
    }
    // What is honoured still answers: a text format, and tools with tool_choice "none".
    for extra in [
        json!({"response_format": {"type": "text"}}),
        json!({"tools": tools, "tool_choice": "none"}),
    ] {
        let (status, got) = post(&base, "/v1/chat/completions", chat(extra)).await;
        assert_eq!(status, 200, "{got}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_guard_the_api_but_not_health() {
    let (base, _) = start(vec!["sk-one".into(), "sk-two".into()]).await;
    let client = reqwest::Client::new();
    let body = json!({"prompt": "x", "max_tokens": 1});
    let r = client
        .post(format!("{base}/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_error(&r.json().await.unwrap(), "authentication_error", "API key");
    let r = client
        .post(format!("{base}/v1/completions"))
        .bearer_auth("sk-wrong")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    for key in ["sk-one", "sk-two"] {
        let r = client
            .post(format!("{base}/v1/completions"))
            .bearer_auth(key)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    assert_eq!(
        client
            .get(format!("{base}/health"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        client
            .get(format!("{base}/v1/models"))
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_preflight_and_a_model_without_chat_template() {
    let args = EngineArgs {
        model: MODEL.into(),
        ..Default::default()
    };
    let opts = ServerOptions {
        served_model_names: vec!["plain".into()],
        api_keys: vec!["sk-x".into()],
        allowed_origins: vec!["https://app.example".into()],
        ..Default::default()
    };
    let (base, _) = serve(args, opts).await;
    let client = reqwest::Client::new();
    let r = client
        .request(
            reqwest::Method::OPTIONS,
            format!("{base}/v1/chat/completions"),
        )
        .header("origin", "https://app.example")
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "authorization,content-type",
        )
        .send()
        .await
        .unwrap();
    assert!(
        r.status().is_success(),
        "preflight passes without a key: {}",
        r.status()
    );
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://app.example"
    );
    let allowed = r.headers()["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .to_lowercase();
    assert!(allowed.contains("authorization"), "{allowed}");
    let r = client
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth("sk-x")
        .json(&json!({"messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_error(
        &r.json().await.unwrap(),
        "invalid_request_error",
        "no chat template",
    );
}
