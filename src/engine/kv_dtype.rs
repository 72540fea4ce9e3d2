//! The KV cache's elements from `--kv-cache-dtype`: refused before anything loads where an FP8
//! cache cannot be (the CPU, a model that is not 16-bit), then the model's dtype or e4m3 with each
//! layer's scales from the checkpoint.

use candle_core::{DType, Device};

use super::args::{EngineError, KvCacheDtype};
use crate::model::{KvElements, ModelConfig, Weights};

/// Refuses, before anything loads, an FP8 KV cache where there is none: on the CPU, or for a
/// model whose dtype is not 16-bit.
pub(super) fn check_kv_cache_dtype(
    kv: KvCacheDtype,
    device: &Device,
    dtype: DType,
) -> Result<(), EngineError> {
    if kv == KvCacheDtype::Auto {
        return Ok(());
    }
    if device.is_cpu() {
        return Err(EngineError::Config(
            "--kv-cache-dtype fp8 needs a GPU: the CPU's KV cache is f32 (use \
             --kv-cache-dtype auto)"
                .into(),
        ));
    }
    if !matches!(dtype, DType::BF16 | DType::F16) {
        return Err(EngineError::Config(format!(
            "--kv-cache-dtype fp8 needs a bf16 or f16 model, not {dtype:?} (--dtype)"
        )));
    }
    Ok(())
}

/// The GPU cache's elements for `--kv-cache-dtype`: the model's `dtype`, or e4m3 with each
/// layer's scales from the checkpoint (1.0 where it has none, as vLLM).
pub(super) fn kv_elements(
    kv: KvCacheDtype,
    dtype: DType,
    weights: &Weights,
    cfg: &ModelConfig,
) -> Result<KvElements, EngineError> {
    let scales = weights
        .kv_scales(cfg.num_hidden_layers)
        .map_err(EngineError::Config)?;
    match kv {
        KvCacheDtype::Auto => {
            if scales.is_some() {
                tracing::info!(
                    "the checkpoint has FP8 KV-cache scales; --kv-cache-dtype auto keeps the \
                     cache in {dtype:?} and does not use them"
                );
            }
            Ok(KvElements::Model(dtype))
        }
        KvCacheDtype::Fp8E4m3 => {
            let from = if scales.is_some() {
                "the checkpoint's k_scale / v_scale"
            } else {
                "1.0: the checkpoint has none"
            };
            tracing::info!("KV cache in FP8 e4m3, one byte a value; scales: {from}");
            Ok(KvElements::Fp8 {
                dtype,
                scales: scales.unwrap_or_else(|| vec![(1.0, 1.0); cfg.num_hidden_layers]),
            })
        }
    }
}
