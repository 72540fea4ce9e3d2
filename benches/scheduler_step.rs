//! One `schedule()` + `update()` step with 256 running sequences of 1k-4k tokens (all decoding),
//! prefix caching on, 16-token blocks: the engine's per-step CPU cost outside the model.
//!
//! `cargo bench --bench scheduler_step`. Target (issue 2): under 50 µs per step on the 2-core CI
//! machine. Results go in benches/RESULTS.md.

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use pagewise::sampler::SeededRng;
use pagewise::scheduler::SeqUpdate;
use pagewise::{SamplingParams, Scheduler, SchedulerConfig, SchedulerOutput, SeqId, Sequence};

const NUM_SEQS: usize = 256;
/// Steps timed on one copy of the prepared state before it is refreshed (keeps lengths in 1k-4k).
const STEPS_PER_COPY: u64 = 64;

/// A scheduler with 256 sequences of 1k-4k tokens, all past prefill and decoding.
fn decoding_scheduler() -> Scheduler {
    let block_size = 16;
    let max_len = 4096 + 4096;
    let mut s = Scheduler::new(SchedulerConfig {
        max_num_seqs: NUM_SEQS,
        max_num_batched_tokens: 16_384,
        max_model_len: max_len,
        block_size,
        num_blocks: NUM_SEQS * max_len / block_size + 1,
        enable_prefix_caching: true,
        window: None,
    });
    let params = Arc::new(SamplingParams {
        max_tokens: 4096,
        ignore_eos: true,
        ..Default::default()
    });
    let eos: Arc<[u32]> = Arc::from(vec![2u32]);
    let mut rng = SeededRng::new(0, 0);
    for i in 0..NUM_SEQS {
        let len = 1024 + (rng.next_u64() % 3073) as usize;
        let prompt: Vec<u32> = (0..len)
            .map(|_| (rng.next_u64() % 50_000) as u32 + 3)
            .collect();
        let seq = Sequence::new(
            SeqId(i as u64),
            prompt,
            params.clone(),
            eos.clone(),
            None,
            0,
        );
        s.add(seq).expect("fits");
    }
    let mut out = SchedulerOutput::default();
    let mut updates = Vec::new();
    while s.running().len() < NUM_SEQS || s.running().iter().any(|q| q.num_pending_tokens() > 1) {
        step(&mut s, &mut out, &mut updates);
    }
    s
}

fn step(s: &mut Scheduler, out: &mut SchedulerOutput, updates: &mut Vec<SeqUpdate>) {
    s.schedule_into(out);
    let sampled = vec![7u32; out.num_sampling()];
    s.update_into(out, &sampled, &[], updates);
}

fn bench(c: &mut Criterion) {
    let prepared = decoding_scheduler();
    c.bench_function("schedule+update, 256 decoding seqs of 1k-4k tokens", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut out = SchedulerOutput::default();
            let mut updates = Vec::with_capacity(NUM_SEQS);
            let mut left = iters;
            while left > 0 {
                let n = left.min(STEPS_PER_COPY);
                let mut s = prepared.clone();
                step(&mut s, &mut out, &mut updates); // warm the reused buffers
                let start = Instant::now();
                for _ in 0..n {
                    step(&mut s, &mut out, &mut updates);
                }
                total += start.elapsed();
                assert_eq!(out.seqs.len(), NUM_SEQS);
                left -= n;
            }
            total
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
