use serde_json::json;

use super::*;

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "get_time"}}
    ])
}

fn param(r: Result<Option<(ToolCalling, Option<StructuredOutputs>)>, ApiError>) -> String {
    r.err().and_then(|e| e.param).unwrap_or_default()
}

#[test]
fn choices_resolve_to_modes_and_constraints() {
    let auto = ToolOptions {
        auto_tool_choice: true,
        parser: Some(ToolParser::Hermes),
    };
    let t = tools();
    let (c, constraint) = resolve(Some(&t), None, None, &auto).unwrap().unwrap();
    assert_eq!(c.mode, ToolMode::Auto(ToolParser::Hermes));
    assert!(constraint.is_none());
    assert!(
        resolve(Some(&t), Some(&json!("none")), None, &auto)
            .unwrap()
            .is_none()
    );
    assert!(resolve(None, None, None, &auto).unwrap().is_none());

    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    let (c, constraint) = resolve(Some(&t), Some(&named), None, &auto)
        .unwrap()
        .unwrap();
    assert_eq!(c.mode, ToolMode::Named("get_weather".into()));
    let Some(StructuredOutputs::Json(schema)) = constraint else {
        panic!()
    };
    assert_eq!(schema["required"], json!(["city"]));

    let (c, constraint) = resolve(Some(&t), Some(&json!("required")), Some(false), &auto)
        .unwrap()
        .unwrap();
    assert_eq!((c.mode, c.parallel), (ToolMode::Required, false));
    let Some(StructuredOutputs::Json(schema)) = constraint else {
        panic!()
    };
    assert_eq!(schema["maxItems"], 1);
    assert_eq!(
        schema["items"]["anyOf"][1]["properties"]["name"]["const"],
        "get_time"
    );
    assert_eq!(
        schema["items"]["anyOf"][1]["properties"]["parameters"]["type"],
        "object"
    );
}

#[test]
fn what_cannot_be_honoured_is_a_400_naming_the_field() {
    let off = ToolOptions::default();
    let t = tools();
    assert_eq!(param(resolve(Some(&t), None, None, &off)), "tool_choice");
    assert_eq!(
        param(resolve(Some(&t), Some(&json!("auto")), None, &off)),
        "tool_choice"
    );
    assert_eq!(
        param(resolve(None, Some(&json!("required")), None, &off)),
        "tool_choice"
    );
    assert_eq!(
        param(resolve(Some(&t), Some(&json!("sometimes")), None, &off)),
        "tool_choice"
    );
    let unknown = json!({"type": "function", "function": {"name": "nope"}});
    assert_eq!(
        param(resolve(Some(&t), Some(&unknown), None, &off)),
        "tool_choice"
    );
    let bad = json!([{"type": "function", "function": {"parameters": {}}}]);
    assert_eq!(
        param(resolve(Some(&bad), Some(&json!("required")), None, &off)),
        "tools"
    );
    let bad = json!([{"type": "retrieval"}]);
    assert_eq!(
        param(resolve(Some(&bad), Some(&json!("required")), None, &off)),
        "tools"
    );
}

#[test]
fn answers_become_calls_or_stay_content() {
    let named = ToolCalling {
        mode: ToolMode::Named("get_weather".into()),
        parallel: true,
    };
    let p = named.extract("{\"city\": \"Paris\"}");
    assert_eq!(p.calls[0].arguments, "{\"city\": \"Paris\"}");
    // Cut short by max_tokens: still the call, with its arguments as far as they got.
    let p = named.extract("{\"city\": \"Pa");
    assert_eq!(
        (p.calls[0].arguments.as_str(), p.content),
        ("{\"city\": \"Pa", None)
    );
    assert_eq!(named.finish_reason(true, Some("stop")), Some("stop"));

    let required = ToolCalling {
        mode: ToolMode::Required,
        parallel: false,
    };
    let p = required
        .extract("[{\"name\": \"a\", \"parameters\": {}}, {\"name\": \"b\", \"parameters\": {}}]");
    assert_eq!(p.calls.len(), 1, "parallel calls off keeps the first");
    assert_eq!(
        required.finish_reason(true, Some("stop")),
        Some("tool_calls")
    );
    assert_eq!(required.finish_reason(true, Some("length")), Some("length"));
    assert_eq!(required.finish_reason(false, Some("stop")), Some("stop"));
    // Cut before any name is whole: nothing reads as a call.
    assert_eq!(
        required.extract("[{\"name\": \"get_w").content.as_deref(),
        Some("[{\"name\": \"get_w")
    );
}

#[test]
fn required_lists_cut_short_keep_their_calls() {
    let required = ToolCalling {
        mode: ToolMode::Required,
        parallel: true,
    };
    let calls = |text: &str| {
        let p = required.extract(text);
        assert!(p.content.is_none(), "{text}: {:?}", p.content);
        p.calls
            .into_iter()
            .map(|c| (c.name, c.arguments))
            .collect::<Vec<_>>()
    };
    let first = r#"[{"name": "a", "parameters": {"s": "}]\"{"}}, "#;
    assert_eq!(calls(first), vec![("a".into(), r#"{"s":"}]\"{"}"#.into())]);
    assert_eq!(
        calls(&format!(
            r#"{first}{{"name": "b", "parameters": {{"x": [1, 2"#
        )),
        vec![
            ("a".into(), r#"{"s":"}]\"{"}"#.into()),
            ("b".into(), r#"{"x": [1, 2"#.into())
        ]
    );
    assert_eq!(calls(r#"[{"name": "b""#), vec![("b".into(), String::new())]);
    assert_eq!(
        calls(r#"[{"name": "b", "param"#),
        vec![("b".into(), String::new())]
    );
    assert_eq!(
        calls(r#"[{"name": "b", "parameters": "#),
        vec![("b".into(), String::new())]
    );
    // Not a list the constraint wrote: content.
    let odd = required.extract(r#"{"name": "b", "parameters": {"#);
    assert_eq!(odd.calls.len(), 0);
}

/// Drives a strict-auto grammar byte by byte (the test vocabulary has one token per byte):
/// whether the guide takes all of `text`.
fn takes(grammar: &StructuredOutputs, text: &str) -> bool {
    takes_with(grammar, text, false)
}

/// [`takes`] on a server that allows additional properties or not.
fn takes_with(grammar: &StructuredOutputs, text: &str, allow_additional_properties: bool) -> bool {
    let tokenizer = std::sync::Arc::new(crate::testing::byte_level_tokenizer(&[]));
    let eos = tokenizer.token_to_id("<eos>").unwrap();
    let grammars =
        crate::guided::Grammars::new(tokenizer, 300, &[eos], allow_additional_properties);
    let mut guide = grammars.compile(grammar).unwrap();
    text.bytes().all(|b| {
        guide.mask().is_some_and(|m| m.is_allowed(u32::from(b)))
            && guide.advance(u32::from(b)).is_ok()
    })
}

#[test]
fn strict_tools_under_auto_hold_calls_to_their_schemas() {
    let mut t = tools();
    t[0]["function"]["strict"] = json!(true);
    let opts = |parser| ToolOptions {
        auto_tool_choice: true,
        parser: Some(parser),
    };
    let grammar = |parser| {
        let (c, g) = resolve(Some(&t), None, None, &opts(parser))
            .unwrap()
            .unwrap();
        assert_eq!(c.mode, ToolMode::Auto(parser));
        g.expect("a strict tool constrains auto")
    };
    let hermes = grammar(ToolParser::Hermes);
    assert!(takes(&hermes, "It is sunny."));
    assert!(takes(
        &hermes,
        "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
    ));
    assert!(takes(
        &hermes,
        "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"anything\": 1}}\n</tool_call>"
    ));
    assert!(
        !takes(
            &hermes,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"town\""
        ),
        "strict arguments"
    );
    assert!(
        !takes(&hermes, "<tool_call>\n{\"name\": \"launch\""),
        "unknown function"
    );
    // A strict tool's arguments hold only the properties it names.
    assert!(!takes(
        &hermes,
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \""
    ));

    let llama = grammar(ToolParser::Llama3Json);
    assert!(takes(&llama, "Sure thing."));
    assert!(takes(
        &llama,
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}"
    ));
    assert!(!takes(
        &llama,
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": 3"
    ));

    let mistral = grammar(ToolParser::Mistral);
    assert!(takes(
        &mistral,
        "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]"
    ));
    assert!(
        !takes(&mistral, "[{\"name\": \"get_weather\", \"arguments\": {}"),
        "city is required"
    );

    // Without a strict tool, auto is not constrained.
    let (_, g) = resolve(Some(&tools()), None, None, &opts(ToolParser::Hermes))
        .unwrap()
        .unwrap();
    assert!(g.is_none());
}

#[test]
fn forced_calls_hold_only_named_properties_unless_the_server_allows_more() {
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    let off = ToolOptions::default();
    let (_, g) = resolve(Some(&tools()), Some(&named), None, &off)
        .unwrap()
        .unwrap();
    let g = g.unwrap();
    let extra = "{\"city\": \"Paris\", \"unit\": 1}";
    assert!(takes(&g, "{\"city\": \"Paris\"}"));
    assert!(!takes(&g, extra), "closed by default");
    assert!(
        takes_with(&g, extra, true),
        "JSON Schema's reading when allowed"
    );

    // strict closes them whatever the server allows, and refuses schemas that open them.
    let mut t = tools();
    t[0]["function"]["strict"] = json!(true);
    let (_, g) = resolve(Some(&t), Some(&named), None, &off)
        .unwrap()
        .unwrap();
    assert!(!takes_with(&g.unwrap(), extra, true));
    t[0]["function"]["parameters"]["additionalProperties"] = json!(true);
    let e = resolve(Some(&t), Some(&named), None, &off).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("tools"));
    assert!(
        e.message.contains("tools[0].function.parameters"),
        "{}",
        e.message
    );
}
