//! A team of threads that split one job between them, the caller included.
//!
//! A decode step makes a few hundred small matmuls. Handing each to rayon wakes its sleeping
//! workers through the kernel and puts the caller to sleep until they finish: on two cores that
//! cost more than the arithmetic. The team's workers instead spin for a short while on an epoch
//! counter after each job, so the next job, microseconds later, starts without a system call.
//! A worker that has waited long (the engine is idle, or busy outside the matmuls) yields, then
//! sleeps on a condition variable until the next job.

use std::cell::UnsafeCell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread;

/// Spin rounds before a waiting worker starts yielding (about 20 to 50 microseconds).
const SPINS: u32 = 1 << 12;
/// Yields before it sleeps.
const YIELDS: u32 = 1 << 8;

/// The job of the current epoch: called once per member with the member's index.
type Job = *const (dyn Fn(usize) + Sync);

struct Shared {
    /// Bumped once per job; a worker runs a job when it sees the epoch change.
    epoch: AtomicUsize,
    /// Workers that have not finished the current job.
    pending: AtomicUsize,
    /// Workers waiting on `wake` (so the caller knows when to notify).
    sleepers: AtomicUsize,
    /// Set when a worker's share of the job panicked.
    panicked: AtomicBool,
    stop: AtomicBool,
    /// Written by the caller before it bumps `epoch`, read by workers after they see the bump;
    /// never written while `pending` is non-zero.
    job: UnsafeCell<Option<Job>>,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is the only non-Sync field. It is written only by the thread that holds the team
// (`Team::busy`), only while no worker reads it (`pending` is zero), and published to workers by
// the release store of `epoch` that they acquire before reading it.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// A fixed team of `size` threads: the caller of [`Team::run`] and `size - 1` workers.
pub struct Team {
    shared: Arc<Shared>,
    size: usize,
    /// Held by the thread running a job; another thread that finds it held runs its job alone.
    busy: AtomicBool,
}

impl Team {
    /// A team of `size` threads (at least one: the caller).
    pub fn new(size: usize) -> Team {
        let size = size.max(1);
        let shared = Arc::new(Shared {
            epoch: AtomicUsize::new(0),
            pending: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            job: UnsafeCell::new(None),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        for index in 1..size {
            let shared = Arc::clone(&shared);
            thread::Builder::new()
                .name(format!("pagewise-cpu-{index}"))
                .spawn(move || worker(&shared, index))
                .expect("spawning a CPU worker thread");
        }
        Team {
            shared,
            size,
            busy: AtomicBool::new(false),
        }
    }

    /// The process-wide team, as large as rayon's pool (`RAYON_NUM_THREADS`, which `pagewise`
    /// sets to the number of physical cores).
    pub fn global() -> &'static Team {
        static TEAM: OnceLock<Team> = OnceLock::new();
        TEAM.get_or_init(|| Team::new(rayon::current_num_threads()))
    }

    /// Number of members (the caller included).
    pub fn size(&self) -> usize {
        self.size
    }

    /// Calls `job(i)` for every `i` in `0..size()`, member `i` running `job(i)`, and returns
    /// when all have returned. When another thread is running a job on the team, the caller
    /// runs every share itself, one after the other.
    pub fn run<F: Fn(usize) + Sync>(&self, job: &F) {
        if self.size == 1
            || self
                .busy
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            (0..self.size).for_each(job);
            return;
        }
        let s = &*self.shared;
        let erased: &(dyn Fn(usize) + Sync) = job;
        // SAFETY: only the lifetime is erased. Workers call the job only between seeing the new
        // epoch and decrementing `pending`, and this function does not return (nor unwind:
        // the caller's share runs under catch_unwind) before `pending` is zero again.
        let erased: Job = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), Job>(erased) };
        // SAFETY: `busy` is ours and `pending` is zero, so no worker reads `job` now.
        unsafe { *s.job.get() = Some(erased) };
        s.pending.store(self.size - 1, Ordering::Relaxed);
        s.epoch.fetch_add(1, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| job(0)));
        let mut rounds = 0u32;
        while s.pending.load(Ordering::Acquire) != 0 {
            rounds = rounds.saturating_add(1);
            if rounds < SPINS {
                std::hint::spin_loop();
            } else {
                thread::yield_now();
            }
        }
        let theirs = s.panicked.swap(false, Ordering::Relaxed);
        self.busy.store(false, Ordering::Release);
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
        assert!(!theirs, "a CPU worker thread panicked");
    }
}

impl Team {
    /// Calls `f(i, chunk)` for every `chunk`-long piece `i` of `data` (the last may be shorter),
    /// the members taking about equal runs of consecutive pieces.
    pub fn for_each_chunk<T: Send, F: Fn(usize, &mut [T]) + Sync>(
        &self,
        data: &mut [T],
        chunk: usize,
        f: &F,
    ) {
        let chunk = chunk.max(1);
        let pieces = data.len().div_ceil(chunk);
        let members = self.size.min(pieces).max(1);
        // Each member's run of pieces, behind a lock only that member takes.
        let mut runs = Vec::with_capacity(members);
        let mut rest = data;
        for m in 0..members {
            let (first, end) = (pieces * m / members, pieces * (m + 1) / members);
            let len = ((end - first) * chunk).min(rest.len());
            let (run, tail) = rest.split_at_mut(len);
            runs.push(Mutex::new((first, run)));
            rest = tail;
        }
        self.run(&|member| {
            let Some(run) = runs.get(member) else { return };
            let mut run = run.lock().unwrap_or_else(|e| e.into_inner());
            let (first, ref mut slice) = *run;
            for (j, piece) in slice.chunks_mut(chunk).enumerate() {
                f(first + j, piece);
            }
        });
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        let s = &*self.shared;
        s.stop.store(true, Ordering::SeqCst);
        s.epoch.fetch_add(1, Ordering::SeqCst);
        let _guard = s.lock.lock().unwrap_or_else(|e| e.into_inner());
        s.wake.notify_all();
    }
}

fn worker(s: &Shared, index: usize) {
    // The epoch the team started at (not the current one: a job may already be waiting).
    let mut seen = 0;
    loop {
        let mut rounds = 0u32;
        loop {
            let epoch = s.epoch.load(Ordering::Acquire);
            if epoch != seen {
                seen = epoch;
                break;
            }
            rounds = rounds.saturating_add(1);
            if rounds < SPINS {
                std::hint::spin_loop();
            } else if rounds < SPINS + YIELDS {
                thread::yield_now();
            } else {
                let mut guard = s.lock.lock().unwrap_or_else(|e| e.into_inner());
                s.sleepers.fetch_add(1, Ordering::SeqCst);
                while s.epoch.load(Ordering::SeqCst) == seen {
                    guard = s.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
                }
                s.sleepers.fetch_sub(1, Ordering::SeqCst);
                rounds = 0;
            }
        }
        if s.stop.load(Ordering::Acquire) {
            return;
        }
        // SAFETY: the caller wrote `job` before the epoch bump we acquired, and keeps it alive
        // until `pending` reaches zero, which cannot happen before our decrement below.
        let job = unsafe { (*s.job.get()).expect("a job is set before each epoch") };
        // SAFETY: see above: the job outlives this call.
        let job = unsafe { &*job };
        if catch_unwind(AssertUnwindSafe(|| job(index))).is_err() {
            s.panicked.store(true, Ordering::Relaxed);
        }
        s.pending.fetch_sub(1, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_member_runs_its_share_once_per_job() {
        let team = Team::new(3);
        for round in 0..200 {
            let hits: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
            team.run(&|i| {
                hits[i].fetch_add(round + 1, Ordering::Relaxed);
            });
            for h in &hits {
                assert_eq!(h.load(Ordering::Relaxed), round + 1);
            }
        }
    }

    #[test]
    fn every_chunk_is_visited_once_with_its_index() {
        for size in [1, 2, 3] {
            let team = Team::new(size);
            for len in [0, 1, 5, 6, 7, 64] {
                let mut data = vec![0usize; len];
                team.for_each_chunk(&mut data, 3, &|i, piece| {
                    for (j, v) in piece.iter_mut().enumerate() {
                        *v += i * 3 + j + 1;
                    }
                });
                assert_eq!(
                    data,
                    (1..=len).collect::<Vec<_>>(),
                    "team {size}, {len} long"
                );
            }
        }
    }

    #[test]
    fn workers_wake_after_sleeping() {
        let team = Team::new(2);
        let hits = AtomicUsize::new(0);
        team.run(&|_| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
        // Long enough for the worker to give up spinning and sleep on the condition variable.
        thread::sleep(std::time::Duration::from_millis(300));
        team.run(&|_| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(hits.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn concurrent_callers_each_get_every_share() {
        let team = Team::new(2);
        thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..100 {
                        let hits = AtomicUsize::new(0);
                        team.run(&|_| {
                            hits.fetch_add(1, Ordering::Relaxed);
                        });
                        assert_eq!(hits.load(Ordering::Relaxed), 2);
                    }
                });
            }
        });
    }

    #[test]
    fn a_panicking_share_reaches_the_caller_and_the_team_survives() {
        let team = Team::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| team.run(&|i| assert!(i != 1, "boom"))));
        assert!(r.is_err());
        let hits = AtomicUsize::new(0);
        team.run(&|_| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(hits.load(Ordering::Relaxed), 2);
    }
}
