//! Incremental detokenization: one sequence's tokens become text as they are sampled, without ever
//! re-decoding the whole output and without emitting half a UTF-8 character.
//!
//! The prefix/read-offset method (as in vLLM and TGI): decode a short window `tokens[prefix..]` and
//! the window without the unread tokens `tokens[prefix..read]`; what the first adds over the second
//! is the new text, unless it ends in U+FFFD (an incomplete byte sequence, held until the next token).
//! Decoding a window instead of single tokens keeps word-boundary spacing right for tokenizers whose
//! decoders depend on context (SentencePiece's leading-space marker). Tokens before the window are
//! dropped, so memory and work per token stay bounded.

use tokenizers::Tokenizer;

/// Prompt tokens kept as decoding context for the first generated tokens.
const PROMPT_CONTEXT: usize = 5;

/// The tokenizer failed to decode ids (an id outside its vocabulary, say).
#[derive(Debug, Clone, thiserror::Error)]
#[error("detokenization failed: {0}")]
pub struct DetokenizeError(pub String);

/// Per-sequence incremental decoding state.
#[derive(Clone, Debug)]
pub struct IncrementalDetokenizer {
    /// The decoding window: already-emitted context, then tokens not yet turned into text.
    tokens: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
    skip_special_tokens: bool,
}

impl IncrementalDetokenizer {
    /// State for a sequence whose prompt is `prompt` (only its last few tokens are kept as context).
    pub fn new(prompt: &[u32], skip_special_tokens: bool) -> Self {
        let context = &prompt[prompt.len().saturating_sub(PROMPT_CONTEXT)..];
        IncrementalDetokenizer {
            tokens: context.to_vec(),
            prefix_offset: 0,
            read_offset: context.len(),
            skip_special_tokens,
        }
    }

    /// Adds a generated token and returns the text it completes (often empty while a multi-byte
    /// character is split across tokens).
    pub fn step(&mut self, tokenizer: &Tokenizer, token: u32) -> Result<String, DetokenizeError> {
        self.tokens.push(token);
        self.read(tokenizer, false)
    }

    /// Returns any text still held back (an incomplete character at the very end is emitted as
    /// U+FFFD). Call once when the sequence finishes.
    pub fn flush(&mut self, tokenizer: &Tokenizer) -> Result<String, DetokenizeError> {
        self.read(tokenizer, true)
    }

    /// Tokens in the decoding window (bounded, whatever the output length).
    pub fn window_len(&self) -> usize {
        self.tokens.len()
    }

    fn read(&mut self, tokenizer: &Tokenizer, flush: bool) -> Result<String, DetokenizeError> {
        if self.read_offset == self.tokens.len() {
            return Ok(String::new());
        }
        let decode = |ids: &[u32]| {
            tokenizer
                .decode(ids, self.skip_special_tokens)
                .map_err(|e| DetokenizeError(e.to_string()))
        };
        let prefix = decode(&self.tokens[self.prefix_offset..self.read_offset])?;
        let full = decode(&self.tokens[self.prefix_offset..])?;
        if full.len() <= prefix.len() && !flush {
            // Nothing visible yet (a special token skipped, or a partial character merged away).
            return Ok(String::new());
        }
        if full.ends_with('\u{FFFD}') && !flush {
            return Ok(String::new());
        }
        let delta = match full.strip_prefix(prefix.as_str()) {
            Some(rest) => rest.to_string(),
            None => match full.strip_prefix(prefix.trim_end_matches('\u{FFFD}')) {
                // The prefix ended in a partial character (say, the prompt's last token) that the
                // new tokens completed: the completed character is new text.
                Some(rest) => rest.to_string(),
                // A decoder that rewrote earlier text: take what lies past the old prefix's length.
                None => full
                    .get(floor_char_boundary(&full, prefix.len())..)
                    .unwrap_or_default()
                    .to_string(),
            },
        };
        self.prefix_offset = self.read_offset;
        self.read_offset = self.tokens.len();
        self.tokens.drain(..self.prefix_offset);
        self.read_offset -= self.prefix_offset;
        self.prefix_offset = 0;
        Ok(delta)
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::byte_level_tokenizer;

    #[test]
    fn multibyte_characters_split_across_tokens_are_emitted_whole() {
        let tok = byte_level_tokenizer(&[]);
        let text = "héllo 世界 🎉!";
        let ids = tok.encode(text, false).unwrap().get_ids().to_vec();
        assert!(ids.len() > text.chars().count(), "bytes, not chars");
        let mut d = IncrementalDetokenizer::new(&[], true);
        let mut out = String::new();
        let mut deltas = Vec::new();
        for &id in &ids {
            let delta = d.step(&tok, id).unwrap();
            assert!(!delta.contains('\u{FFFD}'), "half a character in {delta:?}");
            out.push_str(&delta);
            deltas.push(delta);
            assert!(d.window_len() <= 8, "window must stay bounded");
        }
        out.push_str(&d.flush(&tok).unwrap());
        assert_eq!(out, text);
        // The 4-byte emoji comes out once, on its last byte.
        assert!(deltas.iter().any(|d| d == "🎉"));
    }

    #[test]
    fn merged_tokens_special_tokens_and_prompt_context() {
        let tok = byte_level_tokenizer(&[("h", "e"), ("he", "l"), ("hel", "l"), ("hell", "o")]);
        let prompt = tok.encode("say:", false).unwrap().get_ids().to_vec();
        let ids = tok
            .encode(" hello hello", false)
            .unwrap()
            .get_ids()
            .to_vec();
        let eos = tok.token_to_id("<eos>").unwrap();
        let mut d = IncrementalDetokenizer::new(&prompt, true);
        let mut out = String::new();
        for &id in ids.iter().chain([eos].iter()) {
            out.push_str(&d.step(&tok, id).unwrap());
        }
        out.push_str(&d.flush(&tok).unwrap());
        assert_eq!(
            out, " hello hello",
            "prompt context is not re-emitted, <eos> skipped"
        );

        let mut keep = IncrementalDetokenizer::new(&prompt, false);
        let text: String = [ids[0], eos]
            .iter()
            .map(|&id| keep.step(&tok, id).unwrap())
            .collect();
        assert_eq!(text, " <eos>");
    }

    #[test]
    fn flush_emits_an_incomplete_tail() {
        let tok = byte_level_tokenizer(&[]);
        let ids = tok.encode("é", false).unwrap().get_ids().to_vec();
        let mut d = IncrementalDetokenizer::new(&[], true);
        assert_eq!(d.step(&tok, ids[0]).unwrap(), "");
        assert_eq!(d.flush(&tok).unwrap(), "\u{FFFD}");
        assert_eq!(d.flush(&tok).unwrap(), "");
    }
}
