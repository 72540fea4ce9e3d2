//! OpenAI's gpt-oss (`GptOssForCausalLM`): a mixture of experts (softmax over the top-k router
//! logits, experts with biases and a clamped SwiGLU, `(up + 1) * gate * sigmoid(1.702 gate)`);
//! attention with biases and a learned sink logit per head; sliding-window layers (128 positions)
//! between full ones; YaRN rotary. Expert weights come dequantized or as MXFP4 (dequantized at
//! load). On a GPU its attention (with sinks) runs every row through the decode kernel; its
//! experts take the device path of the other mixtures for decode steps (biases and the clamped
//! SwiGLU in the kernels), so decode runs in CUDA graphs.

use candle_core::Tensor;

use super::attention::KvCache;
use super::batch::ForwardBatch;
use super::config::ModelConfig;
use super::embedding::TokenEmbedding;
use super::layers::Linear;
use super::lm_head::LmHead;
use super::moe::{Expert, MoeSettings, SparseMoe};
use super::norm::RmsNorm;
use super::qkv::{Heads, QkvProj, attention_with_sinks, o_proj};
use super::rotary::Rotary;
use super::weights::Weights;
use super::{CausalLm, ModelError};
use crate::parallel::{ExpertShard, Parallel, TpRank};

pub mod config;

/// Layer `layer`'s experts (`model.layers.N.mlp.experts`): gate/up `[experts, hidden, 2 * inter]`
/// (gate and up interleaved by column) and down `[experts, inter, hidden]`, each with a bias
/// `[experts, out]`; or the same as MXFP4 blocks, stored `[out, in]`. Each expert becomes a
/// gate-then-up projection and a down projection, as the other mixtures' experts; under tensor
/// parallelism, this rank's slice of each, under expert parallelism its whole experts
/// ([`shard`]).
pub(super) fn experts(
    w: &Weights,
    layer: usize,
    hidden: usize,
    s: &MoeSettings,
    split: ExpertShard,
) -> Result<Vec<Expert>, ModelError> {
    let (n, i) = (s.num_experts, s.expert_intermediate);
    if let Weights::Gguf { .. } = w {
        if !split.is_whole_model() {
            return Err(ModelError::Unsupported(
                "tensor parallelism reads safetensors or dummy weights; GGUF files are not sharded"
                    .into(),
            ));
        }
        return gguf_experts(w, layer, hidden, s);
    }
    let p = format!("model.layers.{layer}.mlp.experts");
    // Each expert's [out, in] weights: from MXFP4, or transposed from the stacked [in, out].
    let stacked = |name: &str, (rows, cols): (usize, usize)| -> Result<Vec<Tensor>, ModelError> {
        let name = format!("{p}.{name}");
        if let Some(per_expert) = super::mxfp4::experts(w, &name, n, (rows, cols))? {
            return Ok(per_expert);
        }
        let all = w.tensor(&name, (n, cols, rows))?;
        (0..n).map(|e| Ok(all.get(e)?.t()?.contiguous()?)).collect()
    };
    let gate_up = stacked("gate_up_proj", (2 * i, hidden))?;
    let down = stacked("down_proj", (hidden, i))?;
    let gate_up_bias = w.tensor(&format!("{p}.gate_up_proj_bias"), (n, 2 * i))?;
    let down_bias = w.tensor(&format!("{p}.down_proj_bias"), (n, hidden))?;
    // Rows 2j (gate) and 2j + 1 (up) of the interleaved projection, as the gate rows then the up
    // rows.
    let halves = |t: &Tensor| -> candle_core::Result<Tensor> {
        let pairs = t.reshape((i, 2, ()))?;
        let half = |k| pairs.narrow(1, k, 1)?.squeeze(1);
        Tensor::cat(&[half(0)?, half(1)?], 0)
    };
    let held = split.experts(n);
    gate_up
        .into_iter()
        .zip(down)
        .enumerate()
        .skip(held.start)
        .take(held.len())
        .map(|(e, (gu, d))| {
            let gu_bias = halves(&gate_up_bias.get(e)?)?.flatten_all()?;
            shard((halves(&gu)?, gu_bias), (d, down_bias.get(e)?), s, split)
        })
        .collect()
}

/// This rank's part of one expert, given whole: gate/up (`[2 * inter, hidden]`, the gate rows
/// first) and down (`[hidden, inter]`), each with its bias. Under tensor parallelism a rank keeps
/// rows `part` of each half and down's columns `part` (the intermediate slice, as a dense MLP is
/// split), and only the leading rank keeps down's bias, which is then added once before the
/// ranks' parts are summed; under expert parallelism a held expert is kept whole.
fn shard(
    (gate_up, gate_up_bias): (Tensor, Tensor),
    (down, down_bias): (Tensor, Tensor),
    s: &MoeSettings,
    split: ExpertShard,
) -> Result<Expert, ModelError> {
    let (i, part) = (s.expert_intermediate, split.columns(s.expert_intermediate));
    if part.len() == i {
        return Ok(Expert {
            gate_up: Linear::dense(gate_up, Some(gate_up_bias)),
            down: Linear::dense(down, Some(down_bias)),
        });
    }
    let halves = |t: &Tensor| {
        let half = |start| t.narrow(0, start, part.len());
        Tensor::cat(&[half(part.start)?, half(i + part.start)?], 0)
    };
    let down = down.narrow(1, part.start, part.len())?.contiguous()?;
    Ok(Expert {
        gate_up: Linear::dense(halves(&gate_up)?, Some(halves(&gate_up_bias)?)),
        down: Linear::dense(down, split.adds_down_bias().then_some(down_bias)),
    })
}

/// A layer's experts as MXFP4 stacks, the gate rows before the up rows, with their biases
/// (`[experts, 2 * inter]`, gate first, and `[experts, hidden]`).
#[cfg(feature = "cuda")]
pub(super) struct Mxfp4Experts {
    pub gate_up: super::mxfp4::Mxfp4Host,
    pub down: super::mxfp4::Mxfp4Host,
    pub gate_up_bias: Tensor,
    /// `None` on a tensor-parallel rank that does not lead (experts sliced).
    pub down_bias: Option<Tensor>,
}

/// Layer `layer`'s experts kept in MXFP4, when the model runs on a GPU in f16/bf16 (where the
/// expert kernels read MXFP4 as it is), the experts fit those kernels, and the weights hold them
/// so: safetensors with `_blocks` and `_scales`, llama.cpp's GGUF, or dummy weights (which stand
/// for gpt-oss's checkpoints, MXFP4 all). Under tensor parallelism, this rank's slice (as
/// [`shard`] cuts it), when it is whole runs of 32; under expert parallelism, its whole experts. `None` otherwise: the experts are then dequantized at
/// load ([`experts`]).
#[cfg(feature = "cuda")]
pub(super) fn mxfp4_experts(
    w: &Weights,
    layer: usize,
    hidden: usize,
    s: &MoeSettings,
    split: ExpertShard,
) -> Result<Option<Mxfp4Experts>, ModelError> {
    use super::mxfp4::Mxfp4Host;
    use candle_core::DType;
    let (n, i) = (s.num_experts, s.expert_intermediate);
    let part = split.columns(i);
    let dtype = w.dtype();
    if !w.device().is_cuda()
        || !matches!(dtype, DType::F16 | DType::BF16)
        || !hidden.is_multiple_of(32)
        || !part.start.is_multiple_of(32)
        || !part.len().is_multiple_of(32)
        || n > pagewise_kernels::moe_max_experts()
        || !pagewise_kernels::moe_fits(s.top_k, part.len(), dtype)
    {
        return Ok(None);
    }
    let p = format!("model.layers.{layer}.mlp.experts");
    let (gate_up, down, gate_up_bias, down_bias) = match w {
        Weights::Gguf { .. } => {
            let name = |kind: &str| format!("blk.{layer}.ffn_{kind}_exps");
            let host = |kind: &str| w.gguf_mxfp4(&format!("{}.weight", name(kind)));
            let (Some(gate), Some(up), Some(down)) = (host("gate")?, host("up")?, host("down")?)
            else {
                return Ok(None);
            };
            let bias = |kind: &str, width| w.tensor(&format!("{}.bias", name(kind)), (n, width));
            let gate_up_bias = Tensor::cat(&[bias("gate", i)?, bias("up", i)?], 1)?;
            let gate_up = Mxfp4Host::stack_rows(&gate, &up);
            (gate_up, down, gate_up_bias, bias("down", hidden)?)
        }
        Weights::Safetensors { .. } => {
            let host = |name: &str, dims| super::mxfp4::safetensors_host(w, name, n, dims);
            let (Some(gate_up), Some(down)) = (
                host(&format!("{p}.gate_up_proj"), (2 * i, hidden))?,
                host(&format!("{p}.down_proj"), (hidden, i))?,
            ) else {
                return Ok(None);
            };
            // The bias's columns interleave gate and up, as the rows do.
            let bias = w.tensor(&format!("{p}.gate_up_proj_bias"), (n, 2 * i))?;
            let bias = bias
                .reshape((n, i, 2))?
                .transpose(1, 2)?
                .reshape((n, 2 * i))?;
            let down_bias = w.tensor(&format!("{p}.down_proj_bias"), (n, hidden))?;
            (gate_up.halves_from_interleaved(), down, bias, down_bias)
        }
        Weights::Dense { .. } => {
            let seed = 2 * layer as u64;
            (
                Mxfp4Host::random((n, 2 * i, hidden), seed),
                Mxfp4Host::random((n, hidden, i), seed + 1),
                w.tensor(&format!("{p}.gate_up_proj_bias"), (n, 2 * i))?,
                w.tensor(&format!("{p}.down_proj_bias"), (n, hidden))?,
            )
        }
    };
    if gate_up.dims != (n, 2 * i, hidden) || down.dims != (n, hidden, i) {
        return Err(ModelError::Config(format!(
            "layer {layer}'s MXFP4 experts: {:?} and {:?} for {n} experts of {hidden} x {i}",
            gate_up.dims, down.dims
        )));
    }
    if part.len() == i {
        // Every expert, or under expert parallelism this rank's whole ones.
        let held = split.experts(n);
        let rows = |b: Tensor| b.narrow(0, held.start, held.len())?.contiguous();
        return Ok(Some(Mxfp4Experts {
            gate_up: gate_up.experts_part(&held),
            down: down.experts_part(&held),
            gate_up_bias: rows(gate_up_bias)?,
            down_bias: Some(rows(down_bias)?),
        }));
    }
    let bias_half = |start| gate_up_bias.narrow(1, start, part.len());
    Ok(Some(Mxfp4Experts {
        gate_up: gate_up.halves_part(&part),
        down: down.cols_part(&part),
        gate_up_bias: Tensor::cat(&[bias_half(part.start)?, bias_half(i + part.start)?], 1)?,
        down_bias: split.adds_down_bias().then_some(down_bias.contiguous()?),
    }))
}

/// A layer's experts from llama.cpp's GGUF layout: `blk.N.ffn_{gate,up,down}_exps` stacked
/// `[experts, out, in]` (MXFP4 in its files, dequantized here), each with a bias `[experts,
/// out]`.
fn gguf_experts(
    w: &Weights,
    layer: usize,
    hidden: usize,
    s: &MoeSettings,
) -> Result<Vec<Expert>, ModelError> {
    let (n, i) = (s.num_experts, s.expert_intermediate);
    let stack = |kind: &str, rows: usize, cols: usize| -> Result<(Tensor, Tensor), ModelError> {
        let name = format!("blk.{layer}.ffn_{kind}_exps");
        let weight = w.tensor(&format!("{name}.weight"), (n, rows, cols))?;
        Ok((weight, w.tensor(&format!("{name}.bias"), (n, rows))?))
    };
    let (gate, gate_bias) = stack("gate", i, hidden)?;
    let (up, up_bias) = stack("up", i, hidden)?;
    let (down, down_bias) = stack("down", hidden, i)?;
    (0..n)
        .map(|e| {
            let gate_up = Tensor::cat(&[gate.get(e)?, up.get(e)?], 0)?;
            let gate_up_bias = Tensor::cat(&[gate_bias.get(e)?, up_bias.get(e)?], 0)?;
            Ok(Expert {
                gate_up: Linear::dense(gate_up, Some(gate_up_bias)),
                down: Linear::dense(down.get(e)?, Some(down_bias.get(e)?)),
            })
        })
        .collect()
}

struct Layer {
    input_norm: RmsNorm,
    qkv: QkvProj,
    o: Linear,
    /// Each head's sink logit (f32 `[heads]`).
    sinks: Tensor,
    post_norm: RmsNorm,
    moe: SparseMoe,
    sliding: bool,
}

/// A gpt-oss model, or one tensor-parallel rank's shard of it: attention heads (and their sinks)
/// and each expert's intermediate slice split as Llama's heads and MLP are, the router whole on
/// every rank, the LM head split by vocabulary rows when they divide.
pub struct GptOss {
    cfg: ModelConfig,
    /// Positions a sliding layer's query sees.
    window: usize,
    embed: TokenEmbedding,
    layers: Vec<Layer>,
    norm: RmsNorm,
    lm_head: LmHead,
    rotary: Rotary,
    par: Parallel,
}

impl GptOss {
    /// Loads the model (`par`'s shard of it); rotary tables cover positions below `max_len`.
    pub fn load(
        cfg: &ModelConfig,
        w: &Weights,
        max_len: usize,
        par: &Parallel,
    ) -> Result<Self, ModelError> {
        let (Some(sliding), Some(moe)) = (&cfg.sliding, &cfg.moe) else {
            return Err(ModelError::Config("gpt-oss without its settings".into()));
        };
        let (h, nq) = (cfg.hidden_size, cfg.num_attention_heads);
        let eps = cfg.norm_eps;
        let tp = par.rank;
        let embed = TokenEmbedding::load(w, cfg.vocab_size, h)?;
        let lm_head = LmHead::load(w, cfg, &embed, cfg.tie_word_embeddings, tp)?;
        let q_heads = cfg.q_heads(tp);
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| {
                let p = format!("model.layers.{i}");
                let attn = format!("{p}.self_attn");
                // (llama.cpp's names for the two tensors that have no Llama counterpart.)
                let gguf = matches!(w, Weights::Gguf { .. });
                let (sinks, post_norm) = match gguf {
                    true => (
                        format!("blk.{i}.attn_sinks.weight"),
                        format!("blk.{i}.post_attention_norm.weight"),
                    ),
                    false => (
                        format!("{attn}.sinks"),
                        format!("{p}.post_attention_layernorm.weight"),
                    ),
                };
                let sinks = w
                    .tensor(&sinks, nq)?
                    .narrow(0, q_heads.start, q_heads.len())?
                    .to_dtype(candle_core::DType::F32)?;
                Ok(Layer {
                    input_norm: RmsNorm::load(w, &format!("{p}.input_layernorm.weight"), h, eps)?,
                    qkv: QkvProj::load(w, &attn, cfg, tp)?,
                    o: o_proj(w, &attn, cfg, tp)?,
                    sinks,
                    post_norm: RmsNorm::load(w, &post_norm, h, eps)?,
                    moe: SparseMoe::load(w, i, h, moe, par.experts())?,
                    sliding: sliding.sliding[i],
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(GptOss {
            cfg: cfg.clone(),
            window: sliding.window,
            embed,
            layers,
            norm: RmsNorm::load(w, "model.norm.weight", h, eps)?,
            lm_head,
            rotary: Rotary::new(cfg, max_len, w.dtype(), w.device())?,
            par: par.clone(),
        })
    }
}

impl CausalLm for GptOss {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn tp_rank(&self) -> TpRank {
        self.par.rank
    }

    fn graph_batch_limit(&self) -> Option<usize> {
        self.layers.iter().map(|l| l.moe.device_tokens()).min()
    }

    fn forward(&self, batch: &ForwardBatch<'_>, kv: &mut KvCache) -> Result<Tensor, ModelError> {
        let cfg = &self.cfg;
        let tp = self.par.rank;
        let heads = |sliding: bool| Heads {
            q: cfg.q_heads(tp).len(),
            kv: cfg.kv_heads(tp).len(),
            dim: cfg.head_dim,
            scale: 1.0 / (cfg.head_dim as f32).sqrt(),
            window: sliding.then_some(self.window),
        };
        let mut x = self.embed.forward(&batch.input_ids)?;
        let rotary = self.rotary.at(&batch.positions)?;
        let mut h = match self.layers.first() {
            Some(first) => first.input_norm.forward(&x)?,
            None => self.norm.forward(&x)?,
        };
        for (i, layer) in self.layers.iter().enumerate() {
            let attn = attention_with_sinks(
                &layer.qkv,
                i,
                &h,
                &rotary,
                batch,
                kv,
                heads(layer.sliding),
                Some(&layer.sinks),
            )?;
            let o = self.par.all_reduce(layer.o.forward(&attn)?)?;
            let (x_mid, h_mid) = layer.post_norm.add_forward(&x, &o)?;
            let next_norm = self.layers.get(i + 1).map_or(&self.norm, |l| &l.input_norm);
            let moe = self.par.all_reduce(layer.moe.forward(&h_mid)?)?;
            (x, h) = next_norm.add_forward(&x_mid, &moe)?;
        }
        let logits = self.lm_head.forward(&batch.sampled(&h)?, &self.par)?;
        Ok(logits.to_dtype(candle_core::DType::F32)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> Result<ModelConfig, ModelError> {
        ModelConfig::from_hf_json(&format!(
            r#"{{"architectures":["GptOssForCausalLM"],"vocab_size":10,"hidden_size":64,
            "intermediate_size":32,"num_hidden_layers":4,"num_attention_heads":4,
            "num_key_value_heads":2,"head_dim":16,"num_local_experts":4,"num_experts_per_tok":2,
            "max_position_embeddings":4096,"sliding_window":8,
            "rope_scaling":{{"rope_type":"yarn","factor":32.0,"beta_fast":32.0,"beta_slow":1.0,
            "original_max_position_embeddings":128,"truncate":false}},"rope_theta":150000{extra}}}"#
        ))
    }

    #[test]
    fn config_reads_windows_biases_experts_and_yarn() {
        let c = config("").unwrap();
        assert_eq!(c.arch.name, "gpt-oss");
        let g = c.sliding.as_ref().unwrap();
        assert_eq!(
            (g.window, &g.sliding[..]),
            (8, &[true, false, true, false][..])
        );
        // Windows are implemented: the context is not capped at the window.
        assert_eq!(c.max_position_embeddings, 4096);
        assert!(c.qkv_bias && c.o_bias && !c.tie_word_embeddings);
        let moe = c.moe.as_ref().unwrap();
        assert!(moe.renormalize && moe.sparse.iter().all(|&s| s));
        assert_eq!(
            moe.activation,
            crate::model::config::ExpertActivation::ClampedSwiglu {
                alpha: 1.702,
                limit: 7.0
            }
        );
        let y = c.yarn.as_ref().unwrap();
        assert!(!y.truncate && y.factor == 32.0);
        assert!((y.attention_factor - (0.1 * 32f64.ln() + 1.0)).abs() < 1e-12);
        let types = config(
            r#","layer_types":["full_attention","full_attention","sliding_attention","full_attention"],"swiglu_limit":5.0"#,
        )
        .unwrap();
        assert_eq!(types.sliding.unwrap().sliding, [false, false, true, false]);
        assert!(matches!(
            types.moe.unwrap().activation,
            crate::model::config::ExpertActivation::ClampedSwiglu { limit: 5.0, .. }
        ));
        let e = config(r#","layer_types":["full_attention"]"#).unwrap_err();
        assert!(e.to_string().contains("1 layer_types for 4 layers"), "{e}");
    }
}
