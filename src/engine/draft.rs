//! The draft model of speculative decoding, loaded beside the target: by the same loader (any
//! architecture and format the target could be, GGUF included), on the same device and dtype,
//! refused unless its tokenizer is the target's. The KV budget is split between the two caches
//! so both hold about the same number of tokens (the draft a few blocks more per sequence, for
//! its guesses).

use candle_core::{DType, Device};
use tokenizers::Tokenizer;

use super::args::{EngineArgs, EngineError};
use super::proposer_cache;
use crate::loader::{self, LoadOptions};
use crate::model::{self, CausalLm, ModelConfig};
use crate::parallel::Parallel;
use crate::runner::draft::{DraftRunner, DraftSettings};
use crate::spec::Speculation;

/// A loaded draft model, before its cache is sized.
pub struct LoadedDraft {
    model: Box<dyn CausalLm>,
    cfg: ModelConfig,
    max_model_len: usize,
}

/// Loads `spec`'s draft model, if it has one, for a target of `tokenizer`.
pub fn load(
    spec: &Speculation,
    args: &EngineArgs,
    device: &Device,
    dtype: DType,
    tokenizer: &Tokenizer,
) -> Result<Option<LoadedDraft>, EngineError> {
    let Some(name) = spec.draft_model() else {
        return Ok(None);
    };
    let start = std::time::Instant::now();
    let loaded = loader::load(
        name,
        &LoadOptions {
            load_format: args.load_format,
            dtype,
            device: device.clone(),
            gguf_matmul: args.gguf_matmul,
            seed: args.seed.wrapping_add(1),
            quantization: None,
        },
    )
    .map_err(|e| EngineError::Config(format!("the draft model {name}: {e}")))?;
    let (ours, theirs) = (tokenizer.get_vocab(true), loaded.tokenizer.get_vocab(true));
    // Every token of the smaller vocabulary at the same id in the larger (a GGUF conversion pads
    // a vocabulary to the embedding's rows).
    let (small, large) = match ours.len() <= theirs.len() {
        true => (&ours, &theirs),
        false => (&theirs, &ours),
    };
    if !small.iter().all(|(t, id)| large.get(t) == Some(id)) {
        return Err(EngineError::Config(format!(
            "the draft model {name} has another vocabulary than the target ({} tokens against \
             {}: tokens of one missing from the other, or at other ids): a draft model must share the target's \
             tokenizer",
            theirs.len(),
            ours.len()
        )));
    }
    let cfg = loaded.config;
    let max_model_len = cfg.max_position_embeddings;
    let model = model::build_sharded(&cfg, &loaded.weights, max_model_len, &Parallel::single())
        .map_err(|e| EngineError::Config(format!("the draft model {name}: {e}")))?;
    tracing::info!(
        draft = name,
        layers = cfg.num_hidden_layers,
        hidden = cfg.hidden_size,
        seconds = start.elapsed().as_secs_f64(),
        "loaded the draft model"
    );
    Ok(Some(LoadedDraft {
        model,
        cfg,
        max_model_len,
    }))
}

impl LoadedDraft {
    /// The draft model's configuration (its cache's layers and heads).
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The runner over a cache of `bytes` on `device`, for a target of `target_vocab` tokens
    /// serving sequences of up to `max_model_len`.
    pub fn into_runner(
        self,
        bytes: u64,
        args: &EngineArgs,
        device: &Device,
        dtype: DType,
        target_vocab: usize,
        max_num_batched_tokens: usize,
    ) -> Result<DraftRunner, EngineError> {
        let bs = args.block_size;
        let (kv, num_blocks) =
            proposer_cache::allocate("the draft model", &self.cfg, bytes, bs, dtype, device)?;
        Ok(DraftRunner::new(
            self.model,
            kv,
            device.clone(),
            num_blocks,
            bs,
            DraftSettings {
                max_model_len: self.max_model_len,
                max_num_batched_tokens,
                target_vocab,
            },
        ))
    }
}
