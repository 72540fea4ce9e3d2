//! Which decode steps share a CUDA graph (`cuda_graphs.rs` captures and replays them): batch-size
//! buckets, and optional context-length buckets. Plain functions, so they are tested everywhere.

/// Batch sizes captured (those up to `max_num_seqs`, plus `max_num_seqs` itself when it lies in
/// between): sizes between two buckets pad up to the larger.
const BATCH_BUCKETS: [usize; 14] = [1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512];

/// The batch buckets for `max_num_seqs` sequences.
pub fn batch_buckets(max_num_seqs: usize) -> Vec<usize> {
    let mut b: Vec<usize> = BATCH_BUCKETS
        .iter()
        .copied()
        .filter(|&b| b <= max_num_seqs)
        .collect();
    if max_num_seqs < BATCH_BUCKETS[BATCH_BUCKETS.len() - 1] && b.last() != Some(&max_num_seqs) {
        b.push(max_num_seqs);
    }
    b
}

/// The context lengths graphs are captured for: the `bounds` below `max_seq_len` (ascending,
/// without repeats), then `max_seq_len`. Decode attention's split plan is fixed when a graph is
/// captured and made for its context bound, so with bounds a step of short contexts replays a
/// graph of few splits rather than one split for the longest context (most of whose blocks would
/// find nothing to read).
pub fn context_buckets(max_seq_len: usize, bounds: &[usize]) -> Vec<usize> {
    let mut c: Vec<usize> = bounds
        .iter()
        .copied()
        .filter(|&b| b > 0 && b < max_seq_len)
        .collect();
    c.sort_unstable();
    c.dedup();
    c.push(max_seq_len);
    c
}

/// The context bounds captured below the longest context: a short context then replays a graph
/// whose split plan fits it, for three times the graphs (benches/history/tried.md, "Graph
/// context bounds").
pub const CONTEXT_BOUNDS: [usize; 2] = [1024, 4096];

/// The index of the smallest of `buckets` (ascending) that holds `n`.
pub fn smallest_holding(buckets: &[usize], n: usize) -> Option<usize> {
    buckets.iter().position(|&b| b >= n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_buckets_stop_at_max_num_seqs() {
        assert_eq!(batch_buckets(1), vec![1]);
        assert_eq!(batch_buckets(6), vec![1, 2, 4, 6]);
        assert_eq!(batch_buckets(256).last(), Some(&256));
        assert_eq!(batch_buckets(300).last(), Some(&300));
        assert_eq!(batch_buckets(4096).last(), Some(&512));
    }

    #[test]
    fn context_buckets_end_at_the_longest_context() {
        assert_eq!(context_buckets(8192, &[]), vec![8192]);
        assert_eq!(
            context_buckets(8192, &[4096, 1024, 1024]),
            vec![1024, 4096, 8192]
        );
        // Bounds at or past the longest context add nothing.
        assert_eq!(context_buckets(2048, &[1024, 2048, 9000]), vec![1024, 2048]);
    }

    #[test]
    fn a_step_takes_the_smallest_bucket_that_holds_it() {
        let contexts = context_buckets(8192, &[1024]);
        assert_eq!(smallest_holding(&contexts, 1), Some(0));
        assert_eq!(smallest_holding(&contexts, 1024), Some(0));
        assert_eq!(smallest_holding(&contexts, 1025), Some(1));
        assert_eq!(smallest_holding(&contexts, 8193), None);
        assert_eq!(smallest_holding(&batch_buckets(256), 3), Some(2));
    }
}
