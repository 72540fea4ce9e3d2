//! How decode attention splits a context across blocks. The kernel runs one block per (query
//! row, KV head, split); all blocks of a launch do about the same work, so they finish in waves of
//! `slots` (the blocks that fit on the whole GPU at once). A plan picks the split count that
//! minimizes waves × (positions per block in whole tiles + a block's start-up), with a small charge
//! for the merge kernel that a split context needs; of counts that cost the same, the fewest.

use std::sync::atomic::{AtomicUsize, Ordering};

use candle_core::{DType, Result};

use crate::{check_launch, dtype_code, ffi};

/// Fewest context positions worth a split of their own. The kernels never split a context this
/// short, whatever the plan (decode_common.cuh's `kWholeContext`): a short sequence's attention
/// sums in one order in every step, eager or graph-replayed, alone or batched.
pub const MIN_CHUNK: usize = 128;
/// Most splits of one context (bounds the partials' workspace; the merge kernel takes up to this).
pub(crate) const MAX_SPLITS: usize = 512;
/// Context positions a block streams per tile (the tensor-core kernel's; the CUDA-core kernel's 32
/// divide it). A block's time goes by its tiles, each a trip through its stage ring, more than by
/// the positions in them, so the plan counts tiles. (The kernels do not round a row's chunk up to
/// whole tiles: where a block streams many tiles, its bytes count.) Figures: benches/history/
/// tried.md, "Split plans by tiles".
const TILE: usize = 64;
/// A block's start-up (block-table reads, the first tile's round trip), in context positions.
const BLOCK_OVERHEAD: usize = 128;
/// The merge kernel's cost (writing and reading the partials, one more launch), as a share.
const MERGE_COST: f64 = 0.05;

/// How many splits of the context each (sequence, KV head) gets and the positions per split,
/// for `seqs` query rows over `kv_heads` KV heads and contexts up to `max_context_len`, on a GPU
/// that runs `slots` blocks at once (see [`decode_slots`]).
pub fn split_plan(
    seqs: usize,
    kv_heads: usize,
    max_context_len: usize,
    slots: usize,
) -> (usize, usize) {
    let splits = choose_splits(seqs * kv_heads, max_context_len, slots);
    (splits, max_context_len.div_ceil(splits).max(1))
}

/// The split plan of a CUDA graph, captured once and replayed over contexts up to
/// `max_context_len`: the split count for the longest context, and one tensor-core tile of
/// `head_dim` ([`decode_tile_rows`]) as the floor of each row's chunk, so a row spreads its own
/// context over the splits (the kernel takes `max(chunk, ceil(context / splits))`) and the splits
/// past it return at once. A floor of one tile rather than `MIN_CHUNK`: a context past
/// `MIN_CHUNK` (shorter ones stay whole) spreads over the splits in one or two tiles a block
/// instead of up to `MIN_CHUNK`'s worth in a row, since a batch-1 step pays for the tile loop's
/// latency, not for the splits' merge in a cluster (benches/history/tried.md, "One tile as the
/// graph split plan's floor").
pub fn graph_split_plan(
    seqs: usize,
    kv_heads: usize,
    max_context_len: usize,
    slots: usize,
    head_dim: usize,
) -> (usize, usize) {
    (
        choose_splits(seqs * kv_heads, max_context_len, slots),
        decode_tile_rows(head_dim),
    )
}

/// Context positions in one tile of the tensor-core decode kernel at `head_dim`: 16 a warp, and
/// at d256 two warps share each 16 (decode_mma.cuh's `MmaShape::kRows`).
pub fn decode_tile_rows(head_dim: usize) -> usize {
    if head_dim > 128 { 32 } else { 64 }
}

fn choose_splits(pairs: usize, context: usize, slots: usize) -> usize {
    let (pairs, context, slots) = (pairs.max(1), context.max(1), slots.max(1));
    // Past a few waves' worth of splits the cost only grows.
    let most = context
        .div_ceil(MIN_CHUNK)
        .min(MAX_SPLITS)
        .min((4 * slots).div_ceil(pairs))
        .max(1);
    let cost = |s: usize| {
        let waves = (pairs * s).div_ceil(slots) as f64;
        let merge = if s > 1 { 1.0 + MERGE_COST } else { 1.0 };
        let tiles = context.div_ceil(s).div_ceil(TILE);
        waves * (tiles * TILE + BLOCK_OVERHEAD) as f64 * merge
    };
    let mut best = 1;
    for s in 2..=most {
        if cost(s) < cost(best) {
            best = s;
        }
    }
    best
}

/// Decode blocks that run at once on the current CUDA device (multiprocessors × blocks per
/// multiprocessor, by the kernel's shared memory and registers) for `dtype`, `head_dim` and
/// `group` query heads per KV head. Queried once per combination (all GPUs of a process are
/// taken to be alike).
pub fn decode_slots(dtype: DType, head_dim: usize, group: usize) -> Result<usize> {
    static SLOTS: [AtomicUsize; 3 * 3 * 8] = [const { AtomicUsize::new(0) }; 72];
    let code = dtype_code(dtype, "decode_slots")?;
    let dim = match head_dim {
        64 => 0,
        128 => 1,
        256 => 2,
        other => candle_core::bail!("decode attention: head_dim {other} is not 64, 128 or 256"),
    };
    if !(1..=8).contains(&group) {
        candle_core::bail!("decode attention: {group} query heads per KV head (at most 8)");
    }
    let slot = &SLOTS[(code as usize * 3 + dim) * 8 + group - 1];
    let known = slot.load(Ordering::Relaxed);
    if known > 0 {
        return Ok(known);
    }
    let (mut per_sm, mut sms) = (0, 0);
    // SAFETY: writes two ints; the arguments are checked by the callee (1 when unsupported).
    let err = unsafe {
        ffi::pagewise_decode_occupancy(code, head_dim as i32, group as i32, &mut per_sm, &mut sms)
    };
    check_launch(err, "decode_slots")?;
    let slots = (per_sm.max(1) * sms.max(1)) as usize;
    slot.store(slots, Ordering::Relaxed);
    Ok(slots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_fill_one_wave_or_avoid_a_ragged_last_one() {
        // 396 slots (132 SMs x 3 blocks), the H200 at bf16 d128.
        // Batch 1 at 8k over 8 KV heads: one wave, each split 3 tiles; 43 is the fewest splits
        // of 3 tiles (49 would fit, also with 3 tiles a block).
        assert_eq!(split_plan(1, 8, 8192, 396), (43, 191));
        // Batch 8 at 8k: 64 pairs, 6 splits = 384 blocks, one wave.
        assert_eq!(split_plan(8, 8, 8192, 396).0, 6);
        // Batch 64 at 2k: 512 pairs are 1.3 waves; 3 splits make 3.9 full ones.
        assert_eq!(split_plan(64, 8, 2048, 396).0, 3);
        // Batch 256: 5.2 waves, the ragged tail is small: no split.
        assert_eq!(split_plan(256, 8, 2048, 396).0, 1);
        // Short contexts are not split below MIN_CHUNK positions.
        assert_eq!(split_plan(1, 8, 100, 396), (1, 100));
        assert_eq!(split_plan(1, 1, 300, 396).0, 3);
        // A graph's plan keeps the floor chunk.
        assert_eq!(graph_split_plan(1, 8, 8192, 396, 128), (43, 64));
        assert_eq!(graph_split_plan(1, 8, 1024, 396, 256), (8, 32));
    }

    #[test]
    fn every_plan_covers_its_context_within_the_merge_limit() {
        for seqs in [1, 2, 3, 7, 16, 64, 255, 1024] {
            for kv_heads in [1, 2, 8] {
                for ctx in [1, 15, 128, 129, 1000, 8192, 131_072, 1 << 20] {
                    for slots in [1, 132, 396, 1056] {
                        let (splits, chunk) = split_plan(seqs, kv_heads, ctx, slots);
                        assert!((1..=MAX_SPLITS).contains(&splits), "{splits} splits");
                        assert!(splits * chunk >= ctx, "{splits} x {chunk} < {ctx}");
                        assert!(ctx > MIN_CHUNK || splits == 1, "{ctx} split {splits} ways");
                        let (g, floor) = graph_split_plan(seqs, kv_heads, ctx, slots, 256);
                        assert_eq!((g, floor), (splits, decode_tile_rows(256)));
                    }
                }
            }
        }
    }
}
