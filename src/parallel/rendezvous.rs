//! How the ranks meet: rank 0 listens on `--master-addr:--master-port`; every other rank connects
//! (retrying until the deadline: rank 0 may still be starting), says which rank it is and with
//! which settings, and gets the NCCL unique id back. Settings that must agree (model, dtype,
//! lengths, sizes) are compared here, so a host started with other flags is refused by name
//! instead of computing garbage. Everything is bounded by `--tp-join-timeout`: a rank that never
//! comes is an error naming it, not a hang. The connection then carries the step plans.

use std::collections::BTreeMap;
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::config::ParallelConfig;
use super::wire::{Kind, Link};

/// The settings every rank must share, by flag name.
pub type Settings = BTreeMap<String, String>;

/// Why the group could not form.
#[derive(Debug, thiserror::Error)]
#[error("tensor-parallel rendezvous: {0}")]
pub struct RendezvousError(pub String);

/// How often a joining rank retries a refused connection, and a listener polls.
const POLL: Duration = Duration::from_millis(50);

#[derive(serde::Serialize, serde::Deserialize)]
struct Hello {
    rank: usize,
    size: usize,
    settings: Settings,
}

/// The first setting where `theirs` differs from `ours`, worded for the operator.
fn difference(ours: &Settings, theirs: &Settings, rank: usize) -> Option<String> {
    let keys: std::collections::BTreeSet<&String> = ours.keys().chain(theirs.keys()).collect();
    keys.into_iter().find_map(|k| {
        let (a, b) = (ours.get(k), theirs.get(k));
        (a != b).then(|| {
            let show = |v: Option<&String>| v.map_or("(unset)".to_string(), |v| format!("{v:?}"));
            format!(
                "rank {rank} was started with {k} = {}, rank 0 with {}; every rank needs the same \
                 settings",
                show(b),
                show(a)
            )
        })
    })
}

/// Rank 0's side: binds the rendezvous address (`--master-port` or, with none, a free port).
pub fn listen(cfg: &ParallelConfig) -> Result<TcpListener, RendezvousError> {
    let addr = format!("{}:{}", cfg.master_addr, cfg.master_port.unwrap_or(0));
    TcpListener::bind(&addr).map_err(|e| RendezvousError(format!("cannot listen on {addr}: {e}")))
}

/// Rank 0's side: admits ranks `1..size` on `listener` until every one has joined with the same
/// settings, then sends each the `id`. Returns their links, in rank order. While it waits it
/// polls `still_coming`, which fails the rendezvous at once when a rank can no longer come (a
/// local rank's process that already exited), instead of at the deadline.
pub fn lead(
    cfg: &ParallelConfig,
    listener: &TcpListener,
    settings: &Settings,
    id: &[u8],
    still_coming: &mut dyn FnMut() -> Result<(), String>,
) -> Result<Vec<Link>, RendezvousError> {
    let size = cfg.tensor_parallel_size;
    let deadline = Instant::now() + cfg.join_timeout;
    let err = |m: String| RendezvousError(m);
    listener
        .set_nonblocking(true)
        .map_err(|e| err(format!("listener: {e}")))?;
    let mut links: Vec<Option<Link>> = (0..size).map(|_| None).collect();
    while links[1..].iter().any(Option::is_none) {
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                still_coming().map_err(err)?;
                if Instant::now() >= deadline {
                    let missing: Vec<usize> = (1..size).filter(|&r| links[r].is_none()).collect();
                    return Err(err(format!(
                        "rank(s) {missing:?} of {size} did not join at {} within {} s (are their \
                         processes running, with --master-addr and --master-port pointing here?)",
                        listener
                            .local_addr()
                            .map_or_else(|_| "?".into(), |a| a.to_string()),
                        cfg.join_timeout.as_secs()
                    )));
                }
                std::thread::sleep(POLL);
                continue;
            }
            Err(e) => return Err(err(format!("accept: {e}"))),
        };
        let setup = |stream: TcpStream| -> std::io::Result<(Link, Hello)> {
            stream.set_nonblocking(false)?;
            let left = deadline.saturating_duration_since(Instant::now()).max(POLL);
            stream.set_read_timeout(Some(left))?;
            let mut link = Link::new(stream)?;
            let (kind, payload) = link.recv()?;
            if kind != Kind::Hello {
                return Err(std::io::Error::other(format!(
                    "expected a hello, got {kind:?}"
                )));
            }
            let hello = serde_json::from_slice(&payload).map_err(std::io::Error::other)?;
            Ok((link, hello))
        };
        let (mut link, hello) = match setup(stream) {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!("rendezvous: ignoring a connection that did not say hello: {e}");
                continue;
            }
        };
        let refusal = if hello.size != size {
            Some(format!(
                "rank {} was started with --tensor-parallel-size {}, rank 0 with {size}",
                hello.rank, hello.size
            ))
        } else if hello.rank == 0 || hello.rank >= size {
            Some(format!(
                "rank {} is not a worker rank of {size}",
                hello.rank
            ))
        } else if links[hello.rank].is_some() {
            Some(format!("rank {} joined twice", hello.rank))
        } else {
            difference(settings, &hello.settings, hello.rank)
        };
        if let Some(why) = refusal {
            let _ = link.send(Kind::Refuse, why.as_bytes());
            return Err(err(why));
        }
        tracing::info!(rank = hello.rank, "rendezvous: rank joined");
        links[hello.rank] = Some(link);
    }
    let mut joined: Vec<Link> = links.into_iter().flatten().collect();
    for (i, link) in joined.iter_mut().enumerate() {
        link.send(Kind::Welcome, id)
            .and_then(|()| link.stream().set_read_timeout(None))
            .map_err(|e| err(format!("rank {} left during the rendezvous: {e}", i + 1)))?;
    }
    Ok(joined)
}

/// A worker rank's side: connects to rank 0 (retrying until the deadline), introduces itself and
/// returns its link and the NCCL unique id.
pub fn join(cfg: &ParallelConfig, settings: &Settings) -> Result<(Link, Vec<u8>), RendezvousError> {
    let rank = cfg.rank();
    let port = cfg.master_port.ok_or_else(|| {
        RendezvousError("a worker rank needs --master-port (rank 0's rendezvous port)".into())
    })?;
    let addr = format!("{}:{port}", cfg.master_addr);
    let deadline = Instant::now() + cfg.join_timeout;
    let err = |m: String| RendezvousError(m);
    let stream = loop {
        let last = match addr.to_socket_addrs() {
            Ok(mut addrs) => match addrs.next() {
                Some(a) => {
                    let left = deadline.saturating_duration_since(Instant::now()).max(POLL);
                    match TcpStream::connect_timeout(&a, left) {
                        Ok(s) => break s,
                        Err(e) => e.to_string(),
                    }
                }
                None => format!("{addr} resolves to no address"),
            },
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            return Err(err(format!(
                "rank {} could not reach rank 0 at {addr} within {} s: {last}",
                rank.rank,
                cfg.join_timeout.as_secs()
            )));
        }
        std::thread::sleep(POLL);
    };
    let talk = || -> std::io::Result<(Link, Kind, Vec<u8>)> {
        let left = deadline.saturating_duration_since(Instant::now()).max(POLL);
        stream.set_read_timeout(Some(left))?;
        let mut link = Link::new(stream.try_clone()?)?;
        let hello = Hello {
            rank: rank.rank,
            size: rank.size,
            settings: settings.clone(),
        };
        link.send(Kind::Hello, &serde_json::to_vec(&hello)?)?;
        let (kind, payload) = link.recv()?;
        link.stream().set_read_timeout(None)?;
        Ok((link, kind, payload))
    };
    match talk() {
        Ok((link, Kind::Welcome, id)) => Ok((link, id)),
        Ok((_, Kind::Refuse, why)) => Err(err(format!(
            "rank 0 refused rank {}: {}",
            rank.rank,
            String::from_utf8_lossy(&why)
        ))),
        Ok((_, kind, _)) => Err(err(format!("rank 0 answered with {kind:?}"))),
        Err(e) => Err(err(format!(
            "rank {} joined rank 0 at {addr} but got no answer within {} s: {e}",
            rank.rank,
            cfg.join_timeout.as_secs()
        ))),
    }
}
