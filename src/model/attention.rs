//! The paged KV cache and paged attention: the CPU reference implementation of the contract the CUDA
//! kernels implement.
//!
//! Layout, per layer: K and V are each `[num_blocks, block_size, num_kv_heads, head_dim]` (NHD); slot
//! `s` is block `s / block_size`, row `s % block_size`. A step first writes its tokens' K/V at their
//! slots (`reshape_and_cache`), then every query token attends over its sequence's positions
//! `0..=its own position`, read through the sequence's block table: causal inside the step's chunk
//! and full over the cached prefix. Query head `h` reads KV head `h / (num_heads / num_kv_heads)`.

use candle_core::{DType, Device, Tensor};

use super::batch::AttentionMeta;
use crate::cpu::memory::Zeroed;
use crate::cpu::team::Team;
use crate::cpu::{attend, exp};

/// Shape of the paged cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    /// Blocks per layer (block 0 is the null block).
    pub num_blocks: usize,
    /// Token slots per block.
    pub block_size: usize,
    /// KV heads.
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
}

impl KvLayout {
    fn slot_width(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }
}

/// One layer's K and V (f32 on the CPU).
struct LayerKv {
    k: Zeroed,
    v: Zeroed,
}

/// What a GPU cache's elements are.
#[derive(Clone, Debug, PartialEq)]
pub enum KvElements {
    /// The model's dtype.
    Model(DType),
    /// e4m3 bytes (`--kv-cache-dtype fp8`) for a model of 16-bit `dtype`, with each layer's
    /// (K, V) scales: a value `x` is stored as e4m3(`x / scale`).
    Fp8 {
        /// The model's (the values') dtype.
        dtype: DType,
        /// Each layer's (K, V) scales.
        scales: Vec<(f32, f32)>,
    },
}

impl KvElements {
    /// The dtype of the values the cache stands for (the model's).
    pub fn value_dtype(&self) -> DType {
        match self {
            KvElements::Model(d) | KvElements::Fp8 { dtype: d, .. } => *d,
        }
    }
}

enum Store {
    /// f32 in host memory, read by the reference attention below.
    Host(Vec<LayerKv>),
    /// Device tensors `[num_blocks, block_size, num_kv_heads, head_dim]` per layer (K, V), read by
    /// the CUDA kernels: of the model's dtype, or e4m3 bytes (U8) with each layer's scales.
    #[cfg(feature = "cuda")]
    Cuda {
        layers: Vec<(Tensor, Tensor)>,
        elements: KvElements,
    },
}

/// The whole paged KV cache.
pub struct KvCache {
    layout: KvLayout,
    store: Store,
}

impl KvCache {
    /// A zeroed host (CPU) cache of `num_layers` layers.
    pub fn new(layout: KvLayout, num_layers: usize) -> Self {
        Self::new_grouped(layout, &vec![layout.num_blocks; num_layers])
    }

    /// A zeroed host cache whose layer `i` has `layer_blocks[i]` blocks (a window group's layers
    /// have fewer than `layout.num_blocks`).
    pub fn new_grouped(layout: KvLayout, layer_blocks: &[usize]) -> Self {
        let slots = |blocks: usize| blocks * layout.block_size * layout.slot_width();
        // Mappings of their own: the pages of blocks never used are never touched.
        let layers = layer_blocks
            .iter()
            .map(|&b| LayerKv {
                k: Zeroed::new(slots(b)),
                v: Zeroed::new(slots(b)),
            })
            .collect();
        KvCache {
            layout,
            store: Store::Host(layers),
        }
    }

    /// A zeroed cache on `device`: host memory for the CPU, `dtype` tensors on a GPU.
    pub fn on_device(
        layout: KvLayout,
        num_layers: usize,
        dtype: DType,
        device: &Device,
    ) -> candle_core::Result<Self> {
        let blocks = vec![layout.num_blocks; num_layers];
        Self::on_device_grouped(layout, &blocks, KvElements::Model(dtype), device)
    }

    /// [`KvCache::on_device`] with `layer_blocks[i]` blocks in layer `i`, of `elements` on a GPU
    /// (an FP8 cache has a GPU's only: the CPU refuses it).
    pub fn on_device_grouped(
        layout: KvLayout,
        layer_blocks: &[usize],
        elements: KvElements,
        device: &Device,
    ) -> candle_core::Result<Self> {
        if let KvElements::Fp8 { dtype, scales } = &elements {
            if device.is_cpu() {
                candle_core::bail!(
                    "an FP8 KV cache (--kv-cache-dtype fp8) runs on a GPU only; the CPU's cache \
                     is f32"
                );
            }
            if !matches!(dtype, DType::BF16 | DType::F16) {
                candle_core::bail!(
                    "an FP8 KV cache needs a bf16 or f16 model (--dtype), not {dtype:?}"
                );
            }
            if scales.len() != layer_blocks.len() {
                candle_core::bail!(
                    "{} FP8 KV scales for {} layers",
                    scales.len(),
                    layer_blocks.len()
                );
            }
        }
        if device.is_cpu() {
            return Ok(Self::new_grouped(layout, layer_blocks));
        }
        #[cfg(feature = "cuda")]
        {
            let shape = |blocks: usize| {
                (
                    blocks,
                    layout.block_size,
                    layout.num_kv_heads,
                    layout.head_dim,
                )
            };
            let stored = match &elements {
                KvElements::Model(dtype) => *dtype,
                KvElements::Fp8 { .. } => DType::U8,
            };
            let layers = layer_blocks
                .iter()
                .map(|&b| {
                    Ok((
                        Tensor::zeros(shape(b), stored, device)?,
                        Tensor::zeros(shape(b), stored, device)?,
                    ))
                })
                .collect::<candle_core::Result<Vec<_>>>()?;
            Ok(KvCache {
                layout,
                store: Store::Cuda { layers, elements },
            })
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = elements;
            candle_core::bail!("no KV cache for {device:?}: this build has no GPU support")
        }
    }

    /// What a GPU cache's elements are (`None` for the CPU's f32 cache).
    pub fn elements(&self) -> Option<&KvElements> {
        match &self.store {
            Store::Host(_) => None,
            #[cfg(feature = "cuda")]
            Store::Cuda { elements, .. } => Some(elements),
        }
    }

    /// The cache's shape (`num_blocks` is the full layers'; a window group's layers may have
    /// fewer).
    pub fn layout(&self) -> KvLayout {
        self.layout
    }

    /// Layer `layer`'s K and V caches, as the kernels take them, when the cache lives on a GPU.
    #[cfg(feature = "cuda")]
    pub fn device_layer(&self, layer: usize) -> Option<pagewise_kernels::PagedKv<'_>> {
        let Store::Cuda { layers, elements } = &self.store else {
            return None;
        };
        let (k, v) = layers.get(layer)?;
        Some(match elements {
            KvElements::Model(_) => pagewise_kernels::PagedKv::new(k, v),
            KvElements::Fp8 { scales, .. } => {
                let (ks, vs) = scales[layer];
                pagewise_kernels::PagedKv::fp8(k, v, pagewise_kernels::KvScales { k: ks, v: vs })
            }
        })
    }

    /// Attends `q` (`[tokens, heads, head_dim]`) over layer `layer` of a GPU cache that already
    /// holds this step's K/V (written by `pagewise_kernels::rope_qkv_cache` or the projection's
    /// GEMV), over the last `window` positions of each row's context in a sliding-window layer.
    /// Returns `[tokens, heads * head_dim]`.
    #[cfg(feature = "cuda")]
    pub fn attend_written(
        &self,
        layer: usize,
        q: &Tensor,
        meta: &AttentionMeta<'_>,
        scale: f32,
        window: Option<usize>,
    ) -> candle_core::Result<Tensor> {
        let (Some(kv), Some(dm)) = (self.device_layer(layer), &meta.device) else {
            candle_core::bail!("attend_written needs a GPU cache and device metadata");
        };
        match window {
            Some(w) => super::attention_cuda::attend_rows(kv, q, dm, scale, Some(w), None),
            None => super::attention_cuda::attend_cached(kv, q, dm, scale),
        }
    }

    /// Attends a decode step's new tokens straight from their fused projection `x` over layer
    /// `layer` of a GPU cache (`pagewise_kernels::paged_attention_fresh`: the attention kernel
    /// normalizes and rotates q and k and writes K/V itself, one launch instead of two), over the
    /// last `window` positions of each row's context in a sliding-window layer. Returns
    /// `[tokens, heads * head_dim]`, or `None` where the step does not fit that kernel (prefill
    /// rows, f32, an FP8 cache, a cache or metadata off the GPU): the caller then rotates and
    /// writes first.
    #[cfg(feature = "cuda")]
    pub fn attend_fresh(
        &self,
        layer: usize,
        x: &pagewise_kernels::QkvRope<'_>,
        meta: &AttentionMeta<'_>,
        scale: f32,
        window: Option<usize>,
    ) -> candle_core::Result<Option<Tensor>> {
        let (Some(kv), Some(dm)) = (self.device_layer(layer), &meta.device) else {
            return Ok(None);
        };
        if kv.fp8.is_some() {
            return Ok(None);
        }
        super::attention_cuda::attend_fresh((kv.k, kv.v), x, dm, scale, window)
    }

    /// Writes `k`, `v` (`[tokens, kv_heads, head_dim]`) of layer `layer` at the slot mapping, then
    /// attends `q` (`[tokens, heads, head_dim]`) over the cache. Returns `[tokens, heads * head_dim]`.
    pub fn attend(
        &mut self,
        layer: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        meta: &AttentionMeta<'_>,
        scale: f32,
    ) -> candle_core::Result<Tensor> {
        self.attend_with_sinks(layer, q, k, v, meta, scale, None, None)
    }

    /// [`KvCache::attend`] for a sliding-window layer when `window` is given: the query at
    /// position `p` attends to positions `p + 1 - window ..= p` only (transformers' and vLLM's
    /// window), on the CPU and on the GPU (its decode kernel, for every row of the layer); and
    /// with attention sinks when `sinks` is given (gpt-oss; f32 `[heads]` on the model's device):
    /// head `h`'s learned logit `sinks[h]` joins each softmax as one more score that attends to
    /// nothing, so a query may give its positions less than all of its weight.
    #[allow(clippy::too_many_arguments)]
    pub fn attend_with_sinks(
        &mut self,
        layer: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        meta: &AttentionMeta<'_>,
        scale: f32,
        window: Option<usize>,
        sinks: Option<&Tensor>,
    ) -> candle_core::Result<Tensor> {
        let (num_tokens, num_heads, head_dim) = q.dims3()?;
        if let Some(s) = sinks
            && s.dims() != [num_heads]
        {
            candle_core::bail!("attention sinks {:?} for {num_heads} heads", s.dims());
        }
        let layout = self.layout;
        if k.dims3()? != (num_tokens, layout.num_kv_heads, head_dim) || head_dim != layout.head_dim
        {
            candle_core::bail!(
                "paged attention: q {:?} / k {:?} do not match the cache layout {layout:?}",
                q.shape(),
                k.shape()
            );
        }
        let windowed = window.is_some();
        let slots = match &meta.device {
            Some(dm) => dm.tables(windowed).0.dim(0)?,
            None => meta.tables(windowed).0.len(),
        };
        if slots != num_tokens {
            candle_core::bail!("paged attention: {slots} slots for {num_tokens} tokens");
        }
        #[allow(clippy::infallible_destructuring_match)] // a second arm exists with `cuda`
        let layers = match &mut self.store {
            Store::Host(layers) => layers,
            #[cfg(feature = "cuda")]
            Store::Cuda { .. } => {
                let (Some(kv), Some(dm)) = (self.device_layer(layer), &meta.device) else {
                    candle_core::bail!("paged attention on a GPU needs device metadata");
                };
                return super::attention_cuda::attend(kv, q, k, v, dm, scale, window, sinks);
            }
        };
        let (dtype, device) = (q.dtype(), q.device().clone());
        let host = |t: &Tensor| t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>();
        let (q, k, v) = (host(q)?, host(k)?, host(v)?);
        let cache = &mut layers[layer];
        reshape_and_cache(&k, &v, cache, meta.tables(windowed).0, layout)?;
        let sinks = sinks
            .map(|s| s.to_dtype(DType::F32)?.to_vec1::<f32>())
            .transpose()?;
        let shape = Shape {
            heads: num_heads,
            scale,
            window,
            sinks: sinks.as_deref(),
        };
        let out = attend_cpu(&q, cache, meta, layout, shape);
        Tensor::from_vec(out, (num_tokens, num_heads * head_dim), &Device::Cpu)?
            .to_dtype(dtype)?
            .to_device(&device)
    }
}

fn reshape_and_cache(
    k: &[f32],
    v: &[f32],
    cache: &mut LayerKv,
    slots: &[u32],
    layout: KvLayout,
) -> candle_core::Result<()> {
    let w = layout.slot_width();
    let num_slots = cache.k.len() / w;
    for (t, &slot) in slots.iter().enumerate() {
        let slot = slot as usize;
        if slot >= num_slots {
            candle_core::bail!("slot {slot} outside the cache ({num_slots} slots)");
        }
        cache.k[slot * w..(slot + 1) * w].copy_from_slice(&k[t * w..(t + 1) * w]);
        cache.v[slot * w..(slot + 1) * w].copy_from_slice(&v[t * w..(t + 1) * w]);
    }
    Ok(())
}

/// Positions one unit of [`attend_cpu`]'s work covers at most: a query row's positions are cut at
/// multiples of it, so that a decode step of one sequence still splits between the team. The
/// cut depends on the position alone, never on the batch, so a sequence's output is the same in
/// every batch.
const PART: usize = 32;

/// What a step's attention computes beyond the cache's layout.
struct Shape<'a> {
    heads: usize,
    scale: f32,
    window: Option<usize>,
    sinks: Option<&'a [f32]>,
}

/// One unit of work: token `t`'s heads over positions `start..end`.
struct Unit {
    t: usize,
    start: usize,
    end: usize,
}

/// Paged attention for every query row: softmax(q·K / √d)·V over the row's positions (the last
/// `window` of them in a sliding-window layer), with the head's sink logit in the softmax's
/// denominator when the model has sinks.
///
/// The team splits the work by token and [`PART`] of positions. A unit reads each cached slot
/// (every KV head's K or V of a position) once, whole, for all the query heads, and leaves each
/// head's unnormalized partial: the weighted sum of V under `exp(s − m)`, its max `m` and its
/// total. A token's partials are then merged, as flash-decoding merges its splits.
fn attend_cpu(
    q: &[f32],
    cache: &LayerKv,
    meta: &AttentionMeta<'_>,
    layout: KvLayout,
    shape: Shape<'_>,
) -> Vec<f32> {
    let Shape {
        heads: num_heads,
        scale,
        window,
        sinks,
    } = shape;
    let d = layout.head_dim;
    let w = layout.slot_width();
    let bs = layout.block_size;
    let heads = attend::Heads {
        d,
        group: num_heads / layout.num_kv_heads,
    };
    let block_tables = meta.tables(window.is_some()).1;
    let mut units = Vec::new();
    // Each packed token's sequence (its block table), for the units.
    let mut tables = vec![0..0; q.len() / (num_heads * d)];
    for seq in &meta.seqs {
        let first_pos = seq.context_len - seq.query_len;
        for i in 0..seq.query_len {
            let (t, pos) = (seq.query_start + i, first_pos + i);
            tables[t] = seq.block_table.clone();
            let mut start = window.map_or(0, |win| (pos + 1).saturating_sub(win));
            while start <= pos {
                let end = ((start / PART + 1) * PART).min(pos + 1);
                units.push(Unit { t, start, end });
                start = end;
            }
        }
    }
    // Each unit's partial: every head's weighted sum, then their maxima, then their totals.
    let span = num_heads * (d + 2);
    let mut partials = vec![0.0f32; units.len() * span];
    let isa = crate::cpu::kernels::Isa::detect();
    Team::global().for_each_chunk(&mut partials, span, &|u, part| {
        let Unit { t, start, end } = units[u];
        let table = &block_tables[tables[t].clone()];
        let rows: Vec<usize> = (start..end)
            .map(|p| (table[p / bs] as usize * bs + p % bs) * w)
            .collect();
        let qt = &q[t * num_heads * d..][..num_heads * d];
        let n = rows.len();
        // scores[h * n + i]: query head h against position start + i.
        let mut scores = vec![0.0f32; num_heads * n];
        attend::scores(isa, heads, qt, &cache.k, &rows, scale, &mut scores);
        let (sums, stats) = part.split_at_mut(num_heads * d);
        for (h, row) in scores.chunks_exact_mut(n).enumerate() {
            let max = exp::max(row);
            // The row's exp(s − max) in place (vectorized), with their total.
            stats[num_heads + h] = exp::exp_weights(row, max, 1.0, 0.0) as f32;
            stats[h] = max;
        }
        attend::weighted_sum(isa, heads, &scores, &cache.v, &rows, sums);
    });
    let mut out = vec![0.0f32; q.len()];
    let mut first = 0;
    while first < units.len() {
        let t = units[first].t;
        let parts = units[first..].iter().take_while(|u| u.t == t).count();
        let partials = &partials[first * span..(first + parts) * span];
        for h in 0..num_heads {
            let sink = sinks.map(|s| s[h]);
            let max = partials
                .chunks_exact(span)
                .map(|p| p[num_heads * d + h])
                .fold(sink.unwrap_or(f32::NEG_INFINITY), f32::max);
            let o = &mut out[(t * num_heads + h) * d..][..d];
            let mut total = sink.map_or(0.0, |s| (s - max).exp());
            for p in partials.chunks_exact(span) {
                let f = (p[num_heads * d + h] - max).exp();
                total += p[num_heads * d + num_heads + h] * f;
                for (acc, x) in o.iter_mut().zip(&p[h * d..(h + 1) * d]) {
                    *acc += f * x;
                }
            }
            for acc in o.iter_mut() {
                *acc /= total;
            }
        }
        first += parts;
    }
    out
}

mod projected;
pub use projected::{Projected, Rows};

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_projected;
