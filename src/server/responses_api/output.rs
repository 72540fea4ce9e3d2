//! The Responses API's response object and its output items, as OpenAI's SDK reads them. The
//! handler and `/openapi.json` share these definitions.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::request::ResponsesRequest;
use crate::server::chat_stream::Answer;
use crate::server::generate::{now_secs, random_id};

/// A response (`object: "response"`).
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ResponseObject {
    /// `resp_...`.
    pub id: String,
    /// Always `response`.
    pub object: String,
    /// Unix seconds.
    pub created_at: u64,
    /// `in_progress`, `completed`, `incomplete` or `failed`.
    pub status: String,
    /// Served model name.
    pub model: String,
    /// Reasoning, message and function-call items, in order.
    pub output: Vec<OutputItem>,
    /// Why the response is `incomplete`.
    pub incomplete_details: Option<IncompleteDetails>,
    /// Why the response `failed`.
    pub error: Option<ResponseError>,
    /// As sent.
    pub instructions: Option<String>,
    /// As sent.
    pub max_output_tokens: Option<usize>,
    /// As sent.
    pub temperature: Option<f32>,
    /// As sent.
    pub top_p: Option<f32>,
    /// As sent.
    pub tools: Vec<Map<String, Value>>,
    /// As sent (default `auto`).
    pub tool_choice: Value,
    /// As sent (default true).
    pub parallel_tool_calls: bool,
    /// As sent.
    pub previous_response_id: Option<String>,
    /// As sent.
    pub reasoning: Option<Map<String, Value>>,
    /// Whether it was kept for `previous_response_id` and GET.
    pub store: bool,
    /// As sent (default `{"format": {"type": "text"}}`).
    pub text: Value,
    /// Always `disabled`.
    pub truncation: String,
    /// Always false.
    pub background: bool,
    /// Token counts (absent while in progress).
    pub usage: Option<ResponseUsage>,
    /// As sent.
    pub metadata: Map<String, Value>,
    /// As sent.
    pub user: Option<String>,
}

/// What `DELETE /v1/responses/{id}` answers.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ResponseDeleted {
    /// The response's id.
    pub id: String,
    /// Always `response`.
    pub object: String,
    /// Always true.
    pub deleted: bool,
}

/// One output item.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    /// The model's reasoning (reasoning models with `--reasoning-parser`).
    Reasoning {
        /// `rs_...`.
        id: String,
        /// Always empty: the reasoning is in `content`, not summarized.
        summary: Vec<Value>,
        /// The reasoning text.
        content: Vec<ReasoningText>,
        /// `in_progress` or `completed`.
        status: String,
    },
    /// The answer's text.
    Message {
        /// `msg_...`.
        id: String,
        /// `in_progress`, `completed` or `incomplete`.
        status: String,
        /// Always `assistant`.
        role: String,
        /// The text, as one `output_text` part.
        content: Vec<OutputText>,
    },
    /// A call of a function tool.
    FunctionCall {
        /// `fc_...`.
        id: String,
        /// `call_...`: what a `function_call_output` item answers.
        call_id: String,
        /// The function.
        name: String,
        /// Its arguments, as JSON text.
        arguments: String,
        /// `in_progress`, `completed` or `incomplete`.
        status: String,
    },
}

/// A message's text part.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct OutputText {
    /// Always `output_text`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The text.
    pub text: String,
    /// Always empty.
    pub annotations: Vec<Value>,
}

impl OutputText {
    /// An `output_text` part of `text`.
    pub fn new(text: &str) -> Self {
        OutputText {
            kind: "output_text".into(),
            text: text.into(),
            annotations: Vec::new(),
        }
    }
}

/// A reasoning item's text part.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ReasoningText {
    /// Always `reasoning_text`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The text.
    pub text: String,
}

impl ReasoningText {
    /// A `reasoning_text` part of `text`.
    pub fn new(text: &str) -> Self {
        ReasoningText {
            kind: "reasoning_text".into(),
            text: text.into(),
        }
    }
}

/// `incomplete_details`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct IncompleteDetails {
    /// `max_output_tokens`.
    pub reason: String,
}

/// `error` of a failed response.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ResponseError {
    /// `server_error`.
    pub code: String,
    /// What went wrong.
    pub message: String,
}

/// Token counts.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ResponseUsage {
    /// Prompt tokens (the whole conversation).
    pub input_tokens: usize,
    /// `{"cached_tokens": 0}`.
    pub input_tokens_details: Value,
    /// Generated tokens.
    pub output_tokens: usize,
    /// `{"reasoning_tokens": 0}` (not counted apart).
    pub output_tokens_details: Value,
    /// Their sum.
    pub total_tokens: usize,
}

impl ResponseUsage {
    /// Counts of `input` prompt and `output` generated tokens.
    pub fn new(input: usize, output: usize) -> Self {
        ResponseUsage {
            input_tokens: input,
            input_tokens_details: json!({"cached_tokens": 0}),
            output_tokens: output,
            output_tokens_details: json!({"reasoning_tokens": 0}),
            total_tokens: input + output,
        }
    }
}

impl ResponseObject {
    /// The response to `req` before any output: `in_progress`.
    pub fn draft(req: &ResponsesRequest, model: String, store: bool) -> Self {
        ResponseObject {
            id: random_id("resp_"),
            object: "response".into(),
            created_at: now_secs(),
            status: "in_progress".into(),
            model,
            output: Vec::new(),
            incomplete_details: None,
            error: None,
            instructions: req.instructions.clone(),
            max_output_tokens: req.max_output_tokens,
            temperature: req.temperature,
            top_p: req.top_p,
            tools: req.tools.clone().unwrap_or_default(),
            tool_choice: req.tool_choice.clone().unwrap_or(json!("auto")),
            parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
            previous_response_id: req.previous_response_id.clone(),
            reasoning: req.reasoning.clone(),
            store,
            text: match req.text.as_ref().and_then(|t| t.format.clone()) {
                Some(format) => json!({"format": format}),
                None => json!({"format": {"type": "text"}}),
            },
            truncation: "disabled".into(),
            background: false,
            usage: None,
            metadata: req.metadata.clone().unwrap_or_default(),
            user: req.user.clone(),
        }
    }

    /// Ends the response with `output`: `incomplete` when `max_output_tokens` (or the context)
    /// cut it (`finish` "length"), else `completed`.
    pub fn finish(&mut self, output: Vec<OutputItem>, finish: Option<&str>, usage: ResponseUsage) {
        let cut = finish == Some("length");
        self.status = if cut { "incomplete" } else { "completed" }.into();
        self.incomplete_details = cut.then(|| IncompleteDetails {
            reason: "max_output_tokens".into(),
        });
        self.output = output;
        self.usage = Some(usage);
    }
}

/// The output items of a whole answer: its reasoning, its text (when it has text or no calls),
/// then its calls.
pub fn output_items(answer: &Answer, cut: bool) -> Vec<OutputItem> {
    let status = if cut { "incomplete" } else { "completed" };
    let mut items = Vec::new();
    if !answer.reasoning.is_empty() {
        items.push(reasoning_item(
            random_id("rs_"),
            &answer.reasoning,
            "completed",
        ));
    }
    if answer.content.is_some() || answer.calls.is_empty() {
        let text = answer.content.clone().unwrap_or_default();
        items.push(message_item(random_id("msg_"), &text, status));
    }
    for (name, arguments) in &answer.calls {
        items.push(OutputItem::FunctionCall {
            id: random_id("fc_"),
            call_id: random_id("call_"),
            name: name.clone(),
            arguments: arguments.clone(),
            status: status.into(),
        });
    }
    items
}

/// A reasoning item.
pub fn reasoning_item(id: String, text: &str, status: &str) -> OutputItem {
    OutputItem::Reasoning {
        id,
        summary: Vec::new(),
        content: match text.is_empty() {
            true => Vec::new(),
            false => vec![ReasoningText::new(text)],
        },
        status: status.into(),
    }
}

/// A message item with one `output_text` part (none while it is empty and in progress).
pub fn message_item(id: String, text: &str, status: &str) -> OutputItem {
    OutputItem::Message {
        id,
        status: status.into(),
        role: "assistant".into(),
        content: match status == "in_progress" && text.is_empty() {
            true => Vec::new(),
            false => vec![OutputText::new(text)],
        },
    }
}

/// The chat messages `output` adds to a conversation (what a later `previous_response_id`
/// request continues): one assistant message with the text and the calls. Reasoning is left
/// out, as chat templates drop earlier turns' reasoning.
pub fn as_messages(output: &[OutputItem]) -> Vec<Value> {
    let mut content = String::new();
    let mut calls = Vec::new();
    for item in output {
        match item {
            OutputItem::Message { content: parts, .. } => {
                content.extend(parts.iter().map(|p| p.text.as_str()))
            }
            OutputItem::FunctionCall {
                call_id,
                name,
                arguments,
                ..
            } => calls.push(json!({"id": call_id, "type": "function",
                                   "function": {"name": name, "arguments": arguments}})),
            OutputItem::Reasoning { .. } => {}
        }
    }
    let mut message = json!({"role": "assistant", "content": content});
    if !calls.is_empty() {
        message["tool_calls"] = json!(calls);
    }
    vec![message]
}
