//! Anthropic's Messages response: content blocks (`thinking`, `text`, `tool_use`), the stop
//! reason and usage. The handler and `/openapi.json` share these definitions.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::server::generate::random_id;

/// A message (`type: "message"`).
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct MessageResponse {
    /// `msg_...`.
    pub id: String,
    /// Always `message`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Always `assistant`.
    pub role: String,
    /// Served model name.
    pub model: String,
    /// The answer's blocks, in order.
    pub content: Vec<ContentBlock>,
    /// `end_turn`, `max_tokens`, `stop_sequence` or `tool_use` (null while streaming).
    pub stop_reason: Option<String>,
    /// The stop sequence that ended the answer.
    pub stop_sequence: Option<String>,
    /// Token counts.
    pub usage: MessageUsage,
}

/// One content block.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    /// The model's reasoning (reasoning models with `--reasoning-parser`).
    Thinking {
        /// The reasoning text.
        thinking: String,
        /// Always empty: nothing is signed.
        signature: String,
    },
    /// Text.
    Text {
        /// The text.
        text: String,
    },
    /// A call of a tool.
    ToolUse {
        /// `toolu_...`: what a `tool_result` block answers.
        id: String,
        /// The tool.
        name: String,
        /// Its input (`{}` when `max_tokens` cut it before it was whole JSON).
        input: Value,
    },
}

/// Token counts.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct MessageUsage {
    /// Prompt tokens.
    pub input_tokens: usize,
    /// Generated tokens.
    pub output_tokens: usize,
    /// Always 0.
    pub cache_creation_input_tokens: usize,
    /// Always 0 (prefix-cache hits are not counted apart).
    pub cache_read_input_tokens: usize,
}

impl MessageUsage {
    /// Counts of `input` prompt and `output` generated tokens.
    pub fn new(input: usize, output: usize) -> Self {
        MessageUsage {
            input_tokens: input,
            output_tokens: output,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: 0,
        }
    }
}

/// What /v1/messages/count_tokens answers.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct TokenCount {
    /// Prompt tokens of the request, as rendered by the chat template.
    pub input_tokens: usize,
}

/// Anthropic's stop reason of an answer that ended with `finish` (the chat finish reason),
/// `stopped_on` (the stop sequence, if one ended it), with or without tool calls.
pub fn stop_reason(finish: Option<&str>, stopped_on: Option<&str>, has_calls: bool) -> String {
    match (finish, stopped_on) {
        (_, Some(_)) => "stop_sequence",
        (Some("length"), _) => "max_tokens",
        _ if has_calls => "tool_use",
        _ => "end_turn",
    }
    .into()
}

/// The blocks of a whole answer: its reasoning, its text (when it has text or no calls), then
/// its calls.
pub fn blocks(
    reasoning: &str,
    text: Option<&str>,
    calls: &[(String, String)],
) -> Vec<ContentBlock> {
    let mut out = Vec::new();
    if !reasoning.is_empty() {
        out.push(ContentBlock::Thinking {
            thinking: reasoning.into(),
            signature: String::new(),
        });
    }
    if text.is_some_and(|t| !t.is_empty()) || calls.is_empty() {
        out.push(ContentBlock::Text {
            text: text.unwrap_or_default().into(),
        });
    }
    for (name, arguments) in calls {
        out.push(ContentBlock::ToolUse {
            id: random_id("toolu_"),
            name: name.clone(),
            input: tool_input(arguments),
        });
    }
    out
}

/// A call's arguments as the `input` object (`{}` if they are not whole JSON).
pub fn tool_input(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({}),
    }
}
