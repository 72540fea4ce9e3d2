//! Layers shared by the models: a linear layer that is dense or quantized, the gated SiLU MLP, and
//! LayerNorm (rotary position embeddings: `super::rotary`).

use std::sync::Arc;

use candle_core::quantized::QMatMul;
use candle_core::{DType, Module, Tensor};

use super::ModelError;
use super::affine_linear::AffineLinear;
use super::config::ModelConfig;
use super::fp8_linear::Fp8Linear;
use super::glu::{Glu, glu, glu_split};
use super::host::with_f32;
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
    /// A GGUF weight (or an integer checkpoint's expert) on a GPU as codes with group scales and
    /// offsets, streamed by our kernels (bias included).
    Affine(AffineLinear),
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
    /// that stack, all 4-bit alike, all GGUF codes on a GPU (of any widths:
    /// [`AffineLinear::concat`]), or all of one CPU quantized format, or only some have a bias.
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
        let affine: Option<Vec<&AffineLinear>> = parts
            .iter()
            .map(|p| match p {
                Linear::Affine(l) => Some(l),
                _ => None,
            })
            .collect();
        if let Some(affine) = affine {
            return Ok(AffineLinear::concat(&affine)?.map(Linear::Affine));
        }
        let biases: Vec<Tensor> = parts
            .iter()
            .filter_map(|p| match p {
                Linear::Dense(l) => l.bias().cloned(),
                Linear::Cpu { bias, .. } | Linear::Quantized { bias, .. } => bias.clone(),
                Linear::Fp8(l) => l.bias().cloned(),
                Linear::Int4(l) => l.bias().cloned(),
                Linear::Affine(l) => l.bias().cloned(),
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

    /// The weight the fused decode kernels stream, of a layer without a bias: dense, FP8, 4-bit
    /// or GGUF codes.
    #[cfg(feature = "cuda")]
    pub fn gemv_weight(&self) -> Option<pagewise_kernels::GemvWeight<'_>> {
        match self {
            Linear::Fp8(l) if l.bias().is_none() => Some(l.matrix().into()),
            Linear::Int4(l) if l.bias().is_none() => Some(l.matrix().into()),
            Linear::Affine(l) if l.bias().is_none() => Some(l.matrix().into()),
            other => other.dense_weight().map(Into::into),
        }
    }

    /// The layer with any 4-bit codes row by row ([`Int4Linear::with_order`]), as the qkv GEMV
    /// with rotary reads them.
    pub fn in_rows(self) -> candle_core::Result<Linear> {
        match self {
            Linear::Int4(l) => Ok(Linear::Int4(
                l.with_order(super::int4_pack::CodeOrder::Rows)?,
            )),
            other => Ok(other),
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
            Linear::Affine(l) => l.forward(x),
            Linear::Cpu { weight, bias } => {
                let (dtype, dims) = (x.dtype(), x.dims());
                if dims.last() != Some(&weight.cols()) {
                    candle_core::bail!("input {dims:?} does not end in {} features", weight.cols());
                }
                let m = x.elem_count() / weight.cols();
                // f32 values are read in place; others converted first.
                let y = match with_f32(x, |input| weight.matmul(input, m))? {
                    Some(y) => y,
                    None => {
                        weight.matmul(&x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?, m)
                    }
                };
                let mut out_dims = dims.to_vec();
                *out_dims
                    .last_mut()
                    .expect("an input of at least one dimension") = weight.rows();
                let y = Tensor::from_vec(y, out_dims, x.device())?.to_dtype(dtype)?;
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
            Part::Rows(cfg.intermediate(tp)),
            Part::Cols(cfg.intermediate(tp)),
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
