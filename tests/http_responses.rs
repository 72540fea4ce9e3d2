//! OpenAI's Responses API on the tiny random Qwen2 fixture: the same answers as the chat endpoint
//! in the Responses shapes, text formats and function tools, `previous_response_id` over the
//! bounded store with GET and DELETE, typed events in the SDK's order, and refusals by name.

mod common;

use common::server::*;
use serde_json::{Value, json};

fn body(extra: Value) -> Value {
    let mut b = json!({"model": "tiny", "input": "Hello there", "max_output_tokens": 12,
                       "temperature": 0});
    b.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    b
}

/// The text of a response's message items.
fn output_text(r: &Value) -> String {
    r["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "message")
        .flat_map(|i| i["content"].as_array().unwrap().iter())
        .map(|p| p["text"].as_str().unwrap().to_string())
        .collect()
}

fn weather_tool() -> Value {
    json!([{"type": "function", "name": "get_weather", "description": "Weather in a city",
            "parameters": {"type": "object",
                "properties": {"city": {"type": "string", "pattern": "^[a-z]{1,8}$"}},
                "required": ["city"]}}])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_answer_as_chat_does_and_are_kept() {
    let (base, _) = start(vec![]).await;
    let (status, r) = post(
        &base,
        "/v1/responses",
        body(json!({"instructions": "Be brief."})),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(
        (r["object"].as_str(), r["status"].as_str()),
        (Some("response"), Some("incomplete"))
    );
    assert_eq!(r["incomplete_details"]["reason"], "max_output_tokens");
    assert!(r["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(r["usage"]["output_tokens"], 12);
    let u = &r["usage"];
    assert_eq!(
        u["total_tokens"],
        json!(u["input_tokens"].as_u64().unwrap() + 12)
    );
    // The same conversation through chat: the same greedy text.
    let chat = json!({"model": "tiny", "max_tokens": 12, "temperature": 0, "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]});
    let (_, c) = post(&base, "/v1/chat/completions", chat).await;
    assert_eq!(
        output_text(&r),
        c["choices"][0]["message"]["content"].as_str().unwrap()
    );
    assert_eq!(r["usage"]["input_tokens"], c["usage"]["prompt_tokens"]);

    // Kept: GET returns it; a later request continues its conversation.
    let id = r["id"].as_str().unwrap();
    assert_eq!(get_json(&base, &format!("/v1/responses/{id}")).await, r);
    let (status, next) = post(
        &base,
        "/v1/responses",
        body(json!({"previous_response_id": id, "input": "More?"})),
    )
    .await;
    assert_eq!(status, 200, "{next}");
    assert_eq!(next["previous_response_id"], id);
    // Its prompt holds the earlier input and output (less the instructions, which do not carry).
    let earlier = r["usage"]["total_tokens"].as_u64().unwrap();
    assert!(
        next["usage"]["input_tokens"].as_u64().unwrap() > earlier - 10,
        "{next}"
    );

    // DELETE forgets it; so do GET and previous_response_id then.
    let client = reqwest::Client::new();
    let url = format!("{base}/v1/responses/{id}");
    let deleted: Value = client
        .delete(&url)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(deleted["deleted"], true);
    assert_eq!(client.get(&url).send().await.unwrap().status(), 404);
    assert_eq!(client.delete(&url).send().await.unwrap().status(), 404);
    let (status, e) = post(
        &base,
        "/v1/responses",
        body(json!({"previous_response_id": id})),
    )
    .await;
    assert_eq!(status, 400);
    assert_error(&e, "invalid_request_error", "not found");
    assert_eq!(e["error"]["param"], "previous_response_id");

    // store false: not kept.
    let (_, r) = post(&base, "/v1/responses", body(json!({"store": false}))).await;
    assert_eq!(r["store"], false);
    let url = format!("{base}/v1/responses/{}", r["id"].as_str().unwrap());
    assert_eq!(client.get(&url).send().await.unwrap().status(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_formats_and_function_tools() {
    let (base, _) = start(vec![]).await;
    // Messages with parts, an earlier call and its output.
    let items = json!([
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Oslo?"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": "{\"city\": \"Oslo\"}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "It is sunny."}]},
        {"role": "user", "content": "Thanks"}
    ]);
    let (status, r) = post(&base, "/v1/responses", body(json!({"input": items}))).await;
    assert_eq!(status, 200, "{r}");

    // json_schema with strict: only the named key.
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer",
        "minimum": 0, "maximum": 99}}, "required": ["n"]});
    let format = json!({"text": {"format": {"type": "json_schema", "name": "num",
        "schema": schema, "strict": true}}, "max_output_tokens": 40});
    let (status, r) = post(&base, "/v1/responses", body(format)).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["status"], "completed", "{r}");
    let v: Value = serde_json::from_str(&output_text(&r)).unwrap();
    assert_eq!(v.as_object().unwrap().keys().collect::<Vec<_>>(), ["n"]);
    assert_eq!(r["text"]["format"]["name"], "num");

    // Tools: required and named choices give function_call items valid against the schema.
    for choice in [
        json!("required"),
        json!({"type": "function", "name": "get_weather"}),
    ] {
        let req = json!({"tools": weather_tool(), "tool_choice": choice, "max_output_tokens": 100,
                         "parallel_tool_calls": false});
        let (status, r) = post(&base, "/v1/responses", body(req)).await;
        assert_eq!(status, 200, "{r}");
        assert_eq!(r["status"], "completed", "{r}");
        let calls: Vec<&Value> = r["output"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["type"] == "function_call")
            .collect();
        assert!(!calls.is_empty(), "{r}");
        for call in calls {
            assert_eq!(call["name"], "get_weather");
            assert!(
                call["call_id"].as_str().unwrap().starts_with("call_"),
                "{call}"
            );
            let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
            assert_eq!(
                args.as_object().unwrap().keys().collect::<Vec<_>>(),
                ["city"],
                "{args}"
            );
        }
        assert_eq!(r["tools"], weather_tool());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_events_come_in_the_sdks_order() {
    let (base, _) = start(vec![]).await;
    let (_, whole) = post(&base, "/v1/responses", body(json!({}))).await;
    let mut stream = body(json!({"stream": true}));
    let evs = typed_sse(&base, "/v1/responses", &stream).await;
    let kinds: Vec<&str> = evs
        .iter()
        .map(|(_, d)| d["type"].as_str().unwrap())
        .collect();
    for (i, (name, data)) in evs.iter().enumerate() {
        assert_eq!(name, data["type"].as_str().unwrap());
        assert_eq!(data["sequence_number"], i, "{data}");
    }
    let deltas: Vec<&str> = kinds
        .iter()
        .copied()
        .filter(|k| *k == "response.output_text.delta")
        .collect();
    let expected_head = [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ];
    assert_eq!(kinds[..4], expected_head, "{kinds:?}");
    let tail = [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ];
    assert_eq!(kinds[kinds.len() - 4..], tail, "{kinds:?}");
    assert_eq!(kinds.len(), 8 + deltas.len());
    let text: String = evs
        .iter()
        .filter_map(|(_, d)| d["delta"].as_str())
        .collect();
    assert_eq!(text, output_text(&whole));
    let last = &evs.last().unwrap().1["response"];
    assert_eq!(output_text(last), text);
    assert_eq!(last["usage"]["output_tokens"], 12);
    // Kept as streamed.
    let id = last["id"].as_str().unwrap();
    assert_eq!(&get_json(&base, &format!("/v1/responses/{id}")).await, last);

    // A forced call streams as a function_call item with argument deltas.
    stream["tools"] = weather_tool();
    stream["tool_choice"] = json!({"type": "function", "name": "get_weather"});
    stream["max_output_tokens"] = json!(60);
    let evs = typed_sse(&base, "/v1/responses", &stream).await;
    let find = |kind: &str| {
        evs.iter()
            .find(|(_, d)| d["type"] == kind)
            .map(|(_, d)| d.clone())
    };
    let added = find("response.output_item.added").unwrap();
    assert_eq!(added["item"]["type"], "function_call");
    let args: String = evs
        .iter()
        .filter(|(_, d)| d["type"] == "response.function_call_arguments.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        find("response.function_call_arguments.done").unwrap()["arguments"],
        args
    );
    let done = find("response.completed").unwrap();
    assert_eq!(done["response"]["output"][0]["arguments"], args);
    serde_json::from_str::<Value>(&args).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_cannot_be_honoured_is_refused_by_name() {
    let (base, _) = start(vec![]).await;
    let cases = [
        (json!({"background": true}), "background"),
        (json!({"truncation": "auto"}), "truncation"),
        (
            json!({"include": ["reasoning.encrypted_content"]}),
            "include",
        ),
        (json!({"conversation": "conv_1"}), "conversation"),
        (
            json!({"input": [{"type": "computer_call_output", "call_id": "c"}]}),
            "input",
        ),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image",
            "image_url": "http://x/y.png"}]}]}),
            "input",
        ),
        (
            json!({"input": [{"role": "robot", "content": "hi"}]}),
            "input",
        ),
        (json!({"tools": [{"type": "web_search"}]}), "tools"),
        (json!({"text": {"format": {"type": "yaml"}}}), "text.format"),
        (json!({"max_output_tokens": 100000}), "input"),
        (json!({"model": "other"}), "model"),
    ];
    for (extra, param) in cases {
        let (status, e) = post(&base, "/v1/responses", body(extra.clone())).await;
        assert!(status == 400 || status == 404, "{extra}: {status} {e}");
        assert_eq!(e["error"]["param"], param, "{extra}: {e}");
    }
    let (status, e) = post(&base, "/v1/responses", json!({"model": "tiny"})).await;
    assert_eq!(status, 400, "{e}");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("input"),
        "{e}"
    );
}
