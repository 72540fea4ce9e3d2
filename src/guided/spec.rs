//! What a request constrains its output to (vLLM's `structured_outputs`), as plain data, and its
//! translation into an llguidance grammar.

use llguidance::api::TopLevelGrammar;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One constraint on a request's output. Serialized as vLLM's `structured_outputs` object with
/// one field set: `{"json": schema}`, `{"regex": ...}`, `{"choice": [...]}`, `{"grammar": ...}`,
/// or `"json_object"`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StructuredOutputs {
    /// JSON valid against this JSON schema.
    Json(Value),
    /// Any JSON object (OpenAI's `json_object` response format).
    JsonObject,
    /// Text matching this regular expression (whole output).
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// Text in this Lark grammar (llguidance's dialect). A GBNF grammar (rules written with
    /// `::=`, as llama.cpp takes) is translated to Lark first.
    Grammar(String),
}

impl StructuredOutputs {
    /// The kind, as the API names it (for errors and logs).
    pub fn kind(&self) -> &'static str {
        match self {
            StructuredOutputs::Json(_) => "json",
            StructuredOutputs::JsonObject => "json_object",
            StructuredOutputs::Regex(_) => "regex",
            StructuredOutputs::Choice(_) => "choice",
            StructuredOutputs::Grammar(_) => "grammar",
        }
    }

    /// Size of the constraint's source, in bytes (what `--structured-outputs-max-bytes` limits).
    pub fn source_len(&self) -> usize {
        match self {
            StructuredOutputs::Json(schema) => schema.to_string().len(),
            StructuredOutputs::JsonObject => 0,
            StructuredOutputs::Regex(r) | StructuredOutputs::Grammar(r) => r.len(),
            StructuredOutputs::Choice(c) => c.iter().map(|s| s.len() + 1).sum(),
        }
    }

    /// The llguidance grammar. JSON is written compactly as Python's `json.dumps` writes it
    /// (`", "` and `": "`, no other whitespace) unless the schema sets its own `x-guidance`
    /// options: free whitespace lets a small model pad forever instead of closing the object.
    /// With `close_objects`, its objects hold only the properties they name unless they say
    /// otherwise ([`super::schema::close_objects`]).
    pub fn to_grammar(&self, close_objects: bool) -> Result<TopLevelGrammar, String> {
        Ok(match self {
            StructuredOutputs::Json(schema) if close_objects => {
                TopLevelGrammar::from_json_schema(compact(&super::schema::close_objects(schema)))
            }
            StructuredOutputs::Json(schema) => TopLevelGrammar::from_json_schema(compact(schema)),
            StructuredOutputs::JsonObject => {
                TopLevelGrammar::from_json_schema(compact(&serde_json::json!({"type": "object"})))
            }
            StructuredOutputs::Regex(rx) => TopLevelGrammar::from_regex(rx),
            StructuredOutputs::Choice(choices) => {
                if choices.is_empty() {
                    return Err("choice must list at least one string".into());
                }
                let alternatives: Vec<String> = choices.iter().map(|c| escape_regex(c)).collect();
                TopLevelGrammar::from_regex(&format!("({})", alternatives.join("|")))
            }
            StructuredOutputs::Grammar(g) => {
                if g.contains("::=") {
                    TopLevelGrammar::from_lark(super::gbnf::to_lark(g)?)
                } else {
                    TopLevelGrammar::from_lark(g.clone())
                }
            }
        })
    }
}

/// The schema with compact separators, unless it chose its own `x-guidance` options.
fn compact(schema: &Value) -> Value {
    let mut schema = schema.clone();
    if let Value::Object(map) = &mut schema
        && !map.contains_key("x-guidance")
    {
        map.insert(
            "x-guidance".into(),
            serde_json::json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": ",
            }),
        );
    }
    schema
}

/// `text` as a regex matching exactly it: every character that is not a letter, a digit, `_` or
/// a space escaped (as `\x{..}` for control characters).
fn escape_regex(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    for c in text.chars() {
        if c.is_alphanumeric() || c == '_' || c == ' ' {
            out.push(c);
        } else if c.is_ascii_punctuation() {
            out.push('\\');
            out.push(c);
        } else {
            out.push_str(&format!("\\x{{{:x}}}", c as u32));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serializes_as_vllm_structured_outputs() {
        let json: StructuredOutputs = serde_json::from_str(r#"{"choice": ["a", "b"]}"#).unwrap();
        assert_eq!(
            json,
            StructuredOutputs::Choice(vec!["a".into(), "b".into()])
        );
        let obj: StructuredOutputs = serde_json::from_str(r#""json_object""#).unwrap();
        assert_eq!(obj, StructuredOutputs::JsonObject);
    }

    #[test]
    fn escapes_regex_metacharacters() {
        assert_eq!(escape_regex("a.b*(c)"), r"a\.b\*\(c\)");
        assert_eq!(escape_regex("x\ny"), r"x\x{a}y");
        assert_eq!(escape_regex("héllo wörld"), "héllo wörld");
    }

    #[test]
    fn json_gets_compact_separators_unless_it_chose() {
        let s = compact(&serde_json::json!({"type": "object"}));
        assert_eq!(s["x-guidance"]["key_separator"], ": ");
        let own =
            serde_json::json!({"type": "object", "x-guidance": {"whitespace_flexible": true}});
        assert_eq!(compact(&own), own);
    }
}
