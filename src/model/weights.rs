//! Where a model's weights come from: safetensors (memory-mapped), a GGUF file (kept quantized, or
//! dequantized at load), or seeded random weights (`--load-format dummy`). Model code asks for
//! tensors by their Hugging Face names; GGUF names are mapped here, once. A tensor-parallel rank
//! asks for its [`Part`] of a tensor: from safetensors it reads only those bytes of the mapping.

use std::collections::HashMap;

use candle_core::quantized::QTensor;

pub use super::gguf_weights::gguf_name;
use super::gguf_weights::{Iq4Tensor, RawTensor, gguf_linear};

use candle_core::{DType, Device, Shape, Tensor};
use candle_nn::VarBuilder;

use super::ModelError;
use super::checkpoint::Checkpoint;
pub use super::dummy_weights::DummyBackend;
use super::fp8_linear;
use super::layers::Linear;
use super::mxfp4::{GgufMxfp4, Mxfp4Host};
use super::quantized::CheckpointQuant;

/// A model's weights, addressed by Hugging Face tensor names.
pub enum Weights {
    /// Dense weights from a backend (the dummy weights), converted to the model dtype on load.
    Dense {
        /// The backend.
        vb: VarBuilder<'static>,
        /// `--quantization fp8`: the decoder layers' projections are quantized at load.
        quantize_fp8: bool,
        /// A 4-bit checkpoint's config under `--load-format dummy`: its group size, so that a GPU
        /// makes random 4-bit projections (`Weights::kept_int4`).
        dummy_int4: Option<usize>,
    },
    /// Memory-mapped safetensors files, converted to `dtype` on `device` as they are read.
    Safetensors {
        /// The files (one model may span several).
        files: Checkpoint,
        /// The model dtype.
        dtype: DType,
        /// Where tensors live.
        device: Device,
        /// A quantized checkpoint's layout: its FP8 tensors, and its packed integer weights, are
        /// dequantized as they are read, except the FP8 weights a GPU keeps
        /// (`fp8_linear::read_kept`).
        quantization: Option<CheckpointQuant>,
        /// `--quantization fp8` on a 16-bit checkpoint: as [`Weights::Dense`]'s.
        quantize_fp8: bool,
    },
    /// GGUF tensors; matmul weights stay quantized unless `dequantize` says otherwise.
    Gguf {
        /// All tensors of the file, by GGUF name.
        tensors: HashMap<String, QTensor>,
        /// Dtype of dense tensors (norms, embeddings).
        dtype: DType,
        /// Where tensors live.
        device: Device,
        /// Which matmul weights are dequantized at load.
        dequantize: Dequantize,
        /// MXFP4 tensors (gpt-oss's experts), read from the file when asked for: as they are
        /// ([`Weights::gguf_mxfp4`], for the GPU's expert kernels) or dequantized (as any other
        /// dense tensor).
        mxfp4: GgufMxfp4,
        /// IQ4_NL and IQ4_XS tensors (candle does not read them), by GGUF name.
        iq4: HashMap<String, Iq4Tensor>,
    },
}

/// Which GGUF matmul weights become float weights at load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dequantize {
    /// None: on the CPU our kernels take the types they know ([`QLinear`](crate::cpu::QLinear)), candle's quantized
    /// matmul the others.
    Nothing,
    /// Those our CPU kernels lack (on a GPU: none).
    WithoutCpuKernel,
    /// All (float matmuls, exact against the dequantized reference).
    All,
}

pub use super::weight_parts::Part;
use super::weight_parts::missing_or;

impl Weights {
    /// Each of `layers` layers' FP8 KV-cache scales `(k, v)` where a safetensors checkpoint has
    /// them ([`Checkpoint::kv_scales`]); `None` otherwise.
    pub fn kv_scales(&self, layers: usize) -> Result<Option<Vec<(f32, f32)>>, String> {
        match self {
            Weights::Safetensors { files, .. } => files.kv_scales(layers),
            Weights::Dense { .. } | Weights::Gguf { .. } => Ok(None),
        }
    }

    /// The device tensors are loaded to.
    pub fn device(&self) -> &Device {
        match self {
            Weights::Dense { vb, .. } => vb.device(),
            Weights::Safetensors { device, .. } | Weights::Gguf { device, .. } => device,
        }
    }

    /// The dtype of dense tensors.
    pub fn dtype(&self) -> DType {
        match self {
            Weights::Dense { vb, .. } => vb.dtype(),
            Weights::Safetensors { dtype, .. } | Weights::Gguf { dtype, .. } => *dtype,
        }
    }

    /// The MXFP4 tensor of GGUF name `name` as it is, read from the file now; `None` when the
    /// weights have no such MXFP4 tensor.
    pub fn gguf_mxfp4(&self, name: &str) -> Result<Option<Mxfp4Host>, ModelError> {
        match self {
            Weights::Gguf { mxfp4, .. } => mxfp4.host(name),
            _ => Ok(None),
        }
    }

    /// Whether a tensor exists.
    pub fn contains(&self, name: &str) -> bool {
        match self {
            Weights::Dense { vb, .. } => vb.contains_tensor(name),
            Weights::Safetensors {
                files,
                quantization,
                ..
            } => {
                files.has(name)
                    || matches!(quantization, Some(CheckpointQuant::Int(q))
                        if files.has(&q.packed_name(name)))
            }
            Weights::Gguf {
                tensors,
                mxfp4,
                iq4,
                ..
            } => gguf_name(name).is_some_and(|n| {
                tensors.contains_key(&n) || mxfp4.contains(&n) || iq4.contains_key(&n)
            }),
        }
    }

    fn qtensor(&self, name: &str) -> Result<&QTensor, ModelError> {
        let Weights::Gguf { tensors, .. } = self else {
            unreachable!("qtensor is only called on GGUF weights")
        };
        let gguf = gguf_name(name)
            .ok_or_else(|| ModelError::MissingTensor(format!("{name} (no GGUF name)")))?;
        tensors
            .get(&gguf)
            .ok_or_else(|| ModelError::MissingTensor(format!("{name} (GGUF {gguf})")))
    }

    /// A dense tensor of the given shape, in the model dtype.
    pub fn tensor(&self, name: &str, shape: impl Into<Shape>) -> Result<Tensor, ModelError> {
        let shape = shape.into();
        match self {
            Weights::Dense { vb, .. } => vb.get(shape, name).map_err(|e| missing_or(name, e)),
            Weights::Safetensors { .. } => {
                let dims = shape.dims();
                let (rows, cols) = match *dims {
                    [n] => (1, n),
                    [r, c] => (r, c),
                    _ => return self.slice_safetensors(name, dims, &Part::Whole),
                };
                self.slice_safetensors(name, &[rows, cols], &Part::Whole)?
                    .reshape(shape)
                    .map_err(ModelError::from)
            }
            Weights::Gguf {
                device,
                dtype,
                mxfp4,
                iq4,
                ..
            } => {
                // An MXFP4 tensor is read from the file now, dequantized to the model dtype.
                let read = gguf_name(name).map(|n| mxfp4.dequantized(&n, *dtype, device));
                let iq4 = gguf_name(name).and_then(|n| iq4.get(&n));
                let t = match (read.transpose()?.flatten(), iq4) {
                    (Some(t), _) => t,
                    (None, Some(t)) => t.dequantize(device)?,
                    (None, None) => self.qtensor(name)?.dequantize(device)?,
                };
                if t.shape() != &shape {
                    return Err(ModelError::Config(format!(
                        "tensor {name} has shape {:?}, expected {shape:?}",
                        t.shape()
                    )));
                }
                Ok(t.to_dtype(*dtype)?)
            }
        }
    }

    /// A linear layer `prefix.weight` (`[out, in]`) with `prefix.bias` when `bias`.
    pub fn linear(
        &self,
        prefix: &str,
        in_dim: usize,
        out_dim: usize,
        bias: bool,
    ) -> Result<Linear, ModelError> {
        self.linear_part(prefix, (in_dim, out_dim), bias, Part::Whole)
    }

    /// `part` of the linear layer `prefix` (`[out_dim, in_dim]`): [`Part::Rows`] for a
    /// column-parallel layer (its bias sliced the same way), [`Part::Cols`] for a row-parallel
    /// one (its bias whole: the caller asks for it on one rank only).
    pub fn linear_part(
        &self,
        prefix: &str,
        (in_dim, out_dim): (usize, usize),
        bias: bool,
        part: Part,
    ) -> Result<Linear, ModelError> {
        let part = part.within((out_dim, in_dim));
        let weight_name = format!("{prefix}.weight");
        let bias = if bias {
            let name = format!("{prefix}.bias");
            Some(self.vector_part(&name, out_dim, &part.of_vector(out_dim))?)
        } else {
            None
        };
        match self {
            Weights::Dense { .. } | Weights::Safetensors { .. } => {
                if let Some(kept) = self.kept_fp8(&weight_name, (out_dim, in_dim), &part)? {
                    return Ok(Linear::Fp8(kept.with_bias(bias)));
                }
                if let Some(kept) = self.kept_int4(&weight_name, (out_dim, in_dim), &part)? {
                    return Ok(Linear::Int4(kept.with_bias(bias)));
                }
                if let Some(kept) =
                    self.kept_affine_expert(&weight_name, (out_dim, in_dim), &part)?
                {
                    return Ok(Linear::Affine(kept.with_bias(bias)));
                }
                let w = self.tensor_part(&weight_name, (out_dim, in_dim), &part)?;
                if self.quantizes_fp8(prefix) {
                    return fp8_linear::quantized(&w, bias);
                }
                Ok(Linear::dense(w, bias))
            }
            Weights::Gguf {
                dequantize,
                device,
                dtype,
                mxfp4,
                ..
            } => {
                if part != Part::Whole {
                    return Err(gguf_unsharded());
                }
                if gguf_name(&weight_name).is_some_and(|n| mxfp4.contains(&n)) {
                    let w = self.tensor(&weight_name, (out_dim, in_dim))?;
                    return Ok(Linear::dense(w, bias));
                }
                let gguf = gguf_name(&weight_name).ok_or_else(|| {
                    ModelError::MissingTensor(format!("{weight_name} (no GGUF name)"))
                })?;
                let RawTensor { ty, dims, bytes } = self.gguf_raw(&gguf)?.ok_or_else(|| {
                    ModelError::MissingTensor(format!("{weight_name} (GGUF {gguf})"))
                })?;
                if dims != [out_dim, in_dim] {
                    return Err(ModelError::Config(format!(
                        "tensor {weight_name} has shape {dims:?}, expected [{out_dim}, {in_dim}]"
                    )));
                }
                gguf_linear(
                    ty,
                    &bytes,
                    (out_dim, in_dim),
                    *dequantize,
                    (device, *dtype),
                    (bias, false),
                )
            }
        }
    }

    /// `part` of the 2-D tensor `name` of shape `full` (`[rows, cols]`), in the model dtype.
    pub fn tensor_part(
        &self,
        name: &str,
        full: (usize, usize),
        part: &Part,
    ) -> Result<Tensor, ModelError> {
        let part = &part.within(full);
        match (self, part) {
            (_, Part::Whole) => self.tensor(name, full),
            (Weights::Safetensors { .. }, _) => {
                self.slice_safetensors(name, &[full.0, full.1], part)
            }
            // Dummy weights are drawn whole (so every tensor-parallel size gets the same model)
            // and sliced.
            (Weights::Dense { .. }, Part::Rows(r)) => Ok(self
                .tensor(name, full)?
                .narrow(0, r.start, r.len())?
                .contiguous()?),
            (Weights::Dense { .. }, Part::Cols(c)) => Ok(self
                .tensor(name, full)?
                .narrow(1, c.start, c.len())?
                .contiguous()?),
            (Weights::Gguf { .. }, _) => Err(gguf_unsharded()),
        }
    }

    /// `part` (rows of a [`Part::Rows`]) of the vector `name` of length `len`.
    fn vector_part(&self, name: &str, len: usize, part: &Part) -> Result<Tensor, ModelError> {
        match part {
            Part::Rows(r) if r.len() != len => Ok(self
                .tensor_part(name, (1, len), &Part::Cols(r.clone()))?
                .flatten_all()?),
            _ => self.tensor(name, len),
        }
    }
}

pub(super) fn gguf_unsharded() -> ModelError {
    ModelError::Unsupported(
        "tensor parallelism reads safetensors or dummy weights; GGUF files are not sharded".into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hf_names_map_to_gguf_names() {
        assert_eq!(
            gguf_name("model.embed_tokens.weight").unwrap(),
            "token_embd.weight"
        );
        assert_eq!(
            gguf_name("model.layers.12.self_attn.o_proj.weight").unwrap(),
            "blk.12.attn_output.weight"
        );
        assert_eq!(
            gguf_name("model.layers.0.self_attn.q_proj.bias").unwrap(),
            "blk.0.attn_q.bias"
        );
        assert_eq!(
            gguf_name("model.layers.3.post_attention_layernorm.weight").unwrap(),
            "blk.3.ffn_norm.weight"
        );
        assert_eq!(gguf_name("model.layers.3.unknown.weight"), None);
    }
}
