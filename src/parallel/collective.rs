//! The two collectives a sharded model needs, behind one trait: NCCL on GPUs
//! (`super::nccl`, feature `nccl`) and an in-process group of threads on the CPU
//! ([`LocalGroup`], the reference the tests check the sharded model against).

use std::sync::{Arc, Barrier, Mutex};

use candle_core::Tensor;

use super::shard::{ExpertShard, TpRank};

/// Collective operations over the ranks of a tensor-parallel group. Every rank calls the same
/// operations in the same order (each rank runs the same forward pass on its shard).
pub trait Collective: Send + Sync {
    /// The sum of `x` over the ranks, on every rank.
    fn all_reduce(&self, x: &Tensor) -> candle_core::Result<Tensor>;

    /// Every rank's `x` stacked along a new leading dimension (`[size, ..x's shape]`), in rank
    /// order, on every rank.
    fn all_gather(&self, x: &Tensor) -> candle_core::Result<Tensor>;
}

/// What a model layer needs to know about tensor parallelism: its rank, and the group's
/// collectives (none with one rank, where every operation is the identity).
#[derive(Clone)]
pub struct Parallel {
    /// This process's rank.
    pub rank: TpRank,
    comm: Option<Arc<dyn Collective>>,
    /// Whether a mixture's experts are split whole over the ranks (expert parallelism) rather
    /// than each sliced across all of them.
    expert_parallel: bool,
}

impl Parallel {
    /// One rank: the whole model, no collectives.
    pub fn single() -> Self {
        Parallel {
            rank: TpRank::SINGLE,
            comm: None,
            expert_parallel: false,
        }
    }

    /// Rank `rank` of a group whose collectives are `comm`.
    pub fn new(rank: TpRank, comm: Arc<dyn Collective>) -> Self {
        Parallel {
            rank,
            comm: (!rank.is_single()).then_some(comm),
            expert_parallel: false,
        }
    }

    /// This rank with a mixture's experts held whole (`true`: vLLM's
    /// `--enable-expert-parallel`) or sliced (`false`, the default). The attention and dense
    /// layers are split alike either way; an expert layer's output is this rank's part of the
    /// sum in both, so the same all-reduce joins them.
    pub fn with_expert_parallel(mut self, on: bool) -> Self {
        self.expert_parallel = on;
        self
    }

    /// How this rank holds a mixture's experts.
    pub fn experts(&self) -> ExpertShard {
        match self.expert_parallel {
            true => ExpertShard::Whole(self.rank),
            false => ExpertShard::Sliced(self.rank),
        }
    }

    /// The sum over the ranks of the partial results of a row-parallel layer.
    pub fn all_reduce(&self, x: Tensor) -> candle_core::Result<Tensor> {
        match &self.comm {
            Some(c) => c.all_reduce(&x),
            None => Ok(x),
        }
    }

    /// The full `[rows, size * cols]` from each rank's `[rows, cols]` columns (the logits of a
    /// vocabulary-parallel LM head).
    pub fn gather_columns(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let Some(c) = &self.comm else {
            return Ok(x.clone());
        };
        let (rows, cols) = x.dims2()?;
        let parts = c.all_gather(&x.contiguous()?)?;
        if rows == 1 {
            return parts.reshape((1, self.rank.size * cols));
        }
        parts
            .transpose(0, 1)?
            .contiguous()?
            .reshape((rows, self.rank.size * cols))
    }
}

/// A tensor-parallel group of threads in one process, for CPU tests of sharded models: rank `r`'s
/// model runs on its own thread with [`LocalGroup::member`]`(r)` as its collectives. Sums are
/// taken in rank order on every rank, so every rank gets the same bits. The ranks may also share
/// one GPU, each on its own stream: a rank's tensor is finished before the others read it, and
/// what a rank computed from the others' is finished before it lets them go on.
pub struct LocalGroup {
    size: usize,
    slots: Mutex<Vec<Option<Tensor>>>,
    barrier: Barrier,
}

impl LocalGroup {
    /// A group of `size` ranks.
    pub fn new(size: usize) -> Arc<Self> {
        Arc::new(LocalGroup {
            size,
            slots: Mutex::new(vec![None; size]),
            barrier: Barrier::new(size),
        })
    }

    /// Rank `rank`'s handle.
    pub fn member(self: &Arc<Self>, rank: usize) -> Arc<dyn Collective> {
        Arc::new(LocalMember {
            group: Arc::clone(self),
            rank,
        })
    }

    /// Every rank's `x`, in rank order, once every rank has put its own.
    fn exchange(&self, rank: usize, x: &Tensor) -> candle_core::Result<Vec<Tensor>> {
        x.device().synchronize()?;
        self.lock()?[rank] = Some(x.clone());
        self.barrier.wait();
        let all: Option<Vec<Tensor>> = self.lock()?.iter().cloned().collect();
        // Nobody overwrites a slot before everyone has read them all.
        self.barrier.wait();
        all.ok_or_else(|| candle_core::Error::Msg("a rank left the local group".into()))
    }

    fn lock(&self) -> candle_core::Result<std::sync::MutexGuard<'_, Vec<Option<Tensor>>>> {
        self.slots
            .lock()
            .map_err(|_| candle_core::Error::Msg("a rank of the local group panicked".into()))
    }
}

struct LocalMember {
    group: Arc<LocalGroup>,
    rank: usize,
}

impl Collective for LocalMember {
    fn all_reduce(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let all = self.group.exchange(self.rank, x)?;
        let mut sum = all[0].clone();
        for t in &all[1..] {
            sum = (sum + t)?;
        }
        sum.device().synchronize()?;
        Ok(sum)
    }

    fn all_gather(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let all = self.group.exchange(self.rank, x)?;
        debug_assert_eq!(all.len(), self.group.size);
        let stacked = Tensor::stack(&all, 0)?;
        stacked.device().synchronize()?;
        Ok(stacked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn local_group_sums_and_gathers_in_rank_order() {
        let group = LocalGroup::new(3);
        let results: Vec<(Vec<f32>, Vec<Vec<f32>>)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..3)
                .map(|rank| {
                    let par = Parallel::new(TpRank { rank, size: 3 }, group.member(rank));
                    s.spawn(move || {
                        let x = Tensor::new(&[[rank as f32, 10.0 * rank as f32]], &Device::Cpu)
                            .unwrap();
                        let sum = par.all_reduce(x.clone()).unwrap();
                        let both = Tensor::cat(&[&x, &(&x + 1.0).unwrap()], 0).unwrap();
                        let cols = par.gather_columns(&both).unwrap();
                        (
                            sum.flatten_all().unwrap().to_vec1().unwrap(),
                            cols.to_vec2().unwrap(),
                        )
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (sum, cols) in &results {
            assert_eq!(sum, &vec![3.0, 30.0]);
            assert_eq!(cols[0], vec![0.0, 0.0, 1.0, 10.0, 2.0, 20.0]);
            assert_eq!(cols[1], vec![1.0, 1.0, 2.0, 11.0, 3.0, 21.0]);
        }
    }

    #[test]
    fn one_rank_needs_no_collectives() {
        let par = Parallel::single();
        let x = Tensor::new(&[[1f32, 2.0]], &Device::Cpu).unwrap();
        let y = par.all_reduce(x.clone()).unwrap();
        assert_eq!(y.to_vec2::<f32>().unwrap(), x.to_vec2::<f32>().unwrap());
        let g = par.gather_columns(&x).unwrap();
        assert_eq!(g.dims(), &[1, 2]);
    }
}
