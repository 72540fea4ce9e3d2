//! Layers shared by the models: a linear layer that is dense or quantized, the gated SiLU MLP, and
//! rotary position embeddings (rotate-half or interleaved, with Llama 3.1 frequency scaling).

use std::sync::Arc;

use candle_core::quantized::QMatMul;
use candle_core::{DType, Device, Module, Tensor};

use super::ModelError;
use super::config::{Llama3RopeScaling, ModelConfig};
use super::fp8_linear::Fp8Linear;
use super::glu::{Glu, glu, glu_split};
use super::int4_linear::Int4Linear;
use super::weights::{Part, Weights};
use crate::cpu::QLinear;
use crate::parallel::TpRank;

/// `y = x W^T + b`, with `W` dense or quantized (GGUF).
pub enum Linear {
    /// Dense weight `[out, in]`.
    Dense(candle_nn::Linear),
    /// GGUF-quantized weight on the CPU, multiplied by our kernels ([`crate::cpu`]).
    Cpu {
        /// The quantized weight (shared with the token embedding when they are tied).
        weight: Arc<QLinear>,
        /// Optional bias `[out]`.
        bias: Option<Tensor>,
    },
    /// FP8 weight on a GPU, streamed by our kernels (bias included).
    Fp8(Fp8Linear),
    /// 4-bit integer weight on a GPU, streamed by our kernels (bias included).
    Int4(Int4Linear),
    /// Quantized weight; candle's quantized matmul takes f32 input.
    Quantized {
        /// The quantized weight.
        weight: QMatMul,
        /// Optional bias `[out]`.
        bias: Option<Tensor>,
    },
}

impl Linear {
    /// A dense layer.
    pub fn dense(weight: Tensor, bias: Option<Tensor>) -> Self {
        Linear::Dense(candle_nn::Linear::new(weight, bias))
    }

    /// A quantized layer.
    pub fn quantized(weight: QMatMul, bias: Option<Tensor>) -> Self {
        Linear::Quantized { weight, bias }
    }

    /// One layer computing all of `parts` side by side (their weights stacked along the output
    /// dimension, biases too), or `None` when the parts are not all dense, all FP8 with scales
    /// that stack, or all of one CPU quantized format, or only some have a bias.
    pub fn concat(parts: &[&Linear]) -> candle_core::Result<Option<Linear>> {
        let fp8: Option<Vec<&Fp8Linear>> = parts
            .iter()
            .map(|p| match p {
                Linear::Fp8(l) => Some(l),
                _ => None,
            })
            .collect();
        if let Some(fp8) = fp8 {
            return Ok(Fp8Linear::concat(&fp8)?.map(Linear::Fp8));
        }
        let int4: Option<Vec<&Int4Linear>> = parts
            .iter()
            .map(|p| match p {
                Linear::Int4(l) => Some(l),
                _ => None,
            })
            .collect();
        if let Some(int4) = int4 {
            return Ok(Int4Linear::concat(&int4)?.map(Linear::Int4));
        }
        let biases: Vec<Tensor> = parts
            .iter()
            .filter_map(|p| match p {
                Linear::Dense(l) => l.bias().cloned(),
                Linear::Cpu { bias, .. } | Linear::Quantized { bias, .. } => bias.clone(),
                Linear::Fp8(l) => l.bias().cloned(),
                Linear::Int4(l) => l.bias().cloned(),
            })
            .collect();
        let bias = match biases.len() {
            0 => None,
            n if n == parts.len() => Some(Tensor::cat(&biases, 0)?),
            _ => return Ok(None),
        };
        let dense: Option<Vec<Tensor>> = parts
            .iter()
            .map(|p| match p {
                Linear::Dense(l) => Some(l.weight().clone()),
                _ => None,
            })
            .collect();
        if let Some(weights) = dense {
            return Ok(Some(Linear::dense(Tensor::cat(&weights, 0)?, bias)));
        }
        let quantized: Option<Vec<&QLinear>> = parts
            .iter()
            .map(|p| match p {
                Linear::Cpu { weight, .. } => Some(weight.as_ref()),
                _ => None,
            })
            .collect();
        Ok(quantized
            .and_then(|q| QLinear::concat(&q))
            .map(|weight| Linear::Cpu {
                weight: Arc::new(weight),
                bias,
            }))
    }

    /// The weight `[out, in]` of a dense layer without a bias (what the fused decode kernels take).
    pub fn dense_weight(&self) -> Option<&Tensor> {
        match self {
            Linear::Dense(l) if l.bias().is_none() => Some(l.weight()),
            _ => None,
        }
    }

    /// The weight the fused decode kernels stream, of a layer without a bias: dense, FP8 or
    /// 4-bit.
    #[cfg(feature = "cuda")]
    pub fn gemv_weight(&self) -> Option<pagewise_kernels::GemvWeight<'_>> {
        match self {
            Linear::Fp8(l) if l.bias().is_none() => Some(l.matrix().into()),
            Linear::Int4(l) if l.bias().is_none() => Some(l.matrix().into()),
            other => other.dense_weight().map(Into::into),
        }
    }

    /// The weight `[out, in]` and bias of a dense layer.
    pub fn dense_parts(&self) -> Option<(&Tensor, Option<&Tensor>)> {
        match self {
            Linear::Dense(l) => Some((l.weight(), l.bias())),
            _ => None,
        }
    }

    /// Applies the layer to `[tokens, in]`.
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Linear::Dense(l) => l.forward(x),
            Linear::Fp8(l) => l.forward(x),
            Linear::Int4(l) => l.forward(x),
            Linear::Cpu { weight, bias } => {
                let (dtype, dims) = (x.dtype(), x.dims());
                if dims.last() != Some(&weight.cols()) {
                    candle_core::bail!("input {dims:?} does not end in {} features", weight.cols());
                }
                let m = x.elem_count() / weight.cols();
                let input = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
                let mut out_dims = dims.to_vec();
                *out_dims
                    .last_mut()
                    .expect("an input of at least one dimension") = weight.rows();
                let y = Tensor::from_vec(weight.matmul(&input, m), out_dims, x.device())?
                    .to_dtype(dtype)?;
                match bias {
                    Some(b) => y.broadcast_add(b),
                    None => Ok(y),
                }
            }
            Linear::Quantized { weight, bias } => {
                let dtype = x.dtype();
                let y = weight
                    .forward(&x.to_dtype(DType::F32)?.unsqueeze(0)?)?
                    .squeeze(0)?
                    .to_dtype(dtype)?;
                match bias {
                    Some(b) => y.broadcast_add(b),
                    None => Ok(y),
                }
            }
        }
    }
}

/// An MLP's fused gate/up weight and its down weight, as the decode GEMVs stream them.
#[cfg(feature = "cuda")]
pub type GemvPair<'a> = (
    pagewise_kernels::GemvWeight<'a>,
    pagewise_kernels::GemvWeight<'a>,
);

/// Llama's MLP: `down(silu(gate(x)) * up(x))`. Dense gate and up weights are fused into one
/// `[2 * intermediate, hidden]` projection (one matmul, then SiLU-and-multiply in one kernel on a
/// GPU); quantized ones stay two.
pub struct GatedMlp {
    gate_up: GateUp,
    down: Linear,
    /// GeGLU (Gemma: GELU by its tanh approximation) instead of SwiGLU.
    gelu_tanh: bool,
}

enum GateUp {
    Fused(Linear),
    Split(Linear, Linear),
}

impl GatedMlp {
    /// Loads `prefix.{gate,up,down}_proj`: gate and up split by rows and down by columns over
    /// the intermediate features `tp` computes (all of them with one rank). Only the leading
    /// rank keeps down's bias: the all-reduce after it sums the ranks' parts.
    pub fn load(
        w: &Weights,
        prefix: &str,
        cfg: &ModelConfig,
        tp: TpRank,
    ) -> Result<Self, ModelError> {
        let (h, i, b) = (cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias);
        let gelu_tanh = cfg.gelu_mlp;
        if cfg.stacked_projections {
            // Phi-3 stores gate and up stacked already, gate rows first (not sharded).
            return Ok(GatedMlp {
                gate_up: GateUp::Fused(w.linear(&format!("{prefix}.gate_up_proj"), h, 2 * i, b)?),
                down: w.linear(&format!("{prefix}.down_proj"), i, h, b)?,
                gelu_tanh,
            });
        }
        let (rows, cols) = (
            Part::Rows(tp.intermediate(cfg)),
            Part::Cols(tp.intermediate(cfg)),
        );
        let gate = w.linear_part(&format!("{prefix}.gate_proj"), (h, i), b, rows.clone())?;
        let up = w.linear_part(&format!("{prefix}.up_proj"), (h, i), b, rows)?;
        let gate_up = match Linear::concat(&[&gate, &up])? {
            Some(fused) => GateUp::Fused(fused),
            None => GateUp::Split(gate, up),
        };
        Ok(GatedMlp {
            gate_up,
            down: w.linear_part(
                &format!("{prefix}.down_proj"),
                (i, h),
                b && tp.leads(),
                cols,
            )?,
            gelu_tanh,
        })
    }

    /// The fused gate/up weight `[2 * intermediate, hidden]` and the down weight of a SwiGLU MLP
    /// as the decode GEMVs stream them, when both are dense or FP8, without biases.
    #[cfg(feature = "cuda")]
    pub fn gemv_weights(&self) -> Option<GemvPair<'_>> {
        self.fused_gemv().filter(|_| !self.gelu_tanh)
    }

    /// [`GatedMlp::gemv_weights`] for a GeGLU MLP (Gemma).
    #[cfg(feature = "cuda")]
    pub fn gemv_geglu_weights(&self) -> Option<GemvPair<'_>> {
        self.fused_gemv().filter(|_| self.gelu_tanh)
    }

    #[cfg(feature = "cuda")]
    fn fused_gemv(&self) -> Option<GemvPair<'_>> {
        match &self.gate_up {
            GateUp::Fused(l) => Some((l.gemv_weight()?, self.down.gemv_weight()?)),
            GateUp::Split(..) => None,
        }
    }

    /// Applies the MLP to `[tokens, hidden]`.
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let kind = if self.gelu_tanh {
            Glu::GeluTanh
        } else {
            Glu::Silu
        };
        let act = match &self.gate_up {
            GateUp::Fused(l) => glu(kind, &l.forward(x)?)?,
            GateUp::Split(gate, up) => glu_split(kind, &gate.forward(x)?, &up.forward(x)?)?,
        };
        self.down.forward(&act)
    }
}

/// Rotary position embedding tables and their application to packed `[tokens, heads, head_dim]`.
pub struct Rotary {
    cos: Tensor,
    sin: Tensor,
    interleaved: bool,
}

/// Llama 3.1's wavelength-dependent scaling of the inverse frequencies.
fn llama3_scale(inv_freq: &mut [f64], s: &Llama3RopeScaling) {
    let old = s.original_max_position_embeddings as f64;
    let low_wavelen = old / s.low_freq_factor;
    let high_wavelen = old / s.high_freq_factor;
    for f in inv_freq.iter_mut() {
        let wavelen = 2.0 * std::f64::consts::PI / *f;
        if wavelen > low_wavelen {
            *f /= s.factor;
        } else if wavelen >= high_wavelen {
            let smooth =
                (old / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
            *f = (1.0 - smooth) * *f / s.factor + smooth * *f;
        }
    }
}

impl Rotary {
    /// Tables for positions `0..max_len`, in `dtype` on `device`.
    pub fn new(
        cfg: &ModelConfig,
        max_len: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self, ModelError> {
        Self::with_base(cfg, cfg.rope_theta, 1.0, max_len, dtype, device)
    }

    /// [`Rotary::new`] with base `theta` and positions divided by `linear` (linear rope
    /// scaling), for models whose layers turn at different rates (Gemma 3).
    pub fn with_base(
        cfg: &ModelConfig,
        theta: f64,
        linear: f64,
        max_len: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self, ModelError> {
        let d = cfg.rotary_dim();
        let mut inv_freq: Vec<f64> = (0..d / 2)
            .map(|i| 1.0 / theta.powf(2.0 * i as f64 / d as f64) / linear)
            .collect();
        if let Some(s) = &cfg.rope_scaling {
            llama3_scale(&mut inv_freq, s);
        }
        if let Some(y) = &cfg.yarn {
            y.scale(&mut inv_freq, theta);
        }
        // LongRoPE: each frequency divided by its short factor within the original context and
        // by its long factor past it; cos and sin scaled (as YaRN scales them).
        let yarn_scale = cfg.yarn.as_ref().map_or(1.0, |y| y.attention_factor);
        let (mut short, mut long, mut original, mut scale) = (None, None, usize::MAX, yarn_scale);
        if let Some(l) = &cfg.longrope {
            for f in [&l.short_factor, &l.long_factor] {
                if f.len() != inv_freq.len() {
                    return Err(ModelError::Config(format!(
                        "longrope: {} factors for {} rotary frequencies",
                        f.len(),
                        inv_freq.len()
                    )));
                }
            }
            let divided = |f: &[f64]| inv_freq.iter().zip(f).map(|(i, f)| i / f).collect();
            short = Some(divided(&l.short_factor));
            long = Some(divided(&l.long_factor));
            original = l.original_max_position_embeddings;
            scale = l.attention_factor;
        }
        let mut cos = Vec::with_capacity(max_len * d / 2);
        let mut sin = Vec::with_capacity(max_len * d / 2);
        for p in 0..max_len {
            let freqs: &Vec<f64> = match (&short, &long) {
                (Some(s), _) if p < original => s,
                (_, Some(l)) => l,
                _ => &inv_freq,
            };
            for &f in freqs {
                let angle = p as f64 * f;
                cos.push((angle.cos() * scale) as f32);
                sin.push((angle.sin() * scale) as f32);
            }
        }
        let table = |v: Vec<f32>| -> candle_core::Result<Tensor> {
            Tensor::from_vec(v, (max_len, d / 2), &Device::Cpu)?
                .to_dtype(dtype)?
                .to_device(device)
        };
        Ok(Rotary {
            cos: table(cos)?,
            sin: table(sin)?,
            interleaved: cfg.rope_interleaved,
        })
    }

    /// The step's cos and sin rows (`[tokens, head_dim / 2]`), gathered once and shared by every
    /// layer's q and k.
    pub fn at(&self, positions: &Tensor) -> candle_core::Result<RotaryRows> {
        Ok(RotaryRows {
            cos: self.cos.index_select(positions, 0)?,
            sin: self.sin.index_select(positions, 0)?,
            interleaved: self.interleaved,
        })
    }

    /// The qkv projection of `rms_norm(x)` by the fused weight `w` in one GEMV kernel that also
    /// rotates q and k (reading the tables at `positions`, u32 `[rows]`) and writes k and v into
    /// the caches at `slot_mapping` (decode steps of up to `decode_fused::MAX_ROWS` rows; see
    /// `pagewise_kernels::gemv_rope_cache`); returns q, `[rows, heads, head_dim]`.
    #[cfg(feature = "cuda")]
    pub fn project_qkv_and_cache(
        &self,
        x: &Tensor,
        w: pagewise_kernels::GemvWeight<'_>,
        norm: &super::norm::RmsNorm,
        (heads, kv_heads): (usize, usize),
        (k_cache, v_cache): (&Tensor, &Tensor),
        (positions, slot_mapping): (&Tensor, &Tensor),
    ) -> candle_core::Result<Tensor> {
        let target = pagewise_kernels::RopeCacheTarget {
            heads,
            kv_heads,
            cos: &self.cos,
            sin: &self.sin,
            positions: Some(positions),
            interleaved: self.interleaved,
            k_cache,
            v_cache,
            slot_mapping,
        };
        // SAFETY: the indices come from the scheduler's plan (ForwardBatch): block ids below the
        // cache's num_blocks, distinct slots within a step, contexts within each block-table row.
        unsafe {
            pagewise_kernels::gemv_rope_cache(x, w, norm.weight(), norm.eps() as f32, &target)
        }
    }

    /// The fused q/k/v projection `qkv` as the kernels that rotate it take it: the whole tables
    /// read at `positions` (u32 `[tokens]`, no gather), after the per-head norms, if any. For the
    /// fused decode path of models with per-head q/k norms, whose projection cannot rotate as it
    /// stores (a head's norm needs the whole head).
    #[cfg(feature = "cuda")]
    pub fn qkv_rope<'a>(
        &'a self,
        qkv: &'a Tensor,
        (heads, kv_heads): (usize, usize),
        head_norms: Option<pagewise_kernels::HeadNorms<'a>>,
        positions: &'a Tensor,
    ) -> pagewise_kernels::QkvRope<'a> {
        pagewise_kernels::QkvRope {
            qkv,
            heads,
            kv_heads,
            cos: &self.cos,
            sin: &self.sin,
            positions: Some(positions),
            interleaved: self.interleaved,
            head_norms,
        }
    }
}

/// The rotary tables gathered at one step's positions.
pub struct RotaryRows {
    cos: Tensor,
    sin: Tensor,
    interleaved: bool,
}

impl RotaryRows {
    /// The fused q/k/v projection `qkv` as the kernels that rotate it take it (these rows'
    /// tables; after the per-head norms, if the model has them).
    #[cfg(feature = "cuda")]
    pub fn qkv_rope<'a>(
        &'a self,
        qkv: &'a Tensor,
        (heads, kv_heads): (usize, usize),
        head_norms: Option<pagewise_kernels::HeadNorms<'a>>,
    ) -> pagewise_kernels::QkvRope<'a> {
        pagewise_kernels::QkvRope {
            qkv,
            heads,
            kv_heads,
            cos: &self.cos,
            sin: &self.sin,
            positions: None,
            interleaved: self.interleaved,
            head_norms,
        }
    }

    /// Dimensions of each head these tables turn.
    pub fn dims(&self) -> usize {
        2 * self.cos.dims().last().copied().unwrap_or(0)
    }

    /// Rotates `x` (`[tokens, heads, head_dim]`, contiguous): all of each head, or its leading
    /// dimensions when the tables are narrower (partial rotary; the rest pass through).
    pub fn apply(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let (rot, d) = (2 * self.cos.dim(1)?, x.dim(2)?);
        if rot < d {
            let turned = self.apply_whole(&x.narrow(2, 0, rot)?.contiguous()?)?;
            return Tensor::cat(&[&turned, &x.narrow(2, rot, d - rot)?], 2)?.contiguous();
        }
        self.apply_whole(x)
    }

    fn apply_whole(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        if self.interleaved {
            // candle's interleaved kernel takes [batch, heads, tokens, head_dim].
            let x = x.transpose(0, 1)?.unsqueeze(0)?.contiguous()?;
            let y = candle_nn::rotary_emb::rope_i(&x, &self.cos, &self.sin)?;
            y.squeeze(0)?.transpose(0, 1)?.contiguous()
        } else {
            // Rotate-half over [batch, tokens, heads, head_dim]: the packed layout as it is.
            candle_nn::rotary_emb::rope_thd(&x.unsqueeze(0)?, &self.cos, &self.sin)?.squeeze(0)
        }
    }
}

/// LayerNorm over the last dimension (`prefix.weight`, `prefix.bias`).
pub fn layer_norm(
    w: &Weights,
    prefix: &str,
    size: usize,
    eps: f64,
) -> Result<candle_nn::LayerNorm, ModelError> {
    Ok(candle_nn::LayerNorm::new(
        w.tensor(&format!("{prefix}.weight"), size)?,
        w.tensor(&format!("{prefix}.bias"), size)?,
        eps,
    ))
}
