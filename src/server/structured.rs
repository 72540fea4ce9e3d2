//! A request's output constraint: read from OpenAI's `response_format`, vLLM's
//! `structured_outputs` object or its older `guided_*` fields, and compiled before the request
//! reaches the engine, off the async runtime and within the server's limits. A constraint that
//! does not compile is a 400 carrying the compiler's message.

use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use super::AppState;
use super::error::ApiError;
use crate::guided::{Guide, StructuredOutputs, schema};

/// Limits on what a request may ask to constrain its output to.
#[derive(Clone, Copy, Debug)]
pub struct StructuredLimits {
    /// Largest schema, regex, choice list or grammar accepted, in bytes.
    pub max_bytes: usize,
    /// Longest a constraint may take to compile.
    pub timeout: Duration,
}

impl Default for StructuredLimits {
    fn default() -> Self {
        StructuredLimits {
            max_bytes: 256 * 1024,
            timeout: Duration::from_secs(10),
        }
    }
}

/// The constraint fields of a request, as sent.
#[derive(Clone, Debug, Default, Deserialize, schemars::JsonSchema)]
pub struct ConstraintFields {
    /// OpenAI: `{"type": "text"}`, `{"type": "json_object"}`, or `{"type": "json_schema",
    /// "json_schema": {"name", "schema", "strict"}}`.
    pub response_format: Option<Value>,
    /// vLLM: an object with one of `json` (a schema), `regex`, `choice`, `grammar` (Lark, or
    /// GBNF) or `json_object: true`.
    pub structured_outputs: Option<Value>,
    /// vLLM's older name of `structured_outputs.json`.
    pub guided_json: Option<Value>,
    /// vLLM's older name of `structured_outputs.regex`.
    pub guided_regex: Option<String>,
    /// vLLM's older name of `structured_outputs.choice`.
    pub guided_choice: Option<Vec<String>>,
    /// vLLM's older name of `structured_outputs.grammar`.
    pub guided_grammar: Option<String>,
}

impl ConstraintFields {
    /// The one constraint these fields ask for (a 400 when they ask for two).
    pub fn resolve(&self) -> Result<Option<StructuredOutputs>, ApiError> {
        let mut found: Vec<(&'static str, StructuredOutputs)> = Vec::new();
        if let Some(format) = &self.response_format
            && let Some(c) = response_format(format)?
        {
            found.push(("response_format", c));
        }
        if let Some(so) = self.structured_outputs.as_ref().filter(|v| !v.is_null()) {
            found.push(("structured_outputs", structured_outputs(so)?));
        }
        if let Some(schema) = self.guided_json.as_ref().filter(|v| !v.is_null()) {
            found.push((
                "guided_json",
                StructuredOutputs::Json(schema_value("guided_json", schema)?),
            ));
        }
        if let Some(rx) = &self.guided_regex {
            found.push(("guided_regex", StructuredOutputs::Regex(rx.clone())));
        }
        if let Some(choices) = &self.guided_choice {
            found.push(("guided_choice", StructuredOutputs::Choice(choices.clone())));
        }
        if let Some(g) = &self.guided_grammar {
            found.push(("guided_grammar", StructuredOutputs::Grammar(g.clone())));
        }
        match found.len() {
            0 => Ok(None),
            1 => Ok(found.pop().map(|(_, c)| c)),
            _ => Err(ApiError::invalid(
                found[1].0,
                format!(
                    "only one output constraint per request: got {}.",
                    found
                        .iter()
                        .map(|(f, _)| *f)
                        .collect::<Vec<_>>()
                        .join(" and ")
                ),
            )),
        }
    }
}

/// OpenAI's `response_format`.
fn response_format(format: &Value) -> Result<Option<StructuredOutputs>, ApiError> {
    let bad = |msg: &str| ApiError::invalid("response_format", msg.to_string());
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(StructuredOutputs::JsonObject)),
        Some("json_schema") => {
            let spec = format
                .get("json_schema")
                .ok_or_else(|| bad("response_format json_schema needs a `json_schema` object."))?;
            // OpenAI nests the schema under `schema`; vLLM also takes `json_schema` itself.
            let schema = spec
                .get("schema")
                .ok_or_else(|| bad("response_format.json_schema needs a `schema`."))?;
            let schema = schema_value("response_format", schema)?;
            // OpenAI's contract: a strict schema's objects hold only the properties they name,
            // whatever the server's `--structured-outputs-allow-additional-properties`.
            let schema = match spec.get("strict") {
                Some(Value::Bool(true)) => {
                    schema::check_strict(&schema)
                        .map_err(|e| bad(&format!("response_format: {e}")))?;
                    schema::close_objects(&schema)
                }
                None | Some(Value::Bool(false)) | Some(Value::Null) => schema,
                Some(_) => {
                    return Err(bad("response_format.json_schema.strict must be a boolean."));
                }
            };
            Ok(Some(StructuredOutputs::Json(schema)))
        }
        Some(other) => Err(bad(&format!(
            "response_format type {other:?} is not supported: use \"text\", \"json_object\" or \
             \"json_schema\"."
        ))),
        None => Err(bad("response_format needs a `type`.")),
    }
}

/// vLLM's `structured_outputs` object: exactly one kind set.
fn structured_outputs(so: &Value) -> Result<StructuredOutputs, ApiError> {
    let field = "structured_outputs";
    let obj = so
        .as_object()
        .ok_or_else(|| ApiError::invalid(field, "structured_outputs must be an object."))?;
    // vLLM's option: objects hold only their named properties (the default here already,
    // unless the server allows others; then this request asks to close them).
    let close = match obj.get("disable_additional_properties") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::Bool(true)) => true,
        Some(_) => {
            return Err(ApiError::invalid(
                field,
                "structured_outputs.disable_additional_properties must be a boolean.",
            ));
        }
    };
    let mut kinds = Vec::new();
    for (key, value) in obj {
        if value.is_null() || value == &Value::Bool(false) {
            continue;
        }
        let text = || {
            value.as_str().map(str::to_owned).ok_or_else(|| {
                ApiError::invalid(field, format!("structured_outputs.{key} must be a string."))
            })
        };
        kinds.push(match key.as_str() {
            "json" if close => {
                StructuredOutputs::Json(schema::close_objects(&schema_value(field, value)?))
            }
            "json" => StructuredOutputs::Json(schema_value(field, value)?),
            "json_object" => StructuredOutputs::JsonObject,
            "regex" => StructuredOutputs::Regex(text()?),
            "grammar" => StructuredOutputs::Grammar(text()?),
            "choice" => {
                StructuredOutputs::Choice(serde_json::from_value(value.clone()).map_err(|_| {
                    ApiError::invalid(
                        field,
                        "structured_outputs.choice must be a list of strings.",
                    )
                })?)
            }
            // vLLM's options that change nothing here, and the one read above.
            "disable_any_whitespace"
            | "disable_fallback"
            | "disable_additional_properties"
            | "whitespace_pattern" => continue,
            other => {
                return Err(ApiError::invalid(
                    field,
                    format!(
                        "structured_outputs.{other} is not supported: set one of json, regex, \
                         choice, grammar or json_object."
                    ),
                ));
            }
        });
    }
    match kinds.len() {
        1 => Ok(kinds.pop().expect("one")),
        0 => Err(ApiError::invalid(
            field,
            "structured_outputs must set one of json, regex, choice, grammar or json_object.",
        )),
        _ => Err(ApiError::invalid(
            field,
            "structured_outputs must set only one of json, regex, choice, grammar or json_object.",
        )),
    }
}

/// A JSON schema given as an object, or as a string holding one.
fn schema_value(field: &'static str, v: &Value) -> Result<Value, ApiError> {
    match v {
        Value::String(s) => serde_json::from_str(s).map_err(|e| {
            ApiError::invalid(field, format!("{field}: the schema is not valid JSON: {e}"))
        }),
        Value::Object(_) | Value::Bool(_) => Ok(v.clone()),
        _ => Err(ApiError::invalid(
            field,
            format!("{field}: a JSON schema must be an object."),
        )),
    }
}

/// Compiles `constraint` for this server's model, within its size and time limits.
pub async fn compile(state: &AppState, constraint: &StructuredOutputs) -> Result<Guide, ApiError> {
    let field = "structured_outputs";
    let limits = state.structured_limits;
    let size = constraint.source_len();
    if size > limits.max_bytes {
        return Err(ApiError::invalid(
            field,
            format!(
                "the {} constraint is {size} bytes; this server accepts at most {} \
                 (--structured-outputs-max-bytes).",
                constraint.kind(),
                limits.max_bytes
            ),
        ));
    }
    let grammars = state.info.grammars.clone();
    let constraint = constraint.clone();
    let work = tokio::task::spawn_blocking(move || grammars.compile(&constraint));
    match tokio::time::timeout(limits.timeout, work).await {
        Ok(Ok(Ok(guide))) => Ok(guide),
        Ok(Ok(Err(message))) => Err(ApiError::invalid(
            field,
            format!("the output constraint does not compile: {message}"),
        )),
        Ok(Err(join)) => Err(ApiError::invalid(
            field,
            format!("the output constraint does not compile: {join}"),
        )),
        Err(_) => Err(ApiError::invalid(
            field,
            format!(
                "the output constraint took longer than {:.1} s to compile \
                 (--structured-outputs-timeout).",
                limits.timeout.as_secs_f64()
            ),
        )),
    }
}
