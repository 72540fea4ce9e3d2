//! How many draft tokens a step verifies, chosen from what the engine measures: speculation is
//! turned down where it does not pay (large batches on a GPU, where a step's cost grows with its
//! tokens; a CPU, where every extra row costs compute; guesses that are seldom right) and up
//! where it does.
//!
//! For a step of `d` decoding sequences, `k` drafts each, the expected tokens a sequence emits
//! are `1 + a_1 + a_1 a_2 + ... + a_1 ... a_k`, with `a_i` the measured rate at which draft `i`
//! is accepted when the drafts before it were; the step costs `T(d (1 + k))`, the measured time
//! of steps of that many tokens, plus `k` times the measured time of one proposing pass (a draft
//! model's or an EAGLE head's; nothing for n-gram lookup). The tuner picks the `k` (up to the configured number) with the
//! most expected tokens a second. Sizes never measured are estimated from the nearest measured
//! ones, in speculation's favour (so they get tried and measured), and one choice in
//! [`EXPLORE_EVERY`] tries another `k`, in turn, so the table stays current. While the best is
//! no speculation, the tries come ever more rarely (the gap doubles, up to
//! [`MAX_EXPLORE_EVERY`]): a draft model's first pass after a pause reads everything it missed.

use std::collections::BTreeMap;

/// One choice in this many tries another draft length, in turn, instead of the best.
pub const EXPLORE_EVERY: u64 = 32;

/// The widest gap between tries while speculation does not pay.
pub const MAX_EXPLORE_EVERY: u64 = 4096;

/// Weight of the past in the running averages (about the last 50 observations count).
const DECAY: f64 = 0.98;

/// Running measurements of step cost and acceptance.
#[derive(Clone, Debug)]
pub struct SpecTuner {
    max_k: usize,
    /// Per draft position: (times it was verified, times it was accepted), decayed.
    accept: Vec<(f64, f64)>,
    /// Mean step seconds by step size bucket ([`bucket`]).
    cost: BTreeMap<usize, f64>,
    /// Mean seconds of proposing, per draft token of the longest draft.
    pass: Option<f64>,
    choices: u64,
    /// The choice that tries another length next, the gap to the one after, and tries so far.
    next_try: u64,
    gap: u64,
    tries: usize,
}

/// Step sizes of up to 64 tokens are told apart; past that, powers of two.
fn bucket(tokens: usize) -> usize {
    match tokens {
        0..=64 => tokens,
        n => n.next_power_of_two(),
    }
}

impl SpecTuner {
    /// A tuner of up to `max_k` drafts a sequence.
    pub fn new(max_k: usize) -> Self {
        SpecTuner {
            max_k,
            accept: vec![(0.0, 0.0); max_k],
            cost: BTreeMap::new(),
            pass: None,
            choices: 0,
            next_try: EXPLORE_EVERY,
            gap: EXPLORE_EVERY,
            tries: 0,
        }
    }

    /// A step of `tokens` tokens took `seconds`.
    pub fn record_step(&mut self, tokens: usize, seconds: f64) {
        if tokens == 0 {
            return;
        }
        self.cost
            .entry(bucket(tokens))
            .and_modify(|t| *t = DECAY * *t + (1.0 - DECAY) * seconds)
            .or_insert(seconds);
    }

    /// Proposing drafts of up to `k` tokens took `seconds`.
    pub fn record_draft(&mut self, k: usize, seconds: f64) {
        if k == 0 {
            return;
        }
        let per = seconds / k as f64;
        self.pass = Some(match self.pass {
            Some(p) => DECAY * p + (1.0 - DECAY) * per,
            None => per,
        });
    }

    /// One sequence verified `drafted` drafts, of which the first `accepted` held.
    pub fn record_verify(&mut self, drafted: usize, accepted: usize) {
        // Draft i was verified when the drafts before it held.
        for (i, (tried, held)) in self.accept.iter_mut().enumerate().take(drafted) {
            if i > accepted {
                break;
            }
            *tried = DECAY * *tried + 1.0;
            *held = DECAY * *held + if i < accepted { 1.0 } else { 0.0 };
        }
    }

    /// The rate at which draft `i` holds when the ones before it did (optimistic before data).
    fn rate(&self, i: usize) -> f64 {
        match self.accept[i] {
            (tried, held) if tried >= 1.0 => held / tried,
            _ if i > 0 => self.rate(i - 1),
            _ => 1.0,
        }
    }

    /// The estimated seconds of a step of `tokens` tokens; `None` before any step.
    fn step_cost(&self, tokens: usize) -> Option<f64> {
        let b = bucket(tokens);
        let below = self.cost.range(..=b).next_back();
        let above = self.cost.range(b..).next();
        Some(match (below, above) {
            (Some((&lo, &tl)), Some((&hi, &th))) if hi > lo => {
                tl + (th - tl) * (b - lo) as f64 / (hi - lo) as f64
            }
            (Some((_, &t)), _) | (None, Some((_, &t))) => t,
            (None, None) => return None,
        })
    }

    /// Expected tokens a second of a step with `k` drafts for each of `decoding` sequences.
    fn rate_of(&self, k: usize, decoding: usize) -> Option<f64> {
        let mut expected = 1.0;
        let mut reach = 1.0;
        for i in 0..k {
            reach *= self.rate(i);
            expected += reach;
        }
        let cost = self.step_cost(decoding * (1 + k))? + k as f64 * self.pass.unwrap_or(0.0);
        Some(decoding as f64 * expected / cost.max(1e-9))
    }

    /// The draft length for the next step, which `decoding` sequences could take drafts in.
    pub fn choose(&mut self, decoding: usize) -> usize {
        self.choices += 1;
        if decoding == 0 {
            return 0;
        }
        let Some(best) = self.best(decoding) else {
            return self.max_k;
        };
        if self.choices < self.next_try {
            return best;
        }
        self.gap = match best {
            0 => (2 * self.gap).min(MAX_EXPLORE_EVERY),
            _ => EXPLORE_EVERY,
        };
        self.next_try = self.choices + self.gap;
        // The lengths other than the best, in turn.
        self.tries += 1;
        let others = self.max_k.max(1);
        let k = self.tries % others;
        if k >= best { k + 1 } else { k }
    }

    /// The length with the most expected tokens a second; `None` before any step was timed.
    /// (Ties go to the shorter draft: the same speed for less work.)
    fn best(&self, decoding: usize) -> Option<usize> {
        let mut best = (0, f64::MIN);
        for k in 0..=self.max_k {
            let r = self.rate_of(k, decoding)?;
            if r > best.1 * (1.0 + 1e-9) {
                best = (k, r);
            }
        }
        Some(best.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tuner that saw steps of each size up to 64 tokens (and 128, 256) costing
    /// `cost(tokens)`, and verifies where each draft held at about `rate`.
    fn trained(cost: impl Fn(usize) -> f64, rate: f64) -> SpecTuner {
        let mut t = SpecTuner::new(4);
        for _ in 0..100 {
            for n in (1..=64).chain([128, 256]) {
                t.record_step(n, cost(n));
            }
        }
        // 1000 verifies of 4 drafts, each holding with probability `rate` (xorshift64, seeded).
        let mut state = 0x9E37_79B9_7F4A_7C15_u64;
        let mut uniform = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        for _ in 0..1000 {
            let mut accepted = 0;
            while accepted < 4 && uniform() < rate {
                accepted += 1;
            }
            t.record_verify(4, accepted);
        }
        t
    }

    fn best(t: &mut SpecTuner, decoding: usize) -> usize {
        t.best(decoding).unwrap()
    }

    #[test]
    fn flat_costs_and_good_guesses_speculate_fully() {
        // A GPU at small batches: a step costs about the same whatever its tokens.
        let mut t = trained(|n| 1e-3 * (1.0 + n as f64 / 200.0), 0.7);
        assert_eq!(best(&mut t, 1), 4);
    }

    #[test]
    fn compute_bound_steps_or_poor_guesses_turn_it_off() {
        // Cost proportional to tokens: a draft pays only if it always holds.
        let mut t = trained(|n| 1e-3 * n as f64, 0.7);
        assert_eq!(best(&mut t, 1), 0);
        let mut t = trained(|n| 1e-3 * (1.0 + n as f64 / 200.0), 0.0);
        assert_eq!(best(&mut t, 1), 0);
    }

    #[test]
    fn large_batches_turn_it_down() {
        // Flat up to 16 tokens, then proportional (memory-bound, then compute-bound).
        let mut t = trained(|n| 1e-3 * (n.max(16) as f64 / 16.0), 0.6);
        assert_eq!(best(&mut t, 2), 4);
        let k = best(&mut t, 12);
        assert!(k <= 1, "12 sequences: {k}");
        assert_eq!(best(&mut t, 48), 0);
    }

    #[test]
    fn unmeasured_sizes_are_tried_and_every_length_is_explored() {
        let mut t = SpecTuner::new(3);
        assert_eq!(t.choose(1), 3, "nothing measured: speculate");
        t.record_step(1, 1e-3);
        // Only one-token steps measured: longer ones are assumed to cost as much.
        assert_eq!(t.choose(1), 3);
        // Speculation does not pay: other lengths are tried after 32 choices, then 64, 128...
        let mut t = trained(|n| 1e-3 * n as f64, 0.1);
        let tried: Vec<(u64, usize)> = (1..=480)
            .map(|i| (i, t.choose(1)))
            .filter(|&(_, k)| k > 0)
            .collect();
        assert_eq!(tried, [(32, 2), (96, 3), (224, 4), (480, 1)]);
        // It pays: every 32nd choice tries another length.
        let mut t = trained(|n| 1e-3 * (1.0 + n as f64 / 200.0), 0.7);
        let tried: Vec<(u64, usize)> = (1..=128)
            .map(|i| (i, t.choose(1)))
            .filter(|&(_, k)| k != 4)
            .collect();
        assert_eq!(tried, [(32, 1), (64, 2), (96, 3), (128, 0)]);
        assert_eq!(t.choose(0), 0);
    }

    #[test]
    fn a_proposer_as_slow_as_the_target_turns_it_off() {
        // Flat step costs and every guess right, but each guess costs a target step (a model
        // drafting for itself).
        let mut t = trained(|_| 1e-3, 1.0);
        assert_eq!(best(&mut t, 1), 4);
        for _ in 0..200 {
            t.record_draft(4, 4.8e-3);
        }
        assert_eq!(best(&mut t, 1), 0);
    }

    #[test]
    fn acceptance_is_counted_per_position() {
        let mut t = SpecTuner::new(3);
        t.record_verify(3, 1);
        t.record_verify(3, 3);
        assert_eq!(t.rate(0), 1.0);
        assert!((t.rate(1) - 1.0 / 1.98).abs() < 1e-9, "{}", t.rate(1));
        assert_eq!(t.rate(2), 1.0);
    }
}
