//! `ModelConfig` from a GGUF file's metadata: the keys every architecture shares (under the
//! `<general.architecture>.` prefix llama.cpp writes), read here with generic defaults; then the
//! architecture's own [`super::registry::Arch::from_gguf`] reads what only it has.

use std::io::{Read, Seek};

use candle_core::Device;
use candle_core::quantized::gguf_file::{Content, Value};

use super::ModelError;
use super::config::{ArchSettings, ModelConfig};
use super::registry;

/// Something a GGUF file's tensors can be read from.
pub trait ReadSeek: Read + Seek {}
impl<T: Read + Seek> ReadSeek for T {}

/// A GGUF file's metadata, its keys read under the architecture's prefix.
pub struct GgufMeta<'a> {
    content: &'a Content,
    file: &'a mut dyn ReadSeek,
    arch: String,
}

fn missing(key: &str) -> ModelError {
    ModelError::Config(format!("GGUF metadata has no `{key}`"))
}

impl<'a> GgufMeta<'a> {
    /// The metadata of `content`, whose tensors `file` holds.
    pub fn new(content: &'a Content, file: &'a mut dyn ReadSeek) -> Result<Self, ModelError> {
        let arch = content
            .metadata
            .get("general.architecture")
            .ok_or_else(|| missing("general.architecture"))?
            .to_string()
            .map_err(|e| ModelError::Config(format!("GGUF `general.architecture`: {e}")))?
            .clone();
        Ok(GgufMeta {
            content,
            file,
            arch,
        })
    }

    /// `general.architecture`, the prefix of the architecture's keys.
    pub fn arch(&self) -> &str {
        &self.arch
    }

    fn value(&self, key: &str) -> Option<&Value> {
        self.content.metadata.get(&format!("{}.{key}", self.arch))
    }

    /// The integer `<arch>.key`, if present.
    pub fn opt_u32(&self, key: &str) -> Option<u32> {
        as_u32(self.value(key)?)
    }

    /// The integer `<arch>.key`, which must be present.
    pub fn u32(&self, key: &str) -> Result<u32, ModelError> {
        self.opt_u32(key)
            .ok_or_else(|| missing(&format!("{}.{key}", self.arch)))
    }

    /// The number `<arch>.key`, if present.
    pub fn f64(&self, key: &str) -> Option<f64> {
        let v = self.value(key)?;
        v.to_f32().map(f64::from).or_else(|_| v.to_f64()).ok()
    }

    /// The flag `<arch>.key`, if present.
    pub fn bool(&self, key: &str) -> Option<bool> {
        self.value(key)?.to_bool().ok()
    }

    /// The string `<arch>.key`, if present.
    pub fn string(&self, key: &str) -> Option<&str> {
        self.value(key)?.to_string().ok().map(String::as_str)
    }

    /// The flags `<arch>.key` when it is an array: `None` when absent or not an array.
    pub fn bools(&self, key: &str) -> Option<Result<Vec<bool>, ModelError>> {
        let list = self.value(key)?.to_vec().ok()?;
        Some(
            list.iter()
                .map(|f| f.to_bool())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| ModelError::Config(format!("GGUF `{}.{key}`: {e}", self.arch))),
        )
    }

    /// The integer `key` outside the architecture's prefix (`tokenizer.ggml.*`), if present.
    pub fn global_u32(&self, key: &str) -> Option<u32> {
        as_u32(self.content.metadata.get(key)?)
    }

    /// Whether the file holds tensor `name`.
    pub fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// Tensor `name`, dequantized, as f32 values.
    pub fn read_f32(&mut self, name: &str) -> Result<Vec<f32>, ModelError> {
        let bad = |e: candle_core::Error| ModelError::Config(format!("GGUF tensor {name}: {e}"));
        let t = self
            .content
            .tensor(&mut self.file, name, &Device::Cpu)
            .map_err(bad)?;
        t.dequantize(&Device::Cpu)
            .and_then(|v| v.flatten_all()?.to_vec1::<f32>())
            .map_err(bad)
    }
}

fn as_u32(v: &Value) -> Option<u32> {
    v.to_u32()
        .or_else(|_| v.to_u64().map(|x| x as u32))
        .or_else(|_| v.to_i32().map(|x| x as u32))
        .ok()
}

impl ModelConfig {
    /// Reads a GGUF file's metadata.
    pub fn from_gguf(meta: &mut GgufMeta<'_>) -> Result<Self, ModelError> {
        let arch = registry::by_gguf_name(meta.arch())?;
        let vocab_size = match meta.content.metadata.get("tokenizer.ggml.tokens") {
            Some(tokens) => tokens.to_vec().map(Vec::len).unwrap_or(0),
            None => return Err(missing("tokenizer.ggml.tokens")),
        };
        let heads = meta.u32("attention.head_count")? as usize;
        let hidden = meta.u32("embedding_length")? as usize;
        // Qwen3's head width is not hidden / heads: `attention.key_length` says it, or else the
        // rotary width does (an architecture that turns part of each head says otherwise).
        let head_dim = meta
            .opt_u32("attention.key_length")
            .or_else(|| meta.opt_u32("rope.dimension_count"))
            .map_or(hidden / heads, |v| v as usize);
        let context = meta.opt_u32("context_length").map_or(2048, |v| v as usize);
        // A window (llama.cpp writes 0 for none) caps the context where it is not implemented,
        // as in config.json.
        let max_position_embeddings = match meta.opt_u32("attention.sliding_window") {
            Some(w) if !arch.supports.sliding_window && w > 0 && (w as usize) < context => {
                w as usize
            }
            _ => context,
        };
        let mut cfg = ModelConfig {
            arch,
            vocab_size,
            hidden_size: hidden,
            intermediate_size: meta.u32("feed_forward_length")? as usize,
            num_hidden_layers: meta.u32("block_count")? as usize,
            num_attention_heads: heads,
            num_key_value_heads: meta
                .opt_u32("attention.head_count_kv")
                .map_or(heads, |v| v as usize),
            head_dim,
            norm_eps: meta
                .f64("attention.layer_norm_rms_epsilon")
                .or_else(|| meta.f64("attention.layer_norm_epsilon"))
                .unwrap_or(1e-5),
            rope_theta: meta.f64("rope.freq_base").unwrap_or(10_000.0),
            rope_scaling: None,
            longrope: None,
            yarn: None,
            rope_interleaved: false,
            max_position_embeddings,
            tie_word_embeddings: !meta.has_tensor("output.weight"),
            qkv_bias: meta.has_tensor("blk.0.attn_q.bias"),
            qk_norm: false,
            o_bias: meta.has_tensor("blk.0.attn_output.bias"),
            mlp_bias: false,
            stacked_projections: false,
            norms_plus_one: false,
            gelu_mlp: false,
            bos_token_id: meta.global_u32("tokenizer.ggml.bos_token_id"),
            eos_token_ids: meta
                .global_u32("tokenizer.ggml.eos_token_id")
                .into_iter()
                .collect(),
            sliding: None,
            settings: ArchSettings::None,
            moe: None,
            rotary_dim: head_dim,
            quantization: None,
        };
        (arch.from_gguf)(&mut cfg, meta)?;
        Ok(cfg)
    }

    /// For the architectures that turn only part of each head (Phi-3, GPT-NeoX): the head is
    /// `attention.key_length` or `hidden / heads`, and `rope.dimension_count` its rotary part.
    pub(super) fn gguf_partial_rotary(&mut self, meta: &GgufMeta<'_>) {
        self.head_dim = meta
            .opt_u32("attention.key_length")
            .map_or(self.hidden_size / self.num_attention_heads, |v| v as usize);
        self.rotary_dim = meta
            .opt_u32("rope.dimension_count")
            .map_or(self.head_dim, |v| v as usize);
    }
}
