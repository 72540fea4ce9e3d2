use std::sync::Arc;

use super::*;
use crate::request::SamplingParams;

fn config(num_blocks: usize, budget: usize) -> SchedulerConfig {
    SchedulerConfig {
        max_num_seqs: 8,
        max_num_batched_tokens: budget,
        max_model_len: 1024,
        block_size: 4,
        num_blocks,
        enable_prefix_caching: true,
        window: None,
    }
}

fn seq(id: u64, prompt: Vec<u32>, max_tokens: usize) -> Sequence {
    let params = SamplingParams {
        max_tokens,
        ..Default::default()
    };
    Sequence::new(
        SeqId(id),
        prompt,
        Arc::new(params),
        Arc::from(vec![0u32]),
        None,
        0,
    )
}

/// One step with every sampling sequence producing `token`.
fn step(s: &mut Scheduler, token: u32) -> (SchedulerOutput, Vec<SeqUpdate>) {
    let out = s.schedule();
    let sampled = vec![token; out.num_sampling()];
    let updates = s.update(&out, &sampled);
    (out, updates)
}

fn shape(out: &SchedulerOutput) -> Vec<(u64, usize, usize, bool)> {
    out.seqs
        .iter()
        .map(|s| {
            (
                s.seq_id.0,
                s.num_computed_tokens,
                s.num_new_tokens,
                s.samples,
            )
        })
        .collect()
}

#[test]
fn chunked_prefill_then_decode_with_decodes_first() {
    let mut s = Scheduler::new(config(64, 8));
    s.add(seq(1, (1..=20).collect(), 3)).unwrap();
    let (out, _) = step(&mut s, 7);
    assert_eq!(shape(&out), vec![(1, 0, 8, false)]);
    assert_eq!(out.positions, (0..8).collect::<Vec<u32>>());
    let (out, _) = step(&mut s, 7);
    assert_eq!(shape(&out), vec![(1, 8, 8, false)]);
    // A second request arrives: the running prefill continues first, the newcomer takes what is left.
    s.add(seq(2, (100..110).collect(), 2)).unwrap();
    let (out, updates) = step(&mut s, 7);
    assert_eq!(shape(&out), vec![(1, 16, 4, true), (2, 0, 4, false)]);
    assert_eq!(updates.len(), 1);
    assert_eq!(out.token_ids[..4], [17, 18, 19, 20]);
    // Decode of 1 first, then the rest of 2's prefill (6 tokens, under budget 8-1).
    let (out, _) = step(&mut s, 7);
    assert_eq!(shape(&out), vec![(1, 20, 1, true), (2, 4, 6, true)]);
    assert_eq!(out.token_ids[0], 7, "the sampled token is the decode input");
    let (_, updates) = step(&mut s, 7);
    let finished: Vec<_> = updates.iter().map(|u| (u.seq_id.0, u.finish)).collect();
    let length = Some(FinishReason::Length);
    assert_eq!(
        finished,
        vec![(1, length), (2, length)],
        "3 and 2 tokens generated"
    );
    assert!(!s.has_unfinished());
    assert_eq!(s.kv().pool().num_free(), s.kv().pool().num_usable());
}

#[test]
fn slot_mapping_and_block_tables_follow_the_blocks() {
    let mut s = Scheduler::new(config(64, 64));
    s.add(seq(1, (1..=6).collect(), 2)).unwrap();
    let out = s.schedule();
    let table = &out.block_tables[out.seqs[0].block_table.clone()];
    assert_eq!(table.len(), 2);
    let expected: Vec<u32> = (0..6).map(|p| table[p / 4] * 4 + (p % 4) as u32).collect();
    assert_eq!(out.slot_mapping, expected);
    assert!(table.iter().all(|&b| b != 0), "block 0 is the null block");
}

#[test]
fn prefix_cache_hit_skips_the_shared_prompt() {
    let mut s = Scheduler::new(config(64, 64));
    let prompt: Vec<u32> = (1..=13).collect();
    s.add(seq(1, prompt.clone(), 1)).unwrap();
    let (_, updates) = step(&mut s, 5);
    assert_eq!(updates[0].finish, Some(FinishReason::Length));
    // Freed, but its full blocks stay cached: 12 of 13 tokens come from cache.
    s.add(seq(2, prompt, 1)).unwrap();
    let out = s.schedule();
    assert_eq!(shape(&out), vec![(2, 12, 1, true)]);
    assert_eq!(s.running()[0].num_cached_tokens, 12);
    assert_eq!(s.kv().prefix_cache_stats().num_hit_tokens, 12);
}

#[test]
fn out_of_blocks_preempts_the_newest_and_it_resumes_by_recompute() {
    // 4 usable blocks of 4 tokens: two sequences of 7 prompt tokens fit (2 blocks each) until
    // the first needs a third block for its 9th token.
    let mut cfg = config(5, 64);
    cfg.enable_prefix_caching = false;
    let mut s = Scheduler::new(cfg);
    s.add(seq(1, (1..=7).collect(), 6)).unwrap();
    s.add(seq(2, (11..=17).collect(), 6)).unwrap();
    step(&mut s, 9); // both prefilled, token 8 sampled for each
    let (out, _) = step(&mut s, 9); // both decode position 7 (fits in block 2)
    assert_eq!(shape(&out), vec![(1, 7, 1, true), (2, 7, 1, true)]);
    let (out, _) = step(&mut s, 9); // seq 1 needs a 3rd block: seq 2 is preempted
    assert_eq!(out.preempted, vec![SeqId(2)]);
    assert_eq!(shape(&out), vec![(1, 8, 1, true)]);
    assert_eq!(s.num_waiting(), 1);
    let waiting = s.waiting().next().unwrap();
    assert_eq!(
        (waiting.num_computed_tokens(), waiting.num_tokens()),
        (0, 9)
    );
    assert!(waiting.block_table.is_empty());
    assert_eq!(s.num_preemptions_total(), 1);
    // Seq 1 runs to the end; then seq 2 recomputes all 9 tokens and samples its 3rd output token.
    while s.running().iter().any(|q| q.id == SeqId(1)) {
        step(&mut s, 9);
    }
    let (out, _) = step(&mut s, 9);
    assert_eq!(shape(&out), vec![(2, 0, 9, true)]);
    while s.has_unfinished() {
        step(&mut s, 9);
    }
    assert_eq!(s.kv().pool().num_free(), 4);
}

#[test]
fn requests_that_can_never_fit_are_refused() {
    let mut s = Scheduler::new(config(5, 64)); // 16 tokens of cache
    let err = s.add(seq(1, (1..=10).collect(), 7)).unwrap_err();
    assert!(matches!(
        err,
        ScheduleError::CacheTooSmall {
            num_tokens: 17,
            capacity_tokens: 16
        }
    ));
    let mut cfg = config(500, 64);
    cfg.max_model_len = 12;
    let mut s = Scheduler::new(cfg);
    let err = s.add(seq(1, (1..=10).collect(), 3)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "This model's maximum context length is 12 tokens. However, you requested 13 tokens \
         (10 in the messages, 3 in the completion). Please reduce the length of the messages or completion."
    );
    assert_eq!(s.add(seq(2, vec![], 3)), Err(ScheduleError::EmptyPrompt));
    assert!(!s.has_unfinished());
}

#[test]
fn abort_frees_blocks_at_once_and_max_num_seqs_caps_admission() {
    let mut cfg = config(64, 64);
    cfg.max_num_seqs = 2;
    let mut s = Scheduler::new(cfg);
    for id in 1..=3 {
        s.add(seq(id, (1..=5).map(|t| t + id as u32 * 10).collect(), 10))
            .unwrap();
    }
    let out = s.schedule();
    assert_eq!(out.seqs.len(), 2);
    s.update(&out, &[1, 1]);
    assert_eq!(s.num_waiting(), 1);
    let used = s.kv().pool().num_usable() - s.kv().pool().num_free();
    assert_eq!(used, 4);
    assert!(s.abort(SeqId(1)));
    assert!(!s.abort(SeqId(1)));
    assert_eq!(s.kv().pool().num_usable() - s.kv().pool().num_free(), 2);
    assert!(s.abort(SeqId(3)), "waiting sequences can be aborted too");
    let out = s.schedule();
    assert_eq!(shape(&out), vec![(2, 5, 1, true)]);
}
