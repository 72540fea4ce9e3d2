//! OpenAI tool calling for /v1/chat/completions: `tools`, `tool_choice` (`none`, `auto`,
//! `required`, or a named function) and `parallel_tool_calls`.
//!
//! - `none`: the tools reach the chat template; the answer is text.
//! - `auto`: the model decides; the server's `--tool-call-parser` finds calls in its text
//!   (needs `--enable-auto-tool-choice`, as in vLLM).
//! - `required`: the output is constrained (`crate::guided`) to a JSON list of
//!   `{"name", "parameters"}` objects, each valid against its tool's schema; the list becomes the
//!   calls.
//! - a named function: the output is constrained to that function's parameter schema and
//!   becomes its arguments.
//!
//! So `required` and named choices always give arguments valid against the schema, whatever the
//! model; `strict` asks nothing more of them. Under `auto`, a tool with `strict: true` constrains
//! the answer to the parser's format (`strict.rs`): text, or calls valid against the schemas.

pub mod parsers;
pub mod stream;
mod strict;

use serde_json::{Value, json};

use super::error::ApiError;
use crate::guided::StructuredOutputs;
pub use parsers::{ParsedCall, ToolParser};

/// The server's tool-calling settings.
#[derive(Clone, Copy, Debug, Default)]
pub struct ToolOptions {
    /// `--enable-auto-tool-choice`: honour `tool_choice: "auto"`.
    pub auto_tool_choice: bool,
    /// `--tool-call-parser`: the format calls take in the model's text.
    pub parser: Option<ToolParser>,
}

/// How a request's calls come out of its output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolMode {
    /// The model decides; calls are parsed from its text.
    Auto(ToolParser),
    /// Forced: a JSON list of calls.
    Required,
    /// Forced: this function's arguments.
    Named(String),
}

/// A request's tool calling, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCalling {
    /// How the calls come out.
    pub mode: ToolMode,
    /// Whether an answer may hold several calls (`parallel_tool_calls`, default true).
    pub parallel: bool,
}

/// One declared function.
struct Function {
    name: String,
    parameters: Value,
    /// `strict: true`: its arguments must follow `parameters`, under `auto` too.
    strict: bool,
}

/// Resolves `tools`, `tool_choice` and `parallel_tool_calls`: how calls come out (nothing to do
/// for no tools or `none`), and for forced choices the constraint on the output.
pub fn resolve(
    tools: Option<&Value>,
    choice: Option<&Value>,
    parallel: Option<bool>,
    opts: &ToolOptions,
) -> Result<Option<(ToolCalling, Option<StructuredOutputs>)>, ApiError> {
    let functions = match tools.filter(|t| !t.is_null()) {
        Some(t) => functions(t)?,
        None => Vec::new(),
    };
    let choice = choice.filter(|c| !c.is_null());
    if choice.is_some() && functions.is_empty() && choice != Some(&json!("none")) {
        return Err(ApiError::invalid(
            "tool_choice",
            "When using `tool_choice`, `tools` must be set.",
        ));
    }
    let parallel = parallel.unwrap_or(true);
    let calling = |mode| ToolCalling { mode, parallel };
    let choice = match choice {
        None if functions.is_empty() => return Ok(None),
        None => "auto".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(named) => {
            let name = named
                .pointer("/function/name")
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    ApiError::invalid(
                        "tool_choice",
                        "tool_choice must be \"none\", \"auto\", \"required\" or \
                         {\"type\": \"function\", \"function\": {\"name\": ...}}.",
                    )
                })?;
            let f = functions.iter().find(|f| f.name == name).ok_or_else(|| {
                ApiError::invalid(
                    "tool_choice",
                    format!("tool_choice names the function {name:?}, which is not in `tools`."),
                )
            })?;
            let constraint = StructuredOutputs::Json(f.parameters.clone());
            return Ok(Some((
                calling(ToolMode::Named(name.into())),
                Some(constraint),
            )));
        }
    };
    match choice.as_str() {
        "none" => Ok(None),
        "required" => Ok(Some((
            calling(ToolMode::Required),
            Some(required_schema(&functions, parallel)),
        ))),
        "auto" => match (opts.auto_tool_choice, opts.parser) {
            (true, Some(parser)) => {
                // With a strict tool, the calls the model starts are held to the schemas.
                let constraint = match functions.iter().any(|f| f.strict) {
                    true => strict::grammar(parser, &functions, parallel)
                        .map(StructuredOutputs::Grammar),
                    false => None,
                };
                Ok(Some((calling(ToolMode::Auto(parser)), constraint)))
            }
            _ => Err(ApiError::invalid(
                "tool_choice",
                "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser \
                 to be set (tool_choice defaults to \"auto\" when tools are given). Send \
                 tool_choice \"required\", a named function, or \"none\".",
            )),
        },
        other => Err(ApiError::invalid(
            "tool_choice",
            format!(
                "tool_choice {other:?} is not one of \"none\", \"auto\", \"required\" or a \
                 named function."
            ),
        )),
    }
}

/// The declared functions, checked.
fn functions(tools: &Value) -> Result<Vec<Function>, ApiError> {
    let bad = |msg: String| ApiError::invalid("tools", msg);
    let list = tools
        .as_array()
        .ok_or_else(|| bad("tools must be a list.".into()))?;
    list.iter()
        .enumerate()
        .map(|(i, t)| {
            if t.get("type").and_then(Value::as_str) != Some("function") {
                return Err(bad(format!("tools[{i}].type must be \"function\".")));
            }
            let name = t
                .pointer("/function/name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| bad(format!("tools[{i}].function.name is missing.")))?;
            let parameters = match t.pointer("/function/parameters") {
                None | Some(Value::Null) => json!({"type": "object"}),
                Some(p @ Value::Object(_)) => p.clone(),
                Some(_) => {
                    return Err(bad(format!(
                        "tools[{i}].function.parameters must be a JSON schema object."
                    )));
                }
            };
            Ok(Function {
                name: name.to_string(),
                parameters,
                strict: t.pointer("/function/strict") == Some(&Value::Bool(true)),
            })
        })
        .collect()
}

/// The schema of `required` output: a list of calls, each a declared function's name with
/// parameters valid against its schema (one call when parallel calls are off).
fn required_schema(functions: &[Function], parallel: bool) -> StructuredOutputs {
    let calls: Vec<Value> = functions
        .iter()
        .map(|f| {
            json!({
                "type": "object",
                "properties": {"name": {"const": f.name}, "parameters": f.parameters},
                "required": ["name", "parameters"],
                "additionalProperties": false
            })
        })
        .collect();
    let mut schema = json!({"type": "array", "minItems": 1, "items": {"anyOf": calls}});
    if !parallel {
        schema["maxItems"] = json!(1);
    }
    StructuredOutputs::Json(schema)
}

impl ToolCalling {
    /// The content and calls of a whole answer. A text the mode cannot read as calls (an answer
    /// cut short by `max_tokens`, say) comes back as content.
    pub fn extract(&self, text: &str) -> parsers::Parsed {
        let mut parsed = match &self.mode {
            ToolMode::Auto(parser) => parser.parse(text),
            ToolMode::Required => required_calls(text),
            ToolMode::Named(name) => match serde_json::from_str::<Value>(text) {
                Ok(Value::Object(_)) => parsers::Parsed {
                    content: None,
                    calls: vec![ParsedCall {
                        name: name.clone(),
                        arguments: text.trim().to_string(),
                    }],
                },
                _ => as_content(text),
            },
        };
        if !self.parallel {
            parsed.calls.truncate(1);
        }
        parsed
    }

    /// Whether calls come from harmony messages (`openai`), which the reasoning split keeps in
    /// the content for the parser (`super::harmony`).
    pub fn reads_harmony(&self) -> bool {
        self.mode == ToolMode::Auto(ToolParser::Openai)
    }

    /// The finish reason of an answer with calls: `tool_calls`, except for a named function,
    /// which OpenAI ends with `stop`.
    pub fn finish_reason(
        &self,
        has_calls: bool,
        reason: Option<&'static str>,
    ) -> Option<&'static str> {
        match (&self.mode, has_calls, reason) {
            (ToolMode::Named(_), _, r) | (_, false, r) => r,
            (_, true, Some("stop")) => Some("tool_calls"),
            (_, true, r) => r,
        }
    }
}

fn as_content(text: &str) -> parsers::Parsed {
    parsers::Parsed {
        content: Some(text.to_string()).filter(|t| !t.is_empty()),
        calls: Vec::new(),
    }
}

/// `required` output: `[{"name": ..., "parameters": {...}}, ...]`.
fn required_calls(text: &str) -> parsers::Parsed {
    let calls: Option<Vec<ParsedCall>> =
        serde_json::from_str::<Vec<Value>>(text)
            .ok()
            .and_then(|list| {
                list.iter()
                    .map(|c| {
                        Some(ParsedCall {
                            name: c.get("name")?.as_str()?.to_string(),
                            arguments: c.get("parameters")?.to_string(),
                        })
                    })
                    .collect()
            });
    match calls {
        Some(calls) if !calls.is_empty() => parsers::Parsed {
            content: None,
            calls,
        },
        _ => as_content(text),
    }
}

#[cfg(test)]
mod tests;
