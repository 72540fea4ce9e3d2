//! Rotary position embeddings: the cos/sin tables of a model's positions (rotate-half or
//! interleaved, with Llama 3.1's frequency scaling and the `rope_scaling` variants), applied to
//! packed `[tokens, heads, head_dim]` rows ([`Rotary`]), and a step's rows of them ([`RotaryRows`]).

use std::sync::OnceLock;

use candle_core::{DType, Device, Tensor};

use super::ModelError;
use super::config::{Llama3RopeScaling, ModelConfig};

/// Rotary position embedding tables and their application to packed `[tokens, heads, head_dim]`.
pub struct Rotary {
    cos: Tensor,
    sin: Tensor,
    interleaved: bool,
}

/// Llama 3.1's wavelength-dependent scaling of the inverse frequencies.
fn llama3_scale(inv_freq: &mut [f64], s: &Llama3RopeScaling) {
    let old = s.original_max_position_embeddings as f64;
    let low_wavelen = old / s.low_freq_factor;
    let high_wavelen = old / s.high_freq_factor;
    for f in inv_freq.iter_mut() {
        let wavelen = 2.0 * std::f64::consts::PI / *f;
        if wavelen > low_wavelen {
            *f /= s.factor;
        } else if wavelen >= high_wavelen {
            let smooth =
                (old / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
            *f = (1.0 - smooth) * *f / s.factor + smooth * *f;
        }
    }
}

impl Rotary {
    /// Tables for positions `0..max_len`, in `dtype` on `device`.
    pub fn new(
        cfg: &ModelConfig,
        max_len: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self, ModelError> {
        Self::with_base(cfg, cfg.rope_theta, 1.0, max_len, dtype, device)
    }

    /// [`Rotary::new`] with base `theta` and positions divided by `linear` (linear rope
    /// scaling), for models whose layers turn at different rates (Gemma 3).
    pub fn with_base(
        cfg: &ModelConfig,
        theta: f64,
        linear: f64,
        max_len: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self, ModelError> {
        let d = cfg.rotary_dim();
        let mut inv_freq: Vec<f64> = (0..d / 2)
            .map(|i| 1.0 / theta.powf(2.0 * i as f64 / d as f64) / linear)
            .collect();
        if let Some(s) = &cfg.rope_scaling {
            llama3_scale(&mut inv_freq, s);
        }
        if let Some(y) = &cfg.yarn {
            y.scale(&mut inv_freq, theta);
        }
        // LongRoPE: each frequency divided by its short factor within the original context and
        // by its long factor past it; cos and sin scaled (as YaRN scales them).
        let yarn_scale = cfg.yarn.as_ref().map_or(1.0, |y| y.attention_factor);
        let (mut short, mut long, mut original, mut scale) = (None, None, usize::MAX, yarn_scale);
        if let Some(l) = &cfg.longrope {
            for f in [&l.short_factor, &l.long_factor] {
                if f.len() != inv_freq.len() {
                    return Err(ModelError::Config(format!(
                        "longrope: {} factors for {} rotary frequencies",
                        f.len(),
                        inv_freq.len()
                    )));
                }
            }
            let divided = |f: &[f64]| inv_freq.iter().zip(f).map(|(i, f)| i / f).collect();
            short = Some(divided(&l.short_factor));
            long = Some(divided(&l.long_factor));
            original = l.original_max_position_embeddings;
            scale = l.attention_factor;
        }
        let mut cos = Vec::with_capacity(max_len * d / 2);
        let mut sin = Vec::with_capacity(max_len * d / 2);
        for p in 0..max_len {
            let freqs: &Vec<f64> = match (&short, &long) {
                (Some(s), _) if p < original => s,
                (_, Some(l)) => l,
                _ => &inv_freq,
            };
            for &f in freqs {
                let angle = p as f64 * f;
                cos.push((angle.cos() * scale) as f32);
                sin.push((angle.sin() * scale) as f32);
            }
        }
        let table = |v: Vec<f32>| -> candle_core::Result<Tensor> {
            Tensor::from_vec(v, (max_len, d / 2), &Device::Cpu)?
                .to_dtype(dtype)?
                .to_device(device)
        };
        Ok(Rotary {
            cos: table(cos)?,
            sin: table(sin)?,
            interleaved: cfg.rope_interleaved,
        })
    }

    /// The step's cos and sin rows (`[tokens, head_dim / 2]`), gathered once and shared by every
    /// layer's q and k.
    pub fn at(&self, positions: &Tensor) -> candle_core::Result<RotaryRows> {
        let (cos, sin) = (
            self.cos.index_select(positions, 0)?,
            self.sin.index_select(positions, 0)?,
        );
        Ok(RotaryRows {
            cos,
            sin,
            interleaved: self.interleaved,
            host: OnceLock::new(),
        })
    }

    /// The qkv projection of `rms_norm(x)` by the fused weight `w` in one GEMV kernel that also
    /// rotates q and k (reading the tables at `positions`, u32 `[rows]`) and writes k and v into
    /// the caches at `slot_mapping` (decode steps of up to `decode_fused::MAX_ROWS` rows; see
    /// `pagewise_kernels::gemv_rope_cache`); returns q, `[rows, heads, head_dim]`.
    #[cfg(feature = "cuda")]
    pub fn project_qkv_and_cache(
        &self,
        x: &Tensor,
        w: pagewise_kernels::GemvWeight<'_>,
        norm: &super::norm::RmsNorm,
        (heads, kv_heads): (usize, usize),
        (k_cache, v_cache): (&Tensor, &Tensor),
        (positions, slot_mapping): (&Tensor, &Tensor),
    ) -> candle_core::Result<Tensor> {
        let target = pagewise_kernels::RopeCacheTarget {
            heads,
            kv_heads,
            cos: &self.cos,
            sin: &self.sin,
            positions: Some(positions),
            interleaved: self.interleaved,
            k_cache,
            v_cache,
            slot_mapping,
        };
        // SAFETY: the indices come from the scheduler's plan (ForwardBatch): block ids below the
        // cache's num_blocks, distinct slots within a step, contexts within each block-table row.
        unsafe {
            pagewise_kernels::gemv_rope_cache(x, w, norm.weight(), norm.eps() as f32, &target)
        }
    }

    /// The fused q/k/v projection `qkv` as the kernels that rotate it take it: the whole tables
    /// read at `positions` (u32 `[tokens]`, no gather), after the per-head norms, if any. For the
    /// fused decode path of models with per-head q/k norms, whose projection cannot rotate as it
    /// stores (a head's norm needs the whole head).
    #[cfg(feature = "cuda")]
    pub fn qkv_rope<'a>(
        &'a self,
        qkv: &'a Tensor,
        (heads, kv_heads): (usize, usize),
        head_norms: Option<pagewise_kernels::HeadNorms<'a>>,
        positions: &'a Tensor,
    ) -> pagewise_kernels::QkvRope<'a> {
        pagewise_kernels::QkvRope {
            qkv,
            heads,
            kv_heads,
            cos: &self.cos,
            sin: &self.sin,
            positions: Some(positions),
            interleaved: self.interleaved,
            head_norms,
        }
    }
}

/// The rotary tables gathered at one step's positions.
pub struct RotaryRows {
    cos: Tensor,
    sin: Tensor,
    interleaved: bool,
    /// `cos` and `sin` as f32 in host memory, made by the first [`RotaryRows::host`] (on the CPU,
    /// for the models whose attention turns q and k on plain buffers).
    host: OnceLock<(Vec<f32>, Vec<f32>)>,
}

/// [`RotaryRows`] on the host: turns one head of one token in place, as [`RotaryRows::apply`]
/// turns it (the same products in the same order).
#[derive(Clone, Copy)]
pub struct HostRotary<'a> {
    cos: &'a [f32],
    sin: &'a [f32],
    /// Pairs a head turns (half of [`RotaryRows::dims`]).
    half: usize,
    interleaved: bool,
}

impl HostRotary<'_> {
    /// Turns `head` (one head of token `t`, at least [`RotaryRows::dims`] wide): its leading
    /// dimensions, as pairs `(2i, 2i + 1)` when interleaved, else `(i, i + half)`.
    pub fn turn(&self, t: usize, head: &mut [f32]) {
        let (cos, sin) = (
            &self.cos[t * self.half..][..self.half],
            &self.sin[t * self.half..][..self.half],
        );
        for i in 0..self.half {
            let (i1, i2) = if self.interleaved {
                (2 * i, 2 * i + 1)
            } else {
                (i, i + self.half)
            };
            let (x1, x2) = (head[i1], head[i2]);
            head[i1] = x1 * cos[i] - x2 * sin[i];
            head[i2] = x1 * sin[i] + x2 * cos[i];
        }
    }
}

impl RotaryRows {
    /// The fused q/k/v projection `qkv` as the kernels that rotate it take it (these rows'
    /// tables; after the per-head norms, if the model has them).
    #[cfg(feature = "cuda")]
    pub fn qkv_rope<'a>(
        &'a self,
        qkv: &'a Tensor,
        (heads, kv_heads): (usize, usize),
        head_norms: Option<pagewise_kernels::HeadNorms<'a>>,
    ) -> pagewise_kernels::QkvRope<'a> {
        pagewise_kernels::QkvRope {
            qkv,
            heads,
            kv_heads,
            cos: &self.cos,
            sin: &self.sin,
            positions: None,
            interleaved: self.interleaved,
            head_norms,
        }
    }

    /// The tables as plain f32 on the host, when they are on the CPU (copied once a step, by the
    /// first layer that asks).
    pub fn host(&self) -> candle_core::Result<Option<HostRotary<'_>>> {
        if !self.cos.device().is_cpu() {
            return Ok(None);
        }
        let (cos, sin) = match self.host.get() {
            Some(tables) => tables,
            None => {
                let flat = |t: &Tensor| t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>();
                let tables = (flat(&self.cos)?, flat(&self.sin)?);
                self.host.get_or_init(|| tables)
            }
        };
        Ok(Some(HostRotary {
            cos,
            sin,
            half: self.dims() / 2,
            interleaved: self.interleaved,
        }))
    }

    /// Dimensions of each head these tables turn.
    pub fn dims(&self) -> usize {
        2 * self.cos.dims().last().copied().unwrap_or(0)
    }

    /// Rotates `x` (`[tokens, heads, head_dim]`, contiguous): all of each head, or its leading
    /// dimensions when the tables are narrower (partial rotary; the rest pass through).
    pub fn apply(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let (rot, d) = (2 * self.cos.dim(1)?, x.dim(2)?);
        if rot < d {
            let turned = self.apply_whole(&x.narrow(2, 0, rot)?.contiguous()?)?;
            return Tensor::cat(&[&turned, &x.narrow(2, rot, d - rot)?], 2)?.contiguous();
        }
        self.apply_whole(x)
    }

    fn apply_whole(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        if self.interleaved {
            // candle's interleaved kernel takes [batch, heads, tokens, head_dim].
            let x = x.transpose(0, 1)?.unsqueeze(0)?.contiguous()?;
            let y = candle_nn::rotary_emb::rope_i(&x, &self.cos, &self.sin)?;
            y.squeeze(0)?.transpose(0, 1)?.contiguous()
        } else {
            // Rotate-half over [batch, tokens, heads, head_dim]: the packed layout as it is.
            candle_nn::rotary_emb::rope_thd(&x.unsqueeze(0)?, &self.cos, &self.sin)?.squeeze(0)
        }
    }
}
