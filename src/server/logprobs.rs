//! Logprobs in OpenAI's shapes: a chat token's entry with its alternatives, and the completions
//! API's parallel lists (tokens, their logprobs, the alternatives and the text offsets).

use std::collections::BTreeMap;

use super::AppState;
use super::generate::{Prompt, PromptOut};
use super::responses::{
    ChatTokenLogprob, CompletionLogprobs, PromptLogprob, PromptLogprobs, TopLogprob,
};
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
        token_logprobs: lps.iter().map(|l| Some(l.logprob)).collect(),
        top_logprobs: lps.iter().map(|l| Some(top_texts(state, l))).collect(),
        text_offset,
    }
}

/// An entry's alternatives: text -> log-probability.
fn top_texts(state: &AppState, lp: &Logprobs) -> BTreeMap<String, f32> {
    lp.top
        .iter()
        .map(|&(t, v)| (token_text(state, t), v))
        .collect()
}

/// The completions API's logprobs of an echoed prompt (`ids`, with `lps` the logprobs of
/// `ids[1..]`), then of the generated tokens (`after`), whose text follows the prompt's.
pub(super) fn echoed_logprobs(
    state: &AppState,
    ids: &[u32],
    lps: &[Logprobs],
    after: CompletionLogprobs,
) -> CompletionLogprobs {
    let mut out = completion_logprobs(state, ids, &[], 0);
    out.token_logprobs = std::iter::once(None)
        .chain(lps.iter().map(|l| Some(l.logprob)))
        .collect();
    out.top_logprobs = std::iter::once(None)
        .chain(lps.iter().map(|l| Some(top_texts(state, l))))
        .collect();
    out.tokens.extend(after.tokens);
    out.token_logprobs.extend(after.token_logprobs);
    out.top_logprobs.extend(after.top_logprobs);
    out.text_offset.extend(after.text_offset);
    out
}

/// vLLM's `prompt_logprobs` of the prompt `ids` (`lps`: the logprobs of `ids[1..]`): null for
/// the first token, then each token's entry with its alternatives', keyed by token id.
pub(super) fn prompt_logprobs(state: &AppState, ids: &[u32], lps: &[Logprobs]) -> PromptLogprobs {
    let entry = |id: u32, logprob: f32, rank: u32| {
        let decoded_token = token_text(state, id);
        let e = PromptLogprob {
            logprob,
            rank,
            decoded_token,
        };
        (id.to_string(), e)
    };
    std::iter::once(None)
        .chain(ids.iter().skip(1).zip(lps).map(|(&id, lp)| {
            let mut m: BTreeMap<String, PromptLogprob> = lp
                .top
                .iter()
                .zip(1u32..)
                .map(|(&(t, v), rank)| entry(t, v, rank))
                .collect();
            let (k, v) = entry(id, lp.logprob, lp.rank);
            m.insert(k, v);
            Some(m)
        }))
        .collect()
}

/// A streamed completion choice's chunk for one token: where it is in the choice.
pub(super) struct StreamPiece<'a> {
    /// The choice's prompt.
    pub prompt: &'a Prompt,
    /// What becomes of the prompt's logprobs.
    pub out: PromptOut,
    /// The choice's first chunk (the echoed prompt leads it).
    pub first: bool,
}

impl StreamPiece<'_> {
    /// The chunk's text and logprobs for `token` (id, its text, its logprobs, the prompt's
    /// logprobs on the first), `sent` the characters of the choice sent before (moved on).
    pub fn text(
        &self,
        state: &AppState,
        sent: &mut usize,
        token: (u32, String, Option<Logprobs>, Option<Vec<Logprobs>>),
    ) -> (String, Option<CompletionLogprobs>) {
        let (id, mut text, logprobs, prompt_lps) = token;
        let mut offset = *sent;
        let mut lp = logprobs.map(|lp| (vec![id], vec![lp]));
        if self.out.echo_only {
            (text, lp) = (String::new(), lp.map(|_| (Vec::new(), Vec::new())));
        }
        let echo = self.prompt.echo.as_deref().filter(|_| self.first);
        if let Some(echo) = echo {
            offset += echo.chars().count();
            text = format!("{echo}{text}");
        }
        let lp = lp.map(|(ids, lps)| {
            let after = completion_logprobs(state, &ids, &lps, offset);
            match (self.out.echoed && echo.is_some(), &prompt_lps) {
                (true, Some(p)) => echoed_logprobs(state, &self.prompt.ids, p, after),
                _ => after,
            }
        });
        *sent += text.chars().count();
        (text, lp)
    }
}
