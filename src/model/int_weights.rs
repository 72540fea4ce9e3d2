//! Integer weight-only checkpoints: 4- or 8-bit weights with a scale (and a zero point) per group
//! of input features, as AutoAWQ (`quant_method: awq`, GEMM layout), GPTQ (`quant_method: gptq`,
//! AutoGPTQ's and GPTQModel's layout, `desc_act` included) and llm-compressor
//! (`compressed-tensors`, format `pack-quantized`) write them. [`IntCheckpoint::parse`] reads
//! `quantization_config`, refusing by name what it does not know; `IntCheckpoint::unpack`
//! (`super::int_unpack`) unpacks one layer's weight to its codes, zero points and scales.
//!
//! A GPU keeps 4-bit projections packed (`super::int4_linear`); everything else is dequantized at
//! load to the model dtype (`Unpacked::values`), as FP8 checkpoints are (`super::fp8`).

use serde_json::Value;

use super::ModelError;

/// A stored tensor's shape and values; `None` when the checkpoint does not hold it.
pub type Stored<T> = Option<(Vec<usize>, Vec<T>)>;

/// Reads a stored tensor by name.
pub type ReadStored<'a, T> = &'a dyn Fn(&str) -> Result<Stored<T>, ModelError>;

/// How a format lays out its codes and zero points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntLayout {
    /// AutoAWQ GEMM: `qweight` `[in, out/8]` (8 codes an int32 in the order 0 2 4 6 1 3 5 7),
    /// `qzeros` `[groups, out/8]` the same way, `scales` `[groups, out]`.
    Awq,
    /// GPTQ: `qweight` `[in * bits / 32, out]` (codes along the input, low bits first),
    /// `qzeros` `[groups, out * bits / 32]` (along the output), `scales` `[groups, out]`,
    /// `g_idx` `[in]` (each input feature's group; with `desc_act` not in order). The v1 format
    /// stores each zero point less one.
    Gptq {
        /// What the stored zero points are off by (1 in the v1 format, 0 in `gptq_v2`).
        zero_offset: i32,
    },
    /// compressed-tensors `pack-quantized`: `weight_packed` `[out, in * bits / 32]` (codes
    /// packed densely along the input, stored plus `2^(bits-1)`), `weight_scale` `[out, groups]`,
    /// `weight_zero_point` `[out * bits / 32, groups]` when asymmetric (packed along the output).
    PackQuantized,
}

/// An integer checkpoint's layout, from its `quantization_config`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IntCheckpoint {
    /// `awq`, `gptq` or `compressed-tensors`.
    pub method: &'static str,
    /// How its tensors are laid out.
    pub layout: IntLayout,
    /// Bits a weight: 4 or 8.
    pub bits: u32,
    /// Input features a group; `None`: one group per output row (per channel).
    pub group_size: Option<usize>,
    /// Symmetric: no zero points stored (compressed-tensors).
    pub symmetric: bool,
}

fn unsupported(what: String) -> ModelError {
    ModelError::Unsupported(format!(
        "{what}; pagewise reads AWQ (GEMM, 4-bit), GPTQ (4- and 8-bit) and compressed-tensors \
         pack-quantized (4- and 8-bit, weights only) integer checkpoints"
    ))
}

fn get_u64(q: &Value, key: &str) -> Option<u64> {
    q.get(key).and_then(Value::as_u64)
}

/// A group size from a config: -1 (or absent where the format allows) is per channel.
fn group_size(v: Option<&Value>) -> Result<Option<usize>, ModelError> {
    match v.and_then(Value::as_i64) {
        None | Some(-1) => Ok(None),
        Some(g) if g > 0 => Ok(Some(g as usize)),
        Some(g) => Err(unsupported(format!("group_size {g}"))),
    }
}

impl IntCheckpoint {
    /// Reads a `quantization_config` of method `awq`, `gptq`, or `compressed-tensors` with format
    /// `pack-quantized`; `Ok(None)` for any other.
    pub fn parse(q: &Value) -> Result<Option<Self>, ModelError> {
        let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("");
        let format = q.get("format").and_then(Value::as_str).unwrap_or("");
        match (method, format) {
            ("awq", _) => awq(q).map(Some),
            ("gptq", _) => gptq(q).map(Some),
            ("compressed-tensors", "pack-quantized") => pack_quantized(q).map(Some),
            _ => Ok(None),
        }
    }

    /// The tensor holding weight `name`'s (`….weight`) codes.
    pub fn packed_name(&self, name: &str) -> String {
        let stem = name.strip_suffix(".weight").unwrap_or(name);
        match self.layout {
            IntLayout::Awq | IntLayout::Gptq { .. } => format!("{stem}.qweight"),
            IntLayout::PackQuantized => format!("{stem}.weight_packed"),
        }
    }

    /// One line for the load log.
    pub fn describe(&self) -> String {
        let groups = match self.group_size {
            Some(g) => format!("groups of {g}"),
            None => "per channel".to_string(),
        };
        format!(
            "{}-bit integer weights ({}, {groups})",
            self.bits, self.method
        )
    }
}

/// AutoAWQ: 4-bit, GEMM layout, with zero points.
fn awq(q: &Value) -> Result<IntCheckpoint, ModelError> {
    let bits = get_u64(q, "bits")
        .or_else(|| get_u64(q, "w_bit"))
        .unwrap_or(4);
    if bits != 4 {
        return Err(unsupported(format!("AWQ with {bits} bits")));
    }
    let version = q.get("version").and_then(Value::as_str).unwrap_or("gemm");
    if !version.eq_ignore_ascii_case("gemm") {
        return Err(unsupported(format!(
            "AWQ version {version:?} (GEMM is read)"
        )));
    }
    if q.get("zero_point").and_then(Value::as_bool) == Some(false) {
        return Err(unsupported("AWQ without zero points".into()));
    }
    let group = q.get("group_size").or_else(|| q.get("q_group_size"));
    Ok(IntCheckpoint {
        method: "awq",
        layout: IntLayout::Awq,
        bits: 4,
        group_size: group_size(group)?,
        symmetric: false,
    })
}

/// GPTQ: 4 or 8 bits, any group size, `desc_act` through `g_idx`, v1 or v2 zero points.
fn gptq(q: &Value) -> Result<IntCheckpoint, ModelError> {
    let bits = get_u64(q, "bits").unwrap_or(4);
    if bits != 4 && bits != 8 {
        return Err(unsupported(format!("GPTQ with {bits} bits")));
    }
    let format = q
        .get("checkpoint_format")
        .and_then(Value::as_str)
        .unwrap_or("gptq");
    let zero_offset = match format {
        "gptq" => 1,
        "gptq_v2" => 0,
        other => return Err(unsupported(format!("GPTQ checkpoint_format {other:?}"))),
    };
    Ok(IntCheckpoint {
        method: "gptq",
        layout: IntLayout::Gptq { zero_offset },
        bits: bits as u32,
        group_size: group_size(q.get("group_size"))?,
        symmetric: q.get("sym").and_then(Value::as_bool).unwrap_or(true),
    })
}

/// compressed-tensors `pack-quantized`: every config group's weights integers of 4 or 8 bits by
/// group or channel, static, without activation order; activations not quantized.
fn pack_quantized(q: &Value) -> Result<IntCheckpoint, ModelError> {
    super::quantized::one_scheme(q, unsupported, |name, group, w| {
        let bits = get_u64(w, "num_bits").unwrap_or(0);
        let kind = w.get("type").and_then(Value::as_str).unwrap_or("int");
        if kind != "int" || (bits != 4 && bits != 8) {
            return Err(unsupported(format!(
                "config group {name:?}: pack-quantized weights of {bits} bits, type {kind:?}"
            )));
        }
        for what in ["input_activations", "output_activations"] {
            if group.get(what).is_some_and(|a| !a.is_null()) {
                return Err(unsupported(format!(
                    "config group {name:?}: quantized {what} (pack-quantized is read as weights \
                     only)"
                )));
            }
        }
        if w.get("actorder").is_some_and(|a| !a.is_null()) {
            return Err(unsupported(format!(
                "config group {name:?}: actorder {}",
                w["actorder"]
            )));
        }
        if w.get("dynamic").and_then(Value::as_bool) == Some(true) {
            return Err(unsupported(format!(
                "config group {name:?}: dynamic weight scales"
            )));
        }
        let group_size = match w.get("strategy").and_then(Value::as_str).unwrap_or("") {
            "group" => match group_size(w.get("group_size"))? {
                Some(g) => Some(g),
                None => return Err(unsupported("strategy group without a group_size".into())),
            },
            "channel" => None,
            other => {
                return Err(unsupported(format!(
                    "config group {name:?}: weight strategy {other:?} (group and channel are read)"
                )));
            }
        };
        Ok(IntCheckpoint {
            method: "compressed-tensors",
            layout: IntLayout::PackQuantized,
            bits: bits as u32,
            group_size,
            symmetric: w.get("symmetric").and_then(Value::as_bool).unwrap_or(true),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn configs_are_read_and_others_refused_by_name() {
        let awq = json!({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm",
            "zero_point": true});
        let c = IntCheckpoint::parse(&awq).unwrap().unwrap();
        assert_eq!((c.layout, c.group_size), (IntLayout::Awq, Some(128)));
        let gptq = json!({"quant_method": "gptq", "bits": 8, "group_size": -1, "desc_act": true,
            "sym": true});
        let c = IntCheckpoint::parse(&gptq).unwrap().unwrap();
        assert_eq!(
            (c.layout, c.bits, c.group_size),
            (IntLayout::Gptq { zero_offset: 1 }, 8, None)
        );
        assert_eq!(c.packed_name("a.q_proj.weight"), "a.q_proj.qweight");
        for (q, named) in [
            (
                json!({"quant_method": "awq", "version": "gemv"}),
                "\"gemv\"",
            ),
            (json!({"quant_method": "gptq", "bits": 3}), "3 bits"),
            (
                json!({"quant_method": "compressed-tensors", "format": "pack-quantized",
                    "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int",
                    "strategy": "group", "group_size": 128, "actorder": "group"}}}}),
                "actorder",
            ),
            (
                json!({"quant_method": "compressed-tensors", "format": "pack-quantized",
                    "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int",
                    "strategy": "group", "group_size": 128}, "input_activations":
                    {"num_bits": 8, "type": "int"}}}}),
                "input_activations",
            ),
        ] {
            let e = IntCheckpoint::parse(&q).unwrap_err().to_string();
            assert!(e.contains(named), "{e}");
        }
        assert_eq!(
            IntCheckpoint::parse(&json!({"quant_method": "fp8"})).unwrap(),
            None
        );
    }
}
