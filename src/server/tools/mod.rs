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
//! model. A tool with `strict: true` holds its arguments to the properties its schema names even
//! where the server allows others (`crate::guided::schema`), and under `auto` constrains the
//! answer to the parser's format (`strict.rs`): text, or calls valid against the schemas.

pub mod parsers;
pub mod stream;
mod strict;

use serde_json::{Value, json};

use super::error::ApiError;
use crate::guided::{StructuredOutputs, schema};
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
            let strict = t.pointer("/function/strict") == Some(&Value::Bool(true));
            // A strict tool's arguments hold only the properties its schema names, whatever
            // the server's `--structured-outputs-allow-additional-properties`.
            let parameters = match strict {
                true => {
                    schema::check_strict(&parameters)
                        .map_err(|e| bad(format!("tools[{i}].function.parameters: {e}")))?;
                    schema::close_objects(&parameters)
                }
                false => parameters,
            };
            Ok(Function {
                name: name.to_string(),
                parameters,
                strict,
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
    /// The content and calls of a whole answer. A forced choice's answer is calls even when
    /// `max_tokens` cut it short (as vLLM returns them, with `finish_reason: "length"`): a named
    /// function's arguments as far as they got, and a `required` list's calls whose names are
    /// whole. Text that `auto`'s parser cannot read as calls comes back as content.
    pub fn extract(&self, text: &str) -> parsers::Parsed {
        let mut parsed = match &self.mode {
            ToolMode::Auto(parser) => parser.parse(text),
            ToolMode::Required => required_calls(text),
            ToolMode::Named(name) => parsers::Parsed {
                content: None,
                calls: vec![ParsedCall {
                    name: name.clone(),
                    arguments: text.trim().to_string(),
                }],
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

/// `required` output: `[{"name": ..., "parameters": {...}}, ...]`, whole or cut short.
fn required_calls(text: &str) -> parsers::Parsed {
    let calls: Option<Vec<ParsedCall>> = match serde_json::from_str::<Vec<Value>>(text) {
        Ok(list) => list.iter().map(whole_call).collect(),
        Err(e) if e.is_eof() => cut_calls(text),
        Err(_) => None,
    };
    match calls {
        Some(calls) if !calls.is_empty() => parsers::Parsed {
            content: None,
            calls,
        },
        _ => as_content(text),
    }
}

/// One item of a `required` list.
fn whole_call(item: &Value) -> Option<ParsedCall> {
    Some(ParsedCall {
        name: item.get("name")?.as_str()?.to_string(),
        arguments: item.get("parameters")?.to_string(),
    })
}

/// The calls of a `required` list that ends early: its whole items, then the open one if its
/// name is whole, with the text of its parameters so far. The constraint wrote the list, so its
/// items are `{"name": ..., "parameters": ...}` in that order.
fn cut_calls(text: &str) -> Option<Vec<ParsedCall>> {
    let body = text.trim_start().strip_prefix('[')?;
    let mut calls = Vec::new();
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    let mut start = None;
    for (i, c) in body.char_indices() {
        if in_string {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '{' | '[' => {
                if depth == 0 {
                    start = Some(i);
                }
                depth += 1;
            }
            '}' | ']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    let item = serde_json::from_str(&body[start.take()?..=i]).ok()?;
                    calls.push(whole_call(&item)?);
                }
            }
            _ => {}
        }
    }
    if let Some(start) = start {
        calls.extend(cut_call(&body[start..]));
    }
    Some(calls)
}

/// The open item of a cut `required` list: `{"name": "f", "parameters": ...` as far as it got.
fn cut_call(item: &str) -> Option<ParsedCall> {
    let after_key = |text: &str, key: &str| -> Option<usize> {
        let rest = text.trim_start().strip_prefix(key)?.trim_start();
        let rest = rest.strip_prefix(':')?.trim_start();
        Some(text.len() - rest.len())
    };
    let rest = item.strip_prefix('{')?;
    let rest = &rest[after_key(rest, "\"name\"")?..];
    let mut names = serde_json::Deserializer::from_str(rest).into_iter::<String>();
    let name = names.next()?.ok()?;
    let arguments = rest[names.byte_offset()..]
        .trim_start()
        .strip_prefix(',')
        .and_then(|rest| Some(rest[after_key(rest, "\"parameters\"")?..].trim_end()))
        .unwrap_or_default()
        .to_string();
    Some(ParsedCall { name, arguments })
}

#[cfg(test)]
mod tests;
