//! What a caller asks the engine for: sampling parameters (vLLM's names and defaults), their
//! validation, and why a sequence finished.

use serde::{Deserialize, Serialize};

/// How to pick tokens and when to stop, per request. Field names, meanings and defaults follow
/// vLLM's `SamplingParams`, so `SamplingParams { temperature: 0.8, top_p: 0.95, ..Default::default() }`
/// reads the same as the vLLM quick start.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Number of completions per prompt.
    pub n: usize,
    /// Softmax temperature; 0 means greedy.
    pub temperature: f32,
    /// Nucleus sampling: keep the smallest set of tokens whose probability mass reaches `top_p`.
    pub top_p: f32,
    /// Keep only the `top_k` most likely tokens; 0 or -1 disables.
    pub top_k: i32,
    /// Drop tokens whose probability is below `min_p` times the most likely token's.
    pub min_p: f32,
    /// Penalty for tokens already generated at least once (OpenAI semantics), -2..=2.
    pub presence_penalty: f32,
    /// Penalty proportional to how often a token was generated (OpenAI semantics), -2..=2.
    pub frequency_penalty: f32,
    /// Multiplicative penalty for tokens in the prompt or output (1 = off), > 0.
    pub repetition_penalty: f32,
    /// Added to the logits of the given token ids before sampling, each -100..=100.
    pub logit_bias: Vec<(u32, f32)>,
    /// Seed of this request's own random stream: same seed, same tokens, whatever else is batched.
    pub seed: Option<u64>,
    /// Maximum tokens to generate.
    pub max_tokens: usize,
    /// Tokens to generate before EOS or stop token ids may end the sequence.
    pub min_tokens: usize,
    /// Strings that end generation when they appear in the output (excluded from it by default).
    pub stop: Vec<String>,
    /// Token ids that end generation (included in the token output, not in the text).
    pub stop_token_ids: Vec<u32>,
    /// Keep generating past the model's EOS token.
    pub ignore_eos: bool,
    /// Return this many top alternatives' log-probabilities per generated token (0..=20).
    pub logprobs: Option<usize>,
    /// Return the log-probability of every prompt token after the first (the model's raw
    /// distribution at the position before it) with this many top alternatives (0..=20). The
    /// prompt is then computed whole: no prefix-cache hits.
    pub prompt_logprobs: Option<usize>,
    /// Leave special tokens out of the decoded text.
    pub skip_special_tokens: bool,
    /// Keep the matched stop string at the end of the output text.
    pub include_stop_str_in_output: bool,
    /// Constrain the output: a JSON schema, any JSON object, a regex, a choice or a grammar
    /// (vLLM's `structured_outputs`).
    pub structured_outputs: Option<crate::guided::StructuredOutputs>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            n: 1,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            logit_bias: Vec::new(),
            seed: None,
            max_tokens: 16,
            min_tokens: 0,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            logprobs: None,
            prompt_logprobs: None,
            skip_special_tokens: true,
            include_stop_str_in_output: false,
            structured_outputs: None,
        }
    }
}

/// Temperatures below this are greedy (vLLM's `_SAMPLING_EPS`).
pub const GREEDY_EPS: f32 = 1e-5;
/// Most alternatives a request may ask logprobs for.
pub const MAX_LOGPROBS: usize = 20;
/// Most stop strings a request may give.
pub const MAX_STOP_STRINGS: usize = 64;
/// Longest stop string, in bytes.
pub const MAX_STOP_STRING_BYTES: usize = 1024;
/// Most stop token ids a request may give.
pub const MAX_STOP_TOKEN_IDS: usize = 1024;
/// Most `logit_bias` entries (OpenAI's limit).
pub const MAX_LOGIT_BIAS: usize = 1024;

/// A sampling parameter out of range; `param` names the field as the API spells it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct InvalidParam {
    /// The offending field.
    pub param: &'static str,
    /// What is wrong, worded for the API user.
    pub message: String,
}

fn invalid(param: &'static str, message: String) -> Result<(), InvalidParam> {
    Err(InvalidParam { param, message })
}

impl SamplingParams {
    /// Greedy decoding: the argmax token every step.
    pub fn is_greedy(&self) -> bool {
        self.temperature < GREEDY_EPS
    }

    /// Checks every field against vLLM/OpenAI ranges. `vocab_size`, when known, bounds token ids.
    pub fn validate(&self, vocab_size: Option<usize>) -> Result<(), InvalidParam> {
        if self.n < 1 {
            return invalid("n", format!("n must be at least 1, got {}.", self.n));
        }
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return invalid(
                "temperature",
                format!(
                    "temperature must be non-negative, got {}.",
                    self.temperature
                ),
            );
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return invalid(
                "top_p",
                format!("top_p must be in (0, 1], got {}.", self.top_p),
            );
        }
        if self.top_k < -1 {
            return invalid(
                "top_k",
                format!(
                    "top_k must be -1 (disable), or at least 1, got {}.",
                    self.top_k
                ),
            );
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return invalid(
                "min_p",
                format!("min_p must be in [0, 1], got {}.", self.min_p),
            );
        }
        if !(-2.0..=2.0).contains(&self.presence_penalty) {
            return invalid(
                "presence_penalty",
                format!(
                    "presence_penalty must be in [-2, 2], got {}.",
                    self.presence_penalty
                ),
            );
        }
        if !(-2.0..=2.0).contains(&self.frequency_penalty) {
            return invalid(
                "frequency_penalty",
                format!(
                    "frequency_penalty must be in [-2, 2], got {}.",
                    self.frequency_penalty
                ),
            );
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return invalid(
                "repetition_penalty",
                format!(
                    "repetition_penalty must be greater than zero, got {}.",
                    self.repetition_penalty
                ),
            );
        }
        if self.logit_bias.len() > MAX_LOGIT_BIAS {
            return invalid(
                "logit_bias",
                format!(
                    "logit_bias may hold at most {MAX_LOGIT_BIAS} entries, got {}.",
                    self.logit_bias.len()
                ),
            );
        }
        for &(token, bias) in &self.logit_bias {
            if !(-100.0..=100.0).contains(&bias) {
                return invalid(
                    "logit_bias",
                    format!(
                        "logit_bias values must be in [-100, 100], got {bias} for token {token}."
                    ),
                );
            }
            if vocab_size.is_some_and(|v| token as usize >= v) {
                return invalid(
                    "logit_bias",
                    format!("logit_bias token id {token} is out of vocabulary."),
                );
            }
        }
        if self.max_tokens < 1 {
            return invalid(
                "max_tokens",
                format!("max_tokens must be at least 1, got {}.", self.max_tokens),
            );
        }
        if self.min_tokens > self.max_tokens {
            return invalid(
                "min_tokens",
                format!(
                    "min_tokens must be less than or equal to max_tokens={}, got {}.",
                    self.max_tokens, self.min_tokens
                ),
            );
        }
        if let Some(k) = self.logprobs.filter(|&k| k > MAX_LOGPROBS) {
            return invalid(
                "logprobs",
                format!("logprobs must be at most {MAX_LOGPROBS}, got {k}."),
            );
        }
        if let Some(k) = self.prompt_logprobs.filter(|&k| k > MAX_LOGPROBS) {
            return invalid(
                "prompt_logprobs",
                format!("prompt_logprobs must be at most {MAX_LOGPROBS}, got {k}."),
            );
        }
        if self.stop.len() > MAX_STOP_STRINGS {
            return invalid(
                "stop",
                format!(
                    "stop may hold at most {MAX_STOP_STRINGS} strings, got {}.",
                    self.stop.len()
                ),
            );
        }
        if self.stop.iter().any(String::is_empty) {
            return invalid("stop", "stop strings must not be empty.".to_string());
        }
        if let Some(s) = self.stop.iter().find(|s| s.len() > MAX_STOP_STRING_BYTES) {
            return invalid(
                "stop",
                format!(
                    "stop strings may be at most {MAX_STOP_STRING_BYTES} bytes long, got one of {}.",
                    s.len()
                ),
            );
        }
        if self.stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
            return invalid(
                "stop_token_ids",
                format!(
                    "stop_token_ids may hold at most {MAX_STOP_TOKEN_IDS} ids, got {}.",
                    self.stop_token_ids.len()
                ),
            );
        }
        if let Some(&t) = self
            .stop_token_ids
            .iter()
            .find(|&&t| vocab_size.is_some_and(|v| t as usize >= v))
        {
            return invalid(
                "stop_token_ids",
                format!("stop token id {t} is out of vocabulary."),
            );
        }
        Ok(())
    }
}

/// Refuses a request for more sequences than the engine runs at once (`--max-num-seqs`): `n` for
/// one prompt, `n` times the prompt count for a batch of prompts.
pub fn check_num_seqs(num_seqs: usize, max_num_seqs: usize) -> Result<(), InvalidParam> {
    if num_seqs > max_num_seqs {
        return invalid(
            "n",
            format!(
                "This request asks for {num_seqs} sequences (n times the number of prompts), \
                 but the server runs at most {max_num_seqs} at once (--max-num-seqs)."
            ),
        );
    }
    Ok(())
}

/// Why a sequence ended (OpenAI's `finish_reason`, plus `Abort`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// EOS, a stop token id or a stop string.
    Stop,
    /// `max_tokens` or the model's context length.
    Length,
    /// Cancelled (client gone, or an explicit abort).
    Abort,
}

impl FinishReason {
    /// The name OpenAI and vLLM metrics use.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(p: SamplingParams) -> Option<&'static str> {
        p.validate(Some(100)).err().map(|e| e.param)
    }

    #[test]
    fn defaults_and_quick_start_values_are_valid() {
        assert_eq!(check(SamplingParams::default()), None);
        let quick = SamplingParams {
            temperature: 0.8,
            top_p: 0.95,
            max_tokens: 256,
            ..Default::default()
        };
        assert_eq!(check(quick), None);
    }

    #[test]
    fn every_range_is_enforced() {
        let d = SamplingParams::default;
        let cases: Vec<(SamplingParams, &str)> = vec![
            (SamplingParams { n: 0, ..d() }, "n"),
            (
                SamplingParams {
                    temperature: -0.1,
                    ..d()
                },
                "temperature",
            ),
            (
                SamplingParams {
                    temperature: f32::NAN,
                    ..d()
                },
                "temperature",
            ),
            (SamplingParams { top_p: 0.0, ..d() }, "top_p"),
            (SamplingParams { top_p: 1.01, ..d() }, "top_p"),
            (SamplingParams { top_k: -2, ..d() }, "top_k"),
            (SamplingParams { min_p: 1.5, ..d() }, "min_p"),
            (
                SamplingParams {
                    presence_penalty: 2.5,
                    ..d()
                },
                "presence_penalty",
            ),
            (
                SamplingParams {
                    frequency_penalty: -2.5,
                    ..d()
                },
                "frequency_penalty",
            ),
            (
                SamplingParams {
                    repetition_penalty: 0.0,
                    ..d()
                },
                "repetition_penalty",
            ),
            (
                SamplingParams {
                    logit_bias: vec![(1, 101.0)],
                    ..d()
                },
                "logit_bias",
            ),
            (
                SamplingParams {
                    logit_bias: vec![(100, 1.0)],
                    ..d()
                },
                "logit_bias",
            ),
            (
                SamplingParams {
                    max_tokens: 0,
                    ..d()
                },
                "max_tokens",
            ),
            (
                SamplingParams {
                    min_tokens: 17,
                    ..d()
                },
                "min_tokens",
            ),
            (
                SamplingParams {
                    logprobs: Some(21),
                    ..d()
                },
                "logprobs",
            ),
            (
                SamplingParams {
                    stop: vec![String::new()],
                    ..d()
                },
                "stop",
            ),
            (
                SamplingParams {
                    stop: vec!["x".into(); MAX_STOP_STRINGS + 1],
                    ..d()
                },
                "stop",
            ),
            (
                SamplingParams {
                    stop: vec!["x".repeat(MAX_STOP_STRING_BYTES + 1)],
                    ..d()
                },
                "stop",
            ),
            (
                SamplingParams {
                    stop_token_ids: vec![1; MAX_STOP_TOKEN_IDS + 1],
                    ..d()
                },
                "stop_token_ids",
            ),
            (
                SamplingParams {
                    logit_bias: vec![(1, 1.0); MAX_LOGIT_BIAS + 1],
                    ..d()
                },
                "logit_bias",
            ),
            (
                SamplingParams {
                    stop_token_ids: vec![100],
                    ..d()
                },
                "stop_token_ids",
            ),
        ];
        for (p, param) in cases {
            assert_eq!(check(p.clone()), Some(param), "{p:?}");
        }
        assert_eq!(check(SamplingParams { top_k: -1, ..d() }), None);
        assert_eq!(
            check(SamplingParams {
                logprobs: Some(20),
                ..d()
            }),
            None
        );
    }
}
