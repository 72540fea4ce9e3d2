//! OpenAI wire types for requests (responses are built as JSON where they are sent), and their
//! resolution into engine [`SamplingParams`].

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Deserialize;

use super::error::ApiError;
use crate::request::SamplingParams;

/// `stop`: one string or several.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum StopInput {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// `prompt` of /v1/completions: text, texts, token ids, or lists of token ids.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum PromptInput {
    /// One text.
    Text(String),
    /// Several texts.
    Texts(Vec<String>),
    /// One prompt as token ids.
    Tokens(Vec<u32>),
    /// Several prompts as token ids.
    TokenLists(Vec<Vec<u32>>),
}

/// `stream_options`.
#[derive(Clone, Debug, Default, Deserialize, JsonSchema)]
pub struct StreamOptions {
    /// Add one final chunk with usage.
    #[serde(default)]
    pub include_usage: bool,
}

/// Sampling fields shared by both endpoints (OpenAI's plus vLLM's extensions).
#[derive(Clone, Debug, Default, Deserialize, JsonSchema)]
pub struct SamplingFields {
    /// Completions per prompt (at most `--max-num-seqs` in all).
    #[schemars(range(min = 1))]
    pub n: Option<usize>,
    /// Temperature.
    #[schemars(range(min = 0.0))]
    pub temperature: Option<f32>,
    /// Nucleus mass, in (0, 1].
    #[schemars(range(min = 0.001, max = 1.0))]
    pub top_p: Option<f32>,
    /// Top-k (-1 or 0: off).
    #[schemars(range(min = -1))]
    pub top_k: Option<i32>,
    /// Min-p.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub min_p: Option<f32>,
    /// Presence penalty.
    #[schemars(range(min = -2.0, max = 2.0))]
    pub presence_penalty: Option<f32>,
    /// Frequency penalty.
    #[schemars(range(min = -2.0, max = 2.0))]
    pub frequency_penalty: Option<f32>,
    /// Repetition penalty (> 0; 1 is off).
    #[schemars(range(min = 0.01))]
    pub repetition_penalty: Option<f32>,
    /// Token id (as a string key) -> bias.
    pub logit_bias: Option<BTreeMap<String, f32>>,
    /// vLLM's extension: the logprobs of the prompt's tokens with this many alternatives
    /// (0..=20), returned as `prompt_logprobs` (the first token's is null).
    pub prompt_logprobs: Option<usize>,
    /// Stop strings.
    pub stop: Option<StopInput>,
    /// Stop token ids.
    pub stop_token_ids: Option<Vec<u32>>,
    /// Seed (any 64-bit integer, signed as vLLM takes it or unsigned: a negative one is read as
    /// its two's-complement bits).
    #[serde(default, deserialize_with = "seed_bits")]
    #[schemars(with = "Option<i64>")]
    pub seed: Option<u64>,
    /// Output length limit (prompt + output within the context).
    #[schemars(range(min = 1))]
    pub max_tokens: Option<usize>,
    /// Tokens before EOS/stop ids may end the output.
    pub min_tokens: Option<usize>,
    /// Ignore EOS.
    pub ignore_eos: Option<bool>,
    /// Leave special tokens out of the text.
    pub skip_special_tokens: Option<bool>,
    /// Keep the stop string in the output.
    pub include_stop_str_in_output: Option<bool>,
    /// Stream server-sent events.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Isolates prefix-cache entries (vLLM's `cache_salt`).
    pub cache_salt: Option<String>,
    /// Ignored (OpenAI end-user id).
    pub user: Option<String>,
    /// Output constraints (`response_format`, `structured_outputs`, `guided_*`).
    #[serde(flatten)]
    pub constraint: super::structured::ConstraintFields,
}

/// vLLM's sampling fields beyond OpenAI's: the Responses and Messages APIs take them too, as
/// extra fields passed on to the chat request they become (where their own fields do not say).
pub const SAMPLING_EXTENSIONS: &[&str] = &[
    "top_k",
    "min_p",
    "seed",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "min_tokens",
    "structured_outputs",
];

/// Sets on a chat request `body` the sampling fields another API's request gives (`fields`:
/// chat name and value; null ones left out), then the [`SAMPLING_EXTENSIONS`] among its extra
/// fields (`unknown`) that those did not set.
pub fn set_sampling(
    body: &mut serde_json::Value,
    fields: &[(&str, serde_json::Value)],
    unknown: &BTreeMap<String, serde_json::Value>,
) {
    for (key, value) in fields {
        if !value.is_null() {
            body[*key] = value.clone();
        }
    }
    for key in SAMPLING_EXTENSIONS {
        if let Some(v) = unknown.get(*key)
            && body.get(*key).is_none()
        {
            body[*key] = v.clone();
        }
    }
}

/// POST /v1/completions.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
pub struct CompletionRequest {
    /// Served model name.
    pub model: Option<String>,
    /// The prompt(s).
    pub prompt: PromptInput,
    /// Logprobs: how many alternatives per token.
    #[schemars(range(max = 20))]
    pub logprobs: Option<usize>,
    /// Prepend the prompt to the returned text.
    #[serde(default)]
    pub echo: bool,
    /// Completions generated per prompt before the best `n` are returned; only `best_of == n`
    /// is supported.
    pub best_of: Option<usize>,
    /// Sampling.
    #[serde(flatten)]
    pub sampling: SamplingFields,
    /// Fields pagewise does not know (logged once, ignored).
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

/// Whether `name` is a field [`SamplingFields`] reads (its constraint fields included). A request
/// type's flattened `unknown` map also receives these: serde hands a flattened map every field
/// that a flattened struct holding a flattened struct of its own read.
pub fn is_sampling_field(name: &str) -> bool {
    static NAMES: std::sync::LazyLock<Vec<String>> = std::sync::LazyLock::new(|| {
        let schema = schemars::schema_for!(SamplingFields);
        schema
            .get("properties")
            .and_then(serde_json::Value::as_object)
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default()
    });
    NAMES.iter().any(|n| n == name)
}

/// POST /v1/chat/completions.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
pub struct ChatRequest {
    /// Served model name.
    pub model: Option<String>,
    /// The conversation, passed to the chat template as given (content strings or text parts).
    #[schemars(with = "Vec<MessageSchema>")]
    pub messages: Vec<serde_json::Value>,
    /// Newer name of max_tokens (takes precedence).
    pub max_completion_tokens: Option<usize>,
    /// Return logprobs of the chosen tokens.
    #[serde(default)]
    pub logprobs: bool,
    /// Alternatives per token when `logprobs`.
    #[schemars(range(max = 20))]
    pub top_logprobs: Option<usize>,
    /// Append the assistant prompt (default true).
    pub add_generation_prompt: Option<bool>,
    /// Extra variables for the chat template.
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// Tools (`{"type": "function", "function": {"name", "description", "parameters"}}`),
    /// passed to the chat template.
    pub tools: Option<serde_json::Value>,
    /// `none`, `auto` (the default with tools; needs `--enable-auto-tool-choice`), `required`,
    /// or `{"type": "function", "function": {"name": ...}}` (see `super::tools`).
    pub tool_choice: Option<serde_json::Value>,
    /// Whether an answer may call several tools (default true).
    pub parallel_tool_calls: Option<bool>,
    /// Sampling.
    #[serde(flatten)]
    pub sampling: SamplingFields,
    /// Fields pagewise does not know (logged once, ignored).
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

/// The role of a chat message: the ones OpenAI accepts.
#[derive(Clone, Copy, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions.
    System,
    /// Instructions (OpenAI's newer name).
    Developer,
    /// The user.
    User,
    /// The model.
    Assistant,
    /// A tool's result.
    Tool,
    /// A function's result (legacy).
    Function,
}

/// A message's content: text, or content parts whose `text` fields are joined.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Content parts (`{"type": "text", "text": ...}`).
    Parts(Vec<serde_json::Map<String, serde_json::Value>>),
}

/// What a chat message looks like (the schema of `messages`; the handler reads them as JSON
/// values and passes them to the chat template as given).
#[derive(Clone, Debug, Deserialize, JsonSchema)]
pub struct MessageSchema {
    /// Who speaks.
    pub role: Role,
    /// What is said (null or absent: empty).
    pub content: Option<MessageContent>,
    /// The speaker's name, or the tool's.
    pub name: Option<String>,
    /// Tool calls of an assistant message (passed to the template).
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// The call a tool message answers.
    pub tool_call_id: Option<String>,
}

impl SamplingFields {
    /// Engine parameters: the request's values over vLLM's defaults. `max_tokens` defaults to what
    /// is left of the context after the prompt.
    pub fn resolve(
        &self,
        max_tokens: Option<usize>,
        logprobs: Option<usize>,
        default_max_tokens: usize,
    ) -> Result<SamplingParams, ApiError> {
        let d = SamplingParams::default();
        let logit_bias = self
            .logit_bias
            .iter()
            .flatten()
            .map(|(k, &v)| {
                k.parse::<u32>().map(|id| (id, v)).map_err(|_| {
                    ApiError::invalid(
                        "logit_bias",
                        format!("logit_bias key {k:?} is not a token id"),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(SamplingParams {
            n: self.n.unwrap_or(1),
            temperature: self.temperature.unwrap_or(d.temperature),
            top_p: self.top_p.unwrap_or(d.top_p),
            top_k: self.top_k.unwrap_or(d.top_k),
            min_p: self.min_p.unwrap_or(d.min_p),
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            repetition_penalty: self.repetition_penalty.unwrap_or(1.0),
            logit_bias,
            seed: self.seed,
            max_tokens: max_tokens.or(self.max_tokens).unwrap_or(default_max_tokens),
            min_tokens: self.min_tokens.unwrap_or(0),
            stop: match &self.stop {
                None => Vec::new(),
                Some(StopInput::One(s)) => vec![s.clone()],
                Some(StopInput::Many(v)) => v.clone(),
            },
            stop_token_ids: self.stop_token_ids.clone().unwrap_or_default(),
            ignore_eos: self.ignore_eos.unwrap_or(false),
            logprobs,
            prompt_logprobs: self.prompt_logprobs,
            skip_special_tokens: self.skip_special_tokens.unwrap_or(true),
            include_stop_str_in_output: self.include_stop_str_in_output.unwrap_or(false),
            structured_outputs: self.constraint.resolve()?,
        })
    }

    /// Whether to stream.
    pub fn is_stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// Whether the stream ends with a usage chunk.
    pub fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage)
    }
}

/// A seed given as a signed or an unsigned 64-bit integer, as its 64 bits.
fn seed_bits<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Seed {
        Unsigned(u64),
        Signed(i64),
    }
    Ok(Option::<Seed>::deserialize(d)?.map(|s| match s {
        Seed::Unsigned(u) => u,
        Seed::Signed(i) => i as u64,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_fields_nothing_reads_are_unknown() {
        let req: ChatRequest = serde_json::from_value(serde_json::json!({
            "messages": [{"role": "user", "content": "hi"}],
            "temperature": 0.5, "max_tokens": 4, "stream": true, "seed": 1,
            "response_format": {"type": "json_object"}, "bogus": 1
        }))
        .unwrap();
        assert_eq!(req.sampling.temperature, Some(0.5));
        let unknown: Vec<&String> = req
            .unknown
            .keys()
            .filter(|k| !is_sampling_field(k))
            .collect();
        assert_eq!(unknown, ["bogus"]);
    }
}
