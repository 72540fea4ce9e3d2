//! Mixture-of-experts MLPs (Mixtral, Qwen3-MoE, gpt-oss): a router scores every expert for each token,
//! the token goes through its top-k experts, and their outputs are summed with the routing
//! weights. This is the reference path (candle ops, one expert at a time over the tokens that
//! chose it), on the CPU and in f32 on a GPU; on a GPU in f16/bf16, small steps route and run
//! their experts on the device, larger ones (prefill) run every expert in two grouped GEMMs
//! (`moe_device.rs`).

use candle_core::{DType, Tensor};

use super::ModelError;
use super::layers::Linear;
pub use super::moe_settings::{ExpertActivation, ExpertNames, MoeSettings};
pub(super) use super::moe_settings::{gguf_settings, settings};
use super::weights::{Part, Weights};
use crate::parallel::ExpertShard;

/// The most tokens a step may have to take the device path on a GPU (`moe_device.rs`) with
/// dense experts. Up to 8 tokens, an expert may be read up to 8 times a step where the grouped
/// GEMMs read it once, but the step needs no host round trip per layer; CUDA graphs cover decode
/// batches up to this size.
pub const DEVICE_TOKENS: usize = 8;

/// The most tokens a step of experts kept as integer codes (AWQ, GPTQ, GGUF) may have on the
/// device path, each token streaming its own experts' codes. A larger step dequantizes every
/// expert it routes to for the grouped GEMMs: at Qwen3-30B-A3B's shape (AWQ, groups of 128)
/// about 58 GB of bf16 written and read back a step once most experts are routed to, where 64
/// tokens streaming their 8 experts' codes read about 61 GB (less what they share in L2), and
/// inside the CUDA graphs.
pub const AFFINE_DEVICE_TOKENS: usize = 64;

/// The most tokens a step of MXFP4 experts (gpt-oss) may have on the device path. Past
/// [`MXFP4_TOKEN_KERNEL_TOKENS`] it sorts the step's (token, expert) slots by expert on the device
/// and multiplies each expert's tiles of slots on tensor cores, reading the codes as they are;
/// past this many, the grouped GEMMs' dense copy of each routed expert pays for itself.
pub const MXFP4_DEVICE_TOKENS: usize = 256;

/// The most tokens a step of MXFP4 experts takes the token-by-token expert kernels for (each
/// token streaming its own experts' codes); larger steps go to the tensor cores.
pub const MXFP4_TOKEN_KERNEL_TOKENS: usize = 4;

/// Each token's experts and their weights: the softmax over all experts' router logits, the
/// `top_k` largest (on a tie the lower expert first), renormalized when `renormalize`.
pub fn route(
    logits: &[f32],
    num_experts: usize,
    top_k: usize,
    renormalize: bool,
) -> Vec<Vec<(usize, f32)>> {
    logits
        .chunks_exact(num_experts)
        .map(|row| {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let exp: Vec<f32> = row.iter().map(|l| (l - max).exp()).collect();
            let sum: f32 = exp.iter().sum();
            let mut order: Vec<usize> = (0..num_experts).collect();
            order.sort_by(|&a, &b| exp[b].total_cmp(&exp[a]).then(a.cmp(&b)));
            let chosen = &order[..top_k];
            let norm = if renormalize {
                chosen.iter().map(|&e| exp[e]).sum()
            } else {
                sum
            };
            chosen.iter().map(|&e| (e, exp[e] / norm)).collect()
        })
        .collect()
}

/// One expert: a SwiGLU MLP.
pub(super) struct Expert {
    pub(super) gate_up: Linear,
    pub(super) down: Linear,
}

/// A sparse MLP layer.
pub struct SparseMoe {
    router: Linear,
    /// The experts this rank holds: every expert (or its slice, under tensor parallelism), or
    /// under expert parallelism the run of whole experts from `first_expert`.
    experts: Vec<Expert>,
    /// The global index of `experts[0]`.
    first_expert: usize,
    settings: MoeSettings,
    /// On a GPU with 16-bit dense weights: the experts' weights stacked for the device path of
    /// small steps (`moe_device.rs`); each expert's layers are views of them.
    #[cfg(feature = "cuda")]
    stacked: Option<super::moe_device::Stacked>,
    /// For the fused decode path: the router folded through the layer's o projection and the
    /// norm between them (`SparseMoe::fold_router`).
    #[cfg(feature = "cuda")]
    router_fold: Option<Tensor>,
}

impl SparseMoe {
    /// Loads layer `layer`'s router and experts (`hidden` wide) as `shard` splits them: under
    /// tensor parallelism this rank's slice of every expert (gate and up rows, down columns, as
    /// a dense MLP is split), under expert parallelism its whole experts; the layer's output is
    /// then this rank's part of the sum either way. The router is whole on every rank, so every
    /// rank routes alike.
    pub fn load(
        w: &Weights,
        layer: usize,
        hidden: usize,
        s: &MoeSettings,
        shard: ExpertShard,
    ) -> Result<Self, ModelError> {
        let i = s.expert_intermediate;
        let held = shard.experts(s.num_experts);
        if s.names == ExpertNames::GptOss {
            let prefix = format!("model.layers.{layer}.mlp");
            let router = router(w, &format!("{prefix}.router"), hidden, s.num_experts, true)?;
            // On a GPU in f16/bf16 the experts stay MXFP4 (no per-expert layers: every step
            // takes the device path).
            #[cfg(feature = "cuda")]
            if let Some(e) = super::gpt_oss::mxfp4_experts(w, layer, hidden, s, shard)? {
                let stacked =
                    super::moe_device::Stacked::mxfp4(e, w.device(), w.dtype(), s.activation)?
                        .holding(held.start, s.num_experts);
                return Ok(SparseMoe {
                    router,
                    first_expert: held.start,
                    stacked: Some(stacked),
                    router_fold: None,
                    experts: Vec::new(),
                    settings: s.clone(),
                });
            }
            #[allow(unused_mut)]
            let mut experts = super::gpt_oss::experts(w, layer, hidden, s, shard)?;
            return Ok(SparseMoe {
                router,
                first_expert: held.start,
                #[cfg(feature = "cuda")]
                stacked: super::moe_device::Stacked::take(
                    &mut experts,
                    s.top_k,
                    w.dtype(),
                    s.activation,
                )?
                .map(|t| t.holding(held.start, s.num_experts)),
                #[cfg(feature = "cuda")]
                router_fold: None,
                experts,
                settings: s.clone(),
            });
        }
        let (prefix, names) = if s.names == ExpertNames::Mixtral {
            (
                format!("model.layers.{layer}.block_sparse_moe"),
                ["w1", "w3", "w2"],
            )
        } else {
            (
                format!("model.layers.{layer}.mlp"),
                ["gate_proj", "up_proj", "down_proj"],
            )
        };
        // Expert `e`'s projection `k` (0 gate, 1 up, 2 down) as `(in, out)`: from its own
        // tensor, or from the three in which llama.cpp's GGUF stacks a layer's experts.
        let gguf = matches!(w, Weights::Gguf { .. });
        let slice = shard.columns(i);
        let proj = |e: usize, k: usize, dims: (usize, usize)| {
            let part = match k {
                2 => Part::Cols(slice.clone()),
                _ => Part::Rows(slice.clone()),
            };
            match gguf {
                true => {
                    let kind = ["gate", "up", "down"][k];
                    let name = format!("blk.{layer}.ffn_{kind}_exps.weight");
                    w.stacked_expert(&name, e, dims, part)
                }
                false => w.linear_part(
                    &format!("{prefix}.experts.{e}.{}", names[k]),
                    dims,
                    false,
                    part,
                ),
            }
        };
        #[allow(unused_mut)]
        let mut experts = held
            .clone()
            .map(|e| {
                let (gate, up) = (proj(e, 0, (hidden, i))?, proj(e, 1, (hidden, i))?);
                Ok(Expert {
                    gate_up: Linear::concat(&[&gate, &up])?.ok_or_else(|| {
                        ModelError::Unsupported(format!(
                            "expert {e} of layer {layer}: gate and up in different formats"
                        ))
                    })?,
                    down: proj(e, 2, (i, hidden))?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let router = router(w, &format!("{prefix}.gate"), hidden, s.num_experts, false)?;
        #[cfg(feature = "cuda")]
        let stacked =
            super::moe_device::Stacked::take(&mut experts, s.top_k, w.dtype(), s.activation)?
                .map(|t| t.holding(held.start, s.num_experts));
        Ok(SparseMoe {
            router,
            experts,
            first_expert: held.start,
            settings: s.clone(),
            #[cfg(feature = "cuda")]
            stacked,
            #[cfg(feature = "cuda")]
            router_fold: None,
        })
    }
}

/// A router `name` (`[experts, hidden]`, with a bias when `bias`). A dense router scores in f32:
/// in bf16 near-tied experts swap places, and a swapped expert moves the output far more than
/// bf16 rounding does.
fn router(
    w: &Weights,
    name: &str,
    hidden: usize,
    experts: usize,
    bias: bool,
) -> Result<Linear, ModelError> {
    Ok(match w.linear(name, hidden, experts, bias)? {
        Linear::Dense(l) => Linear::dense(
            l.weight().to_dtype(DType::F32)?,
            l.bias().map(|b| b.to_dtype(DType::F32)).transpose()?,
        ),
        other => other,
    })
}

impl SparseMoe {
    /// The most tokens a step may have to run on the device without reading anything back (and
    /// so inside CUDA graphs): [`DEVICE_TOKENS`] for dense experts, up to
    /// [`MXFP4_DEVICE_TOKENS`] for MXFP4 ones; 0 where the layer does not route on the device.
    pub fn device_tokens(&self) -> usize {
        #[cfg(feature = "cuda")]
        {
            self.stacked.as_ref().map_or(0, |s| s.device_tokens())
        }
        #[cfg(not(feature = "cuda"))]
        {
            0
        }
    }

    /// The router's f32 weight, when the fused decode path can take this layer
    /// (`decode_fused.rs`): experts routed on the device and a dense router without a bias.
    #[cfg(feature = "cuda")]
    pub(super) fn fused_router(&self) -> Option<&Tensor> {
        // (A rank holding some of the experts routes through `Stacked::forward`.)
        self.stacked.as_ref().filter(|s| !s.is_partial())?;
        match self.router.dense_parts()? {
            (w, None) if w.dtype() == DType::F32 => Some(w),
            _ => None,
        }
    }

    /// Folds the router through the layer's o projection `o` (`[hidden, k]`) and the norm
    /// between them (`pagewise_kernels::fold_router`), where the fused decode path takes this
    /// layer and `o` is a 16-bit weight on the GPU: that path then scores the router in the o
    /// projection's own grid (`pagewise_kernels::o_router`) wherever the expert slices take
    /// the step ([`SparseMoe::router_fold`]).
    #[cfg(feature = "cuda")]
    pub(super) fn fold_router(
        &mut self,
        o: &Tensor,
        norm: &super::norm::RmsNorm,
    ) -> candle_core::Result<()> {
        if !o.device().is_cuda() || !matches!(o.dtype(), DType::BF16 | DType::F16) {
            return Ok(());
        }
        if let Some(router) = self.fused_router() {
            self.router_fold = Some(pagewise_kernels::fold_router(router, norm.weight(), o)?);
        }
        Ok(())
    }

    /// The folded router ([`SparseMoe::fold_router`]) when the expert slices take a step of
    /// `rows` tokens, so the o projection may score it.
    #[cfg(feature = "cuda")]
    pub(super) fn router_fold(&self, rows: usize) -> Option<&Tensor> {
        let stacked = self.stacked.as_ref()?;
        let top_k = self.settings.top_k;
        self.router_fold
            .as_ref()
            .filter(|_| stacked.routes_in_slices(rows, top_k))
    }

    /// The fused decode path's layer (`decode_fused.rs`): `x + self(norm(x))` for the residual
    /// stream `x`, with the norm folded into the router's and the experts' kernels; with
    /// `before_norm`, the logits `pagewise_kernels::o_router` scored (no router kernel).
    #[cfg(feature = "cuda")]
    pub(super) fn forward_fused(
        &self,
        x: &Tensor,
        norm: &super::norm::RmsNorm,
        before_norm: Option<&Tensor>,
    ) -> candle_core::Result<Tensor> {
        let (Some(stacked), Some(router)) = (&self.stacked, self.fused_router()) else {
            candle_core::bail!("this expert layer does not take the fused decode path");
        };
        let norm = (norm.weight(), norm.eps() as f32);
        stacked.forward_fused(&x.contiguous()?, router, before_norm, norm, &self.settings)
    }

    /// The router's f32 logits for `x`, `[tokens, experts]`.
    fn router_logits(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let scored = match &self.router {
            Linear::Dense(_) => x.to_dtype(DType::F32)?,
            _ => x.clone(),
        };
        self.router.forward(&scored)?.to_dtype(DType::F32)
    }

    /// Applies the layer to `x` (`[tokens, hidden]`).
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let s = &self.settings;
        let logits = self.router_logits(x)?;
        #[cfg(feature = "cuda")]
        if let Some(stacked) = &self.stacked {
            return match x.dim(0)? <= stacked.device_tokens() {
                true => stacked.forward(x, &logits, s),
                false => stacked.forward_grouped(x, &logits, s),
            };
        }
        let routes = route(
            &logits.flatten_all()?.to_vec1::<f32>()?,
            s.num_experts,
            s.top_k,
            s.renormalize,
        );
        let mut chosen: Vec<(Vec<u32>, Vec<f32>)> = vec![(Vec::new(), Vec::new()); s.num_experts];
        for (t, route) in routes.iter().enumerate() {
            for &(e, weight) in route {
                chosen[e].0.push(t as u32);
                chosen[e].1.push(weight);
            }
        }
        let mut out = x.zeros_like()?;
        // This rank's experts only (all of them but under expert parallelism); a token routed
        // elsewhere adds nothing here, and the ranks' outputs are summed after the layer.
        let held = chosen.into_iter().skip(self.first_expert);
        for (expert, (tokens, weights)) in self.experts.iter().zip(held) {
            if tokens.is_empty() {
                continue;
            }
            let n = tokens.len();
            let index = Tensor::from_vec(tokens, n, x.device())?;
            let weights = Tensor::from_vec(weights, (n, 1), x.device())?.to_dtype(x.dtype())?;
            let rows = x.index_select(&index, 0)?;
            let y = expert
                .down
                .forward(&s.activation.apply(&expert.gate_up.forward(&rows)?)?)?;
            out = out.index_add(&index, &y.broadcast_mul(&weights)?, 0)?;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::hf_config::HfConfig;
    use crate::parallel::TpRank;

    #[test]
    fn routing_takes_the_top_k_with_ties_to_the_lower_expert() {
        // Softmax over all four; the top two renormalized, or not.
        let logits = [1.0f32, 3.0, 2.0, 3.0];
        let r = route(&logits, 4, 2, true);
        assert_eq!(r[0].iter().map(|p| p.0).collect::<Vec<_>>(), [1, 3]);
        assert!((r[0][0].1 - 0.5).abs() < 1e-6 && (r[0][1].1 - 0.5).abs() < 1e-6);
        let plain = route(&logits, 4, 2, false);
        let z: f32 = logits.iter().map(|l| l.exp()).sum();
        assert!((plain[0][0].1 - 3f32.exp() / z).abs() < 1e-6);
        // Every expert tied: the lowest ones, equal weights.
        let r = route(&[0.0; 4], 4, 3, true);
        assert_eq!(r[0].iter().map(|p| p.0).collect::<Vec<_>>(), [0, 1, 2]);
        assert!(r[0].iter().all(|p| (p.1 - 1.0 / 3.0).abs() < 1e-6));
    }

    /// Every token routed to expert 0 (its router row dominates), experts 1 and 2 chosen by
    /// none: the layer is expert 0's MLP, weight one. Under expert parallelism over two ranks
    /// (experts 0 and 1 on rank 0, 2 on rank 1) every token is on rank 0, which gives the whole
    /// layer's output, and rank 1, whose expert no token picks, gives zeros.
    #[test]
    fn tokens_all_on_one_expert_and_experts_nobody_picks() {
        use candle_core::Device;
        use std::collections::HashMap;
        let (h, i, dev) = (4, 6, Device::Cpu);
        let ramp = |n: usize, k: f32| -> Vec<f32> {
            (0..n)
                .map(|j| ((j as f32 * 0.37 + k).sin()) * 0.5)
                .collect()
        };
        let mut t = HashMap::new();
        let p = "model.layers.0.block_sparse_moe";
        let mut router = vec![0f32; 3 * h];
        router[..h].copy_from_slice(&[40.0; 4]);
        t.insert(
            format!("{p}.gate.weight"),
            Tensor::from_vec(router, (3, h), &dev).unwrap(),
        );
        for e in 0..3 {
            for (n, shape) in [("w1", (i, h)), ("w3", (i, h)), ("w2", (h, i))] {
                let v = ramp(
                    shape.0 * shape.1,
                    e as f32 + n.len() as f32 + shape.0 as f32,
                );
                let name = format!("{p}.experts.{e}.{n}.weight");
                t.insert(name, Tensor::from_vec(v, shape, &dev).unwrap());
            }
        }
        let get = |k: &str| t[&format!("{p}.experts.0.{k}.weight")].clone();
        let w = Weights::Dense {
            vb: candle_nn::VarBuilder::from_tensors(t.clone(), DType::F32, &dev),
            quantize_fp8: false,
            dummy_int4: None,
        };
        let text = format!(
            r#"{{"num_local_experts":3,"num_experts_per_tok":1,"vocab_size":8,"hidden_size":{h},
            "num_hidden_layers":1,"num_attention_heads":1,"intermediate_size":{i}}}"#
        );
        let s = settings(&HfConfig::parse(&text).unwrap(), ExpertNames::Mixtral).unwrap();
        let load = |shard| SparseMoe::load(&w, 0, h, &s, shard).unwrap();
        let moe = load(ExpertShard::Sliced(TpRank::SINGLE));
        let ranks = [0, 1].map(|rank| load(ExpertShard::Whole(TpRank { rank, size: 2 })));
        assert_eq!(ranks.each_ref().map(|m| m.experts.len()), [2, 1]);
        // Positive inputs: every router logit of expert 0 is far above the others (zero).
        let x = Tensor::from_vec(ramp(5 * h, 9.0), (5, h), &dev)
            .unwrap()
            .abs()
            .unwrap();
        let got = moe.forward(&x).unwrap();
        let gate = x.matmul(&get("w1").t().unwrap()).unwrap();
        let up = x.matmul(&get("w3").t().unwrap()).unwrap();
        let act = (candle_nn::ops::silu(&gate).unwrap() * up).unwrap();
        let want = act.matmul(&get("w2").t().unwrap()).unwrap();
        let diff = (&got - want).unwrap().abs().unwrap().max_all().unwrap();
        assert!(diff.to_scalar::<f32>().unwrap() < 1e-6);
        let on_rank = |r: usize| ranks[r].forward(&x).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(on_rank(0), got.to_vec2::<f32>().unwrap());
        assert!(on_rank(1).iter().flatten().all(|&v| v == 0.0));
    }
}
