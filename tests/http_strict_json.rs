//! JSON outputs hold only the properties their schema names, as OpenAI and vLLM's default backend
//! generate them, on the tiny random Qwen2 fixture: whatever its random weights prefer, sampled
//! over many seeds, no output of a schema without `additionalProperties` has a key the schema
//! does not name, in `response_format`, `structured_outputs` or a forced tool call. The server's
//! `structured_outputs_allow_additional_properties` gives JSON Schema's reading back (and the
//! same requests then do write other keys: the check can fail), except for schemas sent with
//! `strict: true`. Forced tool calls cut short by `max_tokens` are still calls.

mod common;

use common::server::*;
use pagewise::EngineArgs;
use pagewise::server::ServerOptions;
use serde_json::{Value, json};

/// Names properties, bounds every value, says nothing of other properties.
fn open_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "a": {"type": "integer", "minimum": 0, "maximum": 9},
            "b": {"type": "boolean"},
            "inner": {"type": "object", "properties": {"x": {"enum": ["p", "q"]}}}
        }
    })
}

/// Whether `text` is an object with no key `open_schema` does not name, at either level.
fn holds_only_named_keys(text: &str) -> bool {
    let Ok(Value::Object(obj)) = serde_json::from_str::<Value>(text) else {
        return false;
    };
    let inner_ok = match obj.get("inner") {
        None => true,
        Some(Value::Object(inner)) => inner.keys().all(|k| k == "x"),
        Some(_) => false,
    };
    inner_ok
        && obj
            .keys()
            .all(|k| ["a", "b", "inner"].contains(&k.as_str()))
}

async fn server(allow_additional_properties: bool) -> String {
    let args = EngineArgs {
        structured_outputs_allow_additional_properties: allow_additional_properties,
        ..engine_args()
    };
    let opts = ServerOptions {
        served_model_names: vec!["tiny".into()],
        ..Default::default()
    };
    serve(args, opts).await.0
}

/// The answers of 6 seeds x 8 choices of a sampled chat request with `extra` (the content, or
/// the first call's arguments), with their finish reasons.
async fn sampled(base: &str, extra: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for seed in 1..=6 {
        let mut body = json!({"model": "tiny", "messages": [{"role": "user", "content": "Go"}],
            "max_tokens": 60, "temperature": 1.0, "n": 8, "seed": seed});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let (status, body) = post(base, "/v1/chat/completions", body).await;
        assert_eq!(status, 200, "{body}");
        for c in body["choices"].as_array().unwrap() {
            let m = &c["message"];
            let text = match m["tool_calls"].as_array() {
                Some(calls) => calls[0]["function"]["arguments"].as_str().unwrap(),
                None => m["content"].as_str().unwrap(),
            };
            let finish = c["finish_reason"].as_str().unwrap();
            out.push((text.to_string(), finish.to_string()));
        }
    }
    out
}

fn assert_all_closed(answers: &[(String, String)], what: &str) {
    for (text, finish) in answers {
        assert!(holds_only_named_keys(text), "{what}: {text:?} ({finish})");
        assert_ne!(finish, "length", "{what}: {text:?}");
    }
}

fn response_format(strict: Option<bool>, schema: Value) -> Value {
    let mut spec = json!({"name": "thing", "schema": schema});
    if let Some(strict) = strict {
        spec["strict"] = json!(strict);
    }
    json!({"response_format": {"type": "json_schema", "json_schema": spec}})
}

fn named_tool(strict: bool) -> Value {
    json!({"tools": [{"type": "function", "function": {"name": "f", "strict": strict,
            "parameters": open_schema()}}],
           "tool_choice": {"type": "function", "function": {"name": "f"}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_hold_only_named_properties_over_many_seeds() {
    let base = server(false).await;
    let requests = [
        ("response_format", response_format(None, open_schema())),
        (
            "strict response_format",
            response_format(Some(true), open_schema()),
        ),
        (
            "structured_outputs",
            json!({"structured_outputs": {"json": open_schema()}}),
        ),
        ("guided_json", json!({"guided_json": open_schema()})),
        ("named tool", named_tool(false)),
        ("strict named tool", named_tool(true)),
    ];
    for (what, extra) in requests {
        assert_all_closed(&sampled(&base, &extra).await, what);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_may_allow_more_but_strict_schemas_stay_closed() {
    let base = server(true).await;
    // JSON Schema's reading: these random weights do write other keys (so the check above can
    // fail, and did before objects were closed).
    for extra in [
        response_format(None, open_schema()),
        response_format(Some(false), open_schema()),
        named_tool(false),
    ] {
        let answers = sampled(&base, &extra).await;
        let open = answers.iter().filter(|(t, _)| !holds_only_named_keys(t));
        assert!(open.count() > 0, "{extra}: {answers:?}");
    }
    // strict: true, a strict tool, or vLLM's per-request option close them anyway.
    let closed = json!({"structured_outputs": {"json": open_schema(),
        "disable_additional_properties": true}});
    for (what, extra) in [
        (
            "strict response_format",
            response_format(Some(true), open_schema()),
        ),
        ("strict named tool", named_tool(true)),
        ("disable_additional_properties", closed),
    ] {
        assert_all_closed(&sampled(&base, &extra).await, what);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_schemas_that_open_objects_are_refused_by_name() {
    let base = server(false).await;
    let mut schema = open_schema();
    schema["properties"]["inner"]["additionalProperties"] = json!({"type": "string"});
    let (status, body) = post(
        &base,
        "/v1/chat/completions",
        json!({"model": "tiny", "messages": [{"role": "user", "content": "Go"}],
               "response_format": response_format(Some(true), schema.clone())["response_format"]}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_error(&body, "invalid_request_error", "#/properties/inner");
    assert_eq!(body["error"]["param"], "response_format");

    let mut tool = named_tool(true);
    tool["tools"][0]["function"]["parameters"] = schema.clone();
    tool["model"] = json!("tiny");
    tool["messages"] = json!([{"role": "user", "content": "Go"}]);
    let (status, body) = post(&base, "/v1/chat/completions", tool).await;
    assert_eq!(status, 400, "{body}");
    assert_error(&body, "invalid_request_error", "additionalProperties");
    assert_eq!(body["error"]["param"], "tools");

    // Not strict: the schema's own words hold.
    let (status, body) = post(
        &base,
        "/v1/chat/completions",
        json!({"model": "tiny", "messages": [{"role": "user", "content": "Go"}],
               "max_tokens": 5, "guided_json": schema}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
}
