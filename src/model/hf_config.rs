//! `ModelConfig` from a Hugging Face `config.json`: the fields every architecture shares, read
//! here into one permissive struct with generic defaults; then the architecture's own
//! [`super::registry::Arch::from_hf`] reads what only it has.

use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::ModelError;
use super::config::{ArchSettings, ModelConfig};
use super::quantized::CheckpointQuant;
use super::registry::{self, Rope};

/// A token id or a list of them (HF writes `eos_token_id` both ways).
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(u32),
    Many(Vec<u32>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<u32> {
        match self {
            OneOrMany::One(t) => vec![t],
            OneOrMany::Many(v) => v,
        }
    }
}

/// The fields of a `config.json` that architectures share, every one optional so one struct
/// reads them all; [`HfConfig::fields`] reads an architecture's own.
#[derive(Debug, Deserialize)]
pub struct HfConfig {
    #[serde(default)]
    architectures: Vec<String>,
    #[serde(default)]
    model_type: Option<String>,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Residual width.
    #[serde(alias = "n_embd")]
    pub hidden_size: usize,
    /// MLP width.
    #[serde(alias = "ffn_dim", alias = "n_inner")]
    pub intermediate_size: Option<usize>,
    /// Decoder layers.
    #[serde(alias = "n_layer")]
    pub num_hidden_layers: usize,
    /// Query heads.
    #[serde(alias = "n_head")]
    pub num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    /// The norms' epsilon, by any of its names.
    #[serde(alias = "layer_norm_epsilon", alias = "layer_norm_eps")]
    pub rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_scaling: Option<serde_json::Value>,
    /// transformers 5 writes `rope_theta` and the scaling together here.
    rope_parameters: Option<serde_json::Value>,
    /// The context the model was trained for.
    #[serde(alias = "n_positions")]
    pub max_position_embeddings: Option<usize>,
    original_max_position_embeddings: Option<usize>,
    sliding_window: Option<usize>,
    use_sliding_window: Option<bool>,
    /// Whether the LM head is the embedding.
    pub tie_word_embeddings: Option<bool>,
    /// Biases on q/k/v and o (Llama's spelling).
    pub attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    bos_token_id: Option<OneOrMany>,
    eos_token_id: Option<OneOrMany>,
    #[serde(alias = "rotary_pct")]
    partial_rotary_factor: Option<f64>,
    rotary_emb_base: Option<f64>,
    /// How the checkpoint's weights are quantized (`compression_config`: compressed-tensors'
    /// older spelling).
    #[serde(alias = "compression_config")]
    quantization_config: Option<serde_json::Value>,
    /// The whole file, for [`HfConfig::fields`].
    #[serde(skip)]
    text: String,
}

impl HfConfig {
    /// Reads the shared fields of a `config.json`.
    pub fn parse(text: &str) -> Result<Self, ModelError> {
        let mut c: HfConfig = serde_json::from_str(text)
            .map_err(|e| ModelError::Config(format!("config.json: {e}")))?;
        c.text = text.to_string();
        Ok(c)
    }

    /// An architecture's own fields of the file, as its struct `T` declares them.
    pub fn fields<T: DeserializeOwned>(&self) -> Result<T, ModelError> {
        serde_json::from_str(&self.text)
            .map_err(|e| ModelError::Config(format!("config.json: {e}")))
    }

    /// The name the file gives its architecture.
    pub fn arch_name(&self) -> &str {
        self.architectures
            .first()
            .or(self.model_type.as_ref())
            .map_or("", String::as_str)
    }
}

/// The longest context served: the model's `max_position_embeddings`, or its attention window
/// when one applies (Mistral v0.1's `sliding_window`; Qwen's are off unless `use_sliding_window`)
/// and the architecture does not implement windows: up to the window it equals full attention, so
/// the context stops there rather than run past it with the wrong attention.
fn context_limit(c: &HfConfig) -> usize {
    let max = c.max_position_embeddings.unwrap_or(2048);
    match c.sliding_window {
        Some(w) if c.use_sliding_window != Some(false) && w < max => {
            tracing::warn!(
                sliding_window = w,
                max_position_embeddings = max,
                "sliding-window attention is not implemented: the context is capped at the window"
            );
            w
        }
        _ => max,
    }
}

/// A quantized checkpoint's layout (FP8 and integer weights: every architecture reads those);
/// refuses a quantized checkpoint whose `quant_method` is none of those nor one the architecture
/// reads: its weights would be taken as plain values and its scales dropped.
fn check_quantization(
    c: &HfConfig,
    arch: &registry::Arch,
) -> Result<Option<CheckpointQuant>, ModelError> {
    let Some(q) = &c.quantization_config else {
        return Ok(None);
    };
    if let Some(quant) = CheckpointQuant::parse(q)? {
        return Ok(Some(quant));
    }
    let method = q.get("quant_method").and_then(|m| m.as_str()).unwrap_or("");
    if arch.supports.quantization.contains(&method) {
        return Ok(None);
    }
    let format = q
        .get("format")
        .and_then(|f| f.as_str())
        .map(|f| format!(", format {f:?}"))
        .unwrap_or_default();
    let takes = match arch.supports.quantization {
        [] => "no quantized checkpoints".to_string(),
        methods => format!("quant_method {}", methods.join(", ")),
    };
    Err(ModelError::Unsupported(format!(
        "quantization_config with quant_method {method:?}{format}: not implemented for {} \
         (it takes {takes}); serve the unquantized checkpoint, or a GGUF file",
        arch.name
    )))
}

/// How much of each head rotary turns, as `c` says and its architecture allows.
fn rotary_dim(c: &HfConfig, rope: Rope, head_dim: usize) -> Result<usize, ModelError> {
    let params = c.rope_parameters.as_ref().or(c.rope_scaling.as_ref());
    let factor = c
        .partial_rotary_factor
        .or_else(|| params?.get("partial_rotary_factor")?.as_f64())
        .unwrap_or(1.0);
    if factor < 1.0 && rope != Rope::Partial {
        return Err(ModelError::Unsupported(format!(
            "partial rotary (partial_rotary_factor {factor}) in {}",
            c.arch_name()
        )));
    }
    let dim = (head_dim as f64 * factor) as usize;
    if factor < 1.0 && (dim == 0 || dim % 2 == 1) || factor > 1.0 {
        return Err(ModelError::Unsupported(format!(
            "partial_rotary_factor {factor}: rotary would turn {dim} of {head_dim} head \
             dimensions (an even number up to the head is needed)"
        )));
    }
    Ok(dim)
}

impl ModelConfig {
    /// Parses a Hugging Face `config.json`.
    pub fn from_hf_json(text: &str) -> Result<Self, ModelError> {
        let c = HfConfig::parse(text)?;
        let arch = registry::by_hf_name(c.arch_name())?;
        let quantization = check_quantization(&c, arch)?;
        let heads = c.num_attention_heads;
        let head_dim = c.head_dim.unwrap_or(c.hidden_size / heads);
        let params = c.rope_parameters.as_ref().or(c.rope_scaling.as_ref());
        let (rope_theta, scaling) = match arch.supports.rope {
            // (Its file sets them.)
            Rope::Own => (10_000.0, Default::default()),
            Rope::Full | Rope::Partial => (
                c.rope_theta
                    .or_else(|| params?.get("rope_theta")?.as_f64())
                    .or(c.rotary_emb_base)
                    .unwrap_or(10_000.0),
                super::rope_scaling::parse(
                    params,
                    c.max_position_embeddings,
                    c.original_max_position_embeddings,
                )?,
            ),
        };
        let mut cfg = ModelConfig {
            arch,
            vocab_size: c.vocab_size,
            hidden_size: c.hidden_size,
            intermediate_size: c.intermediate_size.unwrap_or(0),
            num_hidden_layers: c.num_hidden_layers,
            num_attention_heads: heads,
            num_key_value_heads: c.num_key_value_heads.unwrap_or(heads),
            head_dim,
            norm_eps: c.rms_norm_eps.unwrap_or(1e-6),
            rope_theta,
            rope_scaling: scaling.llama3,
            longrope: scaling.longrope,
            yarn: scaling.yarn,
            rope_interleaved: false,
            max_position_embeddings: match arch.supports.sliding_window {
                true => c.max_position_embeddings.unwrap_or(2048),
                false => context_limit(&c),
            },
            tie_word_embeddings: c.tie_word_embeddings.unwrap_or(false),
            qkv_bias: c.attention_bias.unwrap_or(false),
            qk_norm: false,
            o_bias: c.attention_bias.unwrap_or(false),
            mlp_bias: c.mlp_bias.unwrap_or(false),
            stacked_projections: false,
            norms_plus_one: false,
            gelu_mlp: false,
            bos_token_id: c
                .bos_token_id
                .clone()
                .and_then(|b| b.into_vec().first().copied()),
            eos_token_ids: c
                .eos_token_id
                .clone()
                .map(OneOrMany::into_vec)
                .unwrap_or_default(),
            sliding: None,
            settings: ArchSettings::None,
            moe: None,
            rotary_dim: rotary_dim(&c, arch.supports.rope, head_dim)?,
            quantization,
        };
        (arch.from_hf)(&mut cfg, &c)?;
        if cfg.intermediate_size == 0 {
            return Err(ModelError::Config(
                "config.json: no intermediate_size".into(),
            ));
        }
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_3_2_style_config_with_llama3_rope_scaling() {
        let c = ModelConfig::from_hf_json(
            r#"{"architectures":["LlamaForCausalLM"],"vocab_size":128256,"hidden_size":2048,
            "intermediate_size":8192,"num_hidden_layers":16,"num_attention_heads":32,
            "num_key_value_heads":8,"rms_norm_eps":1e-5,"rope_theta":500000.0,
            "rope_scaling":{"factor":32.0,"high_freq_factor":4.0,"low_freq_factor":1.0,
            "original_max_position_embeddings":8192,"rope_type":"llama3"},
            "max_position_embeddings":131072,"tie_word_embeddings":true,
            "bos_token_id":128000,"eos_token_id":[128001,128008,128009]}"#,
        )
        .unwrap();
        assert_eq!(c.arch.name, "Llama");
        assert_eq!(c.head_dim, 64);
        assert_eq!(c.rope_scaling.as_ref().unwrap().factor, 32.0);
        assert_eq!(c.eos_token_ids, vec![128001, 128008, 128009]);
        assert!(c.tie_word_embeddings && !c.qkv_bias);
        assert_eq!(c.rope_theta, 500000.0);
        // transformers 5 spelling: theta and scaling together in rope_parameters.
        let t5 = ModelConfig::from_hf_json(
            r#"{"architectures":["LlamaForCausalLM"],"vocab_size":10,"hidden_size":8,
            "intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,
            "rope_parameters":{"rope_theta":1234.0,"rope_type":"default"}}"#,
        )
        .unwrap();
        assert_eq!((t5.rope_theta, t5.rope_scaling.is_none()), (1234.0, true));
        assert_eq!(
            c.kv_bytes_per_token(c.num_key_value_heads, 2),
            2 * 16 * 8 * 64 * 2
        );
    }

    #[test]
    fn qwen2_has_qkv_bias_and_opt_reads_its_fields() {
        let q = ModelConfig::from_hf_json(
            r#"{"architectures":["Qwen2ForCausalLM"],"vocab_size":10,"hidden_size":8,
            "intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,"eos_token_id":3}"#,
        )
        .unwrap();
        assert!(q.qkv_bias && !q.o_bias);
        let o = ModelConfig::from_hf_json(
            r#"{"architectures":["OPTForCausalLM"],"vocab_size":10,"hidden_size":8,"ffn_dim":16,
            "num_hidden_layers":1,"num_attention_heads":2,"word_embed_proj_dim":4,
            "do_layer_norm_before":true,"activation_function":"relu","eos_token_id":2}"#,
        )
        .unwrap();
        assert_eq!(o.intermediate_size, 16);
        let ArchSettings::Opt(opt) = &o.settings else {
            panic!("{:?}", o.settings)
        };
        assert_eq!(opt.word_embed_proj_dim, 4);
        let err = ModelConfig::from_hf_json(
            r#"{"architectures":["FalconForCausalLM"],"vocab_size":10,"hidden_size":8,
            "num_hidden_layers":1,"num_attention_heads":2}"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("FalconForCausalLM"), "{err}");
        // GPT-2's own field names; `n_inner: null` is four times the width.
        let g = ModelConfig::from_hf_json(
            r#"{"architectures":["GPT2LMHeadModel"],"vocab_size":10,"n_embd":8,"n_layer":1,
            "n_head":2,"n_inner":null,"n_positions":64,"layer_norm_epsilon":1e-5}"#,
        )
        .unwrap();
        assert_eq!((g.intermediate_size, g.max_position_embeddings), (32, 64));
        assert!(g.tie_word_embeddings && g.qkv_bias && g.o_bias && g.mlp_bias);
    }

    #[test]
    fn an_attention_window_caps_the_context_where_it_applies() {
        let cfg = |extra: &str| {
            ModelConfig::from_hf_json(&format!(
                r#"{{"architectures":["{}"],"vocab_size":10,"hidden_size":8,
                "intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,
                "max_position_embeddings":32768{extra}}}"#,
                if extra.contains("use_sliding_window") {
                    "Qwen2ForCausalLM"
                } else {
                    "MistralForCausalLM"
                }
            ))
            .unwrap()
            .max_position_embeddings
        };
        assert_eq!(cfg(r#","sliding_window":4096"#), 4096);
        assert_eq!(cfg(r#","sliding_window":null"#), 32768);
        assert_eq!(cfg(r#","sliding_window":65536"#), 32768);
        assert_eq!(
            cfg(r#","sliding_window":4096,"use_sliding_window":false"#),
            32768
        );
    }

    #[test]
    fn phi3_reads_and_what_it_cannot_serve_is_refused_by_name() {
        let phi = |extra: &str| {
            ModelConfig::from_hf_json(&format!(
                r#"{{"architectures":["Phi3ForCausalLM"],"vocab_size":10,"hidden_size":8,
                "intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2{extra}}}"#
            ))
        };
        assert_eq!(phi("").unwrap().arch.name, "Phi-3");
        // LongRoPE: the attention factor from the extension (256 / 64) when not given.
        let l = phi(
            r#","max_position_embeddings":256,"original_max_position_embeddings":64,
            "rope_scaling":{"type":"longrope","short_factor":[1.0,2.0],"long_factor":[3.0,4.0]}"#,
        )
        .unwrap()
        .longrope
        .unwrap();
        assert_eq!(
            (l.short_factor, l.long_factor),
            (vec![1.0, 2.0], vec![3.0, 4.0])
        );
        let want = (1.0 + 4f64.ln() / 64f64.ln()).sqrt();
        assert!((l.attention_factor - want).abs() < 1e-12);
        let e =
            phi(r#","rope_scaling":{"type":"longrope","short_factor":[1.0],"long_factor":[2.0]}"#)
                .unwrap_err();
        assert!(
            e.to_string().contains("original_max_position_embeddings"),
            "{e}"
        );
        let partial = phi(r#","head_dim":64,"partial_rotary_factor":0.75"#).unwrap();
        assert_eq!((partial.rotary_dim(), partial.head_dim), (48, 64));
        let e = phi(r#","partial_rotary_factor":0.75"#).unwrap_err();
        assert!(e.to_string().contains("3 of 4"), "{e}");
    }

    /// A quantized checkpoint pagewise cannot read is refused by name, never loaded with its
    /// scales dropped; gpt-oss's MXFP4 is read.
    #[test]
    fn quantized_checkpoints_it_does_not_read_are_refused_by_name() {
        let cfg = |arch: &str, q: &str| {
            ModelConfig::from_hf_json(&format!(
                r#"{{"architectures":["{arch}"],"vocab_size":10,"hidden_size":8,
                "intermediate_size":16,"num_hidden_layers":2,"num_attention_heads":2,
                "num_local_experts":2,"num_experts_per_tok":1{q}}}"#
            ))
        };
        for (q, named) in [
            (
                r#","quantization_config":{"quant_method":"compressed-tensors","format":"int-quantized"}"#,
                "compressed-tensors format \"int-quantized\"",
            ),
            (
                r#","compression_config":{"quant_method":"compressed-tensors"}"#,
                "compressed-tensors format \"\"",
            ),
            (
                r#","quantization_config":{"quant_method":"bitsandbytes"}"#,
                "\"bitsandbytes\"",
            ),
            (r#","quantization_config":{"bits":4}"#, "\"\""),
        ] {
            let e = cfg("LlamaForCausalLM", q).unwrap_err().to_string();
            assert!(e.contains(named), "{q}: {e}");
        }
        let fp8 = r#","quantization_config":{"quant_method":"fp8","weight_block_size":[128,128]}"#;
        let blocks = super::super::fp8::Fp8Scales::Blocks {
            rows: 128,
            cols: 128,
        };
        let quant = cfg("Qwen3ForCausalLM", fp8).unwrap().quantization;
        assert!(matches!(quant, Some(CheckpointQuant::Fp8(c)) if c.scales == blocks));
        let mxfp4 = r#","quantization_config":{"quant_method":"mxfp4"}"#;
        assert!(cfg("GptOssForCausalLM", mxfp4).is_ok());
        let e = cfg("Qwen3ForCausalLM", mxfp4).unwrap_err().to_string();
        assert!(e.contains("\"mxfp4\"") && e.contains("no quantized"), "{e}");
    }
}
