//! Rotary scaling as a Hugging Face config states it (`rope_scaling`, or transformers 5's
//! `rope_parameters`): Llama 3.1's wavelength-dependent scaling, Phi-3's LongRoPE and YaRN
//! (gpt-oss, Qwen's long-context settings). The tables themselves are computed in
//! `rotary::Rotary`.

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

/// YaRN (`rope_type` "yarn"): frequencies that turn fewer than `beta_slow` times over the original
/// context are interpolated (divided by `factor`), those that turn more than `beta_fast` times are
/// kept, with a linear ramp between; cos and sin are scaled by `attention_factor`.
#[derive(Clone, Debug, PartialEq)]
pub struct Yarn {
    /// Context extension factor.
    pub factor: f64,
    /// Rotations over the original context above which a frequency is kept.
    pub beta_fast: f64,
    /// Rotations below which it is fully interpolated.
    pub beta_slow: f64,
    /// The context the model was pre-trained with.
    pub original_max_position_embeddings: usize,
    /// Scale of cos and sin.
    pub attention_factor: f64,
    /// Whether the ramp's ends are rounded to whole dimensions (transformers' default; gpt-oss
    /// says `false`).
    pub truncate: bool,
}

impl Yarn {
    /// `inv_freq` (the `rotary_dim / 2` unscaled inverse frequencies of base `theta`) scaled, as
    /// transformers computes them.
    pub fn scale(&self, inv_freq: &mut [f64], theta: f64) {
        let dim = 2 * inv_freq.len();
        let correction = |rotations: f64| {
            let turns = self.original_max_position_embeddings as f64
                / (rotations * 2.0 * std::f64::consts::PI);
            dim as f64 * turns.ln() / (2.0 * theta.ln())
        };
        let (mut low, mut high) = (correction(self.beta_fast), correction(self.beta_slow));
        if self.truncate {
            (low, high) = (low.floor(), high.ceil());
        }
        let (low, mut high) = (low.max(0.0), high.min(dim as f64 - 1.0));
        if low == high {
            high += 0.001;
        }
        for (i, f) in inv_freq.iter_mut().enumerate() {
            // How much of the original frequency is kept (1 at high frequencies).
            let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
            let keep = 1.0 - ramp;
            *f = *f / self.factor * (1.0 - keep) + *f * keep;
        }
    }
}

/// The rotary scalings a config may state (at most one is set).
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Scaling {
    pub llama3: Option<Llama3RopeScaling>,
    pub longrope: Option<LongRope>,
    pub yarn: Option<Yarn>,
}

/// The scaling `params` names (`rope_type` or `type`): Llama 3.1's, LongRoPE or YaRN (for which
/// the config's context lengths supply what `params` leaves out), none for "default", an error
/// for any other.
pub(super) fn parse(
    params: Option<&serde_json::Value>,
    max_position_embeddings: Option<usize>,
    original_max_position_embeddings: Option<usize>,
) -> Result<Scaling, ModelError> {
    let Some(v) = params.filter(|v| !v.is_null()) else {
        return Ok(Scaling::default());
    };
    let kind = v
        .get("rope_type")
        .or_else(|| v.get("type"))
        .and_then(|t| t.as_str())
        .unwrap_or("");
    match kind {
        "llama3" => Ok(Scaling {
            llama3: Some(
                serde_json::from_value(v.clone())
                    .map_err(|e| ModelError::Config(format!("rope_scaling: {e}")))?,
            ),
            ..Scaling::default()
        }),
        "default" => Ok(Scaling::default()),
        "longrope" | "su" => Ok(Scaling {
            longrope: Some(parse_longrope(
                v,
                max_position_embeddings,
                original_max_position_embeddings,
            )?),
            ..Scaling::default()
        }),
        "yarn" => Ok(Scaling {
            yarn: Some(parse_yarn(
                v,
                max_position_embeddings,
                original_max_position_embeddings,
            )?),
            ..Scaling::default()
        }),
        other => Err(ModelError::Unsupported(format!(
            "rope_scaling type {other:?}"
        ))),
    }
}

/// The pre-training context a `kind` scaling `v` extends: its own
/// `original_max_position_embeddings`, else the config's (`fallback`).
fn original_context(
    v: &serde_json::Value,
    fallback: Option<usize>,
    kind: &str,
) -> Result<usize, ModelError> {
    v.get("original_max_position_embeddings")
        .and_then(|o| o.as_u64())
        .map(|o| o as usize)
        .or(fallback)
        .ok_or_else(|| {
            ModelError::Config(format!("{kind} without original_max_position_embeddings"))
        })
}

/// YaRN's settings from `rope_scaling` (or `rope_parameters`) `v`, with transformers' defaults:
/// the factor from the context extension, betas 32 and 1, the attention factor
/// `0.1 ln(factor) + 1` (or its `mscale` / `mscale_all_dim` ratio).
pub(crate) fn parse_yarn(
    v: &serde_json::Value,
    max_position_embeddings: Option<usize>,
    original_max_position_embeddings: Option<usize>,
) -> Result<Yarn, ModelError> {
    let num = |key: &str| v.get(key).and_then(|x| x.as_f64()).filter(|x| *x != 0.0);
    let original = original_context(v, original_max_position_embeddings, "yarn")?;
    let factor = match num("factor") {
        Some(f) => f,
        None => {
            max_position_embeddings.ok_or_else(|| {
                ModelError::Config("yarn without a factor or max_position_embeddings".into())
            })? as f64
                / original as f64
        }
    };
    let mscale = |m: f64| match factor <= 1.0 {
        true => 1.0,
        false => 0.1 * m * factor.ln() + 1.0,
    };
    let attention_factor = match (
        num("attention_factor"),
        num("mscale"),
        num("mscale_all_dim"),
    ) {
        (Some(a), _, _) => a,
        (None, Some(m), Some(all)) => mscale(m) / mscale(all),
        _ => mscale(1.0),
    };
    Ok(Yarn {
        factor,
        beta_fast: num("beta_fast").unwrap_or(32.0),
        beta_slow: num("beta_slow").unwrap_or(1.0),
        original_max_position_embeddings: original,
        attention_factor,
        truncate: v.get("truncate").and_then(|t| t.as_bool()).unwrap_or(true),
    })
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
    let original = original_context(v, original_max_position_embeddings, "longrope")?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// transformers' `_compute_yarn_parameters` (5.17) for head dim 16, base 10000, factor 4
    /// over an original context of 64: its inverse frequencies, truncated ramp ends (the
    /// default) and not, and the attention factor `0.1 ln 4 + 1`.
    #[test]
    fn yarn_frequencies_match_transformers() {
        let cases: [(bool, [f64; 8]); 2] = [
            (
                true,
                [
                    1.0,
                    0.237_170_815,
                    0.049_999_997,
                    0.007_905_694_7,
                    0.002_5,
                    0.000_790_569_47,
                    0.000_25,
                    7.905_694_7e-5,
                ],
            ),
            (
                false,
                [
                    1.0,
                    0.198_583_528,
                    0.025_595_250,
                    0.007_905_694_7,
                    0.002_5,
                    0.000_790_569_47,
                    0.000_25,
                    7.905_694_7e-5,
                ],
            ),
        ];
        for (truncate, want) in cases {
            let v = serde_json::json!({"rope_type": "yarn", "factor": 4.0,
                "original_max_position_embeddings": 64, "truncate": truncate});
            let y = parse(Some(&v), Some(256), None).unwrap().yarn.unwrap();
            assert!((y.attention_factor - 1.138_629_436_111_989).abs() < 1e-12);
            let mut inv: Vec<f64> = (0..8)
                .map(|i| 1.0 / 10_000f64.powf(2.0 * i as f64 / 16.0))
                .collect();
            y.scale(&mut inv, 10_000.0);
            for (g, w) in inv.iter().zip(want) {
                assert!((g - w).abs() <= 1e-6 * w, "truncate {truncate}: {inv:?}");
            }
        }
        // The factor from the context extension when the config leaves it out.
        let v = serde_json::json!({"rope_type": "yarn", "original_max_position_embeddings": 64});
        assert_eq!(
            parse(Some(&v), Some(256), None)
                .unwrap()
                .yarn
                .unwrap()
                .factor,
            4.0
        );
    }
}
