//! The device path of a mixture-of-experts layer for small steps (decode): the experts' weights
//! stacked once at load, then `pagewise_kernels::moe_route` and `moe_experts` — routing, each
//! token's chosen experts and their weighted sum without reading anything back to the host, so
//! the step runs inside a CUDA graph. Each token streams its own experts' weights, which is what a
//! few tokens need; a larger step would read an expert once per token that chose it, and goes
//! through the reference path (`SparseMoe::forward`), which reads each chosen expert once.

use candle_core::{DType, Tensor};

use super::layers::Linear;
use super::moe::{Expert, MoeSettings};

/// A layer's expert weights stacked: gate/up `[experts, 2 * inter, hidden]` (gate rows first)
/// and down `[experts, hidden, inter]`.
pub struct Stacked {
    gate_up: Tensor,
    down: Tensor,
}

impl Stacked {
    /// Stacks the experts' weights when they are dense f16/bf16 on a GPU and fit the kernels (with
    /// `top_k` experts a token),
    /// and makes each expert's layers views of the stacks (so the weights are held once).
    pub fn take(experts: &mut [Expert], top_k: usize) -> candle_core::Result<Option<Stacked>> {
        let weights: Option<Vec<(Tensor, Tensor)>> = experts
            .iter()
            .map(|e| {
                Some((
                    e.gate_up.dense_weight()?.clone(),
                    e.down.dense_weight()?.clone(),
                ))
            })
            .collect();
        let Some(weights) = weights.filter(|w| !w.is_empty()) else {
            return Ok(None);
        };
        let (gate_up, down) = &weights[0];
        let (hidden, inter) = (down.dim(0)?, down.dim(1)?);
        if gate_up.device().is_cpu()
            || !matches!(gate_up.dtype(), DType::BF16 | DType::F16)
            || !hidden.is_multiple_of(8)
            || !pagewise_kernels::moe_fits(top_k, inter, gate_up.dtype())
        {
            return Ok(None);
        }
        let gate_up = Tensor::stack(&weights.iter().map(|w| &w.0).collect::<Vec<_>>(), 0)?;
        let down = Tensor::stack(&weights.iter().map(|w| &w.1).collect::<Vec<_>>(), 0)?;
        drop(weights);
        for (e, expert) in experts.iter_mut().enumerate() {
            expert.gate_up = Linear::dense(gate_up.get(e)?, None);
            expert.down = Linear::dense(down.get(e)?, None);
        }
        Ok(Some(Stacked { gate_up, down }))
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
        pagewise_kernels::moe_experts(&x.contiguous()?, &self.gate_up, &self.down, &routes)
    }
}
