//! The quantized checkpoints every architecture reads, whatever its graph: FP8
//! ([`super::fp8`]) and 4- or 8-bit integer weights ([`super::int_weights`]). `Weights`
//! dequantizes them as it reads them, so the models never see the difference.

use serde_json::Value;

use super::ModelError;
use super::fp8::Fp8Checkpoint;
use super::int_weights::IntCheckpoint;

/// A quantized checkpoint's layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckpointQuant {
    /// e4m3 weights with their scales.
    Fp8(Fp8Checkpoint),
    /// Packed integer weights with group scales and zero points.
    Int(IntCheckpoint),
}

impl CheckpointQuant {
    /// Reads a `quantization_config`; `Ok(None)` for a method neither reader knows (the
    /// architecture's own, or one to refuse).
    pub fn parse(q: &Value) -> Result<Option<Self>, ModelError> {
        if let Some(int) = IntCheckpoint::parse(q)? {
            return Ok(Some(CheckpointQuant::Int(int)));
        }
        Ok(Fp8Checkpoint::parse(q)?.map(CheckpointQuant::Fp8))
    }

    /// One line for the load log.
    pub fn describe(&self) -> String {
        match self {
            CheckpointQuant::Fp8(c) => c.describe(),
            CheckpointQuant::Int(c) => c.describe(),
        }
    }
}

/// Reads each group of a compressed-tensors `config_groups` with `read(name, group, weights)` (a
/// group that quantizes no weights is refused) and returns the scheme they all share; mixed
/// schemes are refused. `unsupported` words each refusal as the format's reader does.
pub(super) fn one_scheme<T: PartialEq + std::fmt::Debug>(
    q: &Value,
    unsupported: fn(String) -> ModelError,
    read: impl Fn(&str, &Value, &Value) -> Result<T, ModelError>,
) -> Result<T, ModelError> {
    let groups = q
        .get("config_groups")
        .and_then(Value::as_object)
        .filter(|g| !g.is_empty())
        .ok_or_else(|| unsupported("compressed-tensors without config_groups".into()))?;
    let mut found: Option<T> = None;
    for (name, group) in groups {
        let weights = group
            .get("weights")
            .filter(|w| !w.is_null())
            .ok_or_else(|| unsupported(format!("config group {name:?} quantizes no weights")))?;
        let this = read(name, group, weights)?;
        match &found {
            Some(other) if *other != this => {
                return Err(unsupported(format!(
                    "config groups with different weight schemes ({other:?} and {this:?}) are \
                     not implemented"
                )));
            }
            _ => found = Some(this),
        }
    }
    Ok(found.expect("config_groups is not empty"))
}
