//! Request fields that ask for something this server does not do yet: tool calls it would have
//! to parse out of the model's text (`tool_choice` other than "none"). A request that sends one
//! is refused with a 400 naming the field, never answered as if it had been honoured.
//!
//! Other unknown fields are still accepted and logged once (`AppState::note_unknown_fields`).

use std::collections::BTreeMap;

use serde_json::Value;

use super::error::ApiError;

/// Refuses a request whose `unknown` fields (those the request types do not declare) ask for
/// parsed tool calls. `tools` is the chat request's tool list, if any.
pub fn refuse_unhonoured(
    unknown: &BTreeMap<String, Value>,
    tools: Option<&Value>,
) -> Result<(), ApiError> {
    let given = |name: &str| unknown.get(name).filter(|v| !v.is_null());
    let has_tools = tools.is_some_and(|t| t.as_array().is_none_or(|a| !a.is_empty()));
    check_choice("tool_choice", given("tool_choice"), has_tools)?;
    let has_functions = given("functions").is_some();
    check_choice("function_call", given("function_call"), has_functions)
}

/// `tool_choice` (or the legacy `function_call`): only "none" is honoured, which passes the tools
/// to the chat template and returns the model's text. With tools and no choice, OpenAI's default
/// is "auto", which needs a tool-call parser: refused as vLLM refuses it without one.
fn check_choice(field: &str, choice: Option<&Value>, has_tools: bool) -> Result<(), ApiError> {
    match choice.map(|c| {
        c.as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| c.to_string())
    }) {
        Some(c) if c == "none" => Ok(()),
        None if !has_tools => Ok(()),
        None => Err(ApiError::invalid(
            field,
            format!(
                "{field} defaults to \"auto\" when tools are given, and \"auto\" needs a \
                 tool-call parser, which this server does not have yet. Send {field}: \"none\" \
                 to pass the tools to the chat template and get the model's text."
            ),
        )),
        Some(c) => Err(ApiError::invalid(
            field,
            format!(
                "{field} {c} is not supported by this server: it does not return tool calls \
                 yet. Only \"none\" is (the tools then reach the chat template, and the answer \
                 is the model's text)."
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn fields(v: Value) -> BTreeMap<String, Value> {
        serde_json::from_value(v).unwrap()
    }

    fn param(r: Result<(), ApiError>) -> Option<String> {
        r.err().map(|e| e.param.unwrap_or_default())
    }

    #[test]
    fn no_tools_pass() {
        let tools = json!([{"type": "function", "function": {"name": "f"}}]);
        assert!(refuse_unhonoured(&fields(json!({})), None).is_ok());
        assert!(refuse_unhonoured(&fields(json!({"tool_choice": "none"})), Some(&tools)).is_ok());
        assert!(refuse_unhonoured(&fields(json!({})), Some(&json!([]))).is_ok());
        assert!(refuse_unhonoured(&fields(json!({"some_other_field": 1})), None).is_ok());
    }

    #[test]
    fn tool_calls_are_refused_by_name() {
        let tools = json!([{"type": "function", "function": {"name": "f"}}]);
        let r = |v: Value, t: Option<&Value>| param(refuse_unhonoured(&fields(v), t));
        assert_eq!(r(json!({}), Some(&tools)).as_deref(), Some("tool_choice"));
        assert_eq!(
            r(json!({"tool_choice": "auto"}), Some(&tools)).as_deref(),
            Some("tool_choice")
        );
        assert_eq!(
            r(json!({"tool_choice": "required"}), Some(&tools)).as_deref(),
            Some("tool_choice")
        );
        assert_eq!(
            r(
                json!({"tool_choice": {"type": "function", "function": {"name": "f"}}}),
                Some(&tools)
            )
            .as_deref(),
            Some("tool_choice")
        );
        assert_eq!(
            r(json!({"functions": [{"name": "f"}]}), None).as_deref(),
            Some("function_call")
        );
        assert_eq!(
            r(
                json!({"functions": [{"name": "f"}], "function_call": "none"}),
                None
            ),
            None
        );
    }
}
