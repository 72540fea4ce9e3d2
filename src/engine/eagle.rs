//! The EAGLE-3 head of speculative decoding, loaded beside the target: from a Hugging Face
//! directory (or hub id) holding the head's `config.json` and safetensors, on the target's device
//! and dtype, sharing the target's token embedding when the head has none. Its one-layer cache
//! takes its share of the KV budget as a draft model's does (the same tokens as the target's).

use std::path::Path;

use candle_core::{DType, Device};

use super::args::{EngineArgs, EngineError};
use super::proposer_cache;
use crate::loader::{self, hub};
use crate::model::checkpoint::Checkpoint;
use crate::model::eagle3::{Eagle3Config, Eagle3Head};
use crate::model::weights::Weights;
use crate::model::{CausalLm, ModelConfig};
use crate::runner::eagle::EagleRunner;

/// A loaded head, before its cache is sized.
pub struct LoadedHead {
    head: Eagle3Head,
    /// The target layers whose hidden states it reads.
    pub aux_layers: Vec<usize>,
}

/// Loads the head `name` for `target` (serving up to `max_model_len` positions).
pub fn load(
    name: &str,
    device: &Device,
    dtype: DType,
    target: &dyn CausalLm,
    max_model_len: usize,
) -> Result<LoadedHead, EngineError> {
    let start = std::time::Instant::now();
    let err = |e: String| EngineError::Config(format!("the EAGLE-3 head {name}: {e}"));
    let dir = match Path::new(name) {
        p if p.is_dir() => p.to_path_buf(),
        _ if hub::is_repo_id(name) => hub::resolve(name).map_err(|e| err(e.to_string()))?,
        _ => return Err(err("not a directory or a Hugging Face repo id".into())),
    };
    let text = std::fs::read_to_string(dir.join("config.json"))
        .map_err(|e| err(format!("{}: {e}", dir.join("config.json").display())))?;
    let cfg = Eagle3Config::parse(&text).map_err(|e| err(e.to_string()))?;
    let target_cfg = target.config();
    let aux_layers = cfg
        .aux_layers_for(target_cfg.num_hidden_layers)
        .map_err(|e| err(e.to_string()))?;
    if cfg.target_hidden_size != target_cfg.hidden_size {
        return Err(err(format!(
            "it reads hidden states of {} features, the target's are {}",
            cfg.target_hidden_size, target_cfg.hidden_size
        )));
    }
    let embed = target
        .token_embedding()
        .ok_or_else(|| err(format!("{} shares no embedding", target_cfg.arch.name)))?;
    let paths = loader::safetensors_files(&dir).map_err(|e| err(e.to_string()))?;
    // SAFETY: as the target's checkpoint: mapped read-only, never written by pagewise.
    let files = unsafe { Checkpoint::open(&paths) }.map_err(|e| err(e.to_string()))?;
    let d2t = match files.has("d2t") {
        true => Some(
            files
                .load("d2t", &Device::Cpu)
                .and_then(|t| t.to_dtype(DType::I64)?.to_vec1::<i64>())
                .map_err(|e| err(format!("d2t: {e}")))?,
        ),
        false => None,
    };
    let weights = Weights::Safetensors {
        files,
        dtype,
        device: device.clone(),
        quantization: None,
        quantize_fp8: false,
    };
    let head = Eagle3Head::load(
        cfg,
        &weights,
        d2t,
        embed,
        target_cfg.vocab_size,
        max_model_len,
    )
    .map_err(|e| err(e.to_string()))?;
    tracing::info!(
        head = name,
        aux_layers = ?aux_layers,
        draft_vocab = head.config().draft_vocab_size,
        seconds = start.elapsed().as_secs_f64(),
        "loaded the EAGLE-3 head"
    );
    Ok(LoadedHead { head, aux_layers })
}

impl LoadedHead {
    /// The head's one layer as a model configuration (its cache's layer and heads).
    pub fn config(&self) -> &ModelConfig {
        &self.head.config().layer
    }

    /// The runner over a cache of `bytes` on `device`.
    pub fn into_runner(
        self,
        bytes: u64,
        args: &EngineArgs,
        device: &Device,
        dtype: DType,
    ) -> Result<EagleRunner, EngineError> {
        let bs = args.block_size;
        let (kv, num_blocks) =
            proposer_cache::allocate("the EAGLE-3 head", self.config(), bytes, bs, dtype, device)?;
        Ok(EagleRunner::new(
            self.head,
            kv,
            device.clone(),
            num_blocks,
            bs,
        ))
    }
}
