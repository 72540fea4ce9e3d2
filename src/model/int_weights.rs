//! Integer weight-only checkpoints: 4- or 8-bit weights with a scale (and a zero point) per group
//! of input features, as AutoAWQ (`quant_method: awq`, GEMM layout), GPTQ (`quant_method: gptq`,
//! AutoGPTQ's and GPTQModel's layout, `desc_act` included) and llm-compressor
//! (`compressed-tensors`, format `pack-quantized`) write them. [`IntCheckpoint::parse`] reads
//! `quantization_config`, refusing by name what it does not know; [`IntCheckpoint::unpack`]
//! unpacks one layer's weight to its codes, zero points and scales ([`Unpacked`]).
//!
//! A GPU keeps 4-bit projections packed (`super::int4_linear`); everything else is dequantized at
//! load to the model dtype ([`Unpacked::values`]), as FP8 checkpoints are (`super::fp8`).

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

    /// Weight `name` (`[out, inp]`) unpacked to its codes, zero points and scales. `read_i32`
    /// and `read_f32` give a stored tensor's shape and values (`None`: absent). Shapes that do not
    /// fit are errors naming the tensor.
    pub fn unpack(
        &self,
        name: &str,
        (out, inp): (usize, usize),
        read_i32: ReadStored<'_, i32>,
        read_f32: ReadStored<'_, f32>,
    ) -> Result<Unpacked, ModelError> {
        let stem = name.strip_suffix(".weight").unwrap_or(name);
        let need_i32 = |suffix: &str| {
            let n = format!("{stem}.{suffix}");
            read_i32(&n)?.ok_or(ModelError::MissingTensor(n))
        };
        let need_f32 = |suffix: &str| {
            let n = format!("{stem}.{suffix}");
            read_f32(&n)?.ok_or(ModelError::MissingTensor(n))
        };
        let groups = match self.group_size {
            Some(g) if inp % g == 0 => inp / g,
            Some(g) => {
                return Err(ModelError::Config(format!(
                    "{name}: {inp} input features are not whole groups of {g}"
                )));
            }
            None => 1,
        };
        let per = (32 / self.bits) as usize;
        let check = |what: &str, shape: &[usize], want: &[usize]| {
            if shape == want {
                Ok(())
            } else {
                Err(ModelError::Config(format!(
                    "{stem}.{what} has shape {shape:?}, expected {want:?} for a [{out}, {inp}] \
                     weight in {}",
                    self.describe()
                )))
            }
        };
        let mut u = Unpacked {
            out,
            inp,
            codes: vec![0; out * inp],
            zeros: vec![0; out * groups],
            scales: vec![0.0; out * groups],
            groups,
            group_of: None,
        };
        match self.layout {
            IntLayout::Awq => {
                let (qs, q) = need_i32("qweight")?;
                check("qweight", &qs, &[inp, out / 8])?;
                let (zs, z) = need_i32("qzeros")?;
                check("qzeros", &zs, &[groups, out / 8])?;
                let (ss, s) = need_f32("scales")?;
                check("scales", &ss, &[groups, out])?;
                // Column c of a pack of 8 sits in nibble AWQ_NIBBLE[c].
                const AWQ_NIBBLE: [u32; 8] = [0, 4, 1, 5, 2, 6, 3, 7];
                let code = |words: &[i32], row: usize, c: usize| {
                    let word = words[row * (out / 8) + c / 8] as u32;
                    ((word >> (4 * AWQ_NIBBLE[c % 8])) & 0xF) as u8
                };
                for i in 0..inp {
                    for o in 0..out {
                        u.codes[o * inp + i] = code(&q, i, o);
                    }
                }
                for g in 0..groups {
                    for o in 0..out {
                        u.zeros[o * groups + g] = i32::from(code(&z, g, o));
                        u.scales[o * groups + g] = s[g * out + o];
                    }
                }
            }
            IntLayout::Gptq { zero_offset } => {
                let (qs, q) = need_i32("qweight")?;
                check("qweight", &qs, &[inp / per, out])?;
                let (zs, z) = need_i32("qzeros")?;
                check("qzeros", &zs, &[groups, out / per])?;
                let (ss, s) = need_f32("scales")?;
                check("scales", &ss, &[groups, out])?;
                if let Some((gs, g)) = read_i32(&format!("{stem}.g_idx"))? {
                    check("g_idx", &gs, &[inp])?;
                    if let Some(&bad) = g.iter().find(|&&x| x < 0 || x as usize >= groups) {
                        return Err(ModelError::Config(format!(
                            "{stem}.g_idx names group {bad} of {groups}"
                        )));
                    }
                    let g: Vec<usize> = g.into_iter().map(|x| x as usize).collect();
                    // (A g_idx in order is the plain grouping: kept as none.)
                    if g.iter().enumerate().any(|(i, &x)| x != i / (inp / groups)) {
                        u.group_of = Some(g);
                    }
                }
                let (bits, mask) = (self.bits, (1u32 << self.bits) - 1);
                for i in 0..inp {
                    let shift = bits * (i % per) as u32;
                    for o in 0..out {
                        u.codes[o * inp + i] =
                            ((q[(i / per) * out + o] as u32 >> shift) & mask) as u8;
                    }
                }
                for g in 0..groups {
                    for o in 0..out {
                        let zshift = bits * (o % per) as u32;
                        let zero = ((z[g * (out / per) + o / per] as u32 >> zshift) & mask) as i32;
                        u.zeros[o * groups + g] = zero + zero_offset;
                        u.scales[o * groups + g] = s[g * out + o];
                    }
                }
            }
            IntLayout::PackQuantized => {
                let (qs, q) = need_i32("weight_packed")?;
                let words = (inp * self.bits as usize).div_ceil(32);
                check("weight_packed", &qs, &[out, words])?;
                let (ss, s) = need_f32("weight_scale")?;
                let scale_shape = [out, groups];
                if ss != scale_shape && !(groups == 1 && ss == [out]) {
                    check("weight_scale", &ss, &scale_shape)?;
                }
                u.scales.copy_from_slice(&s);
                // Codes are stored plus 2^(bits-1): that offset is every zero point's part.
                let offset = 1i32 << (self.bits - 1);
                u.zeros.fill(offset);
                if !self.symmetric {
                    let (zs, z) = need_i32("weight_zero_point")?;
                    let zwords = (out * self.bits as usize).div_ceil(32);
                    check("weight_zero_point", &zs, &[zwords, groups])?;
                    // Packed along the output: column g of the packed rows.
                    let mut column = vec![0i32; zwords];
                    for g in 0..groups {
                        for (r, c) in column.iter_mut().enumerate() {
                            *c = z[r * groups + g];
                        }
                        for o in 0..out {
                            u.zeros[o * groups + g] += dense_code(&column, o, self.bits) - offset;
                        }
                    }
                }
                for o in 0..out {
                    let row = &q[o * words..(o + 1) * words];
                    for i in 0..inp {
                        u.codes[o * inp + i] = dense_code(row, i, self.bits) as u8;
                    }
                }
            }
        }
        Ok(u)
    }
}

/// One integer weight `[out, inp]` unpacked: element `(o, i)` is `(codes[o, i] - zeros[o, g]) *
/// scales[o, g]` for `g` its input feature's group.
#[derive(Clone, Debug)]
pub struct Unpacked {
    /// Output features (rows).
    pub out: usize,
    /// Input features (columns).
    pub inp: usize,
    /// `[out, inp]`, unsigned (below `2^bits`).
    pub codes: Vec<u8>,
    /// `[out, groups]`: what each code is less (GPTQ v1's stored-less-one and compressed-tensors'
    /// signed storage already undone).
    pub zeros: Vec<i32>,
    /// `[out, groups]`.
    pub scales: Vec<f32>,
    /// Groups a row.
    pub groups: usize,
    /// Each input feature's group when they are not in order (GPTQ `desc_act`); `None`: feature
    /// `i` is in group `i / (inp / groups)`.
    pub group_of: Option<Vec<usize>>,
}

impl Unpacked {
    /// The group of input feature `i`.
    pub fn group(&self, i: usize) -> usize {
        match &self.group_of {
            Some(g) => g[i],
            None => i / (self.inp / self.groups),
        }
    }

    /// The weight's values, `[out, inp]` row-major f32.
    pub fn values(&self) -> Vec<f32> {
        let mut w = vec![0f32; self.out * self.inp];
        for (o, row) in w.chunks_exact_mut(self.inp.max(1)).enumerate() {
            for (i, v) in row.iter_mut().enumerate() {
                let at = o * self.groups + self.group(i);
                let q = i32::from(self.codes[o * self.inp + i]) - self.zeros[at];
                *v = q as f32 * self.scales[at];
            }
        }
        w
    }
}

/// Code `i` of `words` packed densely at `bits` a code, low bits first (compressed-tensors).
fn dense_code(words: &[i32], i: usize, bits: u32) -> i32 {
    let bit = i * bits as usize;
    let (word, off) = (bit / 32, (bit % 32) as u32);
    let mut v = (words[word] as u32) >> off;
    if off + bits > 32 {
        v |= (words[word + 1] as u32) << (32 - off);
    }
    (v & ((1u32 << bits) - 1)) as i32
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
    let groups = q
        .get("config_groups")
        .and_then(Value::as_object)
        .filter(|g| !g.is_empty())
        .ok_or_else(|| unsupported("compressed-tensors without config_groups".into()))?;
    let mut found: Option<IntCheckpoint> = None;
    for (name, group) in groups {
        let w = group
            .get("weights")
            .filter(|w| !w.is_null())
            .ok_or_else(|| unsupported(format!("config group {name:?} quantizes no weights")))?;
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
        let this = IntCheckpoint {
            method: "compressed-tensors",
            layout: IntLayout::PackQuantized,
            bits: bits as u32,
            group_size,
            symmetric: w.get("symmetric").and_then(Value::as_bool).unwrap_or(true),
        };
        match &found {
            Some(other) if *other != this => {
                return Err(unsupported(
                    "config groups with different weight schemes".into(),
                ));
            }
            _ => found = Some(this),
        }
    }
    Ok(found.expect("config_groups is not empty"))
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

    #[test]
    fn dense_codes_cross_word_boundaries() {
        // 3-bit codes 0..=7 repeated: code 10 spans bits 30..33, across the first two words.
        let codes: Vec<u32> = (0..32).map(|i| i % 8).collect();
        let mut words = vec![0u32; 3];
        for (i, &c) in codes.iter().enumerate() {
            let bit = i * 3;
            words[bit / 32] |= c << (bit % 32);
            if bit % 32 + 3 > 32 {
                words[bit / 32 + 1] |= c >> (32 - bit % 32);
            }
        }
        let words: Vec<i32> = words.into_iter().map(|w| w as i32).collect();
        for (i, &c) in codes.iter().enumerate() {
            assert_eq!(dense_code(&words, i, 3), c as i32, "code {i}");
        }
    }
}
