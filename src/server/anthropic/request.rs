//! Anthropic's Messages request, and its translation into a chat request: `system` first, then
//! the messages (`tool_use` blocks become an assistant message's `tool_calls`, `tool_result`
//! blocks `tool` messages), tools and `tool_choice` in their chat shapes, `stop_sequences` as
//! `stop`. The chat pipeline then checks and resolves it as any chat request; its errors are
//! renamed to this API's fields. What this server cannot honour is refused by name.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::server::error::ApiError;
use crate::server::protocol::{ChatRequest, set_sampling};

/// POST /v1/messages (and, without `max_tokens`, /v1/messages/count_tokens).
#[derive(Clone, Debug, Deserialize, JsonSchema)]
pub struct MessagesRequest {
    /// Served model name.
    pub model: String,
    /// The conversation: `user` and `assistant` turns, content as text or blocks (`text`,
    /// `tool_use`, `tool_result`, `thinking`).
    pub messages: Vec<InputMessage>,
    /// Output length limit (required on /v1/messages).
    #[schemars(range(min = 1))]
    pub max_tokens: Option<usize>,
    /// Instructions: text, or text blocks.
    pub system: Option<Value>,
    /// Strings that end the answer (`stop_reason: "stop_sequence"`).
    pub stop_sequences: Option<Vec<String>>,
    /// Temperature.
    #[schemars(range(min = 0.0, max = 2.0))]
    pub temperature: Option<f32>,
    /// Nucleus mass, in (0, 1].
    #[schemars(range(min = 0.001, max = 1.0))]
    pub top_p: Option<f32>,
    /// Top-k.
    #[schemars(range(min = 0))]
    pub top_k: Option<i32>,
    /// Tools: `{"name", "description", "input_schema"}`.
    pub tools: Option<Vec<Map<String, Value>>>,
    /// `{"type": "auto" | "any" | "tool" | "none", "name", "disable_parallel_tool_use"}`.
    pub tool_choice: Option<Map<String, Value>>,
    /// Stream Anthropic's server-sent events.
    pub stream: Option<bool>,
    /// Ignored (`user_id` for abuse tracking).
    pub metadata: Option<Map<String, Value>>,
    /// `{"type": "enabled" | "disabled", "budget_tokens"}`: reaches the chat template as
    /// `enable_thinking`; with `--reasoning-parser` the reasoning comes back as `thinking` blocks.
    pub thinking: Option<Map<String, Value>>,
    /// `{"format": {"type": "json_schema", "schema"}}` (structured outputs: the answer is JSON
    /// holding only the schema's properties) and `effort` (reaches the chat template as
    /// `reasoning_effort`).
    pub output_config: Option<Map<String, Value>>,
    /// Fields pagewise does not know (logged once, ignored).
    #[serde(flatten)]
    pub unknown: BTreeMap<String, Value>,
}

/// One turn.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
pub struct InputMessage {
    /// `user` or `assistant`.
    #[schemars(extend("enum" = ["user", "assistant"]))]
    pub role: String,
    /// Text, or content blocks.
    #[schemars(with = "ContentSchema")]
    pub content: Value,
}

/// What a turn's `content` looks like (the schema; the handler reads it as JSON).
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum ContentSchema {
    /// Text.
    Text(String),
    /// Blocks, each with a `type`.
    Blocks(Vec<Map<String, Value>>),
}

/// The request as a chat request.
pub fn to_chat(req: &MessagesRequest) -> Result<ChatRequest, ApiError> {
    if req.messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty."));
    }
    let mut messages = Vec::new();
    if let Some(system) = &req.system {
        let text =
            text_of(system).map_err(|e| ApiError::invalid("system", format!("system: {e}")))?;
        messages.push(json!({"role": "system", "content": text}));
    }
    for (i, m) in req.messages.iter().enumerate() {
        turn(i, m, &mut messages)?;
    }
    let mut body = json!({"model": req.model, "messages": messages});
    if let Some(tools) = &req.tools {
        body["tools"] = Value::Array(
            tools
                .iter()
                .enumerate()
                .map(|(i, t)| tool(i, t))
                .collect::<Result<_, _>>()?,
        );
    }
    if let Some(choice) = &req.tool_choice {
        let (choice, parallel) = tool_choice(choice)?;
        body["tool_choice"] = choice;
        if let Some(parallel) = parallel {
            body["parallel_tool_calls"] = json!(parallel);
        }
    }
    match req
        .thinking
        .as_ref()
        .and_then(|t| t.get("type"))
        .and_then(Value::as_str)
    {
        None => {}
        Some("enabled") => body["chat_template_kwargs"]["enable_thinking"] = json!(true),
        Some("disabled") => body["chat_template_kwargs"]["enable_thinking"] = json!(false),
        Some(other) => {
            return Err(ApiError::invalid(
                "thinking",
                format!("thinking type {other:?} is not one of \"enabled\", \"disabled\"."),
            ));
        }
    }
    if let Some(config) = &req.output_config {
        output_config(config, &mut body)?;
    }
    // Anthropic's range (the chat API's is 0 to 2).
    if let Some(t) = req.temperature.filter(|t| !(0.0..=1.0).contains(t)) {
        return Err(ApiError::invalid(
            "temperature",
            format!("temperature: must be between 0 and 1, got {t}."),
        ));
    }
    let sampling = [
        ("max_tokens", json!(req.max_tokens)),
        ("temperature", json!(req.temperature)),
        ("top_p", json!(req.top_p)),
        ("top_k", json!(req.top_k)),
        ("stop", json!(req.stop_sequences)),
    ];
    set_sampling(&mut body, &sampling, &req.unknown);
    serde_json::from_value(body).map_err(|e| ApiError::invalid("messages", e.to_string()))
}

/// Renames a chat error's field to the one this API's request has.
pub fn rename_param(mut e: ApiError) -> ApiError {
    let renamed = match e.param.as_deref() {
        Some("stop") => "stop_sequences",
        Some("max_completion_tokens") => "max_tokens",
        Some("response_format") => "output_config",
        _ => return e,
    };
    e.param = Some(renamed.to_string());
    e
}

/// One turn as chat messages.
fn turn(i: usize, m: &InputMessage, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let bad = |msg: String| ApiError::invalid("messages", format!("messages[{i}]: {msg}"));
    if m.role != "user" && m.role != "assistant" {
        return Err(bad(format!(
            "role {:?} is not \"user\" or \"assistant\".",
            m.role
        )));
    }
    let blocks = match &m.content {
        Value::String(text) => {
            out.push(json!({"role": m.role, "content": text}));
            return Ok(());
        }
        Value::Array(blocks) => blocks,
        _ => return Err(bad("content must be a string or a list of blocks.".into())),
    };
    let (mut text, mut calls, mut results) = (Vec::new(), Vec::new(), 0);
    for (j, block) in blocks.iter().enumerate() {
        let field = |name: &str| {
            block
                .get(name)
                .ok_or_else(|| bad(format!("content[{j}] needs `{name}`.")))
        };
        match block.get("type").and_then(Value::as_str).unwrap_or("") {
            "text" => text.push(
                field("text")?
                    .as_str()
                    .ok_or_else(|| bad(format!("content[{j}].text must be a string.")))?
                    .to_string(),
            ),
            "tool_use" if m.role == "assistant" => {
                let input = field("input")?;
                calls.push(json!({"id": field("id")?, "type": "function", "function": {
                    "name": field("name")?, "arguments": input.to_string()}}));
            }
            "tool_result" if m.role == "user" => {
                let content = match block.get("content") {
                    None => String::new(),
                    Some(c) => text_of(c).map_err(|e| bad(format!("content[{j}]: {e}")))?,
                };
                out.push(
                    json!({"role": "tool", "tool_call_id": field("tool_use_id")?,
                                "content": content}),
                );
                results += 1;
            }
            // Earlier reasoning: not shown to the model again, as chat templates drop it.
            "thinking" | "redacted_thinking" if m.role == "assistant" => {}
            other => {
                return Err(bad(format!(
                    "content[{j}]: blocks of type {other:?} are not supported in a {} turn: \
                     this server reads text, tool_use (assistant), tool_result (user) and \
                     thinking (assistant) blocks.",
                    m.role
                )));
            }
        }
    }
    // A user turn of tool results alone is those tool messages; any other turn is a message.
    if !text.is_empty() || results == 0 {
        let mut message = json!({"role": m.role, "content": text.join("\n")});
        if !calls.is_empty() {
            message["tool_calls"] = json!(calls);
        }
        out.push(message);
    }
    Ok(())
}

/// Text, or text blocks joined.
fn text_of(v: &Value) -> Result<String, String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => blocks
            .iter()
            .map(
                |b| match (b.get("type").and_then(Value::as_str), b.get("text")) {
                    (Some("text"), Some(Value::String(t))) => Ok(t.clone()),
                    (kind, _) => Err(format!(
                        "blocks of type {} are not supported here: send text blocks.",
                        kind.unwrap_or("(missing)")
                    )),
                },
            )
            .collect::<Result<Vec<_>, _>>()
            .map(|t| t.join("\n")),
        _ => Err("must be a string or a list of text blocks.".into()),
    }
}

fn tool(i: usize, t: &Map<String, Value>) -> Result<Value, ApiError> {
    let bad = |msg: String| ApiError::invalid("tools", format!("tools[{i}]: {msg}"));
    if let Some(kind) = t.get("type").and_then(Value::as_str)
        && kind != "custom"
    {
        return Err(bad(format!(
            "tools of type {kind:?} are not supported: only client tools (name, description, \
             input_schema) are served."
        )));
    }
    let mut function = json!({"name": t.get("name").cloned().unwrap_or(Value::Null)});
    if let Some(d) = t.get("description") {
        function["description"] = d.clone();
    }
    match t.get("input_schema") {
        Some(schema) => function["parameters"] = schema.clone(),
        None => return Err(bad("a tool needs an `input_schema`.".into())),
    }
    Ok(json!({"type": "function", "function": function}))
}

/// Anthropic's `tool_choice` as chat's, and `parallel_tool_calls` when it says.
fn tool_choice(choice: &Map<String, Value>) -> Result<(Value, Option<bool>), ApiError> {
    let parallel = choice
        .get("disable_parallel_tool_use")
        .and_then(Value::as_bool)
        .map(|off| !off);
    let chat = match choice.get("type").and_then(Value::as_str) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => match choice.get("name").and_then(Value::as_str) {
            Some(name) => json!({"type": "function", "function": {"name": name}}),
            None => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    "tool_choice of type \"tool\" needs a `name`.",
                ));
            }
        },
        other => {
            return Err(ApiError::invalid(
                "tool_choice",
                format!(
                    "tool_choice type {} is not one of \"auto\", \"any\", \"tool\", \"none\".",
                    other.map_or("(missing)".into(), |t| format!("{t:?}"))
                ),
            ));
        }
    };
    Ok((chat, parallel))
}

/// `output_config`: a JSON-schema format (strict, as Anthropic's structured outputs are) and an
/// effort.
fn output_config(config: &Map<String, Value>, body: &mut Value) -> Result<(), ApiError> {
    if let Some(effort) = config.get("effort").filter(|e| !e.is_null()) {
        body["chat_template_kwargs"]["reasoning_effort"] = effort.clone();
    }
    let Some(format) = config.get("format").filter(|f| !f.is_null()) else {
        return Ok(());
    };
    match (
        format.get("type").and_then(Value::as_str),
        format.get("schema"),
    ) {
        (Some("json_schema"), Some(schema)) => {
            body["response_format"] = json!({"type": "json_schema", "json_schema": {
                "name": "output", "schema": schema, "strict": true}});
            Ok(())
        }
        _ => Err(ApiError::invalid(
            "output_config",
            "output_config.format must be {\"type\": \"json_schema\", \"schema\": {...}}.",
        )),
    }
}
