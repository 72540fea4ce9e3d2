//! Where a model's weights come from: safetensors (memory-mapped), a GGUF file (kept quantized, or
//! dequantized at load), or seeded random weights (`--load-format dummy`). Model code asks for
//! tensors by their Hugging Face names; GGUF names are mapped here, once.

use std::collections::HashMap;

use candle_core::quantized::{QMatMul, QStorage, QTensor};
use candle_core::{DType, Device, Shape, Tensor};
use candle_nn::VarBuilder;

use super::ModelError;
use super::layers::Linear;
use crate::sampler::SeededRng;

/// A model's weights, addressed by Hugging Face tensor names.
pub enum Weights {
    /// Dense weights: safetensors or the dummy backend, converted to the model dtype on load.
    Dense(VarBuilder<'static>),
    /// GGUF tensors; matmul weights stay quantized unless `dequantize`.
    Gguf {
        /// All tensors of the file, by GGUF name.
        tensors: HashMap<String, QTensor>,
        /// Dtype of dense tensors (norms, embeddings).
        dtype: DType,
        /// Where tensors live.
        device: Device,
        /// Dequantize matmul weights at load (exact-parity mode) instead of quantized matmul.
        dequantize: bool,
    },
}

/// The GGUF (llama.cpp) name of a Hugging Face Llama tensor name.
pub fn gguf_name(hf: &str) -> Option<String> {
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
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        _ => return None,
    };
    Some(format!("blk.{layer}.{mapped}.{kind}"))
}

impl Weights {
    /// The device tensors are loaded to.
    pub fn device(&self) -> &Device {
        match self {
            Weights::Dense(vb) => vb.device(),
            Weights::Gguf { device, .. } => device,
        }
    }

    /// The dtype of dense tensors.
    pub fn dtype(&self) -> DType {
        match self {
            Weights::Dense(vb) => vb.dtype(),
            Weights::Gguf { dtype, .. } => *dtype,
        }
    }

    /// Whether a tensor exists.
    pub fn contains(&self, name: &str) -> bool {
        match self {
            Weights::Dense(vb) => vb.contains_tensor(name),
            Weights::Gguf { tensors, .. } => {
                gguf_name(name).is_some_and(|n| tensors.contains_key(&n))
            }
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
            Weights::Dense(vb) => vb.get(shape, name).map_err(|e| missing_or(name, e)),
            Weights::Gguf { device, dtype, .. } => {
                let t = self.qtensor(name)?.dequantize(device)?;
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
        let weight_name = format!("{prefix}.weight");
        let bias = if bias {
            Some(self.tensor(&format!("{prefix}.bias"), out_dim)?)
        } else {
            None
        };
        match self {
            Weights::Dense(_) => {
                let w = self.tensor(&weight_name, (out_dim, in_dim))?;
                Ok(Linear::dense(w, bias))
            }
            Weights::Gguf {
                dequantize, device, ..
            } => {
                let q = self.qtensor(&weight_name)?;
                if q.shape().dims() != [out_dim, in_dim] {
                    return Err(ModelError::Config(format!(
                        "tensor {weight_name} has shape {:?}, expected [{out_dim}, {in_dim}]",
                        q.shape()
                    )));
                }
                if *dequantize {
                    Ok(Linear::dense(q.dequantize(device)?, bias))
                } else {
                    // A copy of the quantized bytes: a tied embedding also reads this tensor.
                    let storage = QStorage::from_data(q.data()?, device, q.dtype())?;
                    let q = QTensor::new(storage, q.shape().clone())?;
                    Ok(Linear::quantized(QMatMul::from_qtensor(q)?, bias))
                }
            }
        }
    }
}

fn missing_or(name: &str, e: candle_core::Error) -> ModelError {
    let text = e.to_string();
    if text.contains("cannot find tensor") || text.contains("not found") {
        ModelError::MissingTensor(name.to_string())
    } else {
        ModelError::Candle(e)
    }
}

/// Seeded random weights with the right shapes (`--load-format dummy`): N(0, 0.02) for matrices,
/// ones for norm scales, zeros for biases. Each tensor's values depend only on the seed and its
/// name, so the same model is produced on every run.
pub struct DummyBackend {
    /// Base seed.
    pub seed: u64,
}

impl candle_nn::var_builder::SimpleBackend for DummyBackend {
    fn get(
        &self,
        shape: Shape,
        name: &str,
        _hints: candle_nn::Init,
        dtype: DType,
        device: &Device,
    ) -> candle_core::Result<Tensor> {
        let n = shape.elem_count();
        let is_random = !name.ends_with(".bias") && !name.contains("norm");
        if is_random && !device.is_cpu() {
            // A GPU draws its own: an 8B model's weights take seconds instead of minutes. Seeded
            // per tensor, so a run reproduces (the values differ from the CPU's stream).
            let mut h = std::hash::DefaultHasher::new();
            std::hash::Hash::hash(name, &mut h);
            device.set_seed(self.seed ^ std::hash::Hasher::finish(&h))?;
            return Tensor::randn(0f32, 0.02, shape, device)?.to_dtype(dtype);
        }
        let values: Vec<f32> = if name.ends_with(".bias") {
            vec![0.0; n]
        } else if name.contains("norm") {
            vec![1.0; n]
        } else {
            let mut h = std::hash::DefaultHasher::new();
            std::hash::Hash::hash(name, &mut h);
            let mut rng = SeededRng::new(self.seed, std::hash::Hasher::finish(&h));
            (0..n).map(|_| 0.02 * standard_normal(&mut rng)).collect()
        };
        Tensor::from_vec(values, shape, &Device::Cpu)?
            .to_dtype(dtype)?
            .to_device(device)
    }

    fn get_unchecked(
        &self,
        name: &str,
        _dtype: DType,
        _dev: &Device,
    ) -> candle_core::Result<Tensor> {
        candle_core::bail!("dummy weights need a shape for {name}")
    }

    fn contains_tensor(&self, _name: &str) -> bool {
        true
    }
}

/// One standard normal draw (Box-Muller).
fn standard_normal(rng: &mut SeededRng) -> f32 {
    let u1 = rng.next_f64().max(f64::MIN_POSITIVE);
    let u2 = rng.next_f64();
    ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
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

    #[test]
    fn dummy_weights_are_seeded_and_shaped() {
        let vb = |seed| {
            VarBuilder::from_backend(Box::new(DummyBackend { seed }), DType::F32, Device::Cpu)
        };
        let a = vb(1)
            .get((4, 8), "model.layers.0.mlp.up_proj.weight")
            .unwrap();
        let b = vb(1)
            .get((4, 8), "model.layers.0.mlp.up_proj.weight")
            .unwrap();
        let c = vb(2)
            .get((4, 8), "model.layers.0.mlp.up_proj.weight")
            .unwrap();
        let (a, b, c) = (
            a.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            b.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            c.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        );
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.iter().all(|x| x.abs() < 0.2));
        let norm = vb(1)
            .get(8, "model.norm.weight")
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(norm, vec![1.0; 8]);
    }
}
