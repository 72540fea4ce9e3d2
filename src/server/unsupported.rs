//! Request fields that ask for something this server does not do: OpenAI's legacy `functions`
//! with a `function_call` other than "none" (the newer `tools` are honoured: `super::tools`). A
//! request that sends one is refused with a 400 naming the field, never answered as if it had
//! been honoured.
//!
//! Other unknown fields are still accepted and logged once (`AppState::note_unknown_fields`).

use std::collections::BTreeMap;

use serde_json::Value;

use super::error::ApiError;

/// Refuses a request whose `unknown` fields (those the request types do not declare) ask for
/// legacy function calls.
pub fn refuse_unhonoured(unknown: &BTreeMap<String, Value>) -> Result<(), ApiError> {
    let given = |name: &str| unknown.get(name).filter(|v| !v.is_null());
    let call = given("function_call").map(|c| {
        c.as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| c.to_string())
    });
    match (given("functions").is_some(), call) {
        (_, Some(c)) if c == "none" => Ok(()),
        (false, None) => Ok(()),
        (_, c) => Err(ApiError::invalid(
            "function_call",
            format!(
                "function_call {} is not supported: the legacy `functions` API is not served. \
                 Send the functions as `tools` (with `tool_choice`), or function_call \"none\".",
                c.unwrap_or_else(|| "\"auto\" (the default with functions)".into())
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

    #[test]
    fn legacy_function_calls_are_refused_by_name() {
        let r = |v: Value| refuse_unhonoured(&fields(v)).err().and_then(|e| e.param);
        assert_eq!(r(json!({})), None);
        assert_eq!(r(json!({"some_other_field": 1})), None);
        assert_eq!(
            r(json!({"functions": [{"name": "f"}], "function_call": "none"})),
            None
        );
        assert_eq!(
            r(json!({"functions": [{"name": "f"}]})).as_deref(),
            Some("function_call")
        );
        assert_eq!(
            r(json!({"functions": [{"name": "f"}], "function_call": {"name": "f"}})).as_deref(),
            Some("function_call")
        );
    }
}
