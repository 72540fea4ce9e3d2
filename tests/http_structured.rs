//! Structured outputs through HTTP on the tiny random Qwen2 fixture: whatever its random weights
//! prefer, a constraint must make the output valid (OpenAI's `response_format`, vLLM's
//! `structured_outputs` and `guided_*`), streamed or not, alone or batched with unconstrained
//! requests that stay unchanged; and constraints that cannot compile are 400s that say why.

mod common;

use common::server::*;
use pagewise::server::ServerOptions;
use pagewise::server::structured::StructuredLimits;
use serde_json::{Value, json};

/// A schema the fixture's 256-token context can finish: bounded fields only.
fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "admin": {"type": "boolean"},
            "team": {"enum": ["red", "blue"]}
        },
        "required": ["name", "age", "admin", "team"],
        "additionalProperties": false
    })
}

fn assert_person(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    let obj = v.as_object().unwrap();
    assert_eq!(obj.len(), 4, "{text}");
    assert!(v["name"].as_str().unwrap().chars().count() <= 8, "{text}");
    assert!((0..=120).contains(&v["age"].as_i64().unwrap()), "{text}");
    assert!(v["admin"].is_boolean(), "{text}");
    assert!(
        ["red", "blue"].contains(&v["team"].as_str().unwrap()),
        "{text}"
    );
}

async fn chat(base: &str, extra: Value) -> (u16, Value) {
    let mut body = json!({"model": "tiny", "messages": [{"role": "user", "content": "Who?"}],
                          "max_tokens": 120, "temperature": 0});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    post(base, "/v1/chat/completions", body).await
}

async fn complete(base: &str, extra: Value) -> (u16, Value) {
    let mut body =
        json!({"model": "tiny", "prompt": "Answer:", "max_tokens": 60, "temperature": 0});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    post(base, "/v1/completions", body).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_schema_and_json_object_outputs_parse() {
    let (base, _) = start(vec![]).await;
    let format = json!({"response_format": {"type": "json_schema",
        "json_schema": {"name": "person", "schema": person_schema(), "strict": true}}});
    let (status, body) = chat(&base, format.clone()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "stop", "{body}");
    assert_person(body["choices"][0]["message"]["content"].as_str().unwrap());

    // Sampled, several choices, each with its own guide.
    let mut sampled = format.clone();
    sampled["temperature"] = json!(1.0);
    sampled["n"] = json!(3);
    sampled["seed"] = json!(7);
    let (status, body) = chat(&base, sampled).await;
    assert_eq!(status, 200, "{body}");
    for c in body["choices"].as_array().unwrap() {
        assert_person(c["message"]["content"].as_str().unwrap());
    }

    // The same schema through vLLM's fields, as a string and as an object.
    let (_, a) = complete(
        &base,
        json!({"guided_json": person_schema().to_string(), "max_tokens": 120}),
    )
    .await;
    let (_, b) = complete(
        &base,
        json!({"structured_outputs": {"json": person_schema()}, "max_tokens": 120}),
    )
    .await;
    assert_person(a["choices"][0]["text"].as_str().unwrap());
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);

    let (status, body) = chat(
        &base,
        json!({"response_format": {"type": "json_object"}, "max_tokens": 200}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let text = body["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(text.starts_with('{'), "{text}");
    if body["choices"][0]["finish_reason"] == "stop" {
        assert!(
            serde_json::from_str::<Value>(text).unwrap().is_object(),
            "{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regex_choice_and_grammar_hold_streamed_or_not() {
    let (base, _) = start(vec![]).await;
    let (_, body) = complete(
        &base,
        json!({"structured_outputs": {"regex": "[0-9]{3}-[A-Z]{2}"}}),
    )
    .await;
    let text = body["choices"][0]["text"].as_str().unwrap();
    let b = text.as_bytes();
    assert!(
        b.len() == 6 && b[..3].iter().all(u8::is_ascii_digit) && b[3] == b'-',
        "{text}"
    );
    assert!(b[4..].iter().all(u8::is_ascii_uppercase), "{text}");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");

    let choices = json!(["sunny (warm)", "rain*", "snow"]);
    let (_, body) = chat(&base, json!({"guided_choice": choices})).await;
    let text = body["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(
        choices.as_array().unwrap().iter().any(|c| c == text),
        "{text}"
    );

    let lark = "start: \"The answer is \" (\"yes\" | \"no\") \".\"";
    let (_, body) = complete(&base, json!({"structured_outputs": {"grammar": lark}})).await;
    let text = body["choices"][0]["text"].as_str().unwrap();
    assert!(
        text == "The answer is yes." || text == "The answer is no.",
        "{text}"
    );
    let gbnf = "root ::= \"id-\" [0-9] [0-9]";
    let (_, body) = complete(&base, json!({"guided_grammar": gbnf})).await;
    let text = body["choices"][0]["text"].as_str().unwrap();
    assert!(text.len() == 5 && text.starts_with("id-"), "{text}");

    // Streamed, the same text in pieces.
    let constraint = json!({"structured_outputs": {"json": person_schema()}, "max_tokens": 120});
    let (_, whole) = complete(&base, constraint.clone()).await;
    let mut body = json!({"model": "tiny", "prompt": "Answer:", "max_tokens": 120, "temperature": 0, "stream": true});
    body.as_object_mut()
        .unwrap()
        .extend(constraint.as_object().unwrap().clone());
    let mut streamed = String::new();
    for data in sse(&base, "/v1/completions", body).await {
        if data == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(&data).unwrap();
        streamed.push_str(v["choices"][0]["text"].as_str().unwrap_or(""));
    }
    assert_eq!(streamed, whole["choices"][0]["text"].as_str().unwrap());
    assert_person(&streamed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constrained_and_free_requests_share_a_batch_and_free_ones_are_unchanged() {
    let (base, _) = start(vec![]).await;
    let free =
        |i: usize| json!({"prompt": format!("Story {i}:"), "max_tokens": 40, "ignore_eos": true});
    let mut alone = Vec::new();
    for i in 0..3 {
        alone.push(complete(&base, free(i)).await.1["choices"][0]["text"].clone());
    }
    let mut tasks = Vec::new();
    for i in 0..6 {
        let base = base.clone();
        tasks.push(tokio::spawn(async move {
            if i % 2 == 0 {
                complete(&base, free(i / 2)).await
            } else {
                complete(
                    &base,
                    json!({"structured_outputs": {"json": person_schema()}, "max_tokens": 120}),
                )
                .await
            }
        }));
    }
    for (i, t) in tasks.into_iter().enumerate() {
        let (status, body) = t.await.unwrap();
        assert_eq!(status, 200, "{body}");
        let text = &body["choices"][0]["text"];
        if i % 2 == 0 {
            assert_eq!(
                text,
                &alone[i / 2],
                "free request {i} changed in a mixed batch"
            );
        } else {
            assert_person(text.as_str().unwrap());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constraints_that_cannot_compile_are_400s_that_say_why() {
    let opts = ServerOptions {
        served_model_names: vec!["tiny".into()],
        structured_limits: StructuredLimits {
            max_bytes: 2000,
            ..Default::default()
        },
        ..Default::default()
    };
    let (base, _) = serve(engine_args(), opts).await;
    let bad_type = json!({"type": "object", "properties": {"a": {"type": "no-such-type"}}});
    let (status, body) = complete(&base, json!({"guided_json": bad_type})).await;
    assert_eq!(status, 400);
    assert_error(&body, "invalid_request_error", "no-such-type");
    assert_eq!(body["error"]["param"], "structured_outputs");

    let (status, body) = complete(&base, json!({"structured_outputs": {"regex": "(open"}})).await;
    assert_eq!(status, 400, "{body}");
    assert_error(&body, "invalid_request_error", "does not compile");

    let (status, body) = complete(
        &base,
        json!({"structured_outputs": {"grammar": "start: nowhere"}}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_error(&body, "invalid_request_error", "nowhere");

    let (status, body) =
        complete(&base, json!({"guided_regex": "a+", "guided_choice": ["a"]})).await;
    assert_eq!(status, 400, "{body}");
    assert_error(&body, "invalid_request_error", "only one output constraint");

    let (status, body) = complete(
        &base,
        json!({"structured_outputs": {"regex": "a", "choice": ["b"]}}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_error(&body, "invalid_request_error", "only one of");

    let (status, body) = chat(&base, json!({"response_format": {"type": "json_schema"}})).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["param"], "response_format");
    let (status, body) = chat(&base, json!({"response_format": {"type": "yaml"}})).await;
    assert_eq!(status, 400, "{body}");
    assert_error(&body, "invalid_request_error", "yaml");

    let big: Vec<String> = (0..500).map(|i| format!("option-{i}")).collect();
    let (status, body) = complete(&base, json!({"guided_choice": big})).await;
    assert_eq!(status, 400, "{body}");
    assert_error(
        &body,
        "invalid_request_error",
        "--structured-outputs-max-bytes",
    );

    // Text is no constraint; the server is still well.
    let (status, _) = chat(&base, json!({"response_format": {"type": "text"}})).await;
    assert_eq!(status, 200);
}
