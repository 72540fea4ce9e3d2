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
