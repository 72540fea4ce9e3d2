//! The token embedding: a dense table, or on the CPU a GGUF-quantized table whose rows are
//! dequantized as they are looked up. A 262,144 x 640 Q8_0 table (Gemma 3 270M) then takes 178 MB
//! instead of 671 MB of f32, loading does not dequantize it, and a tied LM head multiplies by the
//! same blocks (one copy for both).

use std::sync::Arc;

use candle_core::{DType, Module, Tensor};
use candle_nn::Embedding;

use super::ModelError;
use super::gguf_weights::gguf_name;
use super::layers::Linear;
use super::weights::{Dequantize, Weights};
use crate::cpu::QLinear;

/// Token ids to `[tokens, hidden]` rows. (A clone shares the table.)
#[derive(Clone)]
pub enum TokenEmbedding {
    /// A float table.
    Dense(Embedding),
    /// GGUF blocks for our CPU kernels, rows dequantized to `dtype` on lookup.
    Quantized { table: Arc<QLinear>, dtype: DType },
}

impl TokenEmbedding {
    /// `model.embed_tokens.weight` (`[vocab, hidden]`) of `w`.
    pub fn load(w: &Weights, vocab: usize, hidden: usize) -> Result<Self, ModelError> {
        if kept_quantized(w)
            && let Linear::Cpu { weight, .. } =
                w.linear("model.embed_tokens", hidden, vocab, false)?
        {
            let dtype = w.dtype();
            return Ok(TokenEmbedding::Quantized {
                table: weight,
                dtype,
            });
        }
        let table = w.tensor("model.embed_tokens.weight", (vocab, hidden))?;
        Ok(TokenEmbedding::Dense(Embedding::new(table, hidden)))
    }

    /// The table as a tied LM head multiplies by it: the dense `[vocab, hidden]` tensor, or the
    /// quantized blocks themselves.
    pub fn as_head(&self) -> Linear {
        match self {
            TokenEmbedding::Dense(e) => Linear::dense(e.embeddings().clone(), None),
            TokenEmbedding::Quantized { table, .. } => Linear::Cpu {
                weight: Arc::clone(table),
                bias: None,
            },
        }
    }

    /// The rows of `ids` (a vector of token ids), `[tokens, hidden]`.
    pub fn forward(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            TokenEmbedding::Dense(e) => e.forward(ids),
            TokenEmbedding::Quantized { table, dtype } => {
                let ids: Vec<usize> = ids
                    .flatten_all()?
                    .to_vec1::<u32>()?
                    .into_iter()
                    .map(|id| id as usize)
                    .collect();
                if let Some(bad) = ids.iter().find(|&&id| id >= table.rows()) {
                    candle_core::bail!("token id {bad} is past the vocabulary ({})", table.rows());
                }
                let rows = table.dequantize_rows(&ids);
                Tensor::from_vec(rows, (ids.len(), table.cols()), &candle_core::Device::Cpu)?
                    .to_dtype(*dtype)
            }
        }
    }
}

/// Whether `w` is a GGUF file on the CPU whose embedding our kernels take as it is stored.
fn kept_quantized(w: &Weights) -> bool {
    let Weights::Gguf {
        tensors,
        iq4,
        device,
        dequantize,
        ..
    } = w
    else {
        return false;
    };
    let Some(name) = gguf_name("model.embed_tokens.weight") else {
        return false;
    };
    device.is_cpu()
        && *dequantize != Dequantize::All
        && (iq4.contains_key(&name)
            || tensors
                .get(&name)
                .is_some_and(|t| QLinear::supports(t.dtype())))
}
