//! A rank's collectives on one node (feature `nccl`): all-reduces of up to [`ONE_SHOT_BYTES`]
//! take one kernel over NVLink peer memory (`pagewise_kernels::allreduce`; a decode step's
//! all-reduces are a few KiB, where NCCL's ~19 µs in a graph is mostly synchronisation), the
//! rest and every all-gather go through NCCL.

use candle_core::{DType, Tensor};
use pagewise_kernels::allreduce::{Region, all_reduce_oneshot, alloc_region, open_region};

use super::collective::Collective;
use super::nccl::NcclComm;
use super::shard::TpRank;

/// Largest all-reduce the one-shot kernel takes (a decode step of 64 sequences at hidden 4096).
pub const ONE_SHOT_BYTES: usize = 512 << 10;

/// Every rank's region, opened in this process.
pub struct OneShot {
    regions: Vec<u64>,
    rank: usize,
}

impl OneShot {
    /// This rank's region, or why there is none.
    pub fn prepare() -> Result<Region, String> {
        alloc_region(ONE_SHOT_BYTES).map_err(|e| e.to_string())
    }

    /// Opens the other ranks' regions from `handles` (rank order; this rank's own is `mine`).
    pub fn open(mine: Region, handles: &[Vec<u8>], rank: TpRank) -> Result<Self, String> {
        let regions = handles
            .iter()
            .enumerate()
            .map(|(r, h)| {
                if r == rank.rank {
                    return Ok(mine.ptr);
                }
                let h: [u8; 64] = h.as_slice().try_into().map_err(|_| "a bad handle")?;
                if h == [0u8; 64] {
                    return Err(format!("rank {r} has no region"));
                }
                open_region(&h).map_err(|e| e.to_string())
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(OneShot {
            regions,
            rank: rank.rank,
        })
    }
}

/// NCCL plus, when every rank could open the others' regions, the one-shot all-reduce.
pub struct NodeCollectives {
    nccl: NcclComm,
    oneshot: Option<OneShot>,
}

impl NodeCollectives {
    /// The collectives over `nccl`, with `oneshot` for small all-reduces.
    pub fn new(nccl: NcclComm, oneshot: Option<OneShot>) -> Self {
        if oneshot.is_some() {
            tracing::info!(
                max_bytes = ONE_SHOT_BYTES,
                "small all-reduces take the one-shot kernel over peer memory"
            );
        }
        NodeCollectives { nccl, oneshot }
    }
}

impl Collective for NodeCollectives {
    fn all_reduce(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        if let Some(o) = &self.oneshot {
            let bytes = x.elem_count() * x.dtype().size_in_bytes();
            let kind = matches!(x.dtype(), DType::BF16 | DType::F16 | DType::F32);
            if kind && bytes <= ONE_SHOT_BYTES && x.is_contiguous() {
                // SAFETY: the regions were made by alloc_region with ONE_SHOT_BYTES on every rank
                // and opened in rank order; every rank runs the same forward pass, so the same
                // calls in the same order (the sizes decide the path identically everywhere).
                return unsafe { all_reduce_oneshot(x, &o.regions, o.rank, ONE_SHOT_BYTES) };
            }
        }
        self.nccl.all_reduce(x)
    }

    fn all_gather(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.nccl.all_gather(x)
    }
}
