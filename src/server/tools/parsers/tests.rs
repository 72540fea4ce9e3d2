//! Each parser on answers as the model families write them, and on malformed ones (which come
//! back as content).

use super::*;

fn call(name: &str, arguments: &str) -> ParsedCall {
    ParsedCall {
        name: name.into(),
        arguments: arguments.into(),
    }
}

#[test]
fn hermes_calls_with_and_without_content() {
    let p = ToolParser::Hermes;
    let one = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    assert_eq!(
        p.parse(one),
        Parsed {
            content: None,
            calls: vec![call("get_weather", r#"{"city":"Paris"}"#)]
        }
    );
    let two = format!(
        "Let me check.\n\n{one}\n<tool_call>\n{{\"name\": \"get_time\", \"arguments\": {{}}}}\n</tool_call>"
    );
    let got = p.parse(&two);
    assert_eq!(got.content.as_deref(), Some("Let me check."));
    assert_eq!(got.calls.len(), 2);
    assert_eq!(got.calls[1], call("get_time", "{}"));
    // The answer ended before the close tag: the call still counts.
    let cut = "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}";
    assert_eq!(p.parse(cut).calls, vec![call("f", r#"{"a":1}"#)]);
}

#[test]
fn hermes_malformed_answers_are_content() {
    let p = ToolParser::Hermes;
    for text in [
        "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": </tool_call>",
        "<tool_call>{\"arguments\": {}}</tool_call>",
        "<tool_call>{\"name\": \"f\"}</tool_call> and then more words",
        "Just words, no calls.",
    ] {
        assert_eq!(p.parse(text), Parsed::text(text), "{text}");
    }
    assert_eq!(p.parse(""), Parsed::default());
}

#[test]
fn llama3_json_calls() {
    let p = ToolParser::Llama3Json;
    let text = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}";
    assert_eq!(
        p.parse(text).calls,
        vec![call("get_weather", r#"{"city":"Paris"}"#)]
    );
    let tagged = "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"arguments\": {\"x\": \"1;2\"}}";
    let got = p.parse(tagged);
    assert_eq!(
        got.calls,
        vec![call("a", "{}"), call("b", r#"{"x":"1;2"}"#)]
    );
    assert_eq!(got.content, None);
    // Prose, or JSON that is not a call, is content.
    for text in [
        "The weather is nice.",
        "{\"city\": \"Paris\"}",
        "{\"name\": \"f\", \"parameters\": {}} trailing",
    ] {
        assert_eq!(p.parse(text), Parsed::text(text), "{text}");
    }
}

#[test]
fn mistral_calls() {
    let p = ToolParser::Mistral;
    let text = "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}]";
    assert_eq!(
        p.parse(text).calls,
        vec![
            call("get_weather", r#"{"city":"Paris"}"#),
            call("f", r#"{"a": 1}"#)
        ]
    );
    // With the special marker skipped from the text.
    let bare = "[{\"name\": \"g\", \"arguments\": {}}]";
    assert_eq!(p.parse(bare).calls, vec![call("g", "{}")]);
    for text in ["[TOOL_CALLS] [{\"name\": ", "[1, 2]", "No calls today."] {
        assert_eq!(p.parse(text), Parsed::text(text), "{text}");
    }
}

#[test]
fn streaming_holds_back_only_what_may_start_a_call() {
    assert_eq!(ToolParser::Hermes.undecided_tail("Hello <tool_"), 7);
    assert_eq!(ToolParser::Hermes.undecided_tail("Hello\n"), 1);
    assert_eq!(ToolParser::Hermes.undecided_tail("Hello <b>"), 0);
    assert_eq!(ToolParser::Hermes.call_start("Hi <tool_call>{"), Some(3));
    assert_eq!(ToolParser::Llama3Json.undecided_tail("  \n"), 3);
    assert_eq!(ToolParser::Llama3Json.call_start("  {\"na"), Some(2));
    assert_eq!(ToolParser::Llama3Json.call_start("Sure, {"), None);
    assert_eq!(ToolParser::Llama3Json.undecided_tail("Sure"), 0);
    assert_eq!(ToolParser::Mistral.undecided_tail("x [TOOL"), 6);
    assert_eq!(ToolParser::Mistral.undecided_tail(" ["), 2);
    assert_eq!(ToolParser::Mistral.call_start("[{\"name\""), Some(0));
}
