//! A process's membership of a tensor-parallel group at run time: rank 0 ([`Leader`]) starts
//! its node's other ranks, meets everyone at the rendezvous, sends each step's plan and watches
//! the links; every other rank ([`Follower`]) meets rank 0 and receives the plans.

use std::net::TcpStream;
use std::process::{Child, Command};

use candle_core::Device;

use super::collective::Parallel;
use super::config::ParallelConfig;
use super::rendezvous::{self, Settings};
use super::wire::{Kind, Link, encode_step};
use crate::scheduler::SchedulerOutput;

/// Why a process could not join or keep its place in the group (the engine reports it as
/// `EngineError::Parallel`).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct GroupError(pub String);

fn err(m: impl std::fmt::Display) -> GroupError {
    GroupError(m.to_string())
}

/// Rank 0's side of the group.
pub struct Leader {
    links: Vec<Link>,
    buf: Vec<u8>,
    children: Vec<Child>,
    /// Set when the group shuts down on purpose (the links closing is then no loss).
    stopping: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// A worker rank's side of the group.
pub struct Follower {
    /// The link to rank 0.
    pub link: Link,
    /// This node's other ranks, when this process is the node's first (a worker node).
    pub children: Vec<Child>,
}

/// This process's side.
pub enum Member {
    /// Rank 0.
    Leader(Leader),
    /// Any other rank.
    Follower(Follower),
}

/// Starts this node's other ranks, when this process is the node's first (processes of
/// `cfg.worker_command`, or of this process's own command line, with `--tp-local-rank K
/// --master-port P` appended). They exit when rank 0 stops the group or goes away.
fn start_local_ranks(cfg: &ParallelConfig, port: u16) -> Result<Vec<Child>, GroupError> {
    let command: Vec<std::ffi::OsString> = match &cfg.worker_command {
        Some(c) => c.clone(),
        None => std::env::args_os().collect(),
    };
    let Some((program, rest)) = command.split_first() else {
        return Err(err("no command to start the other ranks with"));
    };
    let program = if cfg.worker_command.is_none() {
        std::env::current_exe().map_err(|e| err(format!("this executable's path: {e}")))?
    } else {
        program.into()
    };
    if cfg.local_rank != 0 {
        return Ok(Vec::new());
    }
    (1..cfg.local_size())
        .map(|k| {
            Command::new(&program)
                .args(rest)
                .args(["--tp-local-rank", &k.to_string()])
                .args(["--master-port", &port.to_string()])
                .spawn()
                .map_err(|e| err(format!("starting local rank {k}: {e}")))
        })
        .collect()
}

/// Fails when one of this node's other ranks has already exited (it failed to start).
pub fn local_ranks_alive(children: &mut [Child]) -> Result<(), String> {
    for (k, child) in children.iter_mut().enumerate() {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "local rank {} (pid {}) exited with {status} before joining; its log is above",
                k + 1,
                child.id()
            ));
        }
    }
    Ok(())
}

/// Joins (or, as rank 0, forms) the group `cfg` describes, with the model's device already open:
/// rendezvous (every rank must bring the same `settings`), then NCCL. Returns this rank's
/// [`Parallel`] and its side.
pub fn join_group(
    cfg: &ParallelConfig,
    settings: &Settings,
    device: &Device,
) -> Result<(Parallel, Member), GroupError> {
    cfg.check().map_err(err)?;
    let rank = cfg.rank();
    let (id, member) = if rank.leads() {
        let listener = rendezvous::listen(cfg).map_err(err)?;
        let port = listener.local_addr().map_err(err)?.port();
        let mut children = start_local_ranks(cfg, port)?;
        let id = unique_id()?;
        let mut still_coming = || local_ranks_alive(&mut children);
        let links =
            rendezvous::lead(cfg, &listener, settings, &id, &mut still_coming).map_err(err)?;
        let leader = Leader {
            links,
            buf: Vec::new(),
            children,
            stopping: Default::default(),
        };
        (id, Member::Leader(leader))
    } else {
        let children = match (cfg.local_rank, cfg.master_port) {
            (0, Some(port)) => start_local_ranks(cfg, port)?,
            _ => Vec::new(),
        };
        let (link, id) = rendezvous::join(cfg, settings).map_err(err)?;
        (id, Member::Follower(Follower { link, children }))
    };
    let mut member = member;
    let comm = communicator(cfg, device, rank, &id, &mut member)?;
    tracing::info!(
        rank = rank.rank,
        size = rank.size,
        "joined the tensor-parallel group"
    );
    Ok((Parallel::new(rank, comm), member))
}

#[cfg(feature = "nccl")]
fn unique_id() -> Result<Vec<u8>, GroupError> {
    super::nccl::unique_id().map_err(err)
}

/// NCCL, with the one-shot all-reduce over peer memory for small calls when every rank is on
/// this node, each rank could open every other's region, and `--disable-custom-all-reduce` is
/// not given (the ranks agree on it, or their collectives would not pair up).
#[cfg(feature = "nccl")]
fn communicator(
    cfg: &ParallelConfig,
    device: &Device,
    rank: super::TpRank,
    id: &[u8],
    member: &mut Member,
) -> Result<std::sync::Arc<dyn super::Collective>, GroupError> {
    use super::oneshot::{NodeCollectives, OneShot};
    let nccl = super::nccl::NcclComm::new(device, rank, id).map_err(err)?;
    let mut oneshot = None;
    if cfg.nnodes == 1 && !cfg.disable_custom_all_reduce {
        let mine = OneShot::prepare();
        let handle = mine.as_ref().map_or([0u8; 64], |r| r.handle);
        let handles = member.all_gather_bytes(&handle)?;
        let opened = mine.and_then(|r| OneShot::open(r, &handles, rank));
        let everyone = member.agree_min(u64::from(opened.is_ok()))? == 1;
        match (opened, everyone) {
            (Ok(o), true) => oneshot = Some(o),
            (Err(e), _) => tracing::warn!("all-reduces go through NCCL alone: {e}"),
            (Ok(_), false) => tracing::warn!(
                "all-reduces go through NCCL alone: a rank could not open the peer regions"
            ),
        }
    }
    Ok(std::sync::Arc::new(NodeCollectives::new(nccl, oneshot)))
}

#[cfg(not(feature = "nccl"))]
fn unique_id() -> Result<Vec<u8>, GroupError> {
    Err(no_nccl())
}

#[cfg(not(feature = "nccl"))]
fn communicator(
    _: &ParallelConfig,
    _: &Device,
    _: super::TpRank,
    _: &[u8],
    _: &mut Member,
) -> Result<std::sync::Arc<dyn super::Collective>, GroupError> {
    Err(no_nccl())
}

#[cfg(not(feature = "nccl"))]
fn no_nccl() -> GroupError {
    err("tensor parallelism needs a build with `--features nccl` (NCCL on CUDA GPUs)")
}

impl Member {
    /// The KV-cache bytes every rank can hold: the least of the ranks' own budgets.
    pub fn agree_kv_bytes(&mut self, mine: u64) -> Result<u64, GroupError> {
        let least = self.agree_min(mine)?;
        if matches!(self, Member::Leader(_)) {
            tracing::info!(
                bytes = least,
                mine,
                "KV cache sized by the smallest rank's memory"
            );
        }
        Ok(least)
    }

    /// The smallest of every rank's `mine`: rank 0 collects them and sends back the least; the
    /// others send theirs and take the answer.
    pub fn agree_min(&mut self, mine: u64) -> Result<u64, GroupError> {
        let mut payload = Vec::new();
        match self {
            Member::Leader(l) => {
                let mut least = mine;
                for (i, link) in l.links.iter_mut().enumerate() {
                    let kind = link.recv_into(&mut payload).map_err(|e| lost(i + 1, e))?;
                    least = least.min(read_u64(kind, &payload)?);
                }
                for (i, link) in l.links.iter_mut().enumerate() {
                    link.send(Kind::Agree, &least.to_le_bytes())
                        .map_err(|e| lost(i + 1, e))?;
                }
                Ok(least)
            }
            Member::Follower(f) => {
                f.link
                    .send(Kind::Agree, &mine.to_le_bytes())
                    .map_err(|e| lost(0, e))?;
                let kind = f.link.recv_into(&mut payload).map_err(|e| lost(0, e))?;
                read_u64(kind, &payload)
            }
        }
    }

    /// Every rank's `mine` (all the same length), in rank order, on every rank: rank 0 collects
    /// them and sends the whole list back.
    pub fn all_gather_bytes(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>, GroupError> {
        let mut payload = Vec::new();
        let len = mine.len().max(1);
        let all = match self {
            Member::Leader(l) => {
                let mut all = mine.to_vec();
                for (i, link) in l.links.iter_mut().enumerate() {
                    let kind = link.recv_into(&mut payload).map_err(|e| lost(i + 1, e))?;
                    if kind != Kind::Handles || payload.len() != mine.len() {
                        return Err(err(format!("rank {} sent {kind:?}, not its handle", i + 1)));
                    }
                    all.extend_from_slice(&payload);
                }
                for (i, link) in l.links.iter_mut().enumerate() {
                    link.send(Kind::Handles, &all).map_err(|e| lost(i + 1, e))?;
                }
                all
            }
            Member::Follower(f) => {
                f.link.send(Kind::Handles, mine).map_err(|e| lost(0, e))?;
                let kind = f.link.recv_into(&mut payload).map_err(|e| lost(0, e))?;
                if kind != Kind::Handles || !payload.len().is_multiple_of(len) {
                    return Err(err(format!(
                        "rank 0 sent {kind:?}, not every rank's handle"
                    )));
                }
                payload
            }
        };
        Ok(all.chunks(len).map(<[u8]>::to_vec).collect())
    }
}

fn lost(rank: usize, e: std::io::Error) -> GroupError {
    err(format!("lost rank {rank}: {e}"))
}

fn read_u64(kind: Kind, payload: &[u8]) -> Result<u64, GroupError> {
    match (kind, <[u8; 8]>::try_from(payload)) {
        (Kind::Agree, Ok(b)) => Ok(u64::from_le_bytes(b)),
        _ => Err(err(format!("expected a number to agree on, got {kind:?}"))),
    }
}

impl Leader {
    /// Sends `out` to every other rank (they compute it alongside this one).
    pub fn broadcast(&mut self, out: &SchedulerOutput) -> Result<(), GroupError> {
        encode_step(out, &mut self.buf);
        for (i, link) in self.links.iter_mut().enumerate() {
            link.send(Kind::Step, &self.buf)
                .map_err(|e| lost(i + 1, e))?;
        }
        Ok(())
    }

    /// Watches the other ranks from now on: they send nothing more after the rendezvous, so a
    /// readable link means that rank is gone; `on_loss` is called once with why.
    pub fn watch(&self, on_loss: impl Fn(String) + Send + Sync + 'static) {
        let on_loss = std::sync::Arc::new(on_loss);
        for (i, link) in self.links.iter().enumerate() {
            let Ok(mut stream): std::io::Result<TcpStream> = link.stream().try_clone() else {
                continue;
            };
            let (on_loss, stopping) = (on_loss.clone(), self.stopping.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("pagewise-watch-rank-{}", i + 1))
                .spawn(move || {
                    let mut byte = [0u8; 1];
                    let why = match std::io::Read::read(&mut stream, &mut byte) {
                        Ok(0) => "its connection closed".to_string(),
                        Ok(_) => "it sent an unexpected message".to_string(),
                        Err(e) => e.to_string(),
                    };
                    if stopping.load(std::sync::atomic::Ordering::Acquire) {
                        return;
                    }
                    on_loss(format!(
                        "tensor-parallel rank {} is gone ({why}); the model cannot run without it",
                        i + 1
                    ));
                });
            if let Err(e) = spawned {
                tracing::warn!("cannot watch rank {}: {e}", i + 1);
            }
        }
    }
}

impl Drop for Leader {
    fn drop(&mut self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::Release);
        tracing::info!("stopping the other tensor-parallel ranks");
        for link in &mut self.links {
            let _ = link.send(Kind::Stop, &[]);
            let _ = link.stream().shutdown(std::net::Shutdown::Both);
        }
        for child in &mut self.children {
            // Local ranks exit on Stop; reap them so none is left a zombie.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while matches!(child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            if matches!(child.try_wait(), Ok(None)) {
                tracing::warn!(
                    pid = child.id(),
                    "a local rank did not stop within 5 s; killing it"
                );
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
