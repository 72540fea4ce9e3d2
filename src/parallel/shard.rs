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

/// How a mixture of experts' layers are split over a group's ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertShard {
    /// Tensor parallelism: every rank holds its slice of every expert's intermediate features
    /// (gate and up rows, down columns), as a dense MLP is split.
    Sliced(TpRank),
    /// Expert parallelism (`--enable-expert-parallel`): every rank holds whole experts, a
    /// contiguous run of them ([`ExpertShard::experts`]).
    Whole(TpRank),
}

impl ExpertShard {
    /// The experts of `n` this rank holds: all of them when sliced; otherwise its run, the
    /// first `n % size` ranks taking one more than the others (vLLM's split).
    pub fn experts(&self, n: usize) -> Range<usize> {
        match *self {
            ExpertShard::Sliced(_) => 0..n,
            ExpertShard::Whole(r) => {
                let (each, extra) = (n / r.size, n % r.size);
                let start = r.rank * each + r.rank.min(extra);
                start..start + each + usize::from(r.rank < extra)
            }
        }
    }

    /// The intermediate features of each held expert (`inter` wide) this rank computes.
    pub fn columns(&self, inter: usize) -> Range<usize> {
        match *self {
            ExpertShard::Sliced(r) => r.part(inter),
            ExpertShard::Whole(_) => 0..inter,
        }
    }

    /// Whether this rank adds its experts' down biases: the leading rank when every rank
    /// computes a slice of each expert (the ranks' parts are then summed), every rank for its
    /// own whole experts.
    pub fn adds_down_bias(&self) -> bool {
        match *self {
            ExpertShard::Sliced(r) => r.leads(),
            ExpertShard::Whole(_) => true,
        }
    }

    /// Whether this rank holds every expert whole (one rank).
    pub fn is_whole_model(&self) -> bool {
        match *self {
            ExpertShard::Sliced(r) | ExpertShard::Whole(r) => r.is_single(),
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

    #[test]
    fn expert_parallel_ranks_hold_whole_runs_of_experts_that_cover_the_layer() {
        for size in [2, 4, 8] {
            for n in [size, 8, 10, 60, 128] {
                let runs: Vec<_> = (0..size)
                    .map(|rank| ExpertShard::Whole(TpRank { rank, size }).experts(n))
                    .collect();
                let all: Vec<usize> = runs.iter().cloned().flatten().collect();
                assert_eq!(all, (0..n).collect::<Vec<_>>(), "{n} experts over {size}");
                let lens: Vec<usize> = runs.iter().map(|r| r.len()).collect();
                assert!(lens.iter().max().unwrap() - lens.iter().min().unwrap() <= 1);
            }
        }
        let r = TpRank { rank: 1, size: 4 };
        assert_eq!(ExpertShard::Whole(r).experts(10), 3..6);
        assert_eq!(ExpertShard::Whole(r).columns(64), 0..64);
        assert_eq!(ExpertShard::Sliced(r).experts(10), 0..10);
        assert_eq!(ExpertShard::Sliced(r).columns(64), 16..32);
        assert!(ExpertShard::Whole(r).adds_down_bias() && !ExpertShard::Sliced(r).adds_down_bias());
    }
}
