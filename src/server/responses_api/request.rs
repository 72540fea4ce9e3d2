//! The Responses API's request, and its translation into a chat request: `instructions` and the
//! stored conversation of `previous_response_id` go first, then the input items as chat messages
//! (`function_call` items become an assistant message's `tool_calls`, `function_call_output`
//! items `tool` messages); function tools, `tool_choice` and `text.format` take their chat
//! shapes. Everything the chat pipeline checks (context length, tools, schemas) it checks here
//! too, and its errors are renamed to this API's fields. What this server cannot honour is
//! refused by name.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::server::error::ApiError;
use crate::server::protocol::{ChatRequest, set_sampling};

/// POST /v1/responses.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
pub struct ResponsesRequest {
    /// Served model name.
    pub model: Option<String>,
    /// A user message as text, or a list of items: messages (`role` and `content` as text or
    /// `input_text` / `output_text` parts), `function_call`, `function_call_output` and
    /// `reasoning` items.
    pub input: ResponseInput,
    /// A system message put before the conversation (not carried on to later responses).
    pub instructions: Option<String>,
    /// Output length limit.
    #[schemars(range(min = 1))]
    pub max_output_tokens: Option<usize>,
    /// Temperature.
    #[schemars(range(min = 0.0, max = 2.0))]
    pub temperature: Option<f32>,
    /// Nucleus mass, in (0, 1].
    #[schemars(range(min = 0.001, max = 1.0))]
    pub top_p: Option<f32>,
    /// Function tools: `{"type": "function", "name", "description", "parameters", "strict"}`
    /// (`strict` defaults to true, as OpenAI's).
    pub tools: Option<Vec<Map<String, Value>>>,
    /// `none`, `auto`, `required`, or `{"type": "function", "name": ...}`.
    pub tool_choice: Option<Value>,
    /// Whether an answer may call several tools (default true).
    pub parallel_tool_calls: Option<bool>,
    /// `{"format": {"type": "text" | "json_object" | "json_schema", ...}}`.
    pub text: Option<TextConfig>,
    /// Reasoning settings: `effort` reaches the chat template as `reasoning_effort`.
    pub reasoning: Option<Map<String, Value>>,
    /// Stream typed server-sent events.
    pub stream: Option<bool>,
    /// Keep the response for `previous_response_id` and GET (default true).
    pub store: Option<bool>,
    /// Continue the conversation of a stored response.
    pub previous_response_id: Option<String>,
    /// Must be false or absent: responses are not run in the background.
    pub background: Option<bool>,
    /// Returned as given.
    pub metadata: Option<Map<String, Value>>,
    /// End-user id (returned as given).
    pub user: Option<String>,
    /// `disabled` (the default): a conversation too long for the context is a 400.
    pub truncation: Option<String>,
    /// Extra output to include: none is supported.
    pub include: Option<Vec<String>>,
    /// Fields pagewise does not know (logged once, ignored).
    #[serde(flatten)]
    pub unknown: BTreeMap<String, Value>,
}

/// `input`: text, or items.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum ResponseInput {
    /// One user message.
    Text(String),
    /// Messages and items.
    Items(Vec<Map<String, Value>>),
}

/// `text`.
#[derive(Clone, Debug, Default, Deserialize, JsonSchema)]
pub struct TextConfig {
    /// `{"type": "text"}`, `{"type": "json_object"}` or `{"type": "json_schema", "name",
    /// "schema", "strict"}`.
    pub format: Option<Map<String, Value>>,
    /// Only `medium` (the default) is served.
    pub verbosity: Option<String>,
}

/// Request fields that ask for what this server does not do (absent or null is fine).
const REFUSED: &[(&str, &str)] = &[
    (
        "conversation",
        "the Conversations API is not served: use previous_response_id",
    ),
    (
        "prompt",
        "stored prompt templates are not served: send `input`",
    ),
    (
        "max_tool_calls",
        "a limit on built-in tool calls does not apply: no built-in tools",
    ),
];

/// The request as a chat request over `previous` (the stored conversation it continues), and the
/// messages its input adds to that conversation.
pub fn to_chat(
    req: &ResponsesRequest,
    previous: &[Value],
) -> Result<(ChatRequest, Vec<Value>), ApiError> {
    refuse_unhonoured(req)?;
    let added = match &req.input {
        ResponseInput::Text(text) => vec![json!({"role": "user", "content": text})],
        ResponseInput::Items(items) => messages(items)?,
    };
    let mut all = Vec::new();
    if let Some(instructions) = &req.instructions {
        all.push(json!({"role": "system", "content": instructions}));
    }
    all.extend(previous.iter().cloned());
    all.extend(added.iter().cloned());
    let mut body = json!({"model": req.model, "messages": all});
    if let Some(tools) = &req.tools {
        body["tools"] = Value::Array(
            tools
                .iter()
                .enumerate()
                .map(|(i, t)| function_tool(i, t))
                .collect::<Result<_, _>>()?,
        );
    }
    if let Some(choice) = &req.tool_choice {
        body["tool_choice"] = tool_choice(choice)?;
    }
    if let Some(format) = req.text.as_ref().and_then(|t| t.format.as_ref()) {
        body["response_format"] = response_format(format)?;
    }
    if let Some(effort) = req.reasoning.as_ref().and_then(|r| r.get("effort")) {
        body["chat_template_kwargs"] = json!({"reasoning_effort": effort});
    }
    let sampling = [
        ("max_completion_tokens", json!(req.max_output_tokens)),
        ("temperature", json!(req.temperature)),
        ("top_p", json!(req.top_p)),
        ("parallel_tool_calls", json!(req.parallel_tool_calls)),
        ("user", json!(req.user)),
    ];
    set_sampling(&mut body, &sampling, &req.unknown);
    let chat =
        serde_json::from_value(body).map_err(|e| ApiError::invalid("input", e.to_string()))?;
    Ok((chat, added))
}

/// Renames a chat error's field to the one this API's request has.
pub fn rename_param(mut e: ApiError) -> ApiError {
    let renamed = match e.param.as_deref() {
        Some("messages") => "input",
        Some("response_format") | Some("structured_outputs") => "text.format",
        Some("max_tokens") | Some("max_completion_tokens") => "max_output_tokens",
        _ => return e,
    };
    e.param = Some(renamed.to_string());
    e
}

fn refuse_unhonoured(req: &ResponsesRequest) -> Result<(), ApiError> {
    if req.background == Some(true) {
        return Err(ApiError::invalid(
            "background",
            "background responses are not supported: send background false (or leave it out) \
             and stream, or wait for the answer.",
        ));
    }
    if let Some(t) = req.truncation.as_deref().filter(|t| *t != "disabled") {
        return Err(ApiError::invalid(
            "truncation",
            format!("truncation {t:?} is not supported: only \"disabled\" (the default)."),
        ));
    }
    if let Some(first) = req.include.iter().flatten().next() {
        return Err(ApiError::invalid(
            "include",
            format!("include {first:?} is not supported: no extra output can be included."),
        ));
    }
    if let Some(v) = req.text.as_ref().and_then(|t| t.verbosity.as_deref())
        && v != "medium"
    {
        return Err(ApiError::invalid(
            "text.verbosity",
            format!("text.verbosity {v:?} is not supported: only \"medium\" (the default)."),
        ));
    }
    if let Some(k) = req.unknown.get("top_logprobs").and_then(Value::as_u64)
        && k > 0
    {
        return Err(ApiError::invalid(
            "top_logprobs",
            "top_logprobs is not supported on /v1/responses: use /v1/chat/completions.",
        ));
    }
    for (field, why) in REFUSED {
        if req.unknown.get(*field).is_some_and(|v| !v.is_null()) {
            return Err(ApiError::invalid(field, format!("{field}: {why}.")));
        }
    }
    Ok(())
}

/// Input items as chat messages.
fn messages(items: &[Map<String, Value>]) -> Result<Vec<Value>, ApiError> {
    let mut out: Vec<Value> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let bad = |msg: String| ApiError::invalid("input", format!("input[{i}]: {msg}"));
        let kind = item.get("type").and_then(Value::as_str);
        match kind {
            None | Some("message") => {
                let role = item
                    .get("role")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("a message needs a `role`.".into()))?;
                if !["user", "assistant", "system", "developer"].contains(&role) {
                    return Err(bad(format!(
                        "role {role:?} is not one of user, assistant, system, developer."
                    )));
                }
                let content = text_of(item.get("content")).map_err(bad)?;
                out.push(json!({"role": role, "content": content}));
            }
            Some("function_call") => {
                let field = |name: &str| {
                    item.get(name)
                        .and_then(Value::as_str)
                        .ok_or_else(|| bad(format!("a function_call needs a string `{name}`.")))
                };
                let call = json!({"id": field("call_id")?, "type": "function",
                    "function": {"name": field("name")?, "arguments": field("arguments")?}});
                // Calls in a row are one assistant turn.
                match out.last_mut() {
                    Some(last) if last["role"] == "assistant" && last["tool_calls"].is_array() => {
                        last["tool_calls"]
                            .as_array_mut()
                            .expect("an array")
                            .push(call)
                    }
                    _ => out.push(json!({"role": "assistant", "content": null,
                                         "tool_calls": [call]})),
                }
            }
            Some("function_call_output") => {
                let call_id = item.get("call_id").and_then(Value::as_str).ok_or_else(|| {
                    bad("a function_call_output needs a string `call_id`.".into())
                })?;
                let output = text_of(item.get("output")).map_err(bad)?;
                out.push(json!({"role": "tool", "tool_call_id": call_id, "content": output}));
            }
            // The model's earlier reasoning: not shown to it again, as chat templates drop it.
            Some("reasoning") => {}
            Some(other) => {
                return Err(bad(format!(
                    "items of type {other:?} are not supported: send messages, function_call, \
                     function_call_output or reasoning items."
                )));
            }
        }
    }
    Ok(out)
}

/// A message's content (or a call's output) as text: a string, or text parts joined.
fn text_of(content: Option<&Value>) -> Result<String, String> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = Vec::new();
            for (j, part) in parts.iter().enumerate() {
                let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
                match (kind, part.get("text").and_then(Value::as_str)) {
                    ("input_text" | "output_text" | "text", Some(t)) => text.push(t),
                    ("refusal", _) => text.push(part["refusal"].as_str().unwrap_or("")),
                    ("input_text" | "output_text" | "text", None) => {
                        return Err(format!("content[{j}] needs a string `text`."));
                    }
                    _ => {
                        return Err(format!(
                            "content[{j}]: parts of type {kind:?} are not supported: this \
                             server reads text (input_text, output_text)."
                        ));
                    }
                }
            }
            Ok(text.join("\n"))
        }
        Some(_) => Err("content must be a string or a list of parts.".into()),
    }
}

/// A Responses function tool in the chat shape.
fn function_tool(i: usize, tool: &Map<String, Value>) -> Result<Value, ApiError> {
    let bad = |msg: String| ApiError::invalid("tools", format!("tools[{i}]: {msg}"));
    match tool.get("type").and_then(Value::as_str) {
        Some("function") => {}
        Some(other) => {
            return Err(bad(format!(
                "tools of type {other:?} are not supported: only function tools are served."
            )));
        }
        None => return Err(bad("a tool needs a `type`.".into())),
    }
    let mut function = json!({
        "name": tool.get("name").cloned().unwrap_or(Value::Null),
        "strict": tool.get("strict").and_then(Value::as_bool).unwrap_or(true),
    });
    for key in ["description", "parameters"] {
        if let Some(v) = tool.get(key).filter(|v| !v.is_null()) {
            function[key] = v.clone();
        }
    }
    Ok(json!({"type": "function", "function": function}))
}

fn tool_choice(choice: &Value) -> Result<Value, ApiError> {
    match choice {
        Value::String(_) => Ok(choice.clone()),
        Value::Object(o) if o.get("type") == Some(&json!("function")) => {
            let name = o.get("name").and_then(Value::as_str).ok_or_else(|| {
                ApiError::invalid("tool_choice", "tool_choice function needs a `name`.")
            })?;
            Ok(json!({"type": "function", "function": {"name": name}}))
        }
        _ => Err(ApiError::invalid(
            "tool_choice",
            "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \
             \"name\": ...}.",
        )),
    }
}

/// `text.format` as chat's `response_format`.
fn response_format(format: &Map<String, Value>) -> Result<Value, ApiError> {
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(json!({"type": "text"})),
        Some("json_object") => Ok(json!({"type": "json_object"})),
        Some("json_schema") => {
            let mut spec = json!({"name": format.get("name").cloned().unwrap_or(json!("output"))});
            for key in ["schema", "strict", "description"] {
                if let Some(v) = format.get(key) {
                    spec[key] = v.clone();
                }
            }
            Ok(json!({"type": "json_schema", "json_schema": spec}))
        }
        other => Err(ApiError::invalid(
            "text.format",
            format!(
                "text.format type {} is not supported: use \"text\", \"json_object\" or \
                 \"json_schema\".",
                other.map_or("(missing)".to_string(), |t| format!("{t:?}"))
            ),
        )),
    }
}
