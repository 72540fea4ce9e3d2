//! Where this process sits in a tensor-parallel group, and how the group meets (vLLM's flags:
//! `--tensor-parallel-size`, `--nnodes`, `--node-rank`, `--master-addr`, `--master-port`,
//! `--enable-expert-parallel`).

use std::ffi::OsString;
use std::time::Duration;

use super::shard::{TP_SIZES, TpRank};

/// Default time the ranks have to meet at the rendezvous.
pub const DEFAULT_JOIN_TIMEOUT: Duration = Duration::from_secs(300);

/// A tensor-parallel group's layout and rendezvous. One process per GPU: each node runs
/// `tensor_parallel_size / nnodes` ranks, the first started by the user (`pagewise serve ...
/// --node-rank N`), the others started by it.
#[derive(Clone, Debug)]
pub struct ParallelConfig {
    /// Ranks in the group (GPUs the model is split across).
    pub tensor_parallel_size: usize,
    /// Hosts the group spans.
    pub nnodes: usize,
    /// This host's index; node 0 runs rank 0 (the scheduler and the server).
    pub node_rank: usize,
    /// Where rank 0 listens for the other ranks.
    pub master_addr: String,
    /// Rank 0's rendezvous port; `None` picks a free one (one node only).
    pub master_port: Option<u16>,
    /// How long the ranks have to meet before startup fails.
    pub join_timeout: Duration,
    /// This process's rank among its node's ranks (0 for the process the user started).
    pub local_rank: usize,
    /// All-reduces through NCCL only, never the one-shot kernel over peer memory.
    pub disable_custom_all_reduce: bool,
    /// A mixture's experts held whole, a run of them a rank (expert parallelism), rather than
    /// sliced across every rank.
    pub enable_expert_parallel: bool,
    /// The command that starts this node's other ranks (`--tp-local-rank K` is appended);
    /// `None` runs this process's own command line again.
    pub worker_command: Option<Vec<OsString>>,
}

impl Default for ParallelConfig {
    fn default() -> Self {
        ParallelConfig {
            tensor_parallel_size: 1,
            nnodes: 1,
            node_rank: 0,
            master_addr: "127.0.0.1".into(),
            master_port: None,
            join_timeout: DEFAULT_JOIN_TIMEOUT,
            local_rank: 0,
            disable_custom_all_reduce: false,
            enable_expert_parallel: false,
            worker_command: None,
        }
    }
}

impl ParallelConfig {
    /// Ranks per node.
    pub fn local_size(&self) -> usize {
        self.tensor_parallel_size / self.nnodes.max(1)
    }

    /// This process's rank in the group.
    pub fn rank(&self) -> TpRank {
        TpRank {
            rank: self.node_rank * self.local_size() + self.local_rank,
            size: self.tensor_parallel_size,
        }
    }

    /// Whether the model is split at all.
    pub fn is_parallel(&self) -> bool {
        self.tensor_parallel_size > 1
    }

    /// Why the layout is impossible, if it is.
    pub fn check(&self) -> Result<(), String> {
        let (size, nnodes) = (self.tensor_parallel_size, self.nnodes);
        if !TP_SIZES.contains(&size) {
            return Err(format!(
                "--tensor-parallel-size {size} is not one of {TP_SIZES:?}"
            ));
        }
        if nnodes == 0 || !size.is_multiple_of(nnodes) {
            return Err(format!(
                "--nnodes {nnodes} must divide --tensor-parallel-size {size} (one process per \
                 GPU, the same number of GPUs on every node)"
            ));
        }
        if self.node_rank >= nnodes {
            return Err(format!(
                "--node-rank {} must be below --nnodes {nnodes}",
                self.node_rank
            ));
        }
        if self.local_rank >= self.local_size() {
            return Err(format!(
                "local rank {} must be below the {} ranks of a node",
                self.local_rank,
                self.local_size()
            ));
        }
        if nnodes > 1 && self.master_port.is_none() {
            return Err("--master-port is required with more than one node".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_are_numbered_node_by_node() {
        let cfg = |node_rank, local_rank| ParallelConfig {
            tensor_parallel_size: 8,
            nnodes: 2,
            node_rank,
            local_rank,
            master_port: Some(29500),
            ..Default::default()
        };
        assert_eq!(cfg(0, 0).rank(), TpRank { rank: 0, size: 8 });
        assert_eq!(cfg(1, 2).rank(), TpRank { rank: 6, size: 8 });
        assert!(cfg(1, 3).check().is_ok());
        assert!(cfg(1, 4).check().unwrap_err().contains("local rank 4"));
        assert!(cfg(2, 0).check().unwrap_err().contains("--node-rank 2"));
        let mut c = cfg(0, 0);
        c.nnodes = 3;
        assert!(c.check().unwrap_err().contains("--nnodes 3 must divide"));
        c.nnodes = 2;
        c.master_port = None;
        assert!(c.check().unwrap_err().contains("--master-port is required"));
    }
}
