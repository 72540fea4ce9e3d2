//! Tensor parallelism: one model split across GPUs (Megatron-style), one process per GPU.
//! - [`shard`]: which heads, features and vocabulary rows a rank owns.
//! - [`collective`]: the all-reduce and all-gather a sharded forward pass needs (NCCL on GPUs).
//!
//! Rank 0 runs the scheduler and the server; every rank runs the same forward pass on its shard.

pub mod collective;
pub mod shard;

pub use collective::{Collective, LocalGroup, Parallel};
pub use shard::{TP_SIZES, TpRank, head_rows};
