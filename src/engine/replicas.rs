//! Data parallelism (`--data-parallel-size N`): one server in front of N engine replicas, each a
//! whole model on its own device with its own scheduler and KV cache. A request goes to the
//! replica that last took a request sharing the longest prefix with it (its blocks are likely
//! still in that replica's prefix cache), unless that replica is overloaded; otherwise to the
//! least-loaded replica.

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::mpsc;

use super::args::{EngineArgs, EngineError};
use super::device::DeviceArg;
use super::handle::{EngineHandle, GenerateRequest, ModelInfo, StreamEvent, SubmitError};

/// Tokens per routing chunk: prefixes are matched in whole chunks.
pub const ROUTE_CHUNK: usize = 16;

/// The most leading chunks of a prompt the router remembers (the first 2048 tokens).
const MAX_CHUNKS: usize = 128;

/// The most prefixes the router remembers; the oldest are forgotten first.
const MAX_ENTRIES: usize = 1 << 16;

/// Which replica last took each remembered prefix, and how many requests each has taken.
#[derive(Debug)]
pub struct PrefixRouter {
    owners: HashMap<u64, usize>,
    order: VecDeque<u64>,
    routed: Vec<u64>,
}

impl PrefixRouter {
    /// A router over `replicas` replicas that remembers nothing yet.
    pub fn new(replicas: usize) -> Self {
        PrefixRouter {
            owners: HashMap::new(),
            order: VecDeque::new(),
            routed: vec![0; replicas],
        }
    }

    /// The replica for a prompt of `tokens` (under `salt`, whose cache entries are its own),
    /// given each replica's load (sequences running, waiting and queued): the holder of its
    /// longest remembered prefix unless its load is at least `margin` above the least-loaded
    /// replica's, else the least-loaded one (on a tie, the one that has taken the fewest
    /// requests, then the lowest). Remembers the choice for the prompt's prefixes.
    pub fn pick(
        &mut self,
        tokens: &[u32],
        salt: Option<&str>,
        loads: &[usize],
        margin: usize,
    ) -> usize {
        let keys = chunk_keys(tokens, salt);
        let least = (0..loads.len())
            .min_by_key(|&r| (loads[r], self.routed[r], r))
            .unwrap_or(0);
        let holder = keys.iter().rev().find_map(|k| self.owners.get(k).copied());
        let chosen = match holder {
            Some(h) if h < loads.len() && loads[h] < loads[least] + margin => h,
            _ => least,
        };
        for key in keys {
            if self.owners.insert(key, chosen).is_none() {
                self.order.push_back(key);
            }
        }
        while self.order.len() > MAX_ENTRIES {
            if let Some(old) = self.order.pop_front() {
                self.owners.remove(&old);
            }
        }
        self.routed[chosen] += 1;
        chosen
    }
}

/// The keys of a prompt's leading whole chunks, each covering the prompt up to its chunk's end.
fn chunk_keys(tokens: &[u32], salt: Option<&str>) -> Vec<u64> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    salt.hash(&mut h);
    tokens
        .chunks_exact(ROUTE_CHUNK)
        .take(MAX_CHUNKS)
        .map(|chunk| {
            chunk.hash(&mut h);
            h.finish()
        })
        .collect()
}

/// The engine replicas behind one server: one, or `--data-parallel-size` of them.
pub struct Engines {
    replicas: Vec<EngineHandle>,
    router: Mutex<PrefixRouter>,
    /// Requests each replica has been given.
    routed: Vec<AtomicU64>,
    /// How much more loaded than the least-loaded replica a prefix's holder may be and still
    /// take it: one full batch (`--max-num-seqs`).
    margin: usize,
}

impl Engines {
    /// The server's replicas (at least one); `max_num_seqs` is each one's batch limit.
    pub fn new(replicas: Vec<EngineHandle>, max_num_seqs: usize) -> Self {
        assert!(!replicas.is_empty(), "a server needs an engine");
        let n = replicas.len();
        Engines {
            router: Mutex::new(PrefixRouter::new(n)),
            routed: (0..n).map(|_| AtomicU64::new(0)).collect(),
            margin: max_num_seqs.max(1),
            replicas,
        }
    }

    /// The replicas, in order (replica `i` is `engine="i"` in `/metrics`).
    pub fn replicas(&self) -> &[EngineHandle] {
        &self.replicas
    }

    /// Requests given to replica `i` so far.
    pub fn routed(&self, i: usize) -> u64 {
        self.routed[i].load(Ordering::Relaxed)
    }

    /// A replica's load: its sequences running and waiting (published after each step) and
    /// queued (counted live, so a burst is seen at once).
    fn load(handle: &EngineHandle) -> usize {
        let s = handle.stats();
        let published =
            s.num_running.load(Ordering::Relaxed) + s.num_waiting.load(Ordering::Relaxed);
        published as usize + handle.num_queued()
    }

    /// Submits a request to the replica the router picks for it.
    pub async fn submit(
        &self,
        request: GenerateRequest,
    ) -> Result<mpsc::UnboundedReceiver<StreamEvent>, SubmitError> {
        let i = match self.replicas.len() {
            1 => 0,
            _ => {
                let loads: Vec<usize> = self.replicas.iter().map(Self::load).collect();
                let mut router = self.router.lock().unwrap_or_else(|e| e.into_inner());
                let salt = request.cache_salt.as_deref();
                router.pick(&request.prompt_token_ids, salt, &loads, self.margin)
            }
        };
        self.routed[i].fetch_add(1, Ordering::Relaxed);
        self.replicas[i].submit(request).await
    }

    /// Whether every replica runs.
    pub fn is_alive(&self) -> bool {
        self.replicas.iter().all(EngineHandle::is_alive)
    }

    /// Why a replica died, once one has (the server then stops, as with one engine).
    pub fn death_reason(&self) -> Option<std::sync::Arc<str>> {
        self.replicas.iter().find_map(EngineHandle::death_reason)
    }

    /// Resolves with the reason when any replica dies.
    pub async fn died(&self) -> std::sync::Arc<str> {
        let deaths = self.replicas.iter().map(|r| Box::pin(r.died()));
        futures_util::future::select_all(deaths).await.0
    }

    /// Sequences accepted and not yet scheduled, over every replica.
    pub fn num_queued(&self) -> usize {
        self.replicas.iter().map(EngineHandle::num_queued).sum()
    }

    /// Whether no replica has a sequence running, waiting or queued.
    pub fn is_idle(&self) -> bool {
        self.replicas.iter().all(|r| Self::load(r) == 0)
    }

    /// Ends every request in flight on every replica with an error event.
    pub async fn abort_all(&self, message: &str) {
        for r in &self.replicas {
            r.abort_all(message).await;
        }
    }
}

/// Starts `n` engine replicas of `args` at once (`--data-parallel-size n`): replica `i` on the
/// `i`-th GPU from the one `args.device` names (`auto`: from GPU 0 when there is one), or every
/// replica on the CPU. Returns once all are ready, with the first one's model information (the
/// same model everywhere); fails if any fails. `max_queued_seqs` bounds each replica's queue.
pub fn spawn(
    args: &EngineArgs,
    n: usize,
    max_queued_seqs: usize,
) -> Result<(Engines, ModelInfo), EngineError> {
    if n == 0 {
        return Err(EngineError::Config(
            "--data-parallel-size must be at least 1".into(),
        ));
    }
    if n > 1 && args.parallel.is_parallel() {
        return Err(EngineError::Parallel(
            "--data-parallel-size above 1 with --tensor-parallel-size above 1 is not implemented              yet: run one tensor-parallel server per group of GPUs behind a load balancer"
                .into(),
        ));
    }
    if n > 1 && args.parallel.enable_expert_parallel {
        return Err(EngineError::Parallel(
            "--enable-expert-parallel with --data-parallel-size above 1 (experts spread over the \
             replicas, attention data-parallel) is not implemented yet: split the experts over a \
             tensor-parallel group (--tensor-parallel-size N --enable-expert-parallel)"
                .into(),
        ));
    }
    let on_gpu = match args.device {
        DeviceArg::Cuda(_) => true,
        DeviceArg::Cpu => false,
        DeviceArg::Auto => cfg!(feature = "cuda") && n > 1 && DeviceArg::Cuda(0).open().is_ok(),
    };
    let first_gpu = match args.device {
        DeviceArg::Cuda(k) => k,
        _ => 0,
    };
    let spawned: Vec<_> = std::thread::scope(|s| {
        let starts: Vec<_> = (0..n)
            .map(|i| {
                let mut replica = args.clone();
                if n > 1 {
                    replica.device = match on_gpu {
                        true => DeviceArg::Cuda(first_gpu + i),
                        false => DeviceArg::Cpu,
                    };
                }
                s.spawn(move || EngineHandle::spawn(replica, max_queued_seqs))
            })
            .collect();
        starts
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(EngineError::Config(
                        "an engine replica panicked while loading".into(),
                    ))
                })
            })
            .collect()
    });
    let mut handles = Vec::with_capacity(n);
    let mut info = None;
    for (i, r) in spawned.into_iter().enumerate() {
        let (handle, model) = r.map_err(|e| match n {
            1 => e,
            _ => EngineError::Config(format!("engine replica {i}: {e}")),
        })?;
        handles.push(handle);
        info.get_or_insert(model);
    }
    let info = info.expect("at least one replica");
    if n > 1 {
        tracing::info!(
            replicas = n,
            "data parallelism: requests go by prefix and load"
        );
    }
    Ok((Engines::new(handles, info.max_num_seqs), info))
}

impl From<EngineHandle> for Engines {
    fn from(handle: EngineHandle) -> Self {
        Engines::new(vec![handle], 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(prefix: u32, len: usize) -> Vec<u32> {
        (0..len as u32).map(|i| prefix * 1000 + i).collect()
    }

    #[test]
    fn shared_prefixes_land_together_and_new_ones_spread() {
        let mut r = PrefixRouter::new(2);
        let idle = [0, 0];
        let a: Vec<usize> = (0..4)
            .map(|_| r.pick(&prompt(1, 40), None, &idle, 8))
            .collect();
        let b: Vec<usize> = (0..4)
            .map(|_| r.pick(&prompt(2, 40), None, &idle, 8))
            .collect();
        assert_eq!(a, [0; 4]);
        assert_eq!(b, [1; 4]);
        // A longer prompt with A's prefix goes where A went, whatever follows it.
        let mut longer = prompt(1, 32);
        longer.extend(prompt(3, 50));
        assert_eq!(r.pick(&longer, None, &idle, 8), 0);
        // Another salt shares nothing: the replica that has taken fewer requests.
        assert_eq!(r.pick(&prompt(1, 40), Some("other"), &idle, 8), 1);
        // Shorter than a chunk: no prefix to match, the least loaded.
        assert_eq!(r.pick(&[1, 2, 3], None, &[5, 2], 8), 1);
    }

    #[test]
    fn an_overloaded_holder_gives_way_to_the_least_loaded() {
        let mut r = PrefixRouter::new(3);
        assert_eq!(r.pick(&prompt(1, 64), None, &[0, 0, 0], 4), 0);
        // Within the margin the holder keeps it; at the margin the least loaded takes it.
        assert_eq!(r.pick(&prompt(1, 64), None, &[3, 0, 1], 4), 0);
        assert_eq!(r.pick(&prompt(1, 64), None, &[4, 1, 0], 4), 2);
        // The prefix now belongs to the replica that took it last.
        assert_eq!(r.pick(&prompt(1, 64), None, &[0, 0, 0], 4), 2);
    }

    #[test]
    fn the_router_forgets_the_oldest_prefixes_past_its_bound() {
        let mut r = PrefixRouter::new(2);
        for p in 0..(MAX_ENTRIES / MAX_CHUNKS + 10) as u32 {
            r.pick(&prompt(p, ROUTE_CHUNK * MAX_CHUNKS + 5), None, &[0, 0], 1);
        }
        assert!(r.owners.len() <= MAX_ENTRIES && r.order.len() == r.owners.len());
    }
}
