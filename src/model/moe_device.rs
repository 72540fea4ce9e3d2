//! The device path of a mixture-of-experts layer for small steps (decode): the experts' weights
//! stacked once at load, then `pagewise_kernels::moe_route` and `moe_experts` — routing, each
//! token's chosen experts and their weighted sum without reading anything back to the host, so
//! the step runs inside a CUDA graph. Each token streams its own experts' weights, which is what a
//! few tokens need; a larger step would read an expert once per token that chose it, and goes
//! through the reference path (`SparseMoe::forward`), which reads each chosen expert once.

use candle_core::{DType, Tensor};

use super::layers::Linear;
use super::moe::{Expert, ExpertActivation, MoeSettings};

/// A layer's expert weights stacked: gate/up `[experts, 2 * inter, hidden]` (gate rows first)
/// and down `[experts, hidden, inter]`, with their biases (gpt-oss) stacked the same way.
pub struct Stacked {
    gate_up: Tensor,
    down: Tensor,
    gate_up_bias: Option<Tensor>,
    down_bias: Option<Tensor>,
    activation: ExpertActivation,
}

impl Stacked {
    /// Stacks the experts' weights when they are dense f16/bf16 on a GPU and fit the kernels (with
    /// `top_k` experts a token), and makes each expert's layers views of the stacks (so the
    /// weights are held once). Biases come along when every expert has them.
    pub fn take(
        experts: &mut [Expert],
        top_k: usize,
        activation: ExpertActivation,
    ) -> candle_core::Result<Option<Stacked>> {
        type Parts = (Tensor, Option<Tensor>);
        let weights: Option<Vec<(Parts, Parts)>> = experts
            .iter()
            .map(|e| {
                let (gu, gub) = e.gate_up.dense_parts()?;
                let (d, db) = e.down.dense_parts()?;
                Some(((gu.clone(), gub.cloned()), (d.clone(), db.cloned())))
            })
            .collect();
        let Some(weights) = weights.filter(|w| !w.is_empty()) else {
            return Ok(None);
        };
        let ((gate_up, _), (down, _)) = &weights[0];
        let (hidden, inter) = (down.dim(0)?, down.dim(1)?);
        if gate_up.device().is_cpu()
            || !matches!(gate_up.dtype(), DType::BF16 | DType::F16)
            || !hidden.is_multiple_of(8)
            || !pagewise_kernels::moe_fits(top_k, inter, gate_up.dtype())
        {
            return Ok(None);
        }
        let stack = |pick: &dyn Fn(&(Parts, Parts)) -> &Parts| -> candle_core::Result<_> {
            let w = Tensor::stack(&weights.iter().map(|p| &pick(p).0).collect::<Vec<_>>(), 0)?;
            let b: Option<Vec<&Tensor>> = weights.iter().map(|p| pick(p).1.as_ref()).collect();
            let b = b.map(|b| Tensor::stack(&b, 0)).transpose()?;
            Ok((w, b))
        };
        let (gate_up, gate_up_bias) = stack(&|p| &p.0)?;
        let (down, down_bias) = stack(&|p| &p.1)?;
        drop(weights);
        let row = |b: &Option<Tensor>, e: usize| b.as_ref().map(|b| b.get(e)).transpose();
        for (e, expert) in experts.iter_mut().enumerate() {
            expert.gate_up = Linear::dense(gate_up.get(e)?, row(&gate_up_bias, e)?);
            expert.down = Linear::dense(down.get(e)?, row(&down_bias, e)?);
        }
        Ok(Some(Stacked {
            gate_up,
            down,
            gate_up_bias,
            down_bias,
            activation,
        }))
    }

    /// The layer for `x` (`[tokens, hidden]`, at most [`super::moe::DEVICE_TOKENS`]) from its router's f32
    /// `logits` (`[tokens, experts]`).
    pub fn forward(
        &self,
        x: &Tensor,
        logits: &Tensor,
        s: &MoeSettings,
    ) -> candle_core::Result<Tensor> {
        let routes = pagewise_kernels::moe_route(&logits.contiguous()?, s.top_k, s.renormalize)?;
        let extras = pagewise_kernels::ExpertExtras {
            gate_up_bias: self.gate_up_bias.as_ref(),
            down_bias: self.down_bias.as_ref(),
            clamped_swiglu: match self.activation {
                ExpertActivation::SiluMul => None,
                ExpertActivation::ClampedSwiglu { alpha, limit } => Some((alpha, limit)),
            },
        };
        pagewise_kernels::moe_experts_with(
            &x.contiguous()?,
            &self.gate_up,
            &self.down,
            &routes,
            extras,
        )
    }
}
