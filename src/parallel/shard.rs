//! Sharding arithmetic: which heads, intermediate columns and vocabulary rows a tensor-parallel
//! rank owns (Megatron-style: q/k/v and gate/up split by output rows, o and down by input columns).

use std::ops::Range;

use crate::model::ModelConfig;
use crate::model::config::MoeSettings;

/// Tensor-parallel sizes pagewise takes (vLLM's usual ones: a power of two up to one host's GPUs).
pub const TP_SIZES: [usize; 4] = [1, 2, 4, 8];

/// A process's place in a tensor-parallel group: rank `rank` of `size`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TpRank {
    /// This rank, `0..size`; rank 0 runs the scheduler and samples.
    pub rank: usize,
    /// Ranks in the group.
    pub size: usize,
}

impl TpRank {
    /// The whole model on one device.
    pub const SINGLE: TpRank = TpRank { rank: 0, size: 1 };

    /// Whether this is the only rank.
    pub fn is_single(&self) -> bool {
        self.size == 1
    }

    /// Whether this rank leads: it adds the residual and the biases of row-parallel layers
    /// (once, before the all-reduce sums the ranks' parts) and samples.
    pub fn leads(&self) -> bool {
        self.rank == 0
    }

    /// Why `cfg` cannot be split `size` ways, if it cannot.
    pub fn check(size: usize, cfg: &ModelConfig) -> Result<(), String> {
        if !TP_SIZES.contains(&size) {
            return Err(format!(
                "tensor_parallel_size {size} is not one of {TP_SIZES:?}"
            ));
        }
        if size == 1 {
            return Ok(());
        }
        if !cfg.arch.supports.tensor_parallel {
            let takes: Vec<&str> = crate::model::registry::ARCHITECTURES
                .iter()
                .filter(|a| a.supports.tensor_parallel)
                .map(|a| a.name)
                .collect();
            return Err(format!(
                "tensor parallelism does not split {} models (it takes {})",
                cfg.arch.name,
                takes.join(", ")
            ));
        }
        let (nq, nkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
        if !nq.is_multiple_of(size) {
            return Err(format!(
                "tensor_parallel_size {size} must divide the number of attention heads ({nq})"
            ));
        }
        if !nkv.is_multiple_of(size) && !size.is_multiple_of(nkv) {
            return Err(format!(
                "tensor_parallel_size {size} and the number of key/value heads ({nkv}) must \
                 divide one another"
            ));
        }
        if !cfg.intermediate_size.is_multiple_of(size) {
            return Err(format!(
                "tensor_parallel_size {size} must divide the MLP's intermediate size ({})",
                cfg.intermediate_size
            ));
        }
        if let Some(moe) = &cfg.moe
            && !moe.expert_intermediate.is_multiple_of(size)
        {
            return Err(format!(
                "tensor_parallel_size {size} must divide the experts' intermediate size ({})",
                moe.expert_intermediate
            ));
        }
        Ok(())
    }

    /// This rank's share of `n` items split evenly (`n` divisible by `size`).
    fn part(&self, n: usize) -> Range<usize> {
        let each = n / self.size;
        self.rank * each..(self.rank + 1) * each
    }

    /// The query heads this rank computes.
    pub fn q_heads(&self, cfg: &ModelConfig) -> Range<usize> {
        self.part(cfg.num_attention_heads)
    }

    /// The key/value heads this rank keeps: its share, or, with fewer KV heads than ranks, the
    /// one head its query heads read (replicated on `size / kv_heads` ranks).
    pub fn kv_heads(&self, cfg: &ModelConfig) -> Range<usize> {
        let nkv = cfg.num_key_value_heads;
        if nkv >= self.size {
            self.part(nkv)
        } else {
            let head = self.rank * nkv / self.size;
            head..head + 1
        }
    }

    /// The MLP's intermediate columns this rank computes.
    pub fn intermediate(&self, cfg: &ModelConfig) -> Range<usize> {
        self.part(cfg.intermediate_size)
    }

    /// Each expert's intermediate columns this rank computes (a mixture's experts are sharded
    /// as a dense MLP is: every rank holds its slice of every expert).
    pub fn expert_intermediate(&self, moe: &MoeSettings) -> Range<usize> {
        self.part(moe.expert_intermediate)
    }

    /// The vocabulary rows of the LM head this rank computes, or `None` when every rank keeps
    /// the whole head (one rank, or a vocabulary the ranks cannot split evenly).
    pub fn vocab(&self, cfg: &ModelConfig) -> Option<Range<usize>> {
        (self.size > 1 && cfg.vocab_size.is_multiple_of(self.size))
            .then(|| self.part(cfg.vocab_size))
    }
}

/// `heads` scaled to rows of a projection with `head_dim`-wide heads.
pub fn head_rows(heads: &Range<usize>, head_dim: usize) -> Range<usize> {
    heads.start * head_dim..heads.end * head_dim
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(nq: usize, nkv: usize, inter: usize, vocab: usize) -> ModelConfig {
        let json = serde_json::json!({
            "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": inter,
            "num_attention_heads": nq, "num_key_value_heads": nkv, "num_hidden_layers": 1,
            "vocab_size": vocab, "max_position_embeddings": 64, "rms_norm_eps": 1e-6
        });
        ModelConfig::from_hf_json(&json.to_string()).unwrap()
    }

    #[test]
    fn heads_split_evenly_and_cover_the_model() {
        let c = cfg(32, 8, 14336, 128256);
        let ranks: Vec<TpRank> = (0..4).map(|rank| TpRank { rank, size: 4 }).collect();
        let q: Vec<_> = ranks.iter().map(|r| r.q_heads(&c)).collect();
        assert_eq!(q, vec![0..8, 8..16, 16..24, 24..32]);
        let kv: Vec<_> = ranks.iter().map(|r| r.kv_heads(&c)).collect();
        assert_eq!(kv, vec![0..2, 2..4, 4..6, 6..8]);
        assert_eq!(ranks[3].intermediate(&c), 10752..14336);
        assert_eq!(ranks[1].vocab(&c), Some(32064..64128));
        assert_eq!(head_rows(&ranks[1].q_heads(&c), 128), 1024..2048);
    }

    #[test]
    fn fewer_kv_heads_than_ranks_are_replicated_under_their_query_heads() {
        let c = cfg(8, 2, 64, 100);
        let kv: Vec<_> = (0..8)
            .map(|rank| TpRank { rank, size: 8 }.kv_heads(&c))
            .collect();
        assert_eq!(kv, vec![0..1, 0..1, 0..1, 0..1, 1..2, 1..2, 1..2, 1..2]);
        // Each rank's query head reads the KV head it keeps (GQA group = 4 query heads).
        for rank in 0..8 {
            let r = TpRank { rank, size: 8 };
            assert_eq!(r.q_heads(&c).start / 4, r.kv_heads(&c).start);
        }
        // 100 does not split 8 ways: every rank keeps the whole LM head.
        assert_eq!(TpRank { rank: 1, size: 8 }.vocab(&c), None);
        assert_eq!(TpRank::SINGLE.vocab(&c), None);
    }

    /// Every (query heads, KV heads) pair of a GQA model up to 64 heads, at 4 and 8 ranks: where
    /// `check` accepts it, the ranks' query heads and intermediate columns tile the model, every
    /// KV head is kept by some rank, each rank keeps exactly the KV heads its query heads read,
    /// and a replicated head sits on `size / kv_heads` ranks; where it refuses, the reason holds.
    #[test]
    fn four_and_eight_ranks_partition_every_gqa_shape_or_say_why_not() {
        for size in [4, 8] {
            for nq in 1..=64 {
                for nkv in (1..=nq).filter(|k| nq % k == 0) {
                    let c = cfg(nq, nkv, 96 * 8, 1000);
                    let Ok(()) = TpRank::check(size, &c) else {
                        assert!(nq % size != 0 || (nkv % size != 0 && size % nkv != 0));
                        continue;
                    };
                    let ranks: Vec<TpRank> = (0..size).map(|rank| TpRank { rank, size }).collect();
                    let q: Vec<usize> = ranks.iter().flat_map(|r| r.q_heads(&c)).collect();
                    assert_eq!(q, (0..nq).collect::<Vec<_>>(), "{nq}/{nkv} at {size}");
                    let inter: Vec<usize> = ranks.iter().flat_map(|r| r.intermediate(&c)).collect();
                    assert_eq!(inter, (0..96 * 8).collect::<Vec<_>>());
                    let group = nq / nkv;
                    let mut holders = vec![0; nkv];
                    for r in &ranks {
                        let (qh, kv) = (r.q_heads(&c), r.kv_heads(&c));
                        let read = qh.start / group..(qh.end - 1) / group + 1;
                        assert_eq!(kv, read, "{nq}/{nkv} at {size}, rank {}", r.rank);
                        kv.for_each(|h| holders[h] += 1);
                    }
                    let copies = if nkv >= size { 1 } else { size / nkv };
                    assert!(holders.iter().all(|&n| n == copies), "{nq}/{nkv} at {size}");
                }
            }
        }
    }

    #[test]
    fn sizes_that_do_not_divide_the_model_are_refused() {
        let c = cfg(12, 4, 96, 100);
        assert!(TpRank::check(1, &c).is_ok());
        assert!(TpRank::check(2, &c).is_ok());
        assert!(TpRank::check(4, &c).is_ok());
        let e = TpRank::check(8, &c).unwrap_err();
        assert!(
            e.contains("must divide the number of attention heads (12)"),
            "{e}"
        );
        let e = TpRank::check(3, &c).unwrap_err();
        assert!(e.contains("not one of [1, 2, 4, 8]"), "{e}");
        let c = cfg(8, 3, 96, 100);
        let e = TpRank::check(2, &c).unwrap_err();
        assert!(e.contains("key/value heads (3)"), "{e}");
        let c = cfg(8, 8, 100, 100);
        let e = TpRank::check(8, &c).unwrap_err();
        assert!(e.contains("intermediate size (100)"), "{e}");
    }
}
