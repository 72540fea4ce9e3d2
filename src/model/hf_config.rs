//! `ModelConfig` from a Hugging Face `config.json`: the fields every architecture shares, read
//! into one permissive struct, and each architecture's own settings (Gemma 3's and the mixtures
//! of experts' in their modules).

use serde::Deserialize;

use super::ModelError;
use super::config::{Architecture, ModelConfig, NeoxSettings, OptSettings};
use super::moe::ExpertNames;

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

/// The subset of HF `config.json` we read; every field optional so one struct covers all models.
#[derive(Debug, Deserialize)]
struct HfConfig {
    #[serde(default)]
    architectures: Vec<String>,
    #[serde(default)]
    model_type: Option<String>,
    vocab_size: usize,
    #[serde(alias = "n_embd")]
    hidden_size: usize,
    #[serde(alias = "ffn_dim", alias = "n_inner")]
    intermediate_size: Option<usize>,
    #[serde(alias = "n_layer")]
    num_hidden_layers: usize,
    #[serde(alias = "n_head")]
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    #[serde(alias = "layer_norm_epsilon", alias = "layer_norm_eps")]
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_scaling: Option<serde_json::Value>,
    /// transformers 5 writes `rope_theta` and the scaling together here.
    rope_parameters: Option<serde_json::Value>,
    #[serde(alias = "n_positions")]
    max_position_embeddings: Option<usize>,
    original_max_position_embeddings: Option<usize>,
    sliding_window: Option<usize>,
    use_sliding_window: Option<bool>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    bos_token_id: Option<OneOrMany>,
    eos_token_id: Option<OneOrMany>,
    // OPT
    word_embed_proj_dim: Option<usize>,
    do_layer_norm_before: Option<bool>,
    activation_function: Option<String>,
    enable_bias: Option<bool>,
    _remove_final_layer_norm: Option<bool>,
    // GPT-NeoX
    #[serde(alias = "rotary_pct")]
    partial_rotary_factor: Option<f64>,
    rotary_emb_base: Option<f64>,
    use_parallel_residual: Option<bool>,
    hidden_act: Option<String>,
}

fn unsupported(what: String) -> ModelError {
    ModelError::Unsupported(what)
}

/// The longest context served: the model's `max_position_embeddings`, or its attention window
/// when one applies (Mistral v0.1's `sliding_window`; Qwen's are off unless `use_sliding_window`).
/// Windowed attention is not implemented, and up to the window it equals full attention, so the
/// context stops there rather than run past it with the wrong attention.
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

impl ModelConfig {
    /// Parses a Hugging Face `config.json`.
    pub fn from_hf_json(text: &str) -> Result<Self, ModelError> {
        let c: HfConfig = serde_json::from_str(text)
            .map_err(|e| ModelError::Config(format!("config.json: {e}")))?;
        let arch_name = c
            .architectures
            .first()
            .cloned()
            .or(c.model_type.clone())
            .unwrap_or_default();
        let architecture = match arch_name.as_str() {
            "LlamaForCausalLM" | "MistralForCausalLM" | "MixtralForCausalLM" | "llama"
            | "mistral" | "mixtral" => Architecture::Llama,
            "Qwen2ForCausalLM" | "qwen2" => Architecture::Qwen2,
            "Qwen3ForCausalLM" | "Qwen3MoeForCausalLM" | "qwen3" | "qwen3_moe" => {
                Architecture::Qwen3
            }
            "Phi3ForCausalLM" | "phi3" => Architecture::Phi3,
            "OPTForCausalLM" | "opt" => Architecture::Opt,
            "GPT2LMHeadModel" | "gpt2" => Architecture::Gpt2,
            "GPTNeoXForCausalLM" | "gpt_neox" => Architecture::GptNeox,
            "Gemma3ForCausalLM" | "gemma3_text" => Architecture::Gemma3,
            "GptOssForCausalLM" | "gpt_oss" => Architecture::GptOss,
            other => {
                return Err(unsupported(format!(
                    "architecture {other:?} (supported: Llama, Mistral, Qwen2, Qwen3, Phi-3, OPT, GPT-2, GPT-NeoX, Gemma 3 text, Mixtral, Qwen3-MoE, gpt-oss)"
                )));
            }
        };
        let names = match arch_name.as_str() {
            "MixtralForCausalLM" | "mixtral" => Some(ExpertNames::Mixtral),
            "Qwen3MoeForCausalLM" | "qwen3_moe" => Some(ExpertNames::Qwen),
            "GptOssForCausalLM" | "gpt_oss" => Some(ExpertNames::GptOss),
            _ => None,
        };
        let moe = match names {
            Some(names) => {
                let dense = c.intermediate_size.unwrap_or(0);
                Some(super::moe::settings(
                    text,
                    names,
                    c.num_hidden_layers,
                    dense,
                )?)
            }
            None => None,
        };
        let gemma = match architecture {
            Architecture::Gemma3 => Some(super::gemma3::settings(text, c.num_hidden_layers)?),
            _ => None,
        };
        let gpt_oss = match architecture {
            Architecture::GptOss => Some(super::gpt_oss::settings(text, c.num_hidden_layers)?),
            _ => None,
        };
        let rope_params = c.rope_parameters.as_ref().or(c.rope_scaling.as_ref());
        let rope_theta = match &gemma {
            Some((_, global_theta)) => *global_theta,
            None => c
                .rope_theta
                .or_else(|| rope_params?.get("rope_theta")?.as_f64())
                .or(c.rotary_emb_base)
                .unwrap_or(10_000.0),
        };
        let scaling = match gemma {
            // (Gemma 3's rotary settings are its own: `GemmaSettings`.)
            Some(_) => Default::default(),
            None => super::rope_scaling::parse(
                rope_params,
                c.max_position_embeddings,
                c.original_max_position_embeddings,
            )?,
        };
        let heads = c.num_attention_heads;
        let is_opt = architecture == Architecture::Opt;
        if is_opt
            && c.activation_function
                .as_deref()
                .is_some_and(|a| a != "relu")
        {
            return Err(unsupported(format!(
                "OPT activation {:?}",
                c.activation_function
            )));
        }
        if is_opt && c.enable_bias == Some(false) {
            return Err(unsupported("OPT without biases".to_string()));
        }
        let is_gpt2 = architecture == Architecture::Gpt2;
        let is_neox = architecture == Architecture::GptNeox;
        let head_dim = c.head_dim.unwrap_or(c.hidden_size / heads);
        let rotary_factor = c
            .partial_rotary_factor
            .or_else(|| rope_params?.get("partial_rotary_factor")?.as_f64())
            .unwrap_or(1.0);
        // transformers turns part of each head in GPT-NeoX and Phi-3/4 only.
        if rotary_factor < 1.0 && !is_neox && architecture != Architecture::Phi3 {
            return Err(unsupported(format!(
                "partial rotary (partial_rotary_factor {rotary_factor}) in {arch_name}"
            )));
        }
        let rotary_dim = (head_dim as f64 * rotary_factor) as usize;
        if rotary_factor < 1.0 && (rotary_dim == 0 || rotary_dim % 2 == 1) || rotary_factor > 1.0 {
            return Err(unsupported(format!(
                "partial_rotary_factor {rotary_factor}: rotary would turn {rotary_dim} of \
                 {head_dim} head dimensions (an even number up to the head is needed)"
            )));
        }
        let neox = if is_neox {
            let gelu_tanh = match c.hidden_act.as_deref().unwrap_or("gelu") {
                "gelu" => false,
                "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => true,
                other => return Err(unsupported(format!("GPT-NeoX activation {other:?}"))),
            };
            Some(NeoxSettings {
                parallel_residual: c.use_parallel_residual.unwrap_or(true),
                gelu_tanh,
            })
        } else {
            None
        };
        if is_gpt2
            && c.activation_function
                .as_deref()
                .is_some_and(|a| !matches!(a, "gelu_new" | "gelu_pytorch_tanh"))
        {
            return Err(unsupported(format!(
                "GPT-2 activation {:?} (supported: gelu_new)",
                c.activation_function
            )));
        }
        Ok(ModelConfig {
            architecture,
            vocab_size: c.vocab_size,
            hidden_size: c.hidden_size,
            // (GPT-2's `n_inner: null` means four times the width.)
            intermediate_size: match c.intermediate_size {
                Some(i) => i,
                None if is_gpt2 => 4 * c.hidden_size,
                None => {
                    return Err(ModelError::Config(
                        "config.json: no intermediate_size".into(),
                    ));
                }
            },
            num_hidden_layers: c.num_hidden_layers,
            num_attention_heads: heads,
            num_key_value_heads: c.num_key_value_heads.unwrap_or(heads),
            head_dim,
            norm_eps: c.rms_norm_eps.unwrap_or(if is_opt || is_gpt2 || is_neox {
                1e-5
            } else {
                1e-6
            }),
            rope_theta,
            rope_scaling: scaling.llama3,
            longrope: scaling.longrope,
            yarn: scaling.yarn,
            rope_interleaved: false,
            max_position_embeddings: match (is_gpt2, gemma.is_some() || gpt_oss.is_some()) {
                (true, _) => c.max_position_embeddings.unwrap_or(1024),
                // Gemma 3's and gpt-oss's windows are implemented.
                (_, true) => c.max_position_embeddings.unwrap_or(131_072),
                _ => context_limit(&c),
            },
            // OPT and GPT-2 always tie their LM head to the embedding; Gemma by default.
            tie_word_embeddings: is_opt
                || is_gpt2
                || c.tie_word_embeddings.unwrap_or(gemma.is_some()),
            qkv_bias: is_opt
                || is_gpt2
                || (architecture == Architecture::GptOss && c.attention_bias.unwrap_or(true))
                || architecture == Architecture::Qwen2
                || c.attention_bias.unwrap_or(false),
            qk_norm: matches!(architecture, Architecture::Qwen3 | Architecture::Gemma3),
            o_bias: is_opt
                || is_gpt2
                || c.attention_bias
                    .unwrap_or(architecture == Architecture::GptOss),
            mlp_bias: is_opt || is_gpt2 || c.mlp_bias.unwrap_or(false),
            bos_token_id: c.bos_token_id.and_then(|b| b.into_vec().first().copied()),
            eos_token_ids: c.eos_token_id.map(OneOrMany::into_vec).unwrap_or_default(),
            opt: is_opt.then(|| OptSettings {
                word_embed_proj_dim: c.word_embed_proj_dim.unwrap_or(c.hidden_size),
                do_layer_norm_before: c.do_layer_norm_before.unwrap_or(true),
                has_final_layer_norm: c.do_layer_norm_before.unwrap_or(true)
                    && !c._remove_final_layer_norm.unwrap_or(false),
            }),
            neox,
            gemma: gemma.map(|(settings, _)| settings),
            gpt_oss,
            moe,
            rotary_dim,
        })
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
        assert_eq!(c.architecture, Architecture::Llama);
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
        assert_eq!(o.opt.unwrap().word_embed_proj_dim, 4);
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
        assert_eq!(phi("").unwrap().architecture, Architecture::Phi3);
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
}
