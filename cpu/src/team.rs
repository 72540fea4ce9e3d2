//! A team of threads that split one job between them, the caller included.
//!
//! A decode step makes a few hundred small matmuls. Handing each to rayon wakes its sleeping
//! workers through the kernel and puts the caller to sleep until they finish: on two cores that
//! cost more than the arithmetic. The team's workers instead spin for a short while on the job
//! counter after each job, so the next job, microseconds later, starts without a system call.
//! A worker that has waited long (the engine is idle, or busy outside the matmuls) yields, then
//! sleeps on a condition variable until the next job.
//!
//! A job's shares are claimed, not assigned: every member, the caller included, takes the next
//! unclaimed share until none is left, and the caller waits only for shares claimed and not yet
//! finished. A worker the OS has descheduled (another process busy on its core) then costs the
//! job nothing: the others take its shares, where waiting for it cost a whole time slice.

use std::cell::UnsafeCell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread;

/// Spin rounds before a waiting worker starts yielding (about 20 to 50 microseconds).
const SPINS: u32 = 1 << 12;
/// Yields before it sleeps.
const YIELDS: u32 = 1 << 8;
/// Shares of a job per member: more than one, so members that finish early take the shares of
/// one that was descheduled.
const SHARES_PER_MEMBER: usize = 2;

/// The job of the current epoch: called once per share with the share's index.
type Job = *const (dyn Fn(usize) + Sync);

/// The epoch in a claim word (its high half).
fn epoch_of(claim: u64) -> u64 {
    claim >> 32
}

struct Shared {
    /// The current job's epoch (high 32 bits) and its next unclaimed share (low 32 bits). The
    /// caller starts a job by storing a new epoch with share 0; members claim shares by
    /// compare-and-swap, so a claim made for an old epoch fails.
    claim: AtomicU64,
    /// Shares of the current job (written with `job`).
    shares: AtomicUsize,
    /// Shares of the current job finished.
    done: AtomicUsize,
    /// Workers waiting on `wake` (so the caller knows when to notify).
    sleepers: AtomicUsize,
    /// Set when a share run by a worker panicked.
    panicked: AtomicBool,
    stop: AtomicBool,
    /// Written by the caller before it starts an epoch, read by members after a successful
    /// claim in it; never written while a share of the current job is unfinished.
    job: UnsafeCell<Option<Job>>,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is the only non-Sync field. It is written only by the thread that holds the team
// (`Team::busy`), only before it starts a new epoch (every share of the last one finished, so no
// member is between a claim and its share's end), and published by the release store of
// `claim` that members acquire before claiming. A member reads it only after a claim in the
// current epoch succeeded, and the epoch cannot end before that claimed share is finished.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

impl Shared {
    /// Claims and runs shares of the epoch `epoch` until none is left (or a later epoch began).
    /// Returns whether a share run here panicked.
    fn run_shares(&self, epoch: u64) -> bool {
        let mut panicked = false;
        loop {
            let claim = self.claim.load(Ordering::Acquire);
            let share = (claim & 0xffff_ffff) as usize;
            if epoch_of(claim) != epoch || share >= self.shares.load(Ordering::Relaxed) {
                return panicked;
            }
            if self
                .claim
                .compare_exchange_weak(claim, claim + 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            // SAFETY: the claim succeeded in `epoch`, whose job the caller wrote before starting
            // it and keeps alive until every share (this one included) is finished.
            let job = unsafe { (*self.job.get()).expect("a job is set before each epoch") };
            // SAFETY: as above.
            let job = unsafe { &*job };
            panicked |= catch_unwind(AssertUnwindSafe(|| job(share))).is_err();
            self.done.fetch_add(1, Ordering::Release);
        }
    }
}

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
            claim: AtomicU64::new(0),
            shares: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
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
                .spawn(move || worker(&shared))
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

    /// How many shares a job should be cut into: a few per member (one on a team of one).
    pub fn shares(&self) -> usize {
        match self.size {
            1 => 1,
            n => n * SHARES_PER_MEMBER,
        }
    }

    /// Calls `job(i)` for every `i` in `0..shares()`, each once, on whichever members claim
    /// them, and returns when all have returned. When another thread is running a job on the
    /// team, the caller runs every share itself, one after the other.
    pub fn run<F: Fn(usize) + Sync>(&self, job: &F) {
        let shares = self.shares();
        if self.size == 1
            || self
                .busy
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            (0..shares).for_each(job);
            return;
        }
        let s = &*self.shared;
        let erased: &(dyn Fn(usize) + Sync) = job;
        // SAFETY: only the lifetime is erased. Members call the job only for a share claimed
        // in this epoch, and this function does not return (nor unwind: shares run under
        // catch_unwind) before every share of it is finished.
        let erased: Job = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), Job>(erased) };
        // SAFETY: `busy` is ours and every share of the last epoch is finished, so no member
        // reads `job` now.
        unsafe { *s.job.get() = Some(erased) };
        s.shares.store(shares, Ordering::Relaxed);
        s.done.store(0, Ordering::Relaxed);
        let epoch = epoch_of(s.claim.load(Ordering::Relaxed)).wrapping_add(1) & 0xffff_ffff;
        s.claim.store(epoch << 32, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let mine = s.run_shares(epoch);
        let mut rounds = 0u32;
        while s.done.load(Ordering::Acquire) != shares {
            rounds = rounds.saturating_add(1);
            if rounds < SPINS {
                std::hint::spin_loop();
            } else {
                thread::yield_now();
            }
        }
        let theirs = s.panicked.swap(false, Ordering::Relaxed);
        self.busy.store(false, Ordering::Release);
        assert!(!mine && !theirs, "a share of a CPU job panicked");
    }
}

impl Team {
    /// Calls `f(i, chunk)` for every `chunk`-long piece `i` of `data` (the last may be shorter),
    /// cut into up to [`Team::shares`] runs of consecutive pieces, about equal.
    pub fn for_each_chunk<T: Send, F: Fn(usize, &mut [T]) + Sync>(
        &self,
        data: &mut [T],
        chunk: usize,
        f: &F,
    ) {
        let chunk = chunk.max(1);
        let pieces = data.len().div_ceil(chunk);
        let members = self.shares().min(pieces).max(1);
        // Each share's run of pieces, behind a lock only the share's runner takes.
        let mut runs = Vec::with_capacity(members);
        let mut rest = data;
        for m in 0..members {
            let (first, end) = (pieces * m / members, pieces * (m + 1) / members);
            let len = ((end - first) * chunk).min(rest.len());
            let (run, tail) = rest.split_at_mut(len);
            runs.push(Mutex::new((first, run)));
            rest = tail;
        }
        self.run(&|share| {
            let Some(run) = runs.get(share) else { return };
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
        let epoch = epoch_of(s.claim.load(Ordering::Relaxed)).wrapping_add(1) & 0xffff_ffff;
        // No share to claim in the new epoch: workers see it, then `stop`.
        s.shares.store(0, Ordering::Relaxed);
        s.claim.store(epoch << 32, Ordering::SeqCst);
        let _guard = s.lock.lock().unwrap_or_else(|e| e.into_inner());
        s.wake.notify_all();
    }
}

fn worker(s: &Shared) {
    // The epoch the team started at (not the current one: a job may already be waiting).
    let mut seen = 0;
    loop {
        let mut rounds = 0u32;
        loop {
            let epoch = epoch_of(s.claim.load(Ordering::Acquire));
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
                while epoch_of(s.claim.load(Ordering::SeqCst)) == seen {
                    guard = s.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
                }
                s.sleepers.fetch_sub(1, Ordering::SeqCst);
                rounds = 0;
            }
        }
        if s.stop.load(Ordering::Acquire) {
            return;
        }
        if s.run_shares(seen) {
            s.panicked.store(true, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_share_runs_once_per_job() {
        let team = Team::new(3);
        assert_eq!(team.shares(), 3 * SHARES_PER_MEMBER);
        for round in 0..200 {
            let hits: Vec<AtomicUsize> = (0..team.shares()).map(|_| AtomicUsize::new(0)).collect();
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

    /// A member that stalls in its first share (as one the OS descheduled) leaves the other
    /// shares to the rest: the caller runs all of them but the stalled one.
    #[test]
    fn a_stalled_member_leaves_its_shares_to_the_others() {
        let team = Team::new(2);
        let caller = thread::current().id();
        let (by_caller, stalled) = (AtomicUsize::new(0), AtomicBool::new(false));
        team.run(&|_| {
            if thread::current().id() == caller {
                by_caller.fetch_add(1, Ordering::Relaxed);
            } else if !stalled.swap(true, Ordering::Relaxed) {
                thread::sleep(std::time::Duration::from_millis(100));
            }
        });
        assert!(by_caller.load(Ordering::Relaxed) >= team.shares() - 1);
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
        assert_eq!(hits.load(Ordering::Relaxed), 2 * team.shares());
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
                        assert_eq!(hits.load(Ordering::Relaxed), team.shares());
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
        assert_eq!(hits.load(Ordering::Relaxed), team.shares());
    }
}
