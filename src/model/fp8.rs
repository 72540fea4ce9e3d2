//! FP8 checkpoints: e4m3 weights stored with their scales, as llm-compressor
//! (`quant_method: compressed-tensors`, format `float-quantized`) and the block-quantized releases
//! (`quant_method: fp8` with `weight_block_size`, as Qwen3-FP8) write them. [`Fp8Checkpoint::parse`]
//! reads `quantization_config` and refuses, by name, any variant it does not know;
//! [`dequantize`] turns one stored weight and its scale into plain values.
//!
//! Weights are dequantized at load to the model dtype, so every path (CPU, GPU, experts, tensor
//! parallelism) runs them as it runs a 16-bit checkpoint. Activation scales (`input_scale`) are not
//! applied: activations stay in the model dtype, as in transformers' decompressed models.

use candle_core::{DType, Device, Tensor};
use serde_json::Value;

use super::ModelError;

/// How a checkpoint's e4m3 weights are scaled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fp8Scales {
    /// `weight_scale`: one number for the whole tensor.
    PerTensor,
    /// `weight_scale`: one number per output row (`[out, 1]` or `[out]`).
    PerRow,
    /// `weight_scale_inv` (`quant_method: fp8`) or `weight_scale` (compressed-tensors' `block`
    /// strategy): one number per `[rows, cols]` block of the weight, `[⌈out/rows⌉, ⌈in/cols⌉]`.
    Blocks {
        /// Rows of a block (output features).
        rows: usize,
        /// Columns of a block (input features).
        cols: usize,
    },
}

/// An FP8 checkpoint's layout, from its `quantization_config`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fp8Checkpoint {
    /// `compressed-tensors` or `fp8`.
    pub method: &'static str,
    /// How its weights are scaled.
    pub scales: Fp8Scales,
    /// Activations quantized with stored per-tensor scales (`input_scale`) rather than per token.
    pub static_activations: bool,
}

impl Fp8Checkpoint {
    /// The scale tensor stored beside weight `name` (`….weight`).
    pub fn scale_name(&self, name: &str) -> String {
        let stem = name.strip_suffix(".weight").unwrap_or(name);
        match (self.method, self.scales) {
            ("fp8", Fp8Scales::Blocks { .. }) => format!("{stem}.weight_scale_inv"),
            _ => format!("{stem}.weight_scale"),
        }
    }

    /// Reads a `quantization_config` whose `quant_method` is `compressed-tensors` or `fp8`;
    /// `Ok(None)` for any other method (not FP8: the caller decides).
    pub fn parse(q: &Value) -> Result<Option<Self>, ModelError> {
        match q.get("quant_method").and_then(Value::as_str) {
            Some("compressed-tensors") => compressed_tensors(q).map(Some),
            Some("fp8") => block_fp8(q).map(Some),
            _ => Ok(None),
        }
    }

    /// One line for the load log.
    pub fn describe(&self) -> String {
        let scales = match self.scales {
            Fp8Scales::PerTensor => "per-tensor scales".to_string(),
            Fp8Scales::PerRow => "per-channel scales".to_string(),
            Fp8Scales::Blocks { rows, cols } => format!("{rows}x{cols} block scales"),
        };
        let acts = match self.static_activations {
            true => "static activation scales",
            false => "dynamic activation scales",
        };
        format!("FP8 e4m3 ({}, {scales}, {acts})", self.method)
    }
}

fn unsupported(what: String) -> ModelError {
    ModelError::Unsupported(format!(
        "{what}; pagewise reads FP8 e4m3 checkpoints (compressed-tensors \"float-quantized\", or \
         quant_method \"fp8\"), integer ones (AWQ, GPTQ, compressed-tensors \"pack-quantized\") \
         and the unquantized ones"
    ))
}

/// compressed-tensors: `format: float-quantized`, every config group's weights 8-bit float,
/// symmetric, static, by tensor, channel or block; activations absent or 8-bit float.
fn compressed_tensors(q: &Value) -> Result<Fp8Checkpoint, ModelError> {
    let format = q.get("format").and_then(Value::as_str).unwrap_or("");
    if format != "float-quantized" {
        return Err(unsupported(format!(
            "compressed-tensors format {format:?} is not implemented"
        )));
    }
    if q.get("sparsity_config")
        .is_some_and(|s| !s.is_null() && s != &Value::Object(Default::default()))
    {
        return Err(unsupported(
            "compressed-tensors sparsity_config is not implemented".into(),
        ));
    }
    super::quantized::one_scheme(q, unsupported, |name, group, weights| {
        let scales = float8_weights(name, weights)?;
        if group
            .get("output_activations")
            .is_some_and(|o| !o.is_null())
        {
            return Err(unsupported(format!(
                "config group {name:?}: output_activations quantization is not implemented"
            )));
        }
        let static_activations = match group.get("input_activations").filter(|a| !a.is_null()) {
            None => false,
            Some(a) => {
                float8(name, "input_activations", a)?;
                !a.get("dynamic").and_then(Value::as_bool).unwrap_or(false)
            }
        };
        Ok(Fp8Checkpoint {
            method: "compressed-tensors",
            scales,
            static_activations,
        })
    })
}

/// A quantization args object must be 8-bit float (e4m3), symmetric.
fn float8(group: &str, what: &str, a: &Value) -> Result<(), ModelError> {
    let bits = a.get("num_bits").and_then(Value::as_u64);
    let kind = a.get("type").and_then(Value::as_str).unwrap_or("int");
    if bits != Some(8) || kind != "float" {
        return Err(unsupported(format!(
            "config group {group:?}: {what} of {} bits, type {kind:?}, are not implemented",
            bits.map_or("unknown".to_string(), |b| b.to_string())
        )));
    }
    if a.get("symmetric").and_then(Value::as_bool) == Some(false) {
        return Err(unsupported(format!(
            "config group {group:?}: asymmetric {what} are not implemented"
        )));
    }
    Ok(())
}

fn float8_weights(group: &str, w: &Value) -> Result<Fp8Scales, ModelError> {
    float8(group, "weights", w)?;
    if w.get("dynamic").and_then(Value::as_bool) == Some(true) {
        return Err(unsupported(format!(
            "config group {group:?}: dynamic weight scales are not implemented"
        )));
    }
    match w
        .get("strategy")
        .and_then(Value::as_str)
        .unwrap_or("tensor")
    {
        "tensor" => Ok(Fp8Scales::PerTensor),
        "channel" => Ok(Fp8Scales::PerRow),
        "block" => block_size(w.get("block_structure"), "block_structure"),
        other => Err(unsupported(format!(
            "config group {group:?}: weight strategy {other:?} is not implemented (tensor, \
             channel and block are)"
        ))),
    }
}

fn block_size(v: Option<&Value>, key: &str) -> Result<Fp8Scales, ModelError> {
    let dims: Option<Vec<usize>> = v
        .and_then(Value::as_array)
        .and_then(|a| a.iter().map(|d| d.as_u64().map(|d| d as usize)).collect());
    match dims.as_deref() {
        Some(&[rows, cols]) if rows > 0 && cols > 0 => Ok(Fp8Scales::Blocks { rows, cols }),
        _ => Err(unsupported(format!(
            "{key} {v:?} is not two positive sizes"
        ))),
    }
}

/// `quant_method: fp8`: e4m3, block scales (`weight_block_size`, `weight_scale_inv`) or one scale
/// per tensor (`weight_scale`, vLLM's serialized FP8).
fn block_fp8(q: &Value) -> Result<Fp8Checkpoint, ModelError> {
    let fmt = q.get("fmt").and_then(Value::as_str).unwrap_or("e4m3");
    if fmt != "e4m3" {
        return Err(unsupported(format!("fp8 fmt {fmt:?} is not implemented")));
    }
    let scheme = q
        .get("activation_scheme")
        .and_then(Value::as_str)
        .unwrap_or("dynamic");
    let static_activations = match scheme {
        "dynamic" => false,
        "static" => true,
        other => return Err(unsupported(format!("fp8 activation_scheme {other:?}"))),
    };
    let scales = match q.get("weight_block_size").filter(|b| !b.is_null()) {
        Some(b) => block_size(Some(b), "weight_block_size")?,
        None => Fp8Scales::PerTensor,
    };
    Ok(Fp8Checkpoint {
        method: "fp8",
        scales,
        static_activations,
    })
}

/// Weight `name`, stored as e4m3 of `shape` (`[out, in]`), times `scale` laid out as `scheme`
/// says, as f32 on `device`. A scale of any other shape is an error naming both.
pub fn dequantize(
    name: &str,
    weight: &Tensor,
    scale: &Tensor,
    scheme: Fp8Scales,
    device: &Device,
) -> Result<Tensor, ModelError> {
    let (out, inp) = weight.dims2().map_err(|_| {
        ModelError::Config(format!(
            "FP8 tensor {name} has shape {:?}: only matrices are read",
            weight.shape()
        ))
    })?;
    let dims = scale.dims().to_vec();
    let expected: &[&[usize]] = match scheme {
        Fp8Scales::PerTensor => &[&[], &[1]],
        Fp8Scales::PerRow => &[&[out, 1], &[out]],
        Fp8Scales::Blocks { .. } => &[],
    };
    let blocks = match scheme {
        Fp8Scales::Blocks { rows, cols } => Some([out.div_ceil(rows), inp.div_ceil(cols)]),
        _ => None,
    };
    let fits = expected.contains(&dims.as_slice()) || blocks.is_some_and(|b| dims == b);
    if !fits {
        let want = match blocks {
            Some(b) => format!("{b:?}"),
            None => format!("{expected:?}"),
        };
        return Err(ModelError::Config(format!(
            "the scale of FP8 tensor {name} has shape {dims:?}; {scheme:?} scales of a \
             [{out}, {inp}] weight are {want}"
        )));
    }
    let w = weight.to_dtype(DType::F32)?.to_device(&Device::Cpu)?;
    let s: Vec<f32> = scale
        .to_dtype(DType::F32)?
        .to_device(&Device::Cpu)?
        .flatten_all()?
        .to_vec1()?;
    let mut values: Vec<f32> = w.flatten_all()?.to_vec1()?;
    for (r, row) in values.chunks_exact_mut(inp).enumerate() {
        match scheme {
            Fp8Scales::PerTensor => row.iter_mut().for_each(|x| *x *= s[0]),
            Fp8Scales::PerRow => row.iter_mut().for_each(|x| *x *= s[r]),
            Fp8Scales::Blocks { rows, cols } => {
                let per_row = inp.div_ceil(cols);
                let block_row = &s[(r / rows) * per_row..][..per_row];
                for (chunk, scale) in row.chunks_mut(cols).zip(block_row) {
                    chunk.iter_mut().for_each(|x| *x *= scale);
                }
            }
        }
    }
    Ok(Tensor::from_vec(values, (out, inp), &Device::Cpu)?.to_device(device)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn e4m3(values: &[f32], shape: (usize, usize)) -> Tensor {
        Tensor::from_vec(values.to_vec(), shape, &Device::Cpu)
            .unwrap()
            .to_dtype(DType::F8E4M3)
            .unwrap()
    }

    fn run(w: &Tensor, s: Tensor, scheme: Fp8Scales) -> Result<Vec<Vec<f32>>, ModelError> {
        Ok(dequantize("x.weight", w, &s, scheme, &Device::Cpu)?
            .to_vec2()
            .unwrap())
    }

    #[test]
    fn scales_apply_along_their_axis() {
        let w = e4m3(&[1.0, 2.0, 3.0, -4.0, 0.5, 1.5], (2, 3));
        let t = Tensor::new(&[2f32], &Device::Cpu).unwrap();
        assert_eq!(
            run(&w, t, Fp8Scales::PerTensor).unwrap(),
            [[2.0, 4.0, 6.0], [-8.0, 1.0, 3.0]]
        );
        let rows = Tensor::new(&[[2f32], [10.0]], &Device::Cpu).unwrap();
        assert_eq!(
            run(&w, rows, Fp8Scales::PerRow).unwrap(),
            [[2.0, 4.0, 6.0], [-40.0, 5.0, 15.0]]
        );
        // Scales along the input axis are refused, not broadcast.
        let cols = Tensor::new(&[[2f32, 10.0, 1.0]], &Device::Cpu).unwrap();
        let err = run(&w, cols, Fp8Scales::PerRow).unwrap_err().to_string();
        assert!(
            err.contains("[1, 3]") && err.contains("[[2, 1], [2]]"),
            "{err}"
        );
    }

    #[test]
    fn block_scales_cover_partial_blocks() {
        // A [3, 5] weight in 2x2 blocks: scales [2, 3], the last row and column partial.
        let w = e4m3(&[1.0; 15], (3, 5));
        let s = Tensor::new(&[[1f32, 2.0, 3.0], [4.0, 5.0, 6.0]], &Device::Cpu).unwrap();
        let blocks = Fp8Scales::Blocks { rows: 2, cols: 2 };
        assert_eq!(
            run(&w, s.clone(), blocks).unwrap(),
            [
                [1.0, 1.0, 2.0, 2.0, 3.0],
                [1.0, 1.0, 2.0, 2.0, 3.0],
                [4.0, 4.0, 5.0, 5.0, 6.0]
            ]
        );
        let err = run(&w, s.t().unwrap(), blocks).unwrap_err().to_string();
        assert!(err.contains("[3, 2]") && err.contains("[2, 3]"), "{err}");
    }

    #[test]
    fn compressed_tensors_fp8_configs_are_read() {
        let q = json!({"quant_method": "compressed-tensors", "format": "float-quantized",
            "ignore": ["lm_head"], "config_groups": {"group_0": {"targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": true,
                "dynamic": false},
            "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                "dynamic": true, "symmetric": true}}}});
        let c = Fp8Checkpoint::parse(&q).unwrap().unwrap();
        assert_eq!((c.scales, c.static_activations), (Fp8Scales::PerRow, false));
        assert_eq!(c.scale_name("a.q_proj.weight"), "a.q_proj.weight_scale");
        let block = json!({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": [128, 128]});
        let c = Fp8Checkpoint::parse(&block).unwrap().unwrap();
        assert_eq!(
            c.scales,
            Fp8Scales::Blocks {
                rows: 128,
                cols: 128
            }
        );
        assert_eq!(c.scale_name("a.q_proj.weight"), "a.q_proj.weight_scale_inv");
        let awq = json!({"quant_method": "awq", "bits": 4});
        assert_eq!(Fp8Checkpoint::parse(&awq).unwrap(), None);
    }

    #[test]
    fn other_compressed_tensors_schemes_are_refused_by_name() {
        let base = |weights: Value, format: &str| {
            json!({"quant_method": "compressed-tensors", "format": format,
                "config_groups": {"g": {"targets": ["Linear"], "weights": weights}}})
        };
        let fp8 = json!({"num_bits": 8, "type": "float", "strategy": "tensor"});
        let int4 = json!({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128});
        let group = json!({"num_bits": 8, "type": "float", "strategy": "group"});
        for (q, named) in [
            (base(int4.clone(), "pack-quantized"), "\"pack-quantized\""),
            (base(int4, "float-quantized"), "4 bits, type \"int\""),
            (base(group, "float-quantized"), "strategy \"group\""),
            (
                json!({"quant_method": "fp8", "fmt": "e5m2"}),
                "fmt \"e5m2\"",
            ),
        ] {
            let err = Fp8Checkpoint::parse(&q).unwrap_err().to_string();
            assert!(err.contains(named), "{err}");
        }
        assert!(Fp8Checkpoint::parse(&base(fp8, "float-quantized")).is_ok());
    }
}
