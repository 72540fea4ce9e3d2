//! Which of a model's heads, intermediate columns and vocabulary rows a tensor-parallel rank
//! computes, and whether a model splits `size` ways at all (the arithmetic on counts is
//! `crate::parallel::TpRank`'s).

use std::ops::Range;

use super::ModelConfig;
use crate::parallel::{TP_SIZES, TpRank};

impl ModelConfig {
    /// Why this model cannot be split `size` ways, if it cannot. Under expert parallelism
    /// (`expert_parallel`) the experts are not sliced, so their width need not divide.
    pub fn check_tensor_parallel(&self, size: usize, expert_parallel: bool) -> Result<(), String> {
        if !TP_SIZES.contains(&size) {
            return Err(format!(
                "tensor_parallel_size {size} is not one of {TP_SIZES:?}"
            ));
        }
        if size == 1 {
            return Ok(());
        }
        if !self.arch.supports.tensor_parallel {
            let takes: Vec<&str> = super::registry::ARCHITECTURES
                .iter()
                .filter(|a| a.supports.tensor_parallel)
                .map(|a| a.name)
                .collect();
            return Err(format!(
                "tensor parallelism does not split {} models (it takes {})",
                self.arch.name,
                takes.join(", ")
            ));
        }
        let (nq, nkv) = (self.num_attention_heads, self.num_key_value_heads);
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
        if !self.intermediate_size.is_multiple_of(size) {
            return Err(format!(
                "tensor_parallel_size {size} must divide the MLP's intermediate size ({})",
                self.intermediate_size
            ));
        }
        if let Some(moe) = &self.moe
            && !expert_parallel
            && !moe.expert_intermediate.is_multiple_of(size)
        {
            return Err(format!(
                "tensor_parallel_size {size} must divide the experts' intermediate size ({})",
                moe.expert_intermediate
            ));
        }
        Ok(())
    }

    /// The query heads `tp` computes.
    pub fn q_heads(&self, tp: TpRank) -> Range<usize> {
        tp.part(self.num_attention_heads)
    }

    /// The key/value heads `tp` keeps: its share, or, with fewer KV heads than ranks, the one
    /// head its query heads read.
    pub fn kv_heads(&self, tp: TpRank) -> Range<usize> {
        tp.kv_part(self.num_key_value_heads)
    }

    /// The MLP's intermediate columns `tp` computes.
    pub fn intermediate(&self, tp: TpRank) -> Range<usize> {
        tp.part(self.intermediate_size)
    }

    /// The vocabulary rows of the LM head `tp` computes, or `None` when every rank keeps the
    /// whole head (one rank, or a vocabulary the ranks cannot split evenly).
    pub fn vocab_rows(&self, tp: TpRank) -> Option<Range<usize>> {
        (tp.size > 1 && self.vocab_size.is_multiple_of(tp.size)).then(|| tp.part(self.vocab_size))
    }
}

#[cfg(test)]
mod tests {
    use crate::model::ModelConfig;
    use crate::parallel::{TpRank, head_rows};

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
        let q: Vec<_> = ranks.iter().map(|&r| c.q_heads(r)).collect();
        assert_eq!(q, vec![0..8, 8..16, 16..24, 24..32]);
        let kv: Vec<_> = ranks.iter().map(|&r| c.kv_heads(r)).collect();
        assert_eq!(kv, vec![0..2, 2..4, 4..6, 6..8]);
        assert_eq!(c.intermediate(ranks[3]), 10752..14336);
        assert_eq!(c.vocab_rows(ranks[1]), Some(32064..64128));
        assert_eq!(head_rows(&c.q_heads(ranks[1]), 128), 1024..2048);
    }

    #[test]
    fn a_vocabulary_the_ranks_cannot_split_stays_whole() {
        let c = cfg(8, 2, 64, 100);
        assert_eq!(c.vocab_rows(TpRank { rank: 1, size: 8 }), None);
        assert_eq!(c.vocab_rows(TpRank::SINGLE), None);
    }

    /// Every (query heads, KV heads) pair of a GQA model up to 64 heads, at 4 and 8 ranks: where
    /// the check accepts it, the ranks' query heads and intermediate columns tile the model,
    /// every KV head is kept by some rank, each rank keeps exactly the KV heads its query heads
    /// read, and a replicated head sits on `size / kv_heads` ranks; where it refuses, the reason
    /// holds.
    #[test]
    fn four_and_eight_ranks_partition_every_gqa_shape_or_say_why_not() {
        for size in [4, 8] {
            for nq in 1..=64 {
                for nkv in (1..=nq).filter(|k| nq % k == 0) {
                    let c = cfg(nq, nkv, 96 * 8, 1000);
                    let Ok(()) = c.check_tensor_parallel(size, false) else {
                        assert!(nq % size != 0 || (nkv % size != 0 && size % nkv != 0));
                        continue;
                    };
                    let ranks: Vec<TpRank> = (0..size).map(|rank| TpRank { rank, size }).collect();
                    let q: Vec<usize> = ranks.iter().flat_map(|&r| c.q_heads(r)).collect();
                    assert_eq!(q, (0..nq).collect::<Vec<_>>(), "{nq}/{nkv} at {size}");
                    let inter: Vec<usize> = ranks.iter().flat_map(|&r| c.intermediate(r)).collect();
                    assert_eq!(inter, (0..96 * 8).collect::<Vec<_>>());
                    let group = nq / nkv;
                    let mut holders = vec![0; nkv];
                    for &r in &ranks {
                        let (qh, kv) = (c.q_heads(r), c.kv_heads(r));
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
        assert!(c.check_tensor_parallel(1, false).is_ok());
        assert!(c.check_tensor_parallel(2, false).is_ok());
        assert!(c.check_tensor_parallel(4, false).is_ok());
        let e = c.check_tensor_parallel(8, false).unwrap_err();
        assert!(
            e.contains("must divide the number of attention heads (12)"),
            "{e}"
        );
        let e = c.check_tensor_parallel(3, false).unwrap_err();
        assert!(e.contains("not one of [1, 2, 4, 8]"), "{e}");
        let c = cfg(8, 3, 96, 100);
        let e = c.check_tensor_parallel(2, false).unwrap_err();
        assert!(e.contains("key/value heads (3)"), "{e}");
        let c = cfg(8, 8, 100, 100);
        let e = c.check_tensor_parallel(8, false).unwrap_err();
        assert!(e.contains("intermediate size (100)"), "{e}");
    }
}
