//! Reasoning outputs through HTTP (`--reasoning-parser`) on the tiny random Qwen2 fixture, its
//! answers forced by a regex into each format: the reasoning comes back as `reasoning_content`,
//! the rest as `content`, whole or streamed (the streamed parts put back together equal the
//! whole), and no marker reaches the client; /v1/responses returns it as a reasoning item and
//! /v1/messages as a thinking block. Without a parser the text is left as it is.

mod common;

use common::server::*;
use pagewise::server::ServerOptions;
use pagewise::server::reasoning::ReasoningParser;
use pagewise::server::tools::{ToolOptions, ToolParser};
use serde_json::{Value, json};

async fn server(parser: Option<ReasoningParser>) -> String {
    let opts = ServerOptions {
        served_model_names: vec!["tiny".into()],
        reasoning_parser: parser,
        ..Default::default()
    };
    serve(engine_args(), opts).await.0
}

fn request(regex: &str) -> Value {
    json!({"model": "tiny", "messages": [{"role": "user", "content": "2+2?"}],
           "max_tokens": 120, "temperature": 0, "structured_outputs": {"regex": regex}})
}

/// The streamed reasoning, content and tool-call arguments of choice 0.
async fn streamed(base: &str, mut body: Value) -> (String, String, String) {
    body["stream"] = json!(true);
    let (mut reasoning, mut content, mut args) = (String::new(), String::new(), String::new());
    for data in sse(base, "/v1/chat/completions", body).await {
        if data == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(&data).unwrap();
        let delta = &v["choices"][0]["delta"];
        reasoning.push_str(delta["reasoning_content"].as_str().unwrap_or(""));
        content.push_str(delta["content"].as_str().unwrap_or(""));
        for c in delta["tool_calls"].as_array().into_iter().flatten() {
            args.push_str(c["function"]["arguments"].as_str().unwrap_or(""));
        }
    }
    (reasoning, content, args)
}

async fn check(parser: ReasoningParser, regex: &str, content_start: &str) {
    let base = server(Some(parser)).await;
    let (status, body) = post(&base, "/v1/chat/completions", request(regex)).await;
    assert_eq!(status, 200, "{body}");
    let message = &body["choices"][0]["message"];
    let (reasoning, content) = (
        message["reasoning_content"].as_str().unwrap(),
        message["content"].as_str().unwrap(),
    );
    assert!(
        reasoning.trim_start().starts_with("We add") && content.starts_with(content_start),
        "{parser:?}: {message}"
    );
    for part in [reasoning, content] {
        assert!(
            !part.contains("think>") && !part.contains("<|"),
            "{parser:?}: {message}"
        );
    }
    let (r, c, _) = streamed(&base, request(regex)).await;
    assert_eq!(
        (r.as_str(), c.as_str()),
        (reasoning, content),
        "{parser:?} streamed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasoning_is_split_from_content_whole_and_streamed() {
    check(
        ReasoningParser::Qwen3,
        "<think>\nWe add [a-z ]{5,20}\n</think>\n\nIt is [0-9]\\.",
        "\n\nIt is ",
    )
    .await;
    check(
        ReasoningParser::DeepSeekR1,
        "We add [a-z ]{5,20}</think>It is [0-9]\\.",
        "It is ",
    )
    .await;
    check(
        ReasoningParser::GptOss,
        "<\\|channel\\|>analysis<\\|message\\|>We add [a-z ]{5,20}<\\|end\\|><\\|start\\|>assistant\
         <\\|channel\\|>final<\\|message\\|>It is [0-9]\\.",
        "It is ",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_parser_or_reasoning_the_text_is_content() {
    // No parser: the tags stay in the content, and no reasoning_content is sent.
    let base = server(None).await;
    let (status, body) = post(
        &base,
        "/v1/chat/completions",
        request("<think>We add [a-z ]{5,20}</think>It is [0-9]\\."),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let message = &body["choices"][0]["message"];
    assert!(
        message["content"]
            .as_str()
            .unwrap()
            .starts_with("<think>We add")
    );
    assert!(message.get("reasoning_content").is_none(), "{message}");
    // Qwen3 with thinking off: all content.
    let base = server(Some(ReasoningParser::Qwen3)).await;
    let (_, body) = post(&base, "/v1/chat/completions", request("It is [0-9]\\.")).await;
    let message = &body["choices"][0]["message"];
    assert!(message["content"].as_str().unwrap().starts_with("It is"));
    assert!(message.get("reasoning_content").is_none(), "{message}");
}

/// A server that splits reasoning with `reasoning` and reads tool calls with `tools`.
async fn tool_server(reasoning: ReasoningParser, tools: ToolParser) -> String {
    let opts = ServerOptions {
        served_model_names: vec!["tiny".into()],
        reasoning_parser: Some(reasoning),
        tools: ToolOptions {
            auto_tool_choice: true,
            parser: Some(tools),
        },
        ..Default::default()
    };
    serve(engine_args(), opts).await.0
}

/// The one tool the tool-call tests declare: `get_time(zone: "UTC" | "CET")`.
fn get_time_tool() -> Value {
    json!([{"type": "function", "function": {"name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
            "required": ["zone"]}}}])
}

/// Qwen3 reasons, then calls a tool (Hermes' format): the reasoning goes to
/// `reasoning_content`, the call to `tool_calls`, and neither leaks into `content`, whole or
/// streamed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasoning_then_a_tool_call() {
    let base = tool_server(ReasoningParser::Qwen3, ToolParser::Hermes).await;
    let forced = "<think>\nWe need [a-z]{3,8}\\.\n</think>\n\n<tool_call>\n\\{\"name\": \"get_time\", \
                  \"arguments\": \\{\"zone\": \"(UTC|CET)\"\\}\\}\n</tool_call>";
    let mut body = request(forced);
    body["tools"] = get_time_tool();
    let (status, got) = post(&base, "/v1/chat/completions", body.clone()).await;
    assert_eq!(status, 200, "{got}");
    let choice = &got["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{got}");
    let message = &choice["message"];
    let reasoning = message["reasoning_content"].as_str().unwrap();
    assert!(reasoning.trim().starts_with("We need"), "{message}");
    assert!(
        message["content"].as_str().unwrap_or("").trim().is_empty(),
        "{message}"
    );
    let call = &message["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_time", "{message}");
    // Streamed: the same reasoning, the same call, no content.
    let (r, content, args) = streamed(&base, body).await;
    assert_eq!(r, reasoning);
    assert!(content.trim().is_empty(), "{content:?}");
    assert_eq!(args, call["arguments"].as_str().unwrap());
}

/// gpt-oss reasons, says what it will do, then calls a function (harmony, `--tool-call-parser
/// openai`): the analysis goes to `reasoning_content`, the commentary preamble to `content`, the
/// message to `functions.get_time` to `tool_calls`, and no marker reaches the client, whole or
/// streamed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn harmony_reasoning_then_a_tool_call() {
    let base = tool_server(ReasoningParser::GptOss, ToolParser::Openai).await;
    let forced = "<\\|channel\\|>analysis<\\|message\\|>So [a-z]{1,2}\\.<\\|end\\|>\
        <\\|start\\|>assistant<\\|channel\\|>commentary<\\|message\\|>Ok\\.<\\|end\\|>\
        <\\|start\\|>assistant to=functions\\.get_time<\\|channel\\|>commentary\
        <\\|message\\|>\\{\"zone\": \"(UTC|CET)\"\\}<\\|call\\|>";
    let mut body = request(forced);
    body["max_tokens"] = json!(200);
    body["tools"] = get_time_tool();
    let (status, got) = post(&base, "/v1/chat/completions", body.clone()).await;
    assert_eq!(status, 200, "{got}");
    let choice = &got["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{got}");
    let message = &choice["message"];
    let reasoning = message["reasoning_content"].as_str().unwrap();
    assert!(reasoning.starts_with("So "), "{message}");
    assert_eq!(message["content"], "Ok.", "{message}");
    let call = &message["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_time", "{message}");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(args["zone"] == "UTC" || args["zone"] == "CET", "{message}");
    let (r, content, streamed_args) = streamed(&base, body).await;
    assert_eq!(r, reasoning);
    assert_eq!(content, "Ok.");
    assert_eq!(streamed_args, call["arguments"].as_str().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_and_messages_return_reasoning_as_their_own_items() {
    let base = server(Some(ReasoningParser::Qwen3)).await;
    let regex = "<think>\nWe add [a-z ]{5,20}\n</think>\n\nIt is [0-9]\\.";
    let forced = json!({"regex": regex});

    // Responses: a reasoning item, then the message.
    let req = json!({"model": "tiny", "input": "2+2?", "max_output_tokens": 120, "temperature": 0,
                     "reasoning": {"effort": "low"}, "structured_outputs": forced});
    let (status, r) = post(&base, "/v1/responses", req.clone()).await;
    assert_eq!(status, 200, "{r}");
    let output = r["output"].as_array().unwrap();
    assert_eq!(
        (output[0]["type"].as_str(), output[1]["type"].as_str()),
        (Some("reasoning"), Some("message"))
    );
    let reasoning = output[0]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(reasoning.trim_start().starts_with("We add"), "{r}");
    let text = output[1]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        text.starts_with("\n\nIt is ") && !text.contains("think"),
        "{r}"
    );
    let mut streamed = req;
    streamed["stream"] = json!(true);
    let evs: Vec<Value> = typed_sse(&base, "/v1/responses", &streamed)
        .await
        .into_iter()
        .map(|(_, d)| d)
        .collect();
    let joined = |kind: &str| -> String {
        evs.iter()
            .filter(|e| e["type"] == kind)
            .map(|e| e["delta"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(joined("response.reasoning_text.delta"), reasoning);
    assert_eq!(joined("response.output_text.delta"), text);
    let done = evs
        .iter()
        .find(|e| e["type"] == "response.completed")
        .unwrap();
    assert_eq!(
        done["response"]["output"][0]["content"][0]["text"],
        reasoning.as_str()
    );

    // Messages: a thinking block, then the text.
    let req = json!({"model": "tiny", "max_tokens": 120, "temperature": 0,
                     "messages": [{"role": "user", "content": "2+2?"}],
                     "thinking": {"type": "enabled", "budget_tokens": 1024},
                     "structured_outputs": forced});
    let (status, m) = post(&base, "/v1/messages", req.clone()).await;
    assert_eq!(status, 200, "{m}");
    assert_eq!(m["content"][0]["type"], "thinking", "{m}");
    assert_eq!(m["content"][0]["thinking"], reasoning.as_str());
    assert_eq!(m["content"][1]["text"], text.as_str());
    assert_eq!(m["stop_reason"], "end_turn");
    let mut streamed = req;
    streamed["stream"] = json!(true);
    let evs: Vec<Value> = typed_sse(&base, "/v1/messages", &streamed)
        .await
        .into_iter()
        .map(|(_, d)| d)
        .collect();
    let thinking: String = evs
        .iter()
        .filter_map(|e| e["delta"]["thinking"].as_str())
        .collect();
    let streamed_text: String = evs
        .iter()
        .filter_map(|e| e["delta"]["text"].as_str())
        .collect();
    assert_eq!((thinking, streamed_text), (reasoning, text));
}
