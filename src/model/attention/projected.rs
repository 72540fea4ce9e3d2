//! Attention on the CPU straight from the fused q/k/v projection's output, over plain buffers: each
//! token's q heads (normalized, where the model has per-head norms, and) turned into the query
//! buffer, its k heads likewise into its cache slot and its v heads copied there, then
//! [`attend_cpu`]. The same values as rotating q and k as tensors and calling
//! [`KvCache::attend_with_sinks`], without the tensors, copies and allocations between (on a small
//! model they were a tenth of a decode step, run by one thread while the team's others waited).

use super::{KvCache, Shape, Store, attend_cpu};
use crate::model::batch::AttentionMeta;
use crate::model::norm::HostNorm;
use crate::model::rotary::HostRotary;

/// One projection's rows in a buffer: row `t` starts at `data[t * stride + offset]` (q, k and v
/// side by side in the fused projection's rows, or each in a buffer of its own).
#[derive(Clone, Copy)]
pub struct Rows<'a> {
    pub data: &'a [f32],
    pub stride: usize,
    pub offset: usize,
}

impl<'a> Rows<'a> {
    /// Rows `width` wide of their own buffer.
    pub fn packed(data: &'a [f32], width: usize) -> Rows<'a> {
        Rows {
            data,
            stride: width,
            offset: 0,
        }
    }

    /// Rows `width` wide in each of `n` rows: whether the buffer holds them.
    fn hold(&self, n: usize, width: usize) -> bool {
        n == 0
            || self.offset + width <= self.stride
                && (n - 1) * self.stride + self.offset + width <= self.data.len()
    }

    fn row(&self, t: usize, width: usize) -> &'a [f32] {
        &self.data[t * self.stride + self.offset..][..width]
    }
}

/// What [`KvCache::attend_projected_host`] computes beyond the cache's layout.
pub struct Projected<'a> {
    /// Query heads (the projection's rows hold `heads` q heads, then the k and v heads).
    pub heads: usize,
    /// KV heads and the width of a head, as the model has them (checked against the cache's).
    pub kv_heads: usize,
    pub head_dim: usize,
    /// The rotary tables of the step's positions.
    pub rotary: HostRotary<'a>,
    /// The softmax's scale.
    pub scale: f32,
    /// The sliding window, in a sliding-window layer.
    pub window: Option<usize>,
    /// Each query head's sink logit (gpt-oss).
    pub sinks: Option<&'a [f32]>,
    /// The per-head norms of q and k (Qwen3, Gemma 3), applied before the rotary turn.
    pub norms: Option<[HostNorm<'a>; 2]>,
}

impl KvCache {
    /// On the CPU: attention of layer `layer` for `n` tokens from their projections `q` (`heads`
    /// heads a row), `k` and `v` (the cache's KV heads a row), `[n, heads · head_dim]`. `None`
    /// when the cache is not in host memory.
    pub fn attend_projected_host(
        &mut self,
        layer: usize,
        n: usize,
        [q, k, v]: [Rows<'_>; 3],
        meta: &AttentionMeta<'_>,
        p: Projected<'_>,
    ) -> candle_core::Result<Option<Vec<f32>>> {
        let layout = self.layout;
        #[allow(irrefutable_let_patterns)] // a second variant exists with `cuda`
        let Store::Host(layers) = &mut self.store else {
            return Ok(None);
        };
        let (d, w) = (layout.head_dim, layout.slot_width());
        let qw = p.heads * d;
        if (p.kv_heads, p.head_dim) != (layout.num_kv_heads, d)
            || !p.heads.is_multiple_of(layout.num_kv_heads)
            || !(q.hold(n, qw) && k.hold(n, w) && v.hold(n, w))
            || p.norms
                .is_some_and(|norms| norms.iter().any(|norm| norm.scale.len() != d))
        {
            candle_core::bail!(
                "paged attention: {n} tokens' projections of {} q and 2 x {} kv heads of {} (or \
                 their norms) do not match the cache layout {layout:?}",
                p.heads,
                p.kv_heads,
                p.head_dim
            );
        }
        let slots = meta.tables(p.window.is_some()).0;
        if slots.len() != n {
            candle_core::bail!("paged attention: {} slots for {n} tokens", slots.len());
        }
        let cache = &mut layers[layer];
        let num_slots = cache.k.len() / w;
        let mut queries = vec![0.0f32; n * qw];
        for (t, (q_t, &slot)) in queries.chunks_exact_mut(qw).zip(slots).enumerate() {
            let slot = slot as usize;
            if slot >= num_slots {
                candle_core::bail!("slot {slot} outside the cache ({num_slots} slots)");
            }
            q_t.copy_from_slice(q.row(t, qw));
            let k_t = &mut cache.k[slot * w..][..w];
            k_t.copy_from_slice(k.row(t, w));
            if let Some([q_norm, k_norm]) = p.norms {
                q_t.chunks_exact_mut(d).for_each(|head| q_norm.apply(head));
                k_t.chunks_exact_mut(d).for_each(|head| k_norm.apply(head));
            }
            for head in q_t.chunks_exact_mut(d).chain(k_t.chunks_exact_mut(d)) {
                p.rotary.turn(t, head);
            }
            cache.v[slot * w..][..w].copy_from_slice(v.row(t, w));
        }
        let shape = Shape {
            heads: p.heads,
            scale: p.scale,
            window: p.window,
            sinks: p.sinks,
        };
        Ok(Some(attend_cpu(&queries, cache, meta, layout, shape)))
    }
}
