//! The architectures pagewise runs, one line each in [`ARCHITECTURES`]. Each architecture's own
//! file declares its [`Arch`]: the names a checkpoint gives it, how its config is read (beyond the
//! fields every architecture shares), what it supports and how its model is built. Adding an
//! architecture is that file plus one line here (docs/ARCHITECTURE.md, "Adding an architecture").

use std::fmt;

use super::gguf_config::GgufMeta;
use super::hf_config::HfConfig;
use super::weights::Weights;
use super::{CausalLm, ModelConfig, ModelError};
use crate::parallel::Parallel;

/// Every architecture served. The order is the order of the lists in error messages.
pub static ARCHITECTURES: &[&Arch] = &[
    &super::llama::archs::LLAMA,
    &super::llama::archs::MIXTRAL,
    &super::llama::archs::QWEN2,
    &super::llama::archs::QWEN3,
    &super::llama::archs::QWEN3_MOE,
    &super::llama::archs::PHI3,
    &super::gemma3::config::GEMMA3,
    &super::gpt_oss::config::GPT_OSS,
    &super::opt::OPT,
    &super::gpt2::GPT2,
    &super::gpt_neox::GPT_NEOX,
];

/// How an architecture turns its heads (what `config.json`'s rotary fields may say).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rope {
    /// Every dimension of each head; `rope_scaling` / `rope_parameters` read the common way
    /// (Llama 3.1, LongRoPE, YaRN); a `partial_rotary_factor` below 1 is refused.
    Full,
    /// As `Full`, and `partial_rotary_factor` turns only the leading part of each head.
    Partial,
    /// The architecture reads its rotary settings itself (Gemma 3's two bases).
    Own,
}

/// What an architecture supports beyond a single-device forward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Supports {
    /// It can be split over a tensor-parallel group (`--tensor-parallel-size`).
    pub tensor_parallel: bool,
    /// It implements its sliding-window layers. Without it, a `sliding_window` in the config caps
    /// the context at the window, where windowed and full attention agree.
    pub sliding_window: bool,
    /// How its rotary settings are read.
    pub rope: Rope,
    /// The `quantization_config.quant_method`s its checkpoints may carry (none: a quantized
    /// checkpoint is refused by name).
    pub quantization: &'static [&'static str],
}

/// Reads the fields only this architecture has from a `config.json` into `cfg`, which holds the
/// shared ones already (with generic defaults where the file is silent).
pub type FromHf = fn(&mut ModelConfig, &HfConfig) -> Result<(), ModelError>;
/// The same from a GGUF file's metadata.
pub type FromGguf = fn(&mut ModelConfig, &mut GgufMeta<'_>) -> Result<(), ModelError>;
/// Builds the model (one rank's shard under tensor parallelism); rotary tables cover `max_len`.
pub type Build =
    fn(&ModelConfig, &Weights, usize, &Parallel) -> Result<Box<dyn CausalLm>, ModelError>;

/// One architecture.
pub struct Arch {
    /// Its name in logs and errors.
    pub name: &'static str,
    /// The `architectures[0]` and `model_type` values of a Hugging Face `config.json`.
    pub hf_names: &'static [&'static str],
    /// The `general.architecture` values of a GGUF file (none: no GGUF mapping).
    pub gguf_names: &'static [&'static str],
    /// What it supports.
    pub supports: Supports,
    /// Its part of reading `config.json`.
    pub from_hf: FromHf,
    /// Its part of reading GGUF metadata.
    pub from_gguf: FromGguf,
    /// Its model.
    pub build: Build,
}

impl Arch {
    /// [`Arch::from_gguf`] for an architecture whose GGUF files say nothing beyond the shared
    /// keys (or that has no GGUF names, so it is never called).
    pub fn shared_gguf_only(_: &mut ModelConfig, _: &mut GgufMeta<'_>) -> Result<(), ModelError> {
        Ok(())
    }

    /// [`Arch::from_hf`] for an architecture with no `config.json` fields of its own.
    pub fn shared_hf_only(_: &mut ModelConfig, _: &HfConfig) -> Result<(), ModelError> {
        Ok(())
    }
}

impl fmt::Debug for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

/// Architectures are one static each: the same name is the same architecture.
impl PartialEq for Arch {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

/// The architecture a `config.json` names (`architectures[0]`, else `model_type`).
pub fn by_hf_name(name: &str) -> Result<&'static Arch, ModelError> {
    ARCHITECTURES
        .iter()
        .copied()
        .find(|a| a.hf_names.contains(&name))
        .ok_or_else(|| {
            ModelError::Unsupported(format!(
                "architecture {name:?} (supported: {})",
                names(|a| a.hf_names.first().copied())
            ))
        })
}

/// The architecture a GGUF file's `general.architecture` names.
pub fn by_gguf_name(name: &str) -> Result<&'static Arch, ModelError> {
    ARCHITECTURES
        .iter()
        .copied()
        .find(|a| a.gguf_names.contains(&name))
        .ok_or_else(|| {
            ModelError::Unsupported(format!(
                "GGUF architecture {name:?} is not supported (supported: {})",
                names(|a| a.gguf_names.first().copied())
            ))
        })
}

fn names(name: impl Fn(&Arch) -> Option<&'static str>) -> String {
    let mut all: Vec<&str> = ARCHITECTURES.iter().filter_map(|a| name(a)).collect();
    all.dedup();
    all.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_belongs_to_one_architecture() {
        let mut seen = std::collections::HashSet::new();
        for a in ARCHITECTURES {
            assert!(seen.insert(a.name), "{} twice", a.name);
            for n in a.hf_names {
                assert_eq!(by_hf_name(n).unwrap(), *a, "{n}");
            }
        }
        // A GGUF name may serve several (`llama` is Llama and Mixtral): the first reads both.
        assert_eq!(by_gguf_name("llama").unwrap().name, "Llama");
        let e = by_hf_name("FalconForCausalLM").unwrap_err().to_string();
        assert!(
            e.contains("FalconForCausalLM") && e.contains("Qwen3ForCausalLM"),
            "{e}"
        );
        let e = by_gguf_name("falcon").unwrap_err().to_string();
        assert!(e.contains("\"falcon\"") && e.contains("gemma3"), "{e}");
    }
}
