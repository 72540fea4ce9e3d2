//! Which decode steps share a CUDA graph (src/cuda_graphs.rs captures and replays them): batch-size
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

/// The context bounds captured unless `PAGEWISE_GRAPH_CONTEXTS` says otherwise: at batch 1 they
/// took the 1B shape from 810 to 829 tok/s (benches/RESULTS.md) for three times the graphs.
pub const DEFAULT_CONTEXT_BOUNDS: [usize; 2] = [1024, 4096];

/// Context bounds from `PAGEWISE_GRAPH_CONTEXTS` (lengths separated by spaces or commas, e.g.
/// "1024 4096", or "none" for one graph per batch bucket); [`DEFAULT_CONTEXT_BOUNDS`] when unset.
pub fn context_bounds_from_env() -> Result<Vec<usize>, String> {
    match std::env::var("PAGEWISE_GRAPH_CONTEXTS") {
        Ok(text) => parse_bounds(&text),
        Err(_) => Ok(DEFAULT_CONTEXT_BOUNDS.to_vec()),
    }
}

fn parse_bounds(text: &str) -> Result<Vec<usize>, String> {
    if text.trim() == "none" {
        return Ok(Vec::new());
    }
    text.split([' ', ','])
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<usize>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("PAGEWISE_GRAPH_CONTEXTS: {s:?} is not a positive length"))
        })
        .collect()
}

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
    fn bounds_parse_or_fail_clearly() {
        assert_eq!(parse_bounds(""), Ok(vec![]));
        assert_eq!(parse_bounds(" none "), Ok(vec![]));
        assert_eq!(parse_bounds("1024 4096"), Ok(vec![1024, 4096]));
        assert_eq!(parse_bounds("1024,4096"), Ok(vec![1024, 4096]));
        let err = parse_bounds("1024 lots").unwrap_err();
        assert!(err.contains("\"lots\""), "{err}");
        assert!(parse_bounds("0").is_err());
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
