//! Property tests of the scheduler and the page table manager together, driven by a fake model over a
//! fake paged KV cache: random arrivals, prompt and output lengths, shared prefixes, tiny caches
//! (forcing preemption), small token budgets (forcing chunked prefill) and random aborts. After every
//! step: budgets hold, ref counts equal the blocks held by live tables, nothing leaks, no step is
//! empty while work remains; at the end every block is free and every surviving request produced
//! exactly what it produces alone.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use common::fake_model::{self, EOS, FakeModel, VOCAB};
use pagewise::kv::{BlockId, BlockState, WindowConfig};
use pagewise::sampler::SeededRng;
use pagewise::sequence::SeqStatus;
use pagewise::{SamplingParams, Scheduler, SchedulerConfig, SeqId, Sequence};
use proptest::prelude::*;

#[derive(Clone, Debug)]
struct Req {
    arrival_step: usize,
    prefix: usize,
    tail: Vec<u32>,
    max_tokens: usize,
    abort_at: Option<usize>,
    salt: Option<&'static str>,
}

#[derive(Clone, Debug)]
struct Case {
    block_size: usize,
    num_blocks: usize,
    budget: usize,
    max_num_seqs: usize,
    prefix_caching: bool,
    /// Sliding-window layers: (window, blocks of the window group beyond the fewest a step needs).
    window: Option<(usize, usize)>,
    prefixes: Vec<Vec<u32>>,
    reqs: Vec<Req>,
    /// Speculative decoding: (drafts per step at most, seed of the drafts' accepted lengths).
    spec: Option<(usize, u64)>,
}

fn token() -> impl Strategy<Value = u32> {
    1..VOCAB
}

fn req() -> impl Strategy<Value = Req> {
    (
        0..40usize,
        0..3usize,
        prop::collection::vec(token(), 1..24),
        1..24usize,
        prop::option::weighted(0.15, 0..60usize),
        prop::option::weighted(0.2, Just("salt")),
    )
        .prop_map(
            |(arrival_step, prefix, tail, max_tokens, abort_at, salt)| Req {
                arrival_step,
                prefix,
                tail,
                max_tokens,
                abort_at,
                salt,
            },
        )
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::sample::select(vec![8usize, 16]),
        3..24usize,
        prop::sample::select(vec![1usize, 7, 16, 64, 256]),
        1..8usize,
        any::<bool>(),
        prop::option::weighted(0.5, (1..20usize, 0..12usize)),
        prop::collection::vec(prop::collection::vec(token(), 0..40), 3),
        prop::collection::vec(req(), 1..12),
        prop::option::weighted(0.5, (1..6usize, any::<u64>())),
    )
        .prop_map(
            |(
                block_size,
                num_blocks,
                budget,
                max_num_seqs,
                prefix_caching,
                window,
                prefixes,
                reqs,
                spec,
            )| Case {
                block_size,
                num_blocks,
                budget,
                max_num_seqs,
                prefix_caching,
                window,
                prefixes,
                reqs,
                spec,
            },
        )
}

/// Gives each decoding sequence a draft of random length whose first tokens, a random number
/// of them, are the fake model's true continuation and the rest wrong, within `max_tokens`.
fn set_drafts(s: &mut Scheduler, k: usize, rng: &mut SeededRng) {
    for q in s.running_mut() {
        let left = q.params.max_tokens - q.num_output_tokens();
        if q.num_pending_tokens() != 1 || left < 2 {
            q.set_spec_tokens(&[]);
            continue;
        }
        let len = 1 + (rng.next_u64() as usize) % k.min(left - 1);
        let right = (rng.next_u64() as usize) % (len + 1);
        let mut context = q.token_ids().to_vec();
        let mut draft = Vec::new();
        for i in 0..len {
            let t = fake_model::next_token(&context);
            let t = if i < right { t } else { (t + 1) % VOCAB };
            context.push(t);
            draft.push(t);
        }
        q.set_spec_tokens(&draft);
    }
}

/// After an update: each running table covers its computed tokens and no block past its tokens
/// (the blocks only rejected drafts reached were given back).
fn check_rolled_back(s: &Scheduler) {
    let bs = s.config().block_size;
    for q in s.running() {
        let blocks = q.block_table.len();
        assert!(blocks >= q.num_computed_tokens().div_ceil(bs));
        assert!(
            blocks <= q.num_tokens().div_ceil(bs),
            "{:?} holds {blocks} blocks for {} tokens",
            q.id,
            q.num_tokens()
        );
    }
}

fn check_invariants(s: &Scheduler) {
    let pool = s.kv().pool();
    let held: usize = s.running().iter().map(|q| q.block_table.len()).sum();
    assert_eq!(
        pool.total_refs(),
        held as u64,
        "ref counts == blocks held by live tables"
    );
    let distinct: HashSet<_> = s
        .running()
        .iter()
        .flat_map(|q| q.block_table.blocks().to_vec())
        .collect();
    assert_eq!(
        pool.num_free() + distinct.len(),
        pool.num_usable(),
        "no block leaked"
    );
    // The live view's states (kept incrementally) agree with the ref counts and the free list.
    let mut states = Vec::new();
    pool.states_into(&mut states);
    let mut cached_free = 0;
    for (i, &state) in states.iter().enumerate() {
        let id = BlockId(i as u32 + 1);
        let want = match pool.ref_count(id) {
            0 => state == BlockState::Free as u8 || state == BlockState::Cached as u8,
            1 => state == BlockState::Used as u8,
            _ => state == BlockState::Shared as u8,
        };
        assert!(
            want,
            "block {}: state {state}, ref count {}",
            id.0,
            pool.ref_count(id)
        );
        assert_eq!(pool.is_free(id), pool.ref_count(id) == 0);
        cached_free += usize::from(state == BlockState::Cached as u8);
    }
    assert!(
        cached_free <= pool.num_cached(),
        "a cached free block is a registered one"
    );
    if let Some(wpool) = s.kv().window_pool() {
        let live = |q: &Sequence| -> Vec<BlockId> {
            let w = q.block_table.window_blocks();
            assert_eq!(w.len(), q.block_table.len(), "one window entry per block");
            w.iter().copied().filter(|b| b.0 != 0).collect()
        };
        let held: usize = s.running().iter().map(|q| live(q).len()).sum();
        assert_eq!(wpool.total_refs(), held as u64, "window ref counts");
        let distinct: HashSet<_> = s.running().iter().flat_map(live).collect();
        assert_eq!(
            wpool.num_free() + distinct.len(),
            wpool.num_usable(),
            "no window block leaked"
        );
    }
    for q in s.running() {
        assert_eq!(q.status, SeqStatus::Running);
        assert!(q.block_table.len() * s.config().block_size >= q.num_computed_tokens());
    }
    for q in s.waiting() {
        assert_eq!(q.status, SeqStatus::Waiting);
        assert!(
            q.block_table.is_empty(),
            "a waiting sequence holds no blocks"
        );
        assert_eq!(q.num_computed_tokens(), 0, "preempted by recompute");
    }
}

/// Counts of what a run exercised.
#[derive(Debug, Default)]
struct Seen {
    steps: usize,
    preemptions: u64,
    prefix_hit_tokens: u64,
    chunked_prefills: usize,
    drafts: usize,
    accepted: usize,
}

/// A window group of `extra` blocks more than one sequence's largest step needs (its window
/// before the step, plus the step's tokens), the null block included.
fn window_blocks(case: &Case, window: usize, extra: usize) -> usize {
    (window - 1 + case.budget).div_ceil(case.block_size) + 2 + extra
}

fn run(case: &Case) -> Seen {
    let config = SchedulerConfig {
        max_num_seqs: case.max_num_seqs,
        max_num_batched_tokens: case.budget,
        max_model_len: 4096,
        block_size: case.block_size,
        num_blocks: case.num_blocks,
        enable_prefix_caching: case.prefix_caching,
        window: case.window.map(|(window, extra)| WindowConfig {
            window,
            num_blocks: window_blocks(case, window, extra),
        }),
    };
    let capacity = (case.num_blocks - 1) * case.block_size;
    let mut s = Scheduler::new(config.clone());
    let mut model = match config.window {
        Some(w) => FakeModel::with_window(case.num_blocks, case.block_size, w.window, w.num_blocks),
        None => FakeModel::new(case.num_blocks, case.block_size),
    };
    let eos: Arc<[u32]> = Arc::from(vec![EOS]);
    let prompts: Vec<Vec<u32>> = case
        .reqs
        .iter()
        .map(|r| [case.prefixes[r.prefix].clone(), r.tail.clone()].concat())
        .collect();
    let mut outputs: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut accepted = HashSet::new();
    let mut aborted = HashSet::new();
    let last_arrival = case.reqs.iter().map(|r| r.arrival_step).max().unwrap_or(0);

    let mut seen = Seen::default();
    let mut draft_rng = SeededRng::new(case.spec.map_or(0, |(_, seed)| seed), 0);
    let max_steps = 20_000;
    let mut step = 0;
    loop {
        for (i, r) in case.reqs.iter().enumerate() {
            if r.arrival_step == step {
                let params = Arc::new(SamplingParams {
                    max_tokens: r.max_tokens,
                    ..Default::default()
                });
                let seq = Sequence::new(
                    SeqId(i as u64),
                    prompts[i].clone(),
                    params,
                    eos.clone(),
                    r.salt,
                    0,
                );
                let fits = prompts[i].len() + r.max_tokens <= capacity;
                assert_eq!(
                    s.add(seq).is_ok(),
                    fits,
                    "refused exactly when it can never fit"
                );
                if fits {
                    accepted.insert(i as u64);
                }
            }
            if r.abort_at == Some(step) && s.abort(SeqId(i as u64)) {
                aborted.insert(i as u64);
                check_invariants(&s);
            }
        }
        if !s.has_unfinished() && step >= last_arrival {
            break;
        }
        assert!(step < max_steps, "no progress after {max_steps} steps");
        step += 1;
        if !s.has_unfinished() {
            continue;
        }

        if let Some((k, _)) = case.spec {
            set_drafts(&mut s, k, &mut draft_rng);
        }
        let out = s.schedule();
        seen.drafts += out.num_draft_tokens();
        seen.steps += 1;
        seen.chunked_prefills += out.seqs.iter().filter(|q| !q.samples).count();
        assert!(!out.is_empty(), "work remains but nothing was scheduled");
        assert!(out.num_batched_tokens() <= case.budget);
        assert!(out.seqs.len() <= case.max_num_seqs);
        check_invariants(&s);
        let (sampled, emitted) = model.execute_verify(&out);
        let mut updates = Vec::new();
        s.update_into(&out, &sampled, &emitted, &mut updates);
        let mut tokens = sampled.iter();
        for (u, &n) in updates.iter().zip(&emitted) {
            let mine: Vec<u32> = tokens.by_ref().take(n).copied().collect();
            seen.accepted += u.num_accepted;
            assert_eq!(mine[u.num_accepted], u.token_id);
            outputs
                .entry(u.seq_id.0)
                .or_default()
                .extend_from_slice(&mine[..=u.num_accepted]);
        }
        check_invariants(&s);
        check_rolled_back(&s);
        for q in s.waiting().filter(|q| out.preempted.contains(&q.id)) {
            let produced = outputs.get(&q.id.0).map_or(0, Vec::len);
            assert_eq!(
                q.num_tokens(),
                q.num_prompt_tokens() + produced,
                "a preempted sequence keeps its tokens"
            );
        }
    }

    let pool = s.kv().pool();
    assert_eq!(
        pool.num_free(),
        pool.num_usable(),
        "every block is free at the end"
    );
    assert_eq!(pool.total_refs(), 0);
    if let Some(wpool) = s.kv().window_pool() {
        assert_eq!(wpool.num_free(), wpool.num_usable(), "window group freed");
    }
    for &id in accepted.difference(&aborted) {
        let r = &case.reqs[id as usize];
        let expected = fake_model::reference(&prompts[id as usize], r.max_tokens);
        assert_eq!(
            outputs.get(&id).cloned().unwrap_or_default(),
            expected,
            "request {id}"
        );
    }
    seen.preemptions = s.num_preemptions_total();
    seen.prefix_hit_tokens = s.kv().prefix_cache_stats().num_hit_tokens;
    seen
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn scheduler_and_page_table_survive_random_workloads(case in case()) {
        run(&case);
    }
}

/// A long, deterministic workload on a cache too small for it: many preemptions, many prefix hits.
fn heavy_contention(window: Option<(usize, usize)>) -> Case {
    let prefix: Vec<u32> = (1..=40).map(|t| t % (VOCAB - 1) + 1).collect();
    let reqs: Vec<Req> = (0..48)
        .map(|i| Req {
            arrival_step: i % 7,
            prefix: i % 3,
            tail: (0..(1 + i * 7 % 23))
                .map(|t| (t as u32 * 13 + i as u32) % (VOCAB - 1) + 1)
                .collect(),
            max_tokens: 8 + i * 5 % 40,
            abort_at: (i % 11 == 0).then_some(i + 3),
            salt: None,
        })
        .collect();
    Case {
        block_size: 8,
        num_blocks: 40,
        budget: 48,
        max_num_seqs: 16,
        prefix_caching: true,
        window,
        prefixes: vec![prefix.clone(), prefix[..20].to_vec(), vec![]],
        reqs,
        spec: None,
    }
}

#[test]
fn heavy_contention_simulation_matches_solo_runs() {
    let seen = run(&heavy_contention(None));
    eprintln!("{seen:?}");
    assert!(seen.preemptions > 10, "{seen:?}");
    assert!(seen.prefix_hit_tokens > 200, "{seen:?}");
    assert!(seen.chunked_prefills > 10, "{seen:?}");
}

/// The same with sliding-window layers whose own group is the scarcer one (11 blocks for a
/// 12-token window): blocks released as they leave the window, prefix hits that need the window's
/// cached blocks, and preemptions when the window group runs out.
#[test]
fn heavy_contention_with_a_window_group_matches_solo_runs() {
    let seen = run(&heavy_contention(Some((12, 2))));
    eprintln!("{seen:?}");
    assert!(seen.preemptions > 10, "{seen:?}");
    assert!(seen.prefix_hit_tokens > 100, "{seen:?}");
    assert!(seen.chunked_prefills > 10, "{seen:?}");
}

/// The same with draft tokens of random lengths, partly right: accepted drafts keep their KV,
/// rejected ones' blocks are given back, and every request still produces what it produces
/// alone.
#[test]
fn heavy_contention_with_speculation_matches_solo_runs() {
    for window in [None, Some((12, 2))] {
        let seen = run(&Case {
            spec: Some((4, 17)),
            ..heavy_contention(window)
        });
        eprintln!("{seen:?}");
        assert!(seen.preemptions > 10, "{seen:?}");
        assert!(seen.drafts > 200 && seen.accepted > 100, "{seen:?}");
        assert!(seen.accepted < seen.drafts, "{seen:?}");
    }
}
