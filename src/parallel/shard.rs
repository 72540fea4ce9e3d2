//! Sharding arithmetic: a tensor-parallel rank's share of a count of heads, columns or rows
//! (Megatron-style: q/k/v and gate/up split by output rows, o and down by input columns). Which
//! counts of a model they are is the model's (`crate::model::sharding`).

use std::ops::Range;

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

    /// This rank's share of `n` items split evenly (`n` divisible by `size`): its query heads,
    /// intermediate columns, vocabulary rows.
    pub fn part(&self, n: usize) -> Range<usize> {
        let each = n / self.size;
        self.rank * each..(self.rank + 1) * each
    }

    /// The key/value heads of `nkv` this rank keeps: its share, or, with fewer KV heads than
    /// ranks, the one head its query heads read (replicated on `size / nkv` ranks).
    pub fn kv_part(&self, nkv: usize) -> Range<usize> {
        if nkv >= self.size {
            self.part(nkv)
        } else {
            let head = self.rank * nkv / self.size;
            head..head + 1
        }
    }
}

/// `heads` scaled to rows of a projection with `head_dim`-wide heads.
pub fn head_rows(heads: &Range<usize>, head_dim: usize) -> Range<usize> {
    heads.start * head_dim..heads.end * head_dim
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fewer_kv_heads_than_ranks_are_replicated_under_their_query_heads() {
        let kv: Vec<_> = (0..8)
            .map(|rank| TpRank { rank, size: 8 }.kv_part(2))
            .collect();
        assert_eq!(kv, vec![0..1, 0..1, 0..1, 0..1, 1..2, 1..2, 1..2, 1..2]);
        // Each rank's query head reads the KV head it keeps (GQA group = 4 query heads).
        for rank in 0..8 {
            let r = TpRank { rank, size: 8 };
            assert_eq!(r.part(8).start / 4, r.kv_part(2).start);
        }
        assert_eq!(
            head_rows(&TpRank { rank: 1, size: 4 }.part(32), 128),
            1024..2048
        );
    }
}
