//! The LM head of the Llama family, Gemma 3 and gpt-oss, whole or, under tensor parallelism, a
//! rank's rows of the vocabulary when the ranks split it evenly (each rank then reads its share
//! of the largest single matrix, and the logits are gathered from the ranks).

use candle_core::Tensor;

use super::ModelError;
use super::config::ModelConfig;
use super::embedding::TokenEmbedding;
use super::layers::Linear;
use super::weights::{Part, Weights};
use crate::parallel::{Parallel, TpRank};

/// An LM head: `[vocab (or a rank's rows of it), hidden]`.
pub struct LmHead {
    linear: Linear,
    /// Whether the head holds one rank's rows (its logits are gathered).
    vocab_parallel: bool,
}

impl LmHead {
    /// `tp`'s head: the embedding table `embed` when `tied` (from a GGUF file, its `token_embd`
    /// as it is stored: on the CPU the embedding's own quantized blocks), else `lm_head.weight`.
    pub fn load(
        w: &Weights,
        cfg: &ModelConfig,
        embed: &TokenEmbedding,
        tied: bool,
        tp: TpRank,
    ) -> Result<Self, ModelError> {
        let (h, vocab_size) = (cfg.hidden_size, cfg.vocab_size);
        let vocab = cfg.vocab_rows(tp);
        let linear = match (tied, w, &vocab) {
            (true, _, None) if matches!(embed, TokenEmbedding::Quantized { .. }) => embed.as_head(),
            (true, Weights::Gguf { .. }, _) => {
                w.linear("model.embed_tokens", h, vocab_size, false)?
            }
            (true, _, None) => embed.as_head(),
            (true, _, Some(r)) => {
                let head = embed.as_head();
                let table = head.dense_weight().ok_or_else(|| {
                    ModelError::Unsupported("a quantized tied head split between ranks".into())
                })?;
                Linear::dense(table.narrow(0, r.start, r.len())?.contiguous()?, None)
            }
            (false, ..) => {
                let part = vocab.clone().map_or(Part::Whole, Part::Rows);
                w.linear_part("lm_head", (h, vocab_size), false, part)?
            }
        };
        Ok(LmHead {
            linear,
            vocab_parallel: vocab.is_some(),
        })
    }

    /// The whole head's weight `[vocab, hidden]` when it is one dense matrix on this rank (not a
    /// share of the vocabulary, not quantized): what a fused kernel may read in its place.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub fn whole_dense(&self) -> Option<&Tensor> {
        if self.vocab_parallel {
            return None;
        }
        self.linear.dense_weight()
    }

    /// The logits (model dtype) of the rows `h`, every rank's vocabulary rows gathered.
    pub fn forward(&self, h: &Tensor, par: &Parallel) -> Result<Tensor, ModelError> {
        let logits = self.linear.forward(h)?;
        if self.vocab_parallel {
            return Ok(par.gather_columns(&logits)?);
        }
        Ok(logits)
    }
}
