//! Constrained decoding (structured outputs): a request's [`StructuredOutputs`] becomes a
//! [`Guide`], an llguidance matcher that says, before each token, which tokens keep the output
//! valid (a bitmask, one bit a token, 32 to a word), and follows each sampled token.
//!
//! One [`Grammars`] per model compiles constraints against the model's own vocabulary
//! ([`vocab`]); the vocabulary's trie is built on a thread of its own as the engine starts
//! ([`Grammars::warm_up`]), and recent constraints are kept compiled. The server compiles a request's guide before it reaches the
//! engine (off the async runtime, within a time limit); the engine gives each of a request's `n`
//! sequences its own copy. Each step the runner computes the masks of the constrained rows (on
//! the GPU, while the forward pass runs), the sampler leaves only the allowed tokens, and the
//! sequence's guide checks the token it got against the mask and keeps it for the matcher, which
//! takes it with the next mask (so the matcher's work stays under the forward pass too). A
//! completed grammar allows only EOS, and the sequence ends with the token sampled then; a
//! guide that fails ends its request with the error.

pub mod gbnf;
pub mod schema;
pub mod spec;
pub mod vocab;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

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
    /// JSON schemas' objects take properties they do not name unless they say otherwise (JSON
    /// Schema's reading); false: only named ones ([`schema::close_objects`]).
    allow_additional_properties: bool,
    factory: OnceLock<Result<ParserFactory, String>>,
    /// Recently compiled constraints, by their JSON form: requests repeat their schemas.
    cache: Mutex<HashMap<String, Guide>>,
}

/// Compiled constraints kept for reuse (all dropped when full: simple, and enough for the
/// handful of schemas a deployment sees).
const CACHED_GRAMMARS: usize = 128;

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars")
            .field("vocab_size", &self.0.vocab_size)
            .finish_non_exhaustive()
    }
}

impl Grammars {
    /// Grammars over `tokenizer`'s tokens, for a model of `vocab_size` ids whose end-of-sequence
    /// ids are `eos_ids`. JSON schemas' objects hold only the properties they name unless
    /// `allow_additional_properties` (then an object schema without `additionalProperties`
    /// accepts others, as JSON Schema reads it).
    pub fn new(
        tokenizer: Arc<Tokenizer>,
        vocab_size: usize,
        eos_ids: &[u32],
        allow_additional_properties: bool,
    ) -> Self {
        Grammars(Arc::new(GrammarsInner {
            tokenizer,
            vocab_size,
            eos_ids: eos_ids.to_vec(),
            allow_additional_properties,
            factory: OnceLock::new(),
            cache: Mutex::new(HashMap::new()),
        }))
    }

    /// Builds the vocabulary's trie on a thread of its own now, so the first constrained request
    /// does not wait for it (a 128k vocabulary takes a few hundred milliseconds).
    pub fn warm_up(&self) {
        let this = self.clone();
        let spawned = std::thread::Builder::new()
            .name("pagewise-grammars".into())
            .spawn(move || {
                if let Err(e) = this.factory() {
                    tracing::warn!("constrained decoding is unavailable: {e}");
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("building the constrained-decoding vocabulary later: {e}");
        }
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
    /// cannot even start fails here, with the compiler's message). A constraint compiled
    /// recently is copied from the cache.
    pub fn compile(&self, constraint: &StructuredOutputs) -> Result<Guide, String> {
        let key = serde_json::to_string(constraint).map_err(|e| e.to_string())?;
        if let Some(guide) = self.cache().get(&key) {
            return Ok(guide.clone());
        }
        let guide = self.compile_new(constraint)?;
        let mut cache = self.cache();
        if cache.len() >= CACHED_GRAMMARS {
            cache.clear();
        }
        cache.insert(key, guide.clone());
        Ok(guide)
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, HashMap<String, Guide>> {
        // A panic while holding the lock leaves a map that is still whole: keep using it.
        self.0.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn compile_new(&self, constraint: &StructuredOutputs) -> Result<Guide, String> {
        let factory = self.factory()?;
        let grammar = constraint.to_grammar(!self.0.allow_additional_properties)?;
        let parser = factory.create_parser(grammar).map_err(|e| e.to_string())?;
        let mut guide = Guide {
            matcher: Box::new(Matcher::new(Ok(parser))),
            mask: None,
            failed: None,
            pending: None,
            complete: false,
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
    /// The token sampled last, not yet taken by the matcher.
    pending: Option<u32>,
    /// The matcher took a token after which the grammar allows nothing more.
    complete: bool,
}

impl Clone for Guide {
    /// An independent copy (the `n` sequences of a request each follow their own tokens).
    fn clone(&self) -> Self {
        Guide {
            matcher: Box::new(self.matcher.deep_clone()),
            mask: self.mask.clone(),
            failed: self.failed.clone(),
            pending: self.pending,
            complete: self.complete,
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
    /// Takes the token sampled last (if any) and computes the mask of the state it leads to, if
    /// not done yet: the work of a step, meant for while the GPU runs the forward pass. A failure
    /// is kept ([`Guide::error`]); the mask then allows nothing. A complete grammar's mask allows
    /// only EOS.
    pub fn compute_mask(&mut self) {
        if self.mask.is_some() || self.failed.is_some() {
            return;
        }
        if let Some(token) = self.pending.take() {
            if let Err(e) = self.matcher.consume_token(token) {
                self.failed = Some(format!("constrained decoding failed: {e}"));
                return;
            }
            self.complete = self.matcher.is_stopped();
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

    /// Follows a sampled token: checked against the current mask now (a bit test), taken by the
    /// matcher with the next mask ([`Guide::compute_mask`]), off the step's critical path. An
    /// error when the token is not allowed (or the guide had failed already).
    pub fn advance(&mut self, token: u32) -> Result<(), String> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.pending.is_some() {
            // Two tokens without a mask between them: take the first now.
            self.compute_mask();
            if let Some(e) = &self.failed {
                return Err(e.clone());
            }
        }
        if let Some(mask) = self.mask.take()
            && !mask.is_allowed(token)
        {
            let e = format!("constrained decoding failed: token {token} is not allowed here");
            self.failed = Some(e.clone());
            return Err(e);
        }
        self.pending = Some(token);
        Ok(())
    }

    /// Whether the grammar was complete before the last token: nothing but EOS could follow it,
    /// so the sequence ends there (known once that token's mask was computed).
    pub fn is_complete(&self) -> bool {
        self.complete
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
