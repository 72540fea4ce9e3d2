//! Request fields that ask for something this server does not do: OpenAI's legacy `functions`
//! with a `function_call` other than "none" (the newer `tools` are honoured: `super::tools`),
//! a completion's `suffix` (insertion), audio output (`modalities` past "text", `audio`) and
//! web search (`web_search_options`). A request that sends one is refused with a 400 naming the
//! field, never answered as if it had been honoured.
//!
//! Other unknown fields (`user`, `metadata`, `store`, `prediction`, ...: labels and hints that do
//! not change the answer) are accepted and logged once (`AppState::note_unknown_fields`).

use std::collections::BTreeMap;

use serde_json::Value;

use super::error::ApiError;

/// Refuses a request whose `unknown` fields (those the request types do not declare) ask for
/// legacy function calls, insertion, audio output or web search.
pub fn refuse_unhonoured(unknown: &BTreeMap<String, Value>) -> Result<(), ApiError> {
    let given = |name: &str| unknown.get(name).filter(|v| !v.is_null());
    if given("suffix").is_some_and(|s| s.as_str() != Some("")) {
        return Err(ApiError::invalid(
            "suffix",
            "suffix is not supported: insertion (text after the completion) is not served. \
             Leave suffix out, or put all the text in the prompt.",
        ));
    }
    if let Some(m) = given("modalities")
        && !m
            .as_array()
            .is_some_and(|m| m.iter().all(|x| x.as_str() == Some("text")))
    {
        return Err(ApiError::invalid(
            "modalities",
            format!(
                "modalities {m} is not supported: this server answers in text only (\"text\")."
            ),
        ));
    }
    for (field, what) in [
        ("audio", "audio output is not served: answers are text"),
        ("web_search_options", "web search is not served"),
    ] {
        if given(field).is_some() {
            return Err(ApiError::invalid(
                field,
                format!("{field} is not supported: {what}. Leave {field} out."),
            ));
        }
    }
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

    #[test]
    fn insertion_audio_and_web_search_are_refused_by_name() {
        let r = |v: Value| refuse_unhonoured(&fields(v)).err().and_then(|e| e.param);
        assert_eq!(r(json!({"suffix": "x"})).as_deref(), Some("suffix"));
        assert_eq!(r(json!({"suffix": ""})), None);
        assert_eq!(r(json!({"suffix": null})), None);
        assert_eq!(
            r(json!({"modalities": ["text", "audio"]})).as_deref(),
            Some("modalities")
        );
        assert_eq!(r(json!({"modalities": ["text"]})), None);
        assert_eq!(
            r(json!({"audio": {"voice": "alloy"}})).as_deref(),
            Some("audio")
        );
        assert_eq!(
            r(json!({"web_search_options": {}})).as_deref(),
            Some("web_search_options")
        );
        // Labels and hints that leave the answer as it is pass.
        assert_eq!(
            r(json!({"user": "u", "store": false, "prediction": {"type": "content"}})),
            None
        );
    }
}
