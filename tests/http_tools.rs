//! Tool calling through HTTP on the tiny random Qwen2 fixture. `required` and named functions
//! constrain the output, so even random weights give calls whose arguments fit the schema;
//! `auto` parses calls out of the text (forced here into Hermes' format by a regex, so the parser
//! has a call to find). Streamed calls put back together equal the non-streamed ones (a chunk
//! holding at most one entry a call), forced calls cut short by `max_tokens` are still calls, and
//! tool results go back into the chat template.

mod common;

use common::server::*;
use pagewise::EngineArgs;
use pagewise::server::ServerOptions;
use pagewise::server::tools::{ToolOptions, ToolParser};
use serde_json::{Value, json};

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
            "parameters": {"type": "object",
                "properties": {"city": {"type": "string", "maxLength": 10}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                "required": ["city", "days"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "get_time",
            "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
                "required": ["zone"], "additionalProperties": false}}}
    ])
}

fn assert_valid_call(call: &Value) {
    assert!(call["id"].as_str().unwrap().starts_with("call_"), "{call}");
    assert_eq!(call["type"], "function");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    match call["function"]["name"].as_str().unwrap() {
        "get_weather" => {
            assert!(
                args["city"].as_str().unwrap().chars().count() <= 10,
                "{args}"
            );
            assert!((1..=7).contains(&args["days"].as_i64().unwrap()), "{args}");
        }
        "get_time" => assert!(
            ["UTC", "CET"].contains(&args["zone"].as_str().unwrap()),
            "{args}"
        ),
        other => panic!("unknown function {other}"),
    }
}

fn request(extra: Value) -> Value {
    let mut body = json!({"model": "tiny", "messages": [{"role": "user", "content": "Weather?"}],
                          "tools": tools(), "max_tokens": 150, "temperature": 0});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

/// The streamed calls of choice 0 put back together by index, as the OpenAI SDK does, with the
/// streamed content and finish reason.
async fn streamed(base: &str, mut body: Value) -> (String, Vec<Value>, String) {
    body["stream"] = json!(true);
    let (mut content, mut calls, mut finish) = (String::new(), Vec::<Value>::new(), String::new());
    for data in sse(base, "/v1/chat/completions", body).await {
        if data == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(&data).unwrap();
        let choice = &v["choices"][0];
        content.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
        // At most one entry a call in a chunk, as OpenAI and vLLM send them.
        let mut indices: Vec<u64> = choice["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|d| d["index"].as_u64().unwrap())
            .collect();
        let entries = indices.len();
        indices.dedup();
        assert_eq!(indices.len(), entries, "{data}");
        for d in choice["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let i = d["index"].as_u64().unwrap() as usize;
            if i == calls.len() {
                calls.push(json!({"id": d["id"], "type": d["type"],
                    "function": {"name": d["function"]["name"], "arguments": ""}}));
            } else {
                assert!(d.get("id").is_none(), "{d}");
            }
            let args = calls[i]["function"]["arguments"]
                .as_str()
                .unwrap()
                .to_string();
            calls[i]["function"]["arguments"] =
                json!(args + d["function"]["arguments"].as_str().unwrap_or(""));
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (content, calls, finish)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_and_required_choices_give_valid_calls_streamed_or_not() {
    let (base, _) = start(vec![]).await;
    let named = json!({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}});
    let (status, body) = post(&base, "/v1/chat/completions", request(named.clone())).await;
    assert_eq!(status, 200, "{body}");
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "stop", "{body}");
    assert!(choice["message"]["content"].is_null(), "{body}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert_valid_call(&calls[0]);
    let (content, s_calls, finish) = streamed(&base, request(named)).await;
    assert_eq!((content.as_str(), finish.as_str()), ("", "stop"));
    assert_eq!(s_calls[0]["function"], calls[0]["function"]);

    for parallel in [true, false] {
        let required = json!({"tool_choice": "required", "parallel_tool_calls": parallel});
        let (status, body) = post(&base, "/v1/chat/completions", request(required.clone())).await;
        assert_eq!(status, 200, "{body}");
        let choice = &body["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "{body}");
        let calls = choice["message"]["tool_calls"].as_array().unwrap();
        assert!(!calls.is_empty());
        if !parallel {
            assert_eq!(calls.len(), 1);
        }
        calls.iter().for_each(assert_valid_call);
        let (_, s_calls, finish) = streamed(&base, request(required)).await;
        assert_eq!(finish, "tool_calls");
        let names = |c: &[Value]| c.iter().map(|c| c["function"].clone()).collect::<Vec<_>>();
        assert_eq!(names(&s_calls), names(calls));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_calls_cut_short_by_max_tokens_are_still_calls() {
    let (base, _) = start(vec![]).await;
    let named = json!({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}});
    for choice in [named, json!({"tool_choice": "required"})] {
        // The whole answer's length (the fixture's tokens are bytes), then cut inside the arguments.
        let (_, whole) = post(&base, "/v1/chat/completions", request(choice.clone())).await;
        let used = whole["usage"]["completion_tokens"].as_u64().unwrap();
        let whole_call = &whole["choices"][0]["message"]["tool_calls"][0]["function"];
        let mut cut = choice.clone();
        cut["max_tokens"] = json!(used - 4);
        let (status, body) = post(&base, "/v1/chat/completions", request(cut.clone())).await;
        assert_eq!(status, 200, "{body}");
        let c = &body["choices"][0];
        assert_eq!(c["finish_reason"], "length", "{body}");
        assert!(c["message"]["content"].is_null(), "{body}");
        let call = &c["message"]["tool_calls"][0];
        assert!(call["id"].as_str().unwrap().starts_with("call_"), "{call}");
        assert_eq!(call["function"]["name"], whole_call["name"], "{body}");
        let args = call["function"]["arguments"].as_str().unwrap();
        assert!(
            args.starts_with('{') && serde_json::from_str::<Value>(args).is_err(),
            "{body}"
        );
        let (content, calls, finish) = streamed(&base, request(cut)).await;
        assert_eq!((content.as_str(), finish.as_str()), ("", "length"));
        assert_eq!(calls[0]["function"], call["function"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_parses_calls_when_the_server_has_a_parser() {
    let (base, _) = start(vec![]).await;
    let (status, body) = post(&base, "/v1/chat/completions", request(json!({}))).await;
    assert_eq!(status, 400, "auto needs --enable-auto-tool-choice: {body}");
    assert_eq!(body["error"]["param"], "tool_choice");

    let opts = ServerOptions {
        served_model_names: vec!["tiny".into()],
        tools: ToolOptions {
            auto_tool_choice: true,
            parser: Some(ToolParser::Hermes),
        },
        ..Default::default()
    };
    let (base, _) = serve(engine_args(), opts).await;
    // The random model answers in Hermes' format when a regex makes it.
    let forced = r#"Sure\.\n<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "(Paris|Rome)", "days": [1-7]\}\}\n</tool_call>"#;
    let body = request(json!({"structured_outputs": {"regex": forced}}));
    let (status, got) = post(&base, "/v1/chat/completions", body.clone()).await;
    assert_eq!(status, 200, "{got}");
    let choice = &got["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{got}");
    assert_eq!(choice["message"]["content"], "Sure.");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1);
    assert_valid_call(&calls[0]);
    let (content, s_calls, finish) = streamed(&base, body).await;
    assert_eq!((content.as_str(), finish.as_str()), ("Sure.", "tool_calls"));
    assert_eq!(s_calls[0]["function"], calls[0]["function"]);

    // A strict tool holds auto's calls to the schemas: a constraint of its own, so another one in
    // the same request is a 400; alone, whatever the random model writes is text or valid calls.
    let mut strict = request(json!({"structured_outputs": {"regex": forced}}));
    strict["tools"][0]["function"]["strict"] = json!(true);
    let (status, got) = post(&base, "/v1/chat/completions", strict.clone()).await;
    assert_eq!(status, 400, "{got}");
    strict.as_object_mut().unwrap().remove("structured_outputs");
    strict["temperature"] = json!(1.0);
    for seed in 0..4 {
        strict["seed"] = json!(seed);
        let (status, got) = post(&base, "/v1/chat/completions", strict.clone()).await;
        assert_eq!(status, 200, "{got}");
        for call in got["choices"][0]["message"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            assert_valid_call(call);
        }
    }

    // Text that is no call stays content, streamed or not.
    let plain =
        request(json!({"structured_outputs": {"regex": "No tools needed <b>today</b>\\."}}));
    let (_, got) = post(&base, "/v1/chat/completions", plain.clone()).await;
    assert_eq!(
        got["choices"][0]["message"]["content"],
        "No tools needed <b>today</b>."
    );
    assert!(
        got["choices"][0]["message"].get("tool_calls").is_none(),
        "{got}"
    );
    let (content, s_calls, _) = streamed(&base, plain).await;
    assert_eq!(
        (content.as_str(), s_calls.len()),
        ("No tools needed <b>today</b>.", 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_and_tool_results_reach_the_chat_template() {
    // A template that writes the first tool's name and each call's city (an object field: the
    // server turns OpenAI's arguments text back into an object, as transformers expects).
    let template = "{% if tools %}[{{ tools[0].function.name }}]{% endif %}{% for m in messages %}{{ m.role }}:{{ m.content }}{% if m.tool_calls %}{{ m.tool_calls[0].function.arguments.city }}{% endif %}|{% endfor %}";
    let args = EngineArgs {
        chat_template: Some(template.into()),
        ..engine_args()
    };
    let opts = ServerOptions {
        served_model_names: vec!["tiny".into()],
        ..Default::default()
    };
    let (base, _) = serve(args, opts).await;
    let conversation = |city: &str, with_tools: bool| {
        let mut body = json!({"model": "tiny", "max_tokens": 1, "tool_choice": "none", "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": format!("{{\"city\": \"{city}\", \"days\": 1}}")}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
        ]});
        if with_tools {
            body["tools"] = tools();
        }
        body
    };
    let prompt_tokens = |body: Value| {
        let base = base.clone();
        async move {
            let (status, got) = post(&base, "/v1/chat/completions", body).await;
            assert_eq!(status, 200, "{got}");
            got["usage"]["prompt_tokens"].as_u64().unwrap()
        }
    };
    // One byte, one token: "Paris" is one longer than "Rome", "[get_weather]" 13 bytes.
    let paris = prompt_tokens(conversation("Paris", false)).await;
    assert_eq!(prompt_tokens(conversation("Rome", false)).await + 1, paris);
    assert_eq!(prompt_tokens(conversation("Paris", true)).await, paris + 13);
}
