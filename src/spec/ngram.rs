//! The n-gram proposer (prompt lookup): the sequence's last `n` tokens are looked up among its
//! earlier tokens, prompt and output alike, longest `n` first; the tokens that followed the
//! latest earlier occurrence are the guess. It costs no model: text that copies from its
//! context (edits, summaries, retrieval answers, code) is guessed for free, and a miss leaves
//! the step a plain decode.

/// The n-gram proposer's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NgramConfig {
    /// Draft tokens per step, at most.
    pub num_speculative_tokens: usize,
    /// The shortest suffix looked up.
    pub min: usize,
    /// The longest suffix looked up (tried first).
    pub max: usize,
}

impl NgramConfig {
    /// Writes into `draft` (cleared first) the guess after `tokens`, at most `limit` tokens (and
    /// at most `num_speculative_tokens`): what followed the latest earlier occurrence of the
    /// longest suffix of `tokens` that occurs earlier, from `max` tokens down to `min`, copied on
    /// as if the text went on repeating (so a loop of period p is guessed in full, not only up
    /// to its end). Empty when no suffix occurs earlier.
    pub fn propose(&self, tokens: &[u32], limit: usize, draft: &mut Vec<u32>) {
        draft.clear();
        let k = self.num_speculative_tokens.min(limit);
        let len = tokens.len();
        if k == 0 {
            return;
        }
        for n in (self.min..=self.max.min(len.saturating_sub(1))).rev() {
            let suffix = &tokens[len - n..];
            let found = (0..len - n)
                .rev()
                .find(|&start| &tokens[start..start + n] == suffix);
            if let Some(start) = found {
                for i in start + n..start + n + k {
                    let t = match tokens.get(i) {
                        Some(&t) => t,
                        None => draft[i - len],
                    };
                    draft.push(t);
                }
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ngram(k: usize, min: usize, max: usize) -> NgramConfig {
        NgramConfig {
            num_speculative_tokens: k,
            min,
            max,
        }
    }

    fn propose(p: &NgramConfig, tokens: &[u32], limit: usize) -> Vec<u32> {
        let mut draft = vec![99];
        p.propose(tokens, limit, &mut draft);
        draft
    }

    #[test]
    fn proposes_what_followed_the_latest_longest_match() {
        let p = ngram(3, 1, 3);
        // "1 2 3" occurred at 0 and 5; the latest occurrence (5) is followed by 9 8.
        let t = [1, 2, 3, 4, 5, 1, 2, 3, 9, 8, 1, 2, 3];
        assert_eq!(propose(&p, &t, 10), [9, 8, 1]);
        assert_eq!(propose(&p, &t, 2), [9, 8]);
        // Only a 1-gram matches: 7 last occurred before 6.
        let t = [7, 6, 5, 4, 7];
        assert_eq!(propose(&p, &t, 10), [6, 5, 4]);
        // min 2 will not take that 1-gram.
        assert_eq!(propose(&ngram(3, 2, 3), &t, 10), [] as [u32; 0]);
        // Nothing earlier, or too short to look up.
        assert_eq!(propose(&p, &[1, 2, 3], 10), [] as [u32; 0]);
        assert_eq!(propose(&p, &[1], 10), [] as [u32; 0]);
        // Loops are guessed on past their end: a run, and a period of 2.
        assert_eq!(propose(&p, &[5, 5, 5, 5], 10), [5, 5, 5]);
        assert_eq!(
            propose(&ngram(5, 1, 3), &[1, 2, 3, 4, 3, 4], 10),
            [3, 4, 3, 4, 3]
        );
    }

    #[test]
    fn longer_matches_win_over_later_shorter_ones() {
        let p = ngram(2, 1, 2);
        // The 2-gram "1 2" occurred at 0 (then 3); the 1-gram "2" occurred later at 4 (then 6).
        let t = [1, 2, 3, 0, 2, 6, 1, 2];
        assert_eq!(propose(&p, &t, 10), [3, 0]);
    }
}
