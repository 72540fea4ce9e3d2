//! Tensor parallelism: one model split across GPUs (Megatron-style), one process per GPU.
//! - [`shard`]: which heads, features, vocabulary rows and experts a rank owns (experts sliced,
//!   or whole under expert parallelism).
//! - [`collective`]: the all-reduce and all-gather a sharded forward pass needs (NCCL on GPUs).
//! - [`config`]: the group's layout over nodes and its rendezvous address (vLLM's flags).
//! - [`rendezvous`]: how the ranks meet over TCP, agree on settings and share the NCCL id.
//! - [`wire`]: the frames between rank 0 and the others, step plans among them.
//! - [`group`]: a process's side of the group at run time (rank 0 starts its node's other ranks,
//!   sends the plans and watches the links).
//!
//! Rank 0 runs the scheduler and the server; every rank runs the same forward pass on its shard
//! (the other ranks' loop is the engine's, `engine::worker`). Nothing here imports the engine:
//! the settings the ranks compare come from it as plain data.

pub mod collective;
pub mod config;
pub mod group;
#[cfg(feature = "nccl")]
pub mod nccl;
#[cfg(feature = "nccl")]
pub mod oneshot;
pub mod rendezvous;
pub mod shard;
pub mod wire;

pub use collective::{Collective, LocalGroup, Parallel};
pub use config::ParallelConfig;
pub use shard::{ExpertShard, TP_SIZES, TpRank, head_rows};
