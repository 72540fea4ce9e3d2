//! Rotary scaling as a Hugging Face config states it (`rope_scaling`, or transformers 5's
//! `rope_parameters`): Llama 3.1's wavelength-dependent scaling and Phi-3's LongRoPE. The tables
//! themselves are computed in `layers::Rotary`.

use serde::Deserialize;

use super::ModelError;

/// Llama 3.1-style rotary frequency scaling (`rope_scaling.rope_type == "llama3"`).
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Llama3RopeScaling {
    /// Overall scale factor.
    pub factor: f64,
    /// Wavelengths above `original_max_position_embeddings / low_freq_factor` are fully scaled.
    pub low_freq_factor: f64,
    /// Wavelengths below `original_max_position_embeddings / high_freq_factor` are kept.
    pub high_freq_factor: f64,
    /// Context the model was pre-trained with.
    pub original_max_position_embeddings: usize,
}

/// Phi-3's LongRoPE (`rope_scaling.type` "longrope", formerly "su"): per-frequency divisors of the
/// inverse frequencies, one set for positions within the original context and one beyond it, and
/// cos/sin scaled by `attention_factor`.
#[derive(Clone, Debug, PartialEq)]
pub struct LongRope {
    /// Divisors for positions below `original_max_position_embeddings` (one per frequency).
    pub short_factor: Vec<f64>,
    /// Divisors for positions at or past it.
    pub long_factor: Vec<f64>,
    /// The context the model was pre-trained with.
    pub original_max_position_embeddings: usize,
    /// Scale of cos and sin.
    pub attention_factor: f64,
}

/// The scaling `params` names (`rope_type` or `type`): Llama 3.1's or LongRoPE (for which the
/// config's context lengths supply what `params` leaves out), none for "default", an error for
/// any other.
pub(super) fn parse(
    params: Option<&serde_json::Value>,
    max_position_embeddings: Option<usize>,
    original_max_position_embeddings: Option<usize>,
) -> Result<(Option<Llama3RopeScaling>, Option<LongRope>), ModelError> {
    let Some(v) = params.filter(|v| !v.is_null()) else {
        return Ok((None, None));
    };
    let kind = v
        .get("rope_type")
        .or_else(|| v.get("type"))
        .and_then(|t| t.as_str())
        .unwrap_or("");
    match kind {
        "llama3" => Ok((
            Some(
                serde_json::from_value(v.clone())
                    .map_err(|e| ModelError::Config(format!("rope_scaling: {e}")))?,
            ),
            None,
        )),
        "default" => Ok((None, None)),
        "longrope" | "su" => Ok((
            None,
            Some(parse_longrope(
                v,
                max_position_embeddings,
                original_max_position_embeddings,
            )?),
        )),
        other => Err(ModelError::Unsupported(format!(
            "rope_scaling type {other:?}"
        ))),
    }
}

/// LongRoPE's settings from `rope_scaling` (or `rope_parameters`) `v`; the attention
/// factor, when not given, as transformers computes it from the context extension.
fn parse_longrope(
    v: &serde_json::Value,
    max_position_embeddings: Option<usize>,
    original_max_position_embeddings: Option<usize>,
) -> Result<LongRope, ModelError> {
    let factors = |key: &str| -> Result<Vec<f64>, ModelError> {
        v.get(key)
            .and_then(|f| f.as_array())
            .map(|a| a.iter().filter_map(|x| x.as_f64()).collect())
            .ok_or_else(|| ModelError::Config(format!("rope_scaling: longrope without {key}")))
    };
    let original = v
        .get("original_max_position_embeddings")
        .and_then(|o| o.as_u64())
        .map(|o| o as usize)
        .or(original_max_position_embeddings)
        .ok_or_else(|| {
            ModelError::Config("longrope without original_max_position_embeddings".into())
        })?;
    let extension = max_position_embeddings.unwrap_or(original) as f64 / original as f64;
    let attention_factor = v
        .get("attention_factor")
        .and_then(|a| a.as_f64())
        .unwrap_or(if extension <= 1.0 {
            1.0
        } else {
            (1.0 + extension.ln() / (original as f64).ln()).sqrt()
        });
    Ok(LongRope {
        short_factor: factors("short_factor")?,
        long_factor: factors("long_factor")?,
        original_max_position_embeddings: original,
        attention_factor,
    })
}
