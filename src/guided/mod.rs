//! Constrained decoding (structured outputs): a request's [`StructuredOutputs`] becomes a
//! [`Guide`], an llguidance matcher that says, before each token, which tokens keep the output
//! valid (a bitmask, one bit a token, 32 to a word), and follows each sampled token.
//!
//! One [`Grammars`] per model compiles constraints against the model's own vocabulary
//! ([`vocab`]); the vocabulary's trie is built on first use, so a server that never sees a
//! constraint never pays for it. The server compiles a request's guide before it reaches the
//! engine (off the async runtime, within a time limit); the engine gives each of a request's `n`
//! sequences its own copy. Each step the runner computes the masks of the constrained rows (on
//! the GPU, while the forward pass runs), the sampler leaves only the allowed tokens, and the
//! sequence's guide consumes the token it got: a finished grammar ends the sequence, and a guide
//! that fails ends its request with the error.

pub mod gbnf;
pub mod spec;
pub mod vocab;

use std::sync::{Arc, OnceLock};

use llguidance::{Matcher, ParserFactory};
use tokenizers::Tokenizer;
use toktrie::SimpleVob;

pub use spec::StructuredOutputs;

/// Compiles constraints for one model (cheap to clone: shared).
#[derive(Clone)]
pub struct Grammars(Arc<GrammarsInner>);

struct GrammarsInner {
    tokenizer: Arc<Tokenizer>,
    vocab_size: usize,
    eos_ids: Vec<u32>,
    factory: OnceLock<Result<ParserFactory, String>>,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars")
            .field("vocab_size", &self.0.vocab_size)
            .finish_non_exhaustive()
    }
}

impl Grammars {
    /// Grammars over `tokenizer`'s tokens, for a model of `vocab_size` ids whose end-of-sequence
    /// ids are `eos_ids`.
    pub fn new(tokenizer: Arc<Tokenizer>, vocab_size: usize, eos_ids: &[u32]) -> Self {
        Grammars(Arc::new(GrammarsInner {
            tokenizer,
            vocab_size,
            eos_ids: eos_ids.to_vec(),
            factory: OnceLock::new(),
        }))
    }

    fn factory(&self) -> Result<&ParserFactory, String> {
        let inner = &self.0;
        inner
            .factory
            .get_or_init(|| {
                let vocab =
                    vocab::Vocab::new(inner.tokenizer.clone(), inner.vocab_size, &inner.eos_ids)?;
                let mut factory = ParserFactory::new_simple(&vocab.into_env())
                    .map_err(|e| format!("constrained decoding: {e}"))?;
                factory.quiet();
                Ok(factory)
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The guide of `constraint`, compiled, with its first mask computed (so a grammar that
    /// cannot even start fails here, with the compiler's message).
    pub fn compile(&self, constraint: &StructuredOutputs) -> Result<Guide, String> {
        let factory = self.factory()?;
        let grammar = constraint.to_grammar()?;
        let parser = factory.create_parser(grammar).map_err(|e| e.to_string())?;
        let mut guide = Guide {
            matcher: Box::new(Matcher::new(Ok(parser))),
            mask: None,
            failed: None,
        };
        guide.compute_mask();
        match guide.failed {
            Some(e) => Err(e),
            None => Ok(guide),
        }
    }
}

/// One sequence's constraint state: the matcher, and the mask of its current state.
pub struct Guide {
    /// (Boxed: a matcher is large, and sequences and requests move.)
    matcher: Box<Matcher>,
    /// Allowed tokens now (computed once per state).
    mask: Option<SimpleVob>,
    /// Why the guide cannot go on (the grammar failed or cannot be satisfied any more).
    failed: Option<String>,
}

impl Clone for Guide {
    /// An independent copy (the `n` sequences of a request each follow their own tokens).
    fn clone(&self) -> Self {
        Guide {
            matcher: Box::new(self.matcher.deep_clone()),
            mask: self.mask.clone(),
            failed: self.failed.clone(),
        }
    }
}

impl std::fmt::Debug for Guide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guide")
            .field("stopped", &self.matcher.is_stopped())
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl Guide {
    /// Computes the mask of the current state, if not done yet. A failure is kept
    /// ([`Guide::error`]); the mask then allows nothing.
    pub fn compute_mask(&mut self) {
        if self.mask.is_some() || self.failed.is_some() {
            return;
        }
        match self.matcher.compute_mask_or_eos() {
            Ok(mask) if mask.is_zero() => {
                self.failed = Some("the output can no longer satisfy its constraint".into())
            }
            Ok(mask) => self.mask = Some(mask),
            Err(e) => self.failed = Some(format!("constrained decoding failed: {e}")),
        }
    }

    /// The allowed tokens of the current state (computed now if needed); `None` once failed.
    pub fn mask(&mut self) -> Option<&SimpleVob> {
        self.compute_mask();
        self.mask.as_ref()
    }

    /// Follows a sampled token. `Ok(true)` when the grammar is complete and allows nothing more;
    /// an error when the token breaks it (or the guide had failed already).
    pub fn advance(&mut self, token: u32) -> Result<bool, String> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        self.mask = None;
        if let Err(e) = self.matcher.consume_token(token) {
            let e = format!("constrained decoding failed: {e}");
            self.failed = Some(e.clone());
            return Err(e);
        }
        Ok(self.matcher.is_stopped())
    }

    /// Why the guide failed, if it did.
    pub fn error(&self) -> Option<&str> {
        self.failed.as_deref()
    }
}

/// Leaves only the tokens `mask` allows in `row` (the others become -inf). Ids past the mask
/// are not allowed.
pub fn apply_mask(row: &mut [f32], mask: &SimpleVob) {
    let words = mask.as_slice();
    for (chunk, word) in row
        .chunks_mut(32)
        .zip(words.iter().chain(std::iter::repeat(&0)))
    {
        if *word == u32::MAX {
            continue;
        }
        for (bit, x) in chunk.iter_mut().enumerate() {
            if word & (1 << bit) == 0 {
                *x = f32::NEG_INFINITY;
            }
        }
    }
}

#[cfg(test)]
mod tests;
