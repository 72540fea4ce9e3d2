//! Speculative decoding: a cheap proposer guesses the next tokens of each decoding sequence, and
//! one step of the target model verifies them all (`crate::runner`'s verify step). Configured as
//! vLLM's `--speculative-config` JSON.
//!
//! Proposers: n-gram prompt lookup ([`ngram`]), a draft model (`crate::runner::draft`, which
//! runs it) and an EAGLE-3 head (`crate::runner::eagle`). The older EAGLE format is refused by
//! name.

pub mod ngram;
pub mod tuner;

use serde::Deserialize;

/// `--speculative-config`, with vLLM's field names.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeculativeConfig {
    /// The proposer: `ngram` (prompt lookup), `draft_model` (the default when `model` is set) or
    /// `eagle3` (an EAGLE-3 head in `model`). `eagle` (EAGLE-1/2 heads) is not implemented yet.
    #[serde(default)]
    pub method: Option<String>,
    /// The draft model: a directory, hub id or GGUF file, as `--model` takes; it must share the
    /// target's vocabulary. For `eagle3`, the head's directory (or hub id).
    #[serde(default)]
    pub model: Option<String>,
    /// Draft tokens per step, at most.
    pub num_speculative_tokens: usize,
    /// n-gram: the shortest suffix looked up in the sequence's earlier tokens.
    #[serde(default)]
    pub prompt_lookup_min: Option<usize>,
    /// n-gram: the longest suffix looked up (tried first).
    #[serde(default)]
    pub prompt_lookup_max: Option<usize>,
    /// No drafts while more sequences than this run (vLLM's `disable_by_batch_size`): large
    /// batches are bound by compute, where verifying guesses costs more than it saves.
    #[serde(default)]
    pub disable_by_batch_size: Option<usize>,
    /// pagewise's own (not vLLM's): whether each step's draft length is tuned from the measured
    /// step costs and acceptance (`spec::tuner`; the default), or always
    /// `num_speculative_tokens` where a proposer has that many (`false`).
    #[serde(default)]
    pub adaptive: Option<bool>,
}

/// The most draft tokens a step verifies per sequence.
pub const MAX_SPECULATIVE_TOKENS: usize = 16;

/// A checked speculative configuration: what the engine runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Speculation {
    /// Who guesses the drafts.
    pub proposer: Proposer,
    /// Draft tokens per step, at most.
    pub num_speculative_tokens: usize,
    /// See [`SpeculativeConfig::disable_by_batch_size`].
    pub disable_by_batch_size: Option<usize>,
    /// See [`SpeculativeConfig::adaptive`].
    pub adaptive: bool,
}

/// Who guesses the drafts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Proposer {
    /// n-gram prompt lookup.
    Ngram(ngram::NgramConfig),
    /// A draft model (path, hub id or GGUF file), guessing greedily.
    DraftModel(String),
    /// An EAGLE-3 head (directory or hub id), guessing greedily from the target's hidden states.
    Eagle3(String),
}

impl Speculation {
    /// The draft model to load, if the proposer is one.
    pub fn draft_model(&self) -> Option<&str> {
        match &self.proposer {
            Proposer::DraftModel(m) => Some(m),
            Proposer::Ngram(_) | Proposer::Eagle3(_) => None,
        }
    }

    /// The EAGLE-3 head to load, if the proposer is one.
    pub fn eagle3_head(&self) -> Option<&str> {
        match &self.proposer {
            Proposer::Eagle3(m) => Some(m),
            Proposer::Ngram(_) | Proposer::DraftModel(_) => None,
        }
    }
}

impl SpeculativeConfig {
    /// Parses `--speculative-config`'s JSON.
    pub fn parse(json: &str) -> Result<Self, String> {
        serde_json::from_str(json).map_err(|e| format!("--speculative-config: {e}"))
    }

    /// Checks the settings; refuses, by name, what is not implemented.
    pub fn check(&self) -> Result<Speculation, String> {
        let method = match (&self.method, &self.model) {
            (Some(m), _) => m.as_str(),
            (None, Some(_)) => "draft_model",
            (None, None) => {
                return Err(
                    "--speculative-config: set \"method\" (\"ngram\") or a draft \
                            \"model\""
                        .into(),
                );
            }
        };
        let k = self.num_speculative_tokens;
        if k == 0 || k > MAX_SPECULATIVE_TOKENS {
            return Err(format!(
                "--speculative-config: num_speculative_tokens must be 1 to \
                 {MAX_SPECULATIVE_TOKENS}, got {k}"
            ));
        }
        if self.disable_by_batch_size == Some(0) {
            return Err("--speculative-config: disable_by_batch_size must be at least 1".into());
        }
        let proposer = match method {
            "ngram" => Proposer::Ngram(self.ngram(k)?),
            "draft_model" => Proposer::DraftModel(self.draft(method)?),
            "eagle3" => Proposer::Eagle3(self.draft(method)?),
            other => {
                return Err(format!(
                    "--speculative-config: method {other:?} is not implemented yet; \"ngram\" \
                     (prompt lookup), \"draft_model\" and \"eagle3\" are"
                ));
            }
        };
        Ok(Speculation {
            proposer,
            num_speculative_tokens: k,
            disable_by_batch_size: self.disable_by_batch_size,
            adaptive: self.adaptive.unwrap_or(true),
        })
    }

    /// The n-gram proposer's settings.
    fn ngram(&self, k: usize) -> Result<ngram::NgramConfig, String> {
        if self.model.is_some() {
            return Err("--speculative-config: the ngram method takes no \"model\"".into());
        }
        // vLLM's defaults: 5 and 5; one given, the other equals it.
        let (min, max) = match (self.prompt_lookup_min, self.prompt_lookup_max) {
            (None, None) => (5, 5),
            (Some(n), None) | (None, Some(n)) => (n, n),
            (Some(min), Some(max)) => (min, max),
        };
        if min == 0 || min > max {
            return Err(format!(
                "--speculative-config: need 1 <= prompt_lookup_min ({min}) <= prompt_lookup_max \
                 ({max})"
            ));
        }
        Ok(ngram::NgramConfig {
            num_speculative_tokens: k,
            min,
            max,
        })
    }

    /// The draft model's (or head's) name, for `method`.
    fn draft(&self, method: &str) -> Result<String, String> {
        if self.prompt_lookup_min.is_some() || self.prompt_lookup_max.is_some() {
            return Err(format!(
                "--speculative-config: prompt_lookup_min / prompt_lookup_max are the ngram \
                 method's; {method} takes neither"
            ));
        }
        match self.model.as_deref() {
            Some(m) if !m.trim().is_empty() => Ok(m.to_string()),
            _ => Err(format!(
                "--speculative-config: the {method} method needs a \"model\""
            )),
        }
    }
}

/// Counters of drafts and acceptance (vLLM's `spec_decode_*` metrics).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Sequence-steps that verified at least one draft token.
    pub num_drafts: u64,
    /// Draft tokens verified.
    pub num_draft_tokens: u64,
    /// Draft tokens accepted.
    pub num_accepted_tokens: u64,
    /// Accepted draft tokens by their position in the draft (0 = the first).
    pub accepted_per_pos: Vec<u64>,
}

impl SpecStats {
    /// Counts one sequence's verify: `drafted` drafts, of which the first `accepted` held.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        self.num_drafts += 1;
        self.num_draft_tokens += drafted as u64;
        self.num_accepted_tokens += accepted as u64;
        if self.accepted_per_pos.len() < drafted {
            self.accepted_per_pos.resize(drafted, 0);
        }
        for n in &mut self.accepted_per_pos[..accepted] {
            *n += 1;
        }
    }

    /// Accepted draft tokens per draft token (0 before any).
    pub fn acceptance_rate(&self) -> f64 {
        match self.num_draft_tokens {
            0 => 0.0,
            n => self.num_accepted_tokens as f64 / n as f64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ngram_configs_are_checked_and_others_refused_by_name() {
        let ok = SpeculativeConfig::parse(
            r#"{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":2,"prompt_lookup_max":5}"#,
        )
        .unwrap()
        .check()
        .unwrap();
        let Proposer::Ngram(ngram) = &ok.proposer else {
            panic!("{ok:?}")
        };
        assert_eq!(
            (ngram.min, ngram.max, ngram.num_speculative_tokens),
            (2, 5, 4)
        );
        for json in [
            r#"{"model":"some/draft","num_speculative_tokens":4}"#,
            r#"{"method":"draft_model","model":"some/draft","num_speculative_tokens":4}"#,
        ] {
            let ok = SpeculativeConfig::parse(json).unwrap().check().unwrap();
            assert_eq!(ok.draft_model(), Some("some/draft"));
            assert_eq!(ok.num_speculative_tokens, 4);
        }
        let ok = SpeculativeConfig::parse(
            r#"{"method":"eagle3","model":"some/head","num_speculative_tokens":3}"#,
        )
        .unwrap()
        .check()
        .unwrap();
        assert_eq!(
            (ok.eagle3_head(), ok.draft_model()),
            (Some("some/head"), None)
        );
        for (json, named) in [
            (
                r#"{"method":"eagle","model":"x","num_speculative_tokens":4}"#,
                "\"eagle\" is not implemented",
            ),
            (
                r#"{"method":"eagle3","num_speculative_tokens":4}"#,
                "eagle3 method needs a \"model\"",
            ),
            (
                r#"{"method":"draft_model","num_speculative_tokens":4}"#,
                "needs a \"model\"",
            ),
            (
                r#"{"model":"d","num_speculative_tokens":4,"prompt_lookup_max":3}"#,
                "prompt_lookup_max",
            ),
            (
                r#"{"method":"ngram","model":"d","num_speculative_tokens":4}"#,
                "takes no \"model\"",
            ),
            (
                r#"{"method":"ngram","num_speculative_tokens":0}"#,
                "num_speculative_tokens",
            ),
            (
                r#"{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_min":4,"prompt_lookup_max":2}"#,
                "prompt_lookup_min (4)",
            ),
        ] {
            let e = SpeculativeConfig::parse(json).unwrap().check().unwrap_err();
            assert!(e.contains(named), "{json}: {e}");
        }
        let e = SpeculativeConfig::parse(
            r#"{"method":"ngram","num_speculative_tokens":3,"draft_tensor_parallel_size":1}"#,
        )
        .unwrap_err();
        assert!(e.contains("draft_tensor_parallel_size"), "{e}");
    }

    #[test]
    fn stats_count_acceptance_by_position() {
        let mut s = SpecStats::default();
        s.record(3, 2);
        s.record(2, 0);
        s.record(0, 0);
        assert_eq!(
            (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens),
            (2, 5, 2)
        );
        assert_eq!(s.accepted_per_pos, [1, 1, 0]);
        assert!((s.acceptance_rate() - 0.4).abs() < 1e-12);
    }
}
