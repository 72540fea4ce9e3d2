//! Snapshots of the page table for the live view (`/dashboard`): every block's state and every
//! unfinished sequence's block table, as plain data. The engine thread takes one after a step at
//! most [`PERIOD`] apart, and only while someone watches; it hands it over through a
//! `tokio::sync::watch` channel (a pointer swap, never a wait on a reader). An engine that goes
//! idle publishes its idle pool once it has stayed idle for the rest of the period, so an idle
//! pool is shown as it is, and brief gaps between requests do not hide a busy one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::Device;
use tokio::sync::watch;

use crate::scheduler::Scheduler;
use crate::sequence::{SeqStatus, Sequence};

/// Shortest time between two snapshots (10 Hz).
pub const PERIOD: Duration = Duration::from_millis(100);

/// One sequence as the live view shows it: ids and lengths, never its tokens or text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeqView {
    /// The sequence's id.
    pub id: u64,
    /// Running (holds blocks) or waiting.
    pub running: bool,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub output_tokens: usize,
    /// Tokens whose KV is in the cache (prefill progress while below the prompt length).
    pub computed_tokens: usize,
    /// Prompt tokens that came from the prefix cache.
    pub cached_tokens: usize,
    /// Times it was preempted.
    pub preemptions: u32,
    /// Its block table (physical block ids, in order).
    pub blocks: Vec<u32>,
    /// Its sliding layers' table in the window group, one entry per entry of `blocks` (0 where
    /// a block has left every window and went back to the group); empty without a group.
    pub window_blocks: Vec<u32>,
}

impl SeqView {
    fn of(seq: &Sequence) -> Self {
        SeqView {
            id: seq.id.0,
            running: seq.status == SeqStatus::Running,
            prompt_tokens: seq.num_prompt_tokens(),
            output_tokens: seq.num_output_tokens(),
            computed_tokens: seq.num_computed_tokens(),
            cached_tokens: seq.num_cached_tokens,
            preemptions: seq.num_preemptions,
            blocks: seq.block_table.blocks().iter().map(|b| b.0).collect(),
            window_blocks: seq
                .block_table
                .window_blocks()
                .iter()
                .map(|b| b.0)
                .collect(),
        }
    }
}

/// The page table at one moment.
#[derive(Clone, Debug, Default)]
pub struct PoolSnapshot {
    /// Counts up with each snapshot taken.
    pub serial: u64,
    /// When it was taken.
    pub taken_at: Option<Instant>,
    /// Token slots per block.
    pub block_size: usize,
    /// Each usable block's state (block 1 first), as `kv::BlockState` codes.
    pub states: Vec<u8>,
    /// The same for the window group's pool (the sliding-window layers' blocks), when the model
    /// has one (`kv::window`).
    pub window_states: Option<Vec<u8>>,
    /// Positions a sliding layer's query sees, with a window group.
    pub window_tokens: Option<usize>,
    /// Running sequences, then waiting ones.
    pub seqs: Vec<SeqView>,
    /// The GPU's (used, total) bytes, when the model runs on one.
    pub gpu_memory: Option<(u64, u64)>,
}

impl PoolSnapshot {
    /// The scheduler's page table now, and the memory of the device the model runs on.
    pub fn take(scheduler: &Scheduler, device: &Device, serial: u64) -> Self {
        let mut states = Vec::new();
        scheduler.kv().pool().states_into(&mut states);
        let window_states = scheduler.kv().window_pool().map(|pool| {
            let mut states = Vec::new();
            pool.states_into(&mut states);
            states
        });
        let seqs = scheduler
            .running()
            .iter()
            .chain(scheduler.waiting())
            .map(SeqView::of)
            .collect();
        PoolSnapshot {
            serial,
            taken_at: Some(Instant::now()),
            block_size: scheduler.kv().block_size(),
            states,
            window_states,
            window_tokens: scheduler.kv().window().map(|w| w.window),
            seqs,
            gpu_memory: super::device::memory_now(device),
        }
    }
}

/// The receiving side: clone one per viewer (`EngineHandle::watch_pool`).
pub type PoolWatch = watch::Receiver<Arc<PoolSnapshot>>;

/// The engine thread's side.
pub(super) struct Publisher {
    tx: watch::Sender<Arc<PoolSnapshot>>,
    last: Option<Instant>,
    serial: u64,
    /// The engine went idle before [`PERIOD`] had passed: its idle pool is still to publish.
    idle_pending: bool,
}

impl Publisher {
    /// A publisher and the receiver viewers are cloned from (it does not count as a viewer).
    pub fn new() -> (Self, PoolWatch) {
        let (tx, rx) = watch::channel(Arc::new(PoolSnapshot::default()));
        let publisher = Publisher {
            tx,
            last: None,
            serial: 0,
            idle_pending: false,
        };
        (publisher, rx)
    }

    /// Publishes the page table if a viewer watches and [`PERIOD`] has passed. When the engine is
    /// `going_idle` sooner, the idle pool waits for [`Self::idle_wait`]: publishing it at once
    /// would replace the last busy snapshot before a viewer reads it, and under requests that
    /// come and go faster than the period the page would show an empty pool most of the time.
    pub fn after_step(&mut self, scheduler: &Scheduler, device: &Device, going_idle: bool) {
        // The prototype receiver is one; any more are viewers.
        if self.tx.receiver_count() <= 1 {
            self.idle_pending = false;
            return;
        }
        if self.last.is_none_or(|t| t.elapsed() >= PERIOD) {
            self.publish(scheduler, device);
        } else {
            self.idle_pending = going_idle;
        }
    }

    /// How long the idle engine may wait for work before it must publish its idle pool
    /// ([`Self::publish_now`]); `None` when nothing is pending.
    pub fn idle_wait(&self) -> Option<Duration> {
        let last = self.last?;
        self.idle_pending
            .then(|| PERIOD.saturating_sub(last.elapsed()))
    }

    /// Publishes the page table now if a viewer watches (a new viewer's first frame, or the idle
    /// pool once [`Self::idle_wait`] has passed).
    pub fn publish_now(&mut self, scheduler: &Scheduler, device: &Device) {
        if self.tx.receiver_count() > 1 {
            self.publish(scheduler, device);
        }
    }

    fn publish(&mut self, scheduler: &Scheduler, device: &Device) {
        self.idle_pending = false;
        self.serial += 1;
        self.last = Some(Instant::now());
        self.tx
            .send_replace(Arc::new(PoolSnapshot::take(scheduler, device, self.serial)));
    }
}
