//! In-place edits of one logits row before a token is chosen: logit bias, OpenAI presence/frequency
//! penalties, the repetition penalty, and suppression of tokens that may not be sampled yet.

/// Adds each `(token, bias)` to the row; ids outside the vocabulary are ignored (validated earlier).
pub fn apply_logit_bias(row: &mut [f32], bias: &[(u32, f32)]) {
    for &(token, b) in bias {
        if let Some(x) = row.get_mut(token as usize) {
            *x += b;
        }
    }
}

/// OpenAI's penalties over the generated tokens and the multiplicative repetition penalty over
/// prompt and generated tokens, as vLLM applies them. `scratch` is reused between calls.
pub fn apply_penalties(
    row: &mut [f32],
    presence: f32,
    frequency: f32,
    repetition: f32,
    prompt: &[u32],
    output: &[u32],
    scratch: &mut Vec<u32>,
) {
    if repetition != 1.0 {
        scratch.clear();
        scratch.extend_from_slice(prompt);
        scratch.extend_from_slice(output);
        scratch.sort_unstable();
        scratch.dedup();
        for &t in scratch.iter() {
            if let Some(x) = row.get_mut(t as usize) {
                *x = if *x > 0.0 {
                    *x / repetition
                } else {
                    *x * repetition
                };
            }
        }
    }
    if presence != 0.0 || frequency != 0.0 {
        scratch.clear();
        scratch.extend_from_slice(output);
        scratch.sort_unstable();
        for run in scratch.chunk_by(|a, b| a == b) {
            if let Some(x) = row.get_mut(run[0] as usize) {
                *x -= frequency * run.len() as f32 + presence;
            }
        }
    }
}

/// Makes the given tokens impossible to sample (EOS and stop token ids before `min_tokens`).
pub fn suppress(row: &mut [f32], tokens: &[u32]) {
    for &t in tokens {
        if let Some(x) = row.get_mut(t as usize) {
            *x = f32::NEG_INFINITY;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bias_adds_and_ignores_out_of_range() {
        let mut row = vec![0.0, 1.0, 2.0];
        apply_logit_bias(&mut row, &[(0, 5.0), (2, -1.0), (9, 3.0)]);
        assert_eq!(row, vec![5.0, 1.0, 1.0]);
    }

    #[test]
    fn presence_and_frequency_count_output_only() {
        let mut row = vec![1.0; 4];
        let mut s = Vec::new();
        apply_penalties(&mut row, 0.5, 0.25, 1.0, &[3, 3], &[1, 2, 1, 1], &mut s);
        assert_eq!(row, vec![1.0, 1.0 - 0.75 - 0.5, 1.0 - 0.25 - 0.5, 1.0]);
    }

    #[test]
    fn repetition_divides_positive_and_multiplies_negative_once_per_token() {
        let mut row = vec![2.0, -2.0, 2.0, 2.0];
        let mut s = Vec::new();
        apply_penalties(&mut row, 0.0, 0.0, 2.0, &[0, 1, 0], &[1, 2], &mut s);
        assert_eq!(row, vec![1.0, -4.0, 1.0, 2.0]);
    }

    #[test]
    fn suppressed_tokens_become_impossible() {
        let mut row = vec![1.0, 2.0];
        suppress(&mut row, &[1, 7]);
        assert_eq!(row, vec![1.0, f32::NEG_INFINITY]);
    }
}
