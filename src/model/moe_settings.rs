//! A mixture of experts' settings: how many experts, how many a token takes and how their
//! weights are normalized, which layers are sparse, how the checkpoint names the experts and
//! what they compute, read from `config.json` (`moe.rs` runs the layers).

use candle_core::Tensor;
use serde::Deserialize;

use super::ModelError;
use super::gguf_config::GgufMeta;
use super::glu::silu_mul;
use super::hf_config::HfConfig;

/// How a model's experts are laid out and chosen.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeSettings {
    /// Experts a sparse layer has.
    pub num_experts: usize,
    /// Experts each token goes through.
    pub top_k: usize,
    /// Whether the chosen experts' softmax probabilities are renormalized to sum to one
    /// (Mixtral always; Qwen3-MoE with `norm_topk_prob`).
    pub renormalize: bool,
    /// Each expert's inner width.
    pub expert_intermediate: usize,
    /// Which layers are sparse (the others have the dense MLP of `intermediate_size`).
    pub sparse: Vec<bool>,
    /// How the checkpoint names (and lays out) the experts.
    pub names: ExpertNames,
    /// The experts' activation.
    pub activation: ExpertActivation,
}

/// How a checkpoint names its experts' weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertNames {
    /// `block_sparse_moe.experts.N.w1/w2/w3`, router `block_sparse_moe.gate`.
    Mixtral,
    /// `mlp.experts.N.gate_proj/down_proj/up_proj`, router `mlp.gate`.
    Qwen,
    /// gpt-oss: each layer's experts stacked in `mlp.experts.gate_up_proj` (gate and up
    /// interleaved) and `mlp.experts.down_proj` with biases, or as MXFP4 blocks and scales;
    /// router `mlp.router` with a bias.
    GptOss,
}

/// What an expert computes between its two projections.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ExpertActivation {
    /// `silu(gate) * up`.
    SiluMul,
    /// gpt-oss's: `g = min(gate, limit)`, `u = clamp(up, -limit, limit)`,
    /// `(u + 1) * g * sigmoid(alpha * g)`.
    ClampedSwiglu {
        /// Slope of the sigmoid.
        alpha: f32,
        /// The clamp.
        limit: f32,
    },
}

impl ExpertActivation {
    /// The activation of `gate_up` (`[tokens, 2 * inter]`, gate columns first).
    pub fn apply(&self, gate_up: &Tensor) -> candle_core::Result<Tensor> {
        match *self {
            ExpertActivation::SiluMul => silu_mul(gate_up),
            ExpertActivation::ClampedSwiglu { alpha, limit } => {
                let i = gate_up.dim(1)? / 2;
                let gate = gate_up.narrow(1, 0, i)?.minimum(limit as f64)?;
                let up = gate_up
                    .narrow(1, i, i)?
                    .clamp(-limit as f64, limit as f64)?;
                let glu = (&gate * candle_nn::ops::sigmoid(&gate.affine(alpha as f64, 0.0)?)?)?;
                up.affine(1.0, 1.0)? * glu
            }
        }
    }
}

#[derive(Deserialize)]
struct MoeFields {
    #[serde(alias = "num_local_experts")]
    num_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    moe_intermediate_size: Option<usize>,
    norm_topk_prob: Option<bool>,
    decoder_sparse_step: Option<usize>,
    #[serde(default)]
    mlp_only_layers: Vec<usize>,
    shared_expert_intermediate_size: Option<usize>,
    swiglu_limit: Option<f64>,
}

/// The MoE settings of a `config.json` for Mixtral, Qwen3-MoE or gpt-oss (`names`): its decoder
/// layers and dense MLP width from the shared fields, the rest from its own.
pub(super) fn settings(c: &HfConfig, names: ExpertNames) -> Result<MoeSettings, ModelError> {
    let (layers, intermediate) = (c.num_hidden_layers, c.intermediate_size.unwrap_or(0));
    let mixtral = names == ExpertNames::Mixtral;
    let f: MoeFields = c.fields()?;
    if f.shared_expert_intermediate_size.is_some_and(|s| s > 0) {
        return Err(ModelError::Unsupported("shared experts (Qwen2-MoE)".into()));
    }
    let num_experts = f.num_experts.unwrap_or(0);
    let top_k = f.num_experts_per_tok.unwrap_or(2);
    if num_experts == 0 || top_k == 0 || top_k > num_experts {
        return Err(ModelError::Config(format!(
            "mixture of experts with {num_experts} experts and {top_k} a token"
        )));
    }
    let step = f.decoder_sparse_step.unwrap_or(1).max(1);
    let gpt_oss = names == ExpertNames::GptOss;
    Ok(MoeSettings {
        num_experts,
        top_k,
        // (gpt-oss takes the softmax of the chosen experts' logits: the same weights.)
        renormalize: mixtral || gpt_oss || f.norm_topk_prob.unwrap_or(false),
        expert_intermediate: match names {
            ExpertNames::Mixtral | ExpertNames::GptOss => intermediate,
            ExpertNames::Qwen => f.moe_intermediate_size.unwrap_or(intermediate),
        },
        sparse: (0..layers)
            .map(|i| gpt_oss || !f.mlp_only_layers.contains(&i) && (i + 1) % step == 0)
            .collect(),
        names,
        activation: match gpt_oss {
            true => ExpertActivation::ClampedSwiglu {
                alpha: 1.702,
                limit: f.swiglu_limit.unwrap_or(7.0) as f32,
            },
            false => ExpertActivation::SiluMul,
        },
    })
}

/// A mixture of experts' settings from a GGUF file's `<arch>.expert_*` (Mixtral in `llama`
/// files, `qwen3moe`, `gpt-oss`); `None` without `expert_count`. A layer is sparse where it has a
/// router (`blk.N.ffn_gate_inp`); llama.cpp renormalizes the chosen experts' weights. (gpt-oss's
/// clamp is not in llama.cpp's metadata: the released models' 7.)
pub(super) fn gguf_settings(
    meta: &GgufMeta<'_>,
    names: ExpertNames,
) -> Result<Option<MoeSettings>, ModelError> {
    let Some(num_experts) = meta.opt_u32("expert_count") else {
        return Ok(None);
    };
    let layers = meta.u32("block_count")? as usize;
    let dense = meta.opt_u32("feed_forward_length").unwrap_or(0) as usize;
    Ok(Some(MoeSettings {
        num_experts: num_experts as usize,
        top_k: meta.u32("expert_used_count")? as usize,
        renormalize: true,
        expert_intermediate: meta
            .opt_u32("expert_feed_forward_length")
            .map_or(dense, |v| v as usize),
        sparse: (0..layers)
            .map(|i| meta.has_tensor(&format!("blk.{i}.ffn_gate_inp.weight")))
            .collect(),
        names,
        activation: match names {
            ExpertNames::GptOss => ExpertActivation::ClampedSwiglu {
                alpha: 1.702,
                limit: 7.0,
            },
            _ => ExpertActivation::SiluMul,
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`settings`] of a config.json with `layers` layers, a dense MLP `dense` wide, and `extra`.
    fn settings_of(
        extra: &str,
        names: ExpertNames,
        layers: usize,
        dense: usize,
    ) -> Result<MoeSettings, ModelError> {
        let text = format!(
            r#"{{"vocab_size":8,"hidden_size":8,"num_attention_heads":2,
            "num_hidden_layers":{layers},"intermediate_size":{dense},{}"#,
            &extra[1..]
        );
        settings(&HfConfig::parse(&text)?, names)
    }

    #[test]
    fn settings_read_the_sparse_layers_and_refuse_shared_experts() {
        let s = settings_of(
            r#"{"num_experts":8,"num_experts_per_tok":2,"moe_intermediate_size":16,
            "decoder_sparse_step":2,"mlp_only_layers":[3],"norm_topk_prob":false}"#,
            ExpertNames::Qwen,
            6,
            64,
        )
        .unwrap();
        assert_eq!(s.sparse, [false, true, false, false, false, true]);
        assert_eq!((s.expert_intermediate, s.renormalize), (16, false));
        let mixtral = settings_of(
            r#"{"num_local_experts":8,"num_experts_per_tok":2}"#,
            ExpertNames::Mixtral,
            2,
            64,
        )
        .unwrap();
        assert!(mixtral.renormalize && mixtral.expert_intermediate == 64);
        assert_eq!(mixtral.activation, ExpertActivation::SiluMul);
        let shared = settings_of(
            r#"{"num_experts":8,"shared_expert_intermediate_size":32}"#,
            ExpertNames::Qwen,
            2,
            64,
        );
        assert!(shared.unwrap_err().to_string().contains("shared experts"));
        assert!(
            settings_of(
                r#"{"num_experts":2,"num_experts_per_tok":3}"#,
                ExpertNames::Qwen,
                2,
                64
            )
            .is_err()
        );
    }
}
