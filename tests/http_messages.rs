//! Anthropic's Messages API on the tiny random Qwen2 fixture: the chat endpoint's answers as
//! content blocks, stop reasons (including which stop sequence), tools as `tool_use` blocks,
//! Anthropic's stream events, `count_tokens`, `x-api-key`, and errors in Anthropic's shape.

mod common;

use common::server::*;
use serde_json::{Value, json};

fn body(extra: Value) -> Value {
    let mut b = json!({"model": "tiny", "max_tokens": 16, "temperature": 0,
                       "messages": [{"role": "user", "content": "Hello there"}]});
    b.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    b
}

fn text_of(m: &Value) -> String {
    m["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "text")
        .map(|b| b["text"].as_str().unwrap().to_string())
        .collect()
}

fn assert_anthropic_error(body: &Value, kind: &str, needle: &str) {
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], kind, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains(needle), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_answer_as_chat_does_with_anthropics_stop_reasons() {
    let (base, _) = start(vec![]).await;
    let system = json!({"system": [{"type": "text", "text": "Be brief."}]});
    let (status, m) = post(&base, "/v1/messages", body(system.clone())).await;
    assert_eq!(status, 200, "{m}");
    assert_eq!(
        (m["type"].as_str(), m["role"].as_str()),
        (Some("message"), Some("assistant"))
    );
    assert_eq!(m["stop_reason"], "max_tokens");
    assert_eq!(m["usage"]["output_tokens"], 16);
    let chat = json!({"model": "tiny", "max_tokens": 16, "temperature": 0, "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]});
    let (_, c) = post(&base, "/v1/chat/completions", chat).await;
    let text = text_of(&m);
    assert_eq!(
        text,
        c["choices"][0]["message"]["content"].as_str().unwrap()
    );
    assert_eq!(m["usage"]["input_tokens"], c["usage"]["prompt_tokens"]);
    let (_, count) = post(&base, "/v1/messages/count_tokens", body(system.clone())).await;
    assert_eq!(count["input_tokens"], m["usage"]["input_tokens"]);

    // A stop sequence from inside that text ends the answer there, and is named.
    let chars: Vec<char> = text.chars().collect();
    let stop: String = chars[4..7].iter().collect();
    let expected: String = text[..text.find(&stop).unwrap()].to_string();
    let mut req = system;
    req["stop_sequences"] = json!([stop, "never-matches"]);
    let (_, m) = post(&base, "/v1/messages", body(req.clone())).await;
    assert_eq!(
        (m["stop_reason"].as_str(), m["stop_sequence"].as_str()),
        (Some("stop_sequence"), Some(stop.as_str()))
    );
    assert_eq!(text_of(&m), expected);

    // Streamed: Anthropic's events in order, the same text and stop.
    req["stream"] = json!(true);
    let evs = typed_sse(&base, "/v1/messages", &body(req)).await;
    let kinds: Vec<&str> = evs
        .iter()
        .map(|(_, d)| d["type"].as_str().unwrap())
        .collect();
    for (name, data) in &evs {
        assert_eq!(name, data["type"].as_str().unwrap());
    }
    assert_eq!(
        kinds[..3],
        ["message_start", "ping", "content_block_start"],
        "{kinds:?}"
    );
    assert_eq!(
        kinds[kinds.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    assert!(
        kinds[3..kinds.len() - 3]
            .iter()
            .all(|k| *k == "content_block_delta"),
        "{kinds:?}"
    );
    let streamed: String = evs
        .iter()
        .filter_map(|(_, d)| d["delta"]["text"].as_str())
        .collect();
    assert_eq!(streamed, expected);
    let delta = &evs[evs.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], "stop_sequence");
    assert_eq!(delta["delta"]["stop_sequence"], stop);
    assert_eq!(
        evs[0].1["message"]["usage"]["input_tokens"],
        count["input_tokens"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_come_back_as_tool_use_blocks_streamed_or_not() {
    let (base, _) = start(vec![]).await;
    let tools = json!([{"name": "get_weather", "description": "Weather in a city",
        "input_schema": {"type": "object",
            "properties": {"city": {"type": "string", "pattern": "^[a-z]{1,8}$"}},
            "required": ["city"]}}]);
    let req = json!({"tools": tools, "max_tokens": 60,
                     "tool_choice": {"type": "tool", "name": "get_weather"}});
    let (status, m) = post(&base, "/v1/messages", body(req.clone())).await;
    assert_eq!(status, 200, "{m}");
    assert_eq!(m["stop_reason"], "tool_use", "{m}");
    let call = m["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_use")
        .unwrap();
    assert_eq!(call["name"], "get_weather");
    assert!(call["id"].as_str().unwrap().starts_with("toolu_"));
    assert_eq!(
        call["input"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        ["city"]
    );

    let mut streamed = req.clone();
    streamed["stream"] = json!(true);
    let evs = typed_sse(&base, "/v1/messages", &body(streamed)).await;
    let start = evs
        .iter()
        .find(|(_, d)| d["type"] == "content_block_start")
        .unwrap();
    assert_eq!(start.1["content_block"]["type"], "tool_use");
    let partial: String = evs
        .iter()
        .filter_map(|(_, d)| d["delta"]["partial_json"].as_str())
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&partial).unwrap(),
        call["input"]
    );

    // The call and its result go back: tool_use and tool_result blocks.
    let turns = json!([
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": call["id"], "name": "get_weather", "input": call["input"]}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"],
            "content": [{"type": "text", "text": "Sunny"}]}]}
    ]);
    let (status, m) = post(
        &base,
        "/v1/messages",
        body(json!({"messages": turns, "tools": tools,
        "tool_choice": {"type": "none"}})),
    )
    .await;
    assert_eq!(status, 200, "{m}");
    assert_eq!(m["stop_reason"], "max_tokens", "{m}");
    // tool_choice "any" needs a call.
    let any = json!({"tools": tools, "max_tokens": 100,
                     "tool_choice": {"type": "any", "disable_parallel_tool_use": true}});
    let (_, m) = post(&base, "/v1/messages", body(any)).await;
    assert_eq!(m["stop_reason"], "tool_use", "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_anthropic_shaped_and_x_api_key_is_accepted() {
    let (base, _) = start(vec!["sk-ant".into()]).await;
    let client = reqwest::Client::new();
    let send = |req: reqwest::RequestBuilder| async move {
        let r = req.send().await.unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    };
    let url = format!("{base}/v1/messages");
    let (status, e) = send(client.post(&url).json(&body(json!({})))).await;
    assert_eq!(status, 401);
    assert_anthropic_error(&e, "authentication_error", "API key");
    let (status, m) = send(
        client
            .post(&url)
            .header("x-api-key", "sk-ant")
            .json(&body(json!({}))),
    )
    .await;
    assert_eq!(status, 200, "{m}");
    let (status, _) = send(
        client
            .post(&url)
            .bearer_auth("sk-ant")
            .json(&body(json!({}))),
    )
    .await;
    assert_eq!(status, 200);

    let keyed = |b: Value| client.post(&url).header("x-api-key", "sk-ant").json(&b);
    let mut no_max = body(json!({}));
    no_max.as_object_mut().unwrap().remove("max_tokens");
    let cases = [
        (no_max, 400, "invalid_request_error", "max_tokens"),
        (
            body(json!({"model": "claude-x"})),
            404,
            "not_found_error",
            "claude-x",
        ),
        (
            body(json!({"messages": []})),
            400,
            "invalid_request_error",
            "messages",
        ),
        (
            body(
                json!({"messages": [{"role": "user", "content": [{"type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]}),
            ),
            400,
            "invalid_request_error",
            "image",
        ),
        (
            body(json!({"messages": [{"role": "system", "content": "x"}]})),
            400,
            "invalid_request_error",
            "role",
        ),
        (
            body(json!({"temperature": 1.5})),
            400,
            "invalid_request_error",
            "between 0 and 1",
        ),
        (
            body(json!({"tools": [{"type": "web_search_20250305", "name": "web"}]})),
            400,
            "invalid_request_error",
            "web_search",
        ),
        (
            body(json!({"tool_choice": {"type": "sometimes"}})),
            400,
            "invalid_request_error",
            "sometimes",
        ),
        (
            body(json!({"max_tokens": 100000})),
            400,
            "invalid_request_error",
            "context length",
        ),
    ];
    for (req, code, kind, needle) in cases {
        let (status, e) = send(keyed(req.clone())).await;
        assert_eq!(status, code, "{req}: {e}");
        assert_anthropic_error(&e, kind, needle);
    }
    let (status, e) = send(
        client
            .post(&url)
            .header("x-api-key", "sk-ant")
            .header("content-type", "application/json")
            .body("{not json"),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(e["error"]["type"], "invalid_request_error", "{e}");
    let big = "x".repeat(33 << 20);
    let (status, e) = send(
        client
            .post(&url)
            .header("x-api-key", "sk-ant")
            .header("content-type", "application/json")
            .body(big),
    )
    .await;
    assert_eq!(status, 413);
    assert_anthropic_error(&e, "request_too_large", "too large");
}
