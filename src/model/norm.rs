//! RMSNorm, alone or fused with the residual add before it: on a GPU one kernel computes
//! `x + delta` and its normalization (`pagewise_kernels::add_rms_norm`); elsewhere candle's ops do
//! the same in two steps, and on the CPU one pass over plain buffers.

use candle_core::Tensor;

use super::ModelError;
use super::host::with_f32s;
use super::weights::Weights;

/// RMSNorm over the last dimension with a learned scale.
pub struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    /// Loads the scale `name` (`[size]`).
    pub fn load(w: &Weights, name: &str, size: usize, eps: f64) -> Result<Self, ModelError> {
        let weight = w.tensor(name, size)?;
        Ok(RmsNorm { weight, eps })
    }

    /// Loads Gemma's norm `name`, which scales by `1 + w`: the stored `w` plus one, once.
    pub fn load_plus_one(
        w: &Weights,
        name: &str,
        size: usize,
        eps: f64,
    ) -> Result<Self, ModelError> {
        let weight = (w.tensor(name, size)? + 1.0)?;
        Ok(RmsNorm { weight, eps })
    }

    /// The learned scale, `[size]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The epsilon under the square root.
    pub fn eps(&self) -> f64 {
        self.eps
    }

    /// Normalizes `x` (`[tokens, size]`).
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        candle_nn::ops::rms_norm(&x.contiguous()?, &self.weight, self.eps as f32)
    }

    /// `x + norm(delta)`: Gemma's residual add of a normalized attention or MLP output (one
    /// kernel on a GPU, `pagewise_kernels::add_rms_normed`).
    pub fn add_normed(&self, x: &Tensor, delta: &Tensor) -> candle_core::Result<Tensor> {
        #[cfg(feature = "cuda")]
        if x.device().is_cuda() && x.is_contiguous() && delta.is_contiguous() {
            return pagewise_kernels::add_rms_normed(x, delta, &self.weight, self.eps as f32);
        }
        x + self.forward(delta)?
    }

    /// The residual stream after adding `delta` to `x`, and its normalization: `(x + delta,
    /// norm(x + delta))`.
    pub fn add_forward(&self, x: &Tensor, delta: &Tensor) -> candle_core::Result<(Tensor, Tensor)> {
        #[cfg(feature = "cuda")]
        if x.device().is_cuda() && x.is_contiguous() && delta.is_contiguous() {
            return pagewise_kernels::add_rms_norm(x, delta, &self.weight, self.eps as f32);
        }
        if let Some(out) = self.add_forward_host(x, delta)? {
            return Ok(out);
        }
        let sum = (x + delta)?;
        let normed = self.forward(&sum)?;
        Ok((sum, normed))
    }

    /// [`RmsNorm::add_forward`] over plain buffers on the CPU (f32, contiguous, one shape), with
    /// candle's RMSNorm's arithmetic: the same values without the ops' allocations and dispatch,
    /// run by one thread while the team waits. `None` where it does not apply.
    fn add_forward_host(
        &self,
        x: &Tensor,
        delta: &Tensor,
    ) -> candle_core::Result<Option<(Tensor, Tensor)>> {
        let n = self.weight.elem_count();
        if x.shape() != delta.shape() || x.dims().last() != Some(&n) {
            return Ok(None);
        }
        let eps = self.eps as f32;
        let out = with_f32s([x, delta, &self.weight], |[x, delta, alpha]| {
            let sum: Vec<f32> = x.iter().zip(delta).map(|(a, b)| a + b).collect();
            let norm = HostNorm { scale: alpha, eps };
            let mut normed = sum.clone();
            normed.chunks_exact_mut(n).for_each(|row| norm.apply(row));
            (sum, normed)
        })?;
        let Some((sum, normed)) = out else {
            return Ok(None);
        };
        let (shape, device) = (x.shape(), x.device());
        Ok(Some((
            Tensor::from_vec(sum, shape, device)?,
            Tensor::from_vec(normed, shape, device)?,
        )))
    }
}

/// An [`RmsNorm`]'s scale and epsilon as plain values, for the CPU paths over plain buffers.
#[derive(Clone, Copy)]
pub struct HostNorm<'a> {
    pub scale: &'a [f32],
    pub eps: f32,
}

impl HostNorm<'_> {
    /// Normalizes `x` (as wide as the scale) in place, as [`RmsNorm::forward`] does on the CPU,
    /// with candle's arithmetic: the squares summed in order in f32, `m = sqrt(mean + eps)`,
    /// then each value `x / m * scale`.
    pub fn apply(&self, x: &mut [f32]) {
        let sum2 = x.iter().map(|v| v * v).sum::<f32>();
        let m = (sum2 / x.len() as f32 + self.eps).sqrt();
        for (v, a) in x.iter_mut().zip(self.scale) {
            *v = *v / m * *a;
        }
    }
}
