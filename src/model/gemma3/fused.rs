//! Gemma 3's decode steps on the fused path (src/model/decode_fused.rs): a layer is five kernels,
//! its two normalized residual adds folded into the staging of the projection after each
//! (`pagewise_kernels::gemv_add_normed`): qkv (after the last MLP's add, with the input norm),
//! attention (with the q/k norms, rope and cache write), o, gate/up (after o's add, with the
//! pre-MLP norm), and down
//! (GeGLU folded in). The last layer's add rides in the LM head's staging with the final norm
//! when the head is one dense matrix (`logits_after_add`); else it runs alone, before the norm.

use candle_core::{DType, Device, Tensor};
use pagewise_kernels::{GemvInput, GemvWeight, gemv, gemv_add_normed, gemv_fused};

use super::Gemma3;
use crate::model::ModelError;
use crate::model::attention::KvCache;
use crate::model::batch::ForwardBatch;
use crate::model::decode_fused;
use crate::model::norm::RmsNorm;
use crate::model::qkv::Heads;

impl Gemma3 {
    /// The layers' weights for the fused decode path (src/model/decode_fused.rs), when it takes
    /// a step of `rows` rows in `dtype` on `device`: a GPU step of at most
    /// `decode_fused::MAX_ROWS` rows in f16 or bf16, dense weights the GEMV can stage.
    pub(super) fn fused_layers(
        &self,
        rows: usize,
        dtype: DType,
        device: &Device,
        kv: &KvCache,
    ) -> Option<Vec<FusedGemmaLayer<'_>>> {
        use decode_fused::{gemv_takes, step_fits};
        if !step_fits(rows, dtype, device) || self.cfg.rotary_dim() < self.cfg.head_dim {
            return None;
        }
        self.layers
            .iter()
            .enumerate()
            .map(|(i, l)| {
                kv.device_layer(i)?;
                let (gate_up, down) = l.mlp.gemv_geglu_weights()?;
                let f = FusedGemmaLayer {
                    attn: decode_fused::FusedAttention {
                        input_norm: &l.input_norm,
                        qkv: l.qkv.gemv_weight()?,
                        head_norms: l.qkv.head_norms(),
                    },
                    o: l.o.gemv_weight()?,
                    gate_up,
                    down,
                };
                gemv_takes(rows, dtype, &[f.attn.qkv, f.o, gate_up, down]).then_some(f)
            })
            .collect()
    }

    /// Runs every layer on the embedded step `x`, on the fused path
    /// (`layers` from [`Gemma3::fused_layers`]; `heads` gives a layer's heads by whether it
    /// slides). Under tensor parallelism o's and down's outputs are summed over the ranks before
    /// their norms. Returns the residual stream before the last layer's normalized add and that
    /// add's delta (the MLP's output) and norm, for [`Gemma3::logits_after_add`].
    pub(super) fn forward_fused(
        &self,
        x: Tensor,
        layers: &[FusedGemmaLayer<'_>],
        batch: &ForwardBatch<'_>,
        kv: &KvCache,
        heads: impl Fn(bool) -> Heads,
    ) -> candle_core::Result<(Tensor, Option<(Tensor, &RmsNorm)>)> {
        // The stream before the last MLP's normalized add, that MLP's output and its norm: the
        // add is folded into the next projection's staging (`project_after_add`).
        let mut pending: Option<(Tensor, Tensor, &RmsNorm)> = None;
        let mut x = x;
        for (i, (layer, f)) in self.layers.iter().zip(layers).enumerate() {
            let rotary = if layer.sliding {
                &self.local
            } else {
                &self.global
            };
            let qkv = match pending.take() {
                None => {
                    let input = decode_fused::norm_input(&layer.input_norm);
                    gemv_fused(&x, f.attn.qkv, input, None)?
                }
                Some((stream, mlp, post)) => {
                    let (qkv, sum) =
                        project_after_add(&stream, &mlp, post, &layer.input_norm, f.attn.qkv)?;
                    x = sum;
                    qkv
                }
            };
            let attn = decode_fused::attend_projected(
                &qkv,
                &f.attn,
                i,
                rotary,
                batch,
                kv,
                heads(layer.sliding),
            )?;
            let o = self.par.all_reduce(gemv(&attn, f.o)?)?;
            let (gate_up, x_mid) = project_after_add(
                &x,
                &o,
                &layer.post_attention_norm,
                &layer.pre_feedforward_norm,
                f.gate_up,
            )?;
            let mlp = gemv_fused(&gate_up, f.down, GemvInput::GeluTanhMul, None)?;
            let mlp = self.par.all_reduce(mlp)?;
            pending = Some((x_mid, mlp, &layer.post_feedforward_norm));
        }
        Ok(match pending {
            Some((stream, mlp, post)) => (stream, Some((mlp, post))),
            None => (x, None),
        })
    }

    /// The logits after the fused layers (`stream` and the last add's `delta` and norm, from
    /// [`Gemma3::forward_fused`]): with a whole dense LM head and every row sampling, the add,
    /// the final norm and the head are one GEMV (`gemv_add_normed`, four blocks an SM: it reads
    /// Gemma-3-12B's 262208 x 3840 head at about 4.5 TB/s, as cuBLAS does, and saves two
    /// kernels); else the add, the norm, then [`Gemma3::logits`].
    pub(super) fn logits_after_add(
        &self,
        stream: Tensor,
        last: Option<(Tensor, &RmsNorm)>,
        batch: &ForwardBatch<'_>,
    ) -> Result<Tensor, ModelError> {
        let rows = stream.dim(0)?;
        if let (Some((delta, post)), Some(w)) = (&last, self.lm_head.whole_dense())
            && batch.num_sample_rows == rows
        {
            let (logits, _) = project_after_add(&stream, delta, post, &self.norm, w)?;
            return self.softcapped(logits);
        }
        let x = match last {
            Some((delta, post)) => post.add_normed(&stream, &delta)?,
            None => stream,
        };
        self.logits(&self.norm.forward(&x)?, batch)
    }
}

/// A Gemma layer's weights as the fused decode path takes them.
pub(super) struct FusedGemmaLayer<'a> {
    attn: decode_fused::FusedAttention<'a>,
    /// `[hidden, heads * head_dim]`.
    o: GemvWeight<'a>,
    /// `[2 * intermediate, hidden]`, gate rows first.
    gate_up: GemvWeight<'a>,
    /// `[hidden, intermediate]`.
    down: GemvWeight<'a>,
}

/// The projection by `w` of `norm(stream + post(delta))`, and that sum (the residual stream the
/// layer goes on with): one kernel, Gemma's normalized residual add folded into the GEMV's
/// staging (`pagewise_kernels::gemv_add_normed`), where the two norms share their epsilon (every
/// Gemma checkpoint's do); else the add, then the GEMV with the norm folded in.
fn project_after_add<'w>(
    stream: &Tensor,
    delta: &Tensor,
    post: &RmsNorm,
    norm: &RmsNorm,
    w: impl Into<GemvWeight<'w>>,
) -> candle_core::Result<(Tensor, Tensor)> {
    let w = w.into();
    if post.eps() == norm.eps() {
        let eps = norm.eps() as f32;
        return gemv_add_normed(delta, stream, post.weight(), norm.weight(), eps, w);
    }
    let sum = post.add_normed(stream, delta)?;
    let input = decode_fused::norm_input(norm);
    Ok((gemv_fused(&sum, w, input, None)?, sum))
}
