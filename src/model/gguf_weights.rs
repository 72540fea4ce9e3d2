//! GGUF tensors as model weights: llama.cpp's tensor names for the Hugging Face ones the models
//! ask for, a matrix's bytes as a linear layer, and experts stacked in one tensor.

use std::borrow::Cow;

use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{DType, Device, Tensor};

use super::ModelError;
use super::affine_linear::AffineLinear;
use super::gguf_affine;
use super::layers::Linear;
use super::weights::{Dequantize, Part, Weights, gguf_unsharded};
use crate::cpu::QLinear;
use crate::cpu::iq4::{self, Iq4Type};

/// A GGUF tensor's type: one candle reads, or one only pagewise's CPU kernels read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgufType {
    /// A type of candle's.
    Candle(GgmlDType),
    /// IQ4_NL or IQ4_XS.
    Iq4(Iq4Type),
}

/// A GGUF tensor as the file stores it.
pub(super) struct RawTensor<'a> {
    /// Its type.
    pub ty: GgufType,
    /// Its shape, outermost first.
    pub dims: Vec<usize>,
    /// Its blocks.
    pub bytes: Cow<'a, [u8]>,
}

/// A tensor of a type candle does not read (IQ4_NL, IQ4_XS): its bytes as the file has them.
#[derive(Debug)]
pub struct Iq4Tensor {
    /// Its type.
    pub ty: Iq4Type,
    /// Its shape, outermost first.
    pub dims: Vec<usize>,
    /// Its blocks.
    pub bytes: Vec<u8>,
}

impl Iq4Tensor {
    /// The tensor dequantized to f32 on `device`.
    pub fn dequantize(&self, device: &Device) -> Result<Tensor, ModelError> {
        dequantize_iq4(self.ty, &self.bytes, &self.dims, device)
    }
}

/// IQ4 blocks `bytes` of a tensor of shape `dims` dequantized to f32 on `device`.
fn dequantize_iq4(
    ty: Iq4Type,
    bytes: &[u8],
    dims: &[usize],
    device: &Device,
) -> Result<Tensor, ModelError> {
    let mut values = Vec::with_capacity(dims.iter().product());
    iq4::dequantize(ty, bytes, &mut values);
    Ok(Tensor::from_vec(values, dims, device)?)
}

/// The GGUF (llama.cpp) name of a Hugging Face Llama tensor name. Models without Llama's names
/// (GPT-2, GPT-NeoX) ask for llama.cpp's names (`blk.N.*` and the top-level ones), which map to
/// themselves.
pub fn gguf_name(hf: &str) -> Option<String> {
    const GGUF_TOP: [&str; 6] = [
        "token_embd.weight",
        "position_embd.weight",
        "output_norm.weight",
        "output_norm.bias",
        "output.weight",
        "output.bias",
    ];
    if hf.starts_with("blk.") || GGUF_TOP.contains(&hf) {
        return Some(hf.to_string());
    }
    let fixed = match hf {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(name) = fixed {
        return Some(name.to_string());
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let (module, kind) = rest.rsplit_once('.')?;
    let mapped = match module {
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" => "ffn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        // Gemma 3's norms around the attention and the MLP (the one after attention is asked
        // for by its llama.cpp name: Llama's `post_attention_layernorm` is `ffn_norm`).
        "post_attention_norm" => "post_attention_norm",
        "pre_feedforward_layernorm" => "ffn_norm",
        "post_feedforward_layernorm" => "post_ffw_norm",
        // Phi-3's stacked projections (gate rows before up rows, as llama.cpp keeps them).
        "self_attn.qkv_proj" => "attn_qkv",
        "mlp.gate_up_proj" => "ffn_up",
        // A mixture of experts' router (Qwen3-MoE's, Mixtral's and gpt-oss's names).
        "mlp.gate" | "block_sparse_moe.gate" | "mlp.router" => "ffn_gate_inp",
        _ => return None,
    };
    Some(format!("blk.{layer}.{mapped}.{kind}"))
}

/// A linear layer from the GGUF bytes of a `[rows, cols]` matrix of type `ty`. On the CPU, our
/// kernels take the quantized types they know and F16 / BF16 (read as they are, at half the bytes
/// of f32), unless `dequantize` is `All`; F32, and every float type on a GPU, become dense weights
/// in the model's `float` dtype, as safetensors weights do (so they take the same kernels). On a
/// GPU with f16 or bf16 activations, the types [`gguf_affine::repacks`] are our kernels' codes
/// ([`AffineLinear`], experts' too: `expert`) unless `dequantize` is `All`, and the other
/// quantized types are float weights (the log says so, once a type), except an expert's, which
/// keeps candle's quantized matmul. Elsewhere other quantized types are float weights or candle's quantized
/// matmul, as `dequantize` says. IQ4 types, which candle does not read, are float weights
/// wherever our kernels do not take them (on a GPU: dequantized at load).
pub(super) fn gguf_linear(
    ty: GgufType,
    bytes: &[u8],
    (rows, cols): (usize, usize),
    dequantize: Dequantize,
    (device, float): (&Device, DType),
    (bias, expert): (Option<Tensor>, bool),
) -> Result<Linear, ModelError> {
    let dtype = match ty {
        GgufType::Candle(dtype) => dtype,
        GgufType::Iq4(ty) => {
            return iq4_linear(ty, bytes, (rows, cols), dequantize, (device, float), bias);
        }
    };
    let dense = matches!(dtype, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16);
    let codes_here = device.is_cuda()
        && matches!(float, DType::BF16 | DType::F16)
        && dequantize != Dequantize::All
        && !dense;
    if codes_here
        && let Some(a) = gguf_affine::affine_codes(dtype, bytes, (rows, cols))
        && let Some(l) = AffineLinear::new(&a, device)?
    {
        return Ok(Linear::Affine(l.with_bias(bias)));
    }
    // (An expert of another type keeps candle's quantized matmul: dequantized, a large mixture's
    // experts might not fit the GPU.)
    if codes_here && !expert {
        log_dequantized(dtype);
        let q = QTensor::new(
            QStorage::from_data(Cow::Borrowed(bytes), device, dtype)?,
            (rows, cols),
        )?;
        return Ok(Linear::dense(q.dequantize(device)?.to_dtype(float)?, bias));
    }
    let kernel = match dequantize {
        Dequantize::All => None,
        _ if dtype == GgmlDType::F32 || !device.is_cpu() => None,
        _ => QLinear::from_gguf(dtype, bytes, rows, cols),
    };
    if let Some(weight) = kernel {
        return Ok(Linear::Cpu {
            weight: std::sync::Arc::new(weight),
            bias,
        });
    }
    // A copy of the quantized bytes: a tied embedding also reads this tensor.
    let q = QTensor::new(
        QStorage::from_data(Cow::Borrowed(bytes), device, dtype)?,
        (rows, cols),
    )?;
    if dense
        || dequantize == Dequantize::All
        || (dequantize == Dequantize::WithoutCpuKernel && device.is_cpu())
    {
        Ok(Linear::dense(q.dequantize(device)?.to_dtype(float)?, bias))
    } else {
        Ok(Linear::quantized(QMatMul::from_qtensor(q)?, bias))
    }
}

/// Says once a type that a GGUF type our GPU kernels do not read is dequantized at load.
fn log_dequantized(ty: GgmlDType) {
    static LOGGED: std::sync::Mutex<Vec<GgmlDType>> = std::sync::Mutex::new(Vec::new());
    let mut logged = LOGGED.lock().unwrap_or_else(|e| e.into_inner());
    if !logged.contains(&ty) {
        logged.push(ty);
        tracing::info!(
            "GGUF {ty:?} matrices are dequantized at load on the GPU (its kernels read Q4_0, \
             Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K)"
        );
    }
}

/// [`gguf_linear`] for an IQ4 type.
fn iq4_linear(
    ty: Iq4Type,
    bytes: &[u8],
    (rows, cols): (usize, usize),
    dequantize: Dequantize,
    (device, float): (&Device, DType),
    bias: Option<Tensor>,
) -> Result<Linear, ModelError> {
    let misshapen = || {
        ModelError::Config(format!(
            "{} tensor of {} bytes is not [{rows}, {cols}] (rows of whole {}-weight blocks)",
            ty.name(),
            bytes.len(),
            ty.block()
        ))
    };
    if ty
        .bytes_of(cols)
        .is_none_or(|row| row * rows != bytes.len())
    {
        return Err(misshapen());
    }
    if device.is_cpu() && dequantize != Dequantize::All {
        let weight = QLinear::from_iq4(ty, bytes, rows, cols).ok_or_else(misshapen)?;
        return Ok(Linear::Cpu {
            weight: std::sync::Arc::new(weight),
            bias,
        });
    }
    let weight = dequantize_iq4(ty, bytes, &[rows, cols], device)?;
    Ok(Linear::dense(weight.to_dtype(float)?, bias))
}

impl Weights {
    /// Expert `expert` of the experts stacked in the GGUF tensor `gguf` (llama.cpp's
    /// `blk.N.ffn_{gate,up,down}_exps.weight`, `[experts, out_dim, in_dim]`): its `[out_dim,
    /// in_dim]` matrix, read from its own bytes. `part` must cover all of it: GGUF is not
    /// sharded.
    pub fn stacked_expert(
        &self,
        gguf: &str,
        expert: usize,
        (in_dim, out_dim): (usize, usize),
        part: Part,
    ) -> Result<Linear, ModelError> {
        if part.within((out_dim, in_dim)) != Part::Whole {
            return Err(gguf_unsharded());
        }
        let Weights::Gguf {
            dequantize,
            device,
            dtype,
            ..
        } = self
        else {
            return Err(ModelError::Unsupported(format!(
                "stacked experts ({gguf}) outside a GGUF file"
            )));
        };
        let RawTensor {
            ty,
            dims,
            bytes: data,
        } = self
            .gguf_raw(gguf)?
            .ok_or_else(|| ModelError::MissingTensor(gguf.to_string()))?;
        if dims.len() != 3 || dims[1..] != [out_dim, in_dim] || expert >= dims[0] {
            return Err(ModelError::Config(format!(
                "tensor {gguf} has shape {dims:?}, expected [experts > {expert}, {out_dim}, {in_dim}]"
            )));
        }
        let per_expert = data.len() / dims[0];
        let bytes = &data[expert * per_expert..(expert + 1) * per_expert];
        gguf_linear(
            ty,
            bytes,
            (out_dim, in_dim),
            *dequantize,
            (device, *dtype),
            (None, true),
        )
    }

    /// The GGUF tensor `gguf` (a GGUF name) as the file stores it; `None` when the file has no
    /// such tensor (or the weights are not GGUF).
    pub(super) fn gguf_raw(&self, gguf: &str) -> Result<Option<RawTensor<'_>>, ModelError> {
        let Weights::Gguf { tensors, iq4, .. } = self else {
            return Ok(None);
        };
        if let Some(t) = iq4.get(gguf) {
            return Ok(Some(RawTensor {
                ty: GgufType::Iq4(t.ty),
                dims: t.dims.clone(),
                bytes: Cow::Borrowed(&t.bytes),
            }));
        }
        match tensors.get(gguf) {
            Some(q) => Ok(Some(RawTensor {
                ty: GgufType::Candle(q.dtype()),
                dims: q.shape().dims().to_vec(),
                bytes: q.data()?,
            })),
            None => Ok(None),
        }
    }
}
