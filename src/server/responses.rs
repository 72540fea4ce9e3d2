//! OpenAI wire types of the JSON responses. The handlers build these, and `/openapi.json` describes
//! them from the same definitions (`JsonSchema`), so the published schema cannot drift from what is
//! sent. Streamed chunks are SSE text; their JSON follows the same shapes with `delta` for
//! `message`.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Every error: `{"error": {...}}`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ErrorResponse {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// OpenAI's error object.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ErrorDetail {
    /// Human-readable message.
    pub message: String,
    /// OpenAI's error type (`invalid_request_error`, `rate_limit_error`, ...).
    #[serde(rename = "type")]
    pub kind: String,
    /// The request field at fault, if any.
    pub param: Option<String>,
    /// The HTTP status.
    pub code: u16,
}

/// Token counts of a request.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema)]
pub struct Usage {
    /// Prompt tokens (all prompts).
    pub prompt_tokens: usize,
    /// Generated tokens (all choices).
    pub completion_tokens: usize,
    /// Their sum.
    pub total_tokens: usize,
}

impl Usage {
    /// Usage of `prompt_tokens` in and `completion_tokens` out.
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
        }
    }
}

/// POST /v1/completions (not streamed).
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct CompletionResponse {
    /// `cmpl-...`
    pub id: String,
    /// `text_completion`
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// The served model name.
    pub model: String,
    /// One per prompt and `n`: prompt `i`'s choice `j` is `i * n + j`.
    pub choices: Vec<CompletionChoice>,
    /// Token counts.
    pub usage: Usage,
}

/// One completion.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct CompletionChoice {
    /// Position in `choices`.
    pub index: usize,
    /// The generated text (after the prompt, with `echo`).
    pub text: String,
    /// Per-token logprobs, when asked (with `echo`, the prompt's tokens first).
    pub logprobs: Option<CompletionLogprobs>,
    /// `stop`, `length` or `abort`.
    pub finish_reason: Option<String>,
    /// vLLM's `prompt_logprobs`, when asked: per prompt token (null for the first), the token's
    /// and the top alternatives' entries, keyed by token id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<PromptLogprobs>,
}

/// vLLM's `prompt_logprobs`: per prompt token, null (the first) or token id -> entry.
pub type PromptLogprobs = Vec<Option<BTreeMap<String, PromptLogprob>>>;

/// One entry of [`PromptLogprobs`].
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct PromptLogprob {
    /// Log-probability.
    pub logprob: f32,
    /// 1-based rank among all tokens.
    pub rank: u32,
    /// The token's text.
    pub decoded_token: String,
}

/// Legacy completions logprobs.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct CompletionLogprobs {
    /// Each token's text.
    pub tokens: Vec<String>,
    /// Each token's log-probability (null for an echoed prompt's first token).
    pub token_logprobs: Vec<Option<f32>>,
    /// Each token's most likely alternatives: text -> log-probability (null likewise).
    pub top_logprobs: Vec<Option<BTreeMap<String, f32>>>,
    /// Each token's character offset in the text.
    pub text_offset: Vec<usize>,
}

/// POST /v1/chat/completions (not streamed).
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ChatCompletionResponse {
    /// `chatcmpl-...`
    pub id: String,
    /// `chat.completion`
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// The served model name.
    pub model: String,
    /// One per `n`.
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    pub usage: Usage,
    /// vLLM's `prompt_logprobs`, when asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<PromptLogprobs>,
}

/// One chat completion.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ChatChoice {
    /// Position in `choices`.
    pub index: usize,
    /// The assistant's message.
    pub message: ChatMessageOut,
    /// Per-token logprobs, when asked.
    pub logprobs: Option<ChatLogprobs>,
    /// `stop`, `length` or `abort`.
    pub finish_reason: Option<String>,
}

/// The assistant's message.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ChatMessageOut {
    /// Always `assistant`.
    pub role: String,
    /// The generated text (null when the answer is only tool calls).
    pub content: Option<String>,
    /// The answer's reasoning, split from its content by `--reasoning-parser`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Tool calls found in (or forced on) the answer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallOut>,
}

/// A tool call of an answer.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ToolCallOut {
    /// `call_...`.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The function and its arguments.
    pub function: FunctionCallOut,
}

/// The function of a tool call.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct FunctionCallOut {
    /// Its name.
    pub name: String,
    /// Its arguments: a JSON object, serialized.
    pub arguments: String,
}

/// Chat logprobs.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct ChatLogprobs {
    /// One entry per generated token.
    pub content: Vec<ChatTokenLogprob>,
}

/// A generated token's log-probability and its most likely alternatives.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ChatTokenLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// Its UTF-8 bytes.
    pub bytes: Vec<u8>,
    /// The most likely alternatives.
    pub top_logprobs: Vec<TopLogprob>,
}

/// An alternative token at one position.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct TopLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// Its UTF-8 bytes.
    pub bytes: Vec<u8>,
}

/// GET /v1/models
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ModelList {
    /// `list`
    pub object: String,
    /// One card per served name.
    pub data: Vec<ModelCard>,
}

/// A served model.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ModelCard {
    /// The name to request it by.
    pub id: String,
    /// `model`
    pub object: String,
    /// Unix seconds the server started.
    pub created: u64,
    /// `pagewise`
    pub owned_by: String,
    /// The first served name.
    pub root: String,
    /// Longest prompt + output.
    pub max_model_len: usize,
}

/// POST /tokenize: a prompt, or chat messages rendered with the chat template.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct TokenizeRequest {
    /// Text to tokenize.
    pub prompt: Option<String>,
    /// Or a conversation, rendered with the chat template first.
    pub messages: Option<Vec<serde_json::Value>>,
    /// Add the tokenizer's special tokens (default: true for a prompt, false for messages).
    pub add_special_tokens: Option<bool>,
    /// Append the assistant prompt to rendered messages (default true).
    pub add_generation_prompt: Option<bool>,
}

/// POST /tokenize's answer.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct TokenizeResponse {
    /// Number of tokens.
    pub count: usize,
    /// Longest prompt + output.
    pub max_model_len: usize,
    /// The token ids.
    pub tokens: Vec<u32>,
}

/// POST /detokenize
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct DetokenizeRequest {
    /// Token ids of this model's vocabulary.
    pub tokens: Vec<u32>,
}

/// POST /detokenize's answer.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct DetokenizeResponse {
    /// The decoded text.
    pub prompt: String,
}

/// GET /version
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct VersionResponse {
    /// pagewise's version.
    pub version: String,
}
