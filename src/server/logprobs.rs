//! Logprobs in OpenAI's shapes: a chat token's entry with its alternatives, and the completions
//! API's parallel lists (tokens, their logprobs, the alternatives and the text offsets).

use super::AppState;
use super::responses::{ChatTokenLogprob, CompletionLogprobs, TopLogprob};
use crate::sampler::Logprobs;

/// A token as text for logprobs: its decoded text, or its vocabulary entry when it is only part of
/// a UTF-8 character, or vLLM's `token_id:N` for an id the tokenizer has no entry for (a model
/// whose embedding has more rows than its tokenizer has tokens), so distinct tokens never share
/// a key in `top_logprobs`.
fn token_text(state: &AppState, id: u32) -> String {
    let tokenizer = &state.info.tokenizer;
    match tokenizer.decode(&[id], false) {
        Ok(text) if !text.is_empty() && !text.contains('\u{FFFD}') => text,
        _ => tokenizer
            .id_to_token(id)
            .unwrap_or_else(|| format!("token_id:{id}")),
    }
}

/// Chat logprobs of one generated token and its alternatives.
pub(super) fn chat_logprob(state: &AppState, id: u32, lp: &Logprobs) -> ChatTokenLogprob {
    let entry = |id: u32, logprob: f32| {
        let token = token_text(state, id);
        TopLogprob {
            bytes: token.as_bytes().to_vec(),
            token,
            logprob,
        }
    };
    let TopLogprob {
        token,
        logprob,
        bytes,
    } = entry(id, lp.logprob);
    ChatTokenLogprob {
        token,
        logprob,
        bytes,
        top_logprobs: lp.top.iter().map(|&(t, l)| entry(t, l)).collect(),
    }
}

/// The completions API's logprobs of `tokens` (with `lps`), their text starting at character
/// `offset` (`text_offset` counts characters, as OpenAI's and vLLM's do).
pub(super) fn completion_logprobs(
    state: &AppState,
    tokens: &[u32],
    lps: &[Logprobs],
    offset: usize,
) -> CompletionLogprobs {
    let texts: Vec<String> = tokens.iter().map(|&t| token_text(state, t)).collect();
    let mut text_offset = Vec::with_capacity(texts.len());
    let mut at = offset;
    for t in &texts {
        text_offset.push(at);
        at += t.chars().count();
    }
    CompletionLogprobs {
        tokens: texts,
        token_logprobs: lps.iter().map(|l| l.logprob).collect(),
        top_logprobs: lps
            .iter()
            .map(|l| {
                l.top
                    .iter()
                    .map(|&(t, v)| (token_text(state, t), v))
                    .collect()
            })
            .collect(),
        text_offset,
    }
}
