//! Picks the next token of each sampling row: greedy, temperature, min-p, top-k, top-p, penalties,
//! logit bias, per-sequence seeded randomness, and logprobs with top alternatives.
//!
//! Order, as in vLLM: logit bias, penalties, suppression (min_tokens), the constraint's mask (if
//! the request has one: `crate::guided`), then greedy argmax or
//! temperature -> min-p -> top-k -> top-p -> one uniform draw from the sequence's own stream. Logprobs
//! are those of the raw model logits (vLLM's default `raw_logprobs`), before any of that processing.

#[cfg(feature = "cuda")]
pub mod device;
pub mod processors;
pub mod rng;

pub use rng::SeededRng;

use crate::guided::{Guide, apply_mask};
use crate::request::SamplingParams;

/// Everything the sampler needs to know about one row's sequence.
pub struct SampleRequest<'a> {
    /// The request's resolved sampling parameters.
    pub params: &'a SamplingParams,
    /// Prompt token ids (for the repetition penalty).
    pub prompt_tokens: &'a [u32],
    /// Tokens generated so far (for penalties).
    pub output_tokens: &'a [u32],
    /// Token ids that may not be sampled at this step (EOS and stop ids before `min_tokens`).
    pub suppressed: &'a [u32],
    /// The sequence's own random stream.
    pub rng: &'a mut SeededRng,
    /// The sequence's constraint: only the tokens its mask allows may be sampled.
    pub guide: Option<&'a mut Guide>,
}

impl SampleRequest<'_> {
    /// The temperature a GPU can sample this row with (0 = argmax), or `None` when the row needs
    /// the host sampler: logprobs, logit edits (bias, penalties, suppressed ids), top-k or top-p.
    /// (A constraint's mask does not need the host: the GPU kernel takes it as a bitmask.)
    pub fn device_temperature(&self) -> Option<f32> {
        let p = self.params;
        let plain = p.logprobs.is_none()
            && p.logit_bias.is_empty()
            && p.presence_penalty == 0.0
            && p.frequency_penalty == 0.0
            && p.repetition_penalty == 1.0
            && self.suppressed.is_empty();
        if !plain {
            None
        } else if p.is_greedy() || p.top_k == 1 {
            Some(0.0)
        } else if p.top_k <= 0 && p.top_p >= 1.0 {
            Some(p.temperature)
        } else {
            None
        }
    }
}

/// Computes the token masks of the constrained rows among `requests` (in parallel on rayon's
/// pool when there are several: each is independent and can take a millisecond).
pub fn compute_masks(requests: &mut [SampleRequest<'_>]) {
    use rayon::prelude::*;
    let guided = requests.iter().filter(|r| r.guide.is_some()).count();
    let compute = |r: &mut SampleRequest<'_>| {
        if let Some(guide) = r.guide.as_deref_mut() {
            guide.compute_mask();
        }
    };
    if guided >= 4 {
        requests.par_iter_mut().for_each(compute);
    } else {
        requests.iter_mut().for_each(compute);
    }
}

/// Log-probabilities reported for one generated token.
#[derive(Clone, Debug, PartialEq)]
pub struct Logprobs {
    /// Log-probability of the chosen token.
    pub logprob: f32,
    /// 1-based rank of the chosen token among all tokens (1 = most likely).
    pub rank: u32,
    /// The most likely tokens and their log-probabilities, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// The token chosen for one row.
#[derive(Clone, Debug, PartialEq)]
pub struct SampledToken {
    /// The chosen token id.
    pub token_id: u32,
    /// Present when the request asked for logprobs.
    pub logprobs: Option<Logprobs>,
}

/// Reusable scratch space, so sampling a row allocates nothing in steady state.
#[derive(Default, Debug)]
pub struct Sampler {
    candidates: Vec<(f32, u32)>,
    tokens: Vec<u32>,
    raw: Vec<f32>,
}

impl Sampler {
    /// Samples every row of `logits` (`rows × vocab_size`, row-major), one request per row in order.
    /// Rows are modified in place.
    pub fn sample_batch<'a>(
        &mut self,
        logits: &mut [f32],
        vocab_size: usize,
        requests: impl IntoIterator<Item = SampleRequest<'a>>,
    ) -> Vec<SampledToken> {
        logits
            .chunks_exact_mut(vocab_size)
            .zip(requests)
            .map(|(row, req)| self.sample(row, req))
            .collect()
    }

    /// Samples one row (modified in place).
    pub fn sample(&mut self, row: &mut [f32], req: SampleRequest<'_>) -> SampledToken {
        let p = req.params;
        let want_logprobs = p.logprobs.is_some();
        if want_logprobs {
            self.raw.clear();
            self.raw.extend_from_slice(row);
        }

        processors::apply_logit_bias(row, &p.logit_bias);
        processors::apply_penalties(
            row,
            p.presence_penalty,
            p.frequency_penalty,
            p.repetition_penalty,
            req.prompt_tokens,
            req.output_tokens,
            &mut self.tokens,
        );
        processors::suppress(row, req.suppressed);
        if let Some(guide) = req.guide {
            // A failed guide allows nothing; whatever comes out, the sequence then ends with
            // the guide's error when it takes the token.
            match guide.mask() {
                Some(mask) => apply_mask(row, mask),
                None => row.fill(f32::NEG_INFINITY),
            }
        }

        let token_id = if p.is_greedy() || p.top_k == 1 {
            argmax(row)
        } else {
            self.sample_random(row, p, req.rng)
        };
        let logprobs = p
            .logprobs
            .map(|k| raw_logprobs(&self.raw, token_id, k, &mut self.candidates));
        SampledToken { token_id, logprobs }
    }

    fn sample_random(&mut self, row: &mut [f32], p: &SamplingParams, rng: &mut SeededRng) -> u32 {
        let max = crate::cpu::exp::max(row);
        if max == f32::NEG_INFINITY {
            return argmax(row);
        }
        // Unnormalized probabilities in place: the most likely token has weight exactly 1;
        // those under min_p (and NaNs) weigh 0.
        let total = crate::cpu::exp::exp_weights(row, max, 1.0 / p.temperature, p.min_p);

        let vocab = row.len();
        let top_k = if p.top_k > 0 {
            (p.top_k as usize).min(vocab)
        } else {
            vocab
        };
        if top_k == vocab && p.top_p >= 1.0 {
            return draw_row(row, total, rng);
        }

        let c = &mut self.candidates;
        c.clear();
        c.extend(
            row.iter()
                .zip(0u32..)
                .filter(|(w, _)| **w > 0.0)
                .map(|(&w, i)| (w, i)),
        );
        if top_k < c.len() {
            c.select_nth_unstable_by(top_k - 1, by_weight_desc);
            c.truncate(top_k);
        }
        if p.top_p < 1.0 {
            let mass: f64 = c.iter().map(|&(w, _)| f64::from(w)).sum();
            let keep = nucleus_len(c, mass * f64::from(p.top_p));
            c.truncate(keep);
        }
        let kept: f64 = c.iter().map(|&(w, _)| f64::from(w)).sum();
        draw(c.iter().map(|&(w, i)| (w, i)), kept, rng)
    }
}

fn by_weight_desc(a: &(f32, u32), b: &(f32, u32)) -> std::cmp::Ordering {
    b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
}

/// Index of the largest logit (the lowest index among ties; NaN never wins).
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_value = f32::NEG_INFINITY;
    for (i, &x) in row.iter().enumerate() {
        if x > best_value {
            best_value = x;
            best = i;
        }
    }
    best as u32
}

/// Sorts the heaviest candidates first, only as far as needed, and returns how many make up the
/// smallest set whose weight reaches `target` (at least one).
fn nucleus_len(c: &mut [(f32, u32)], target: f64) -> usize {
    let len = c.len();
    let mut n = len.min(64);
    loop {
        if n < len {
            c.select_nth_unstable_by(n - 1, by_weight_desc);
        }
        c[..n].sort_unstable_by(by_weight_desc);
        let mut cum = 0.0f64;
        for (j, &(w, _)) in c[..n].iter().enumerate() {
            cum += f64::from(w);
            if cum >= target {
                return j + 1;
            }
        }
        if n == len {
            return len.max(1);
        }
        n = (n * 8).min(len);
    }
}

/// [`draw`] over a whole row of weights, skipping runs of 256 whose sum `u` passes (their sums in
/// 8 f32 lanes: a serial f64 scan of 150k–262k weights took a tenth of a millisecond or more).
fn draw_row(row: &[f32], total: f64, rng: &mut SeededRng) -> u32 {
    const RUN: usize = 256;
    let mut u = rng.next_f64() * total;
    let mut last = 0;
    for (r, run) in row.chunks(RUN).enumerate() {
        let mut lanes = [0f32; 8];
        let mut eights = run.chunks_exact(8);
        for c in &mut eights {
            for (l, &w) in lanes.iter_mut().zip(c) {
                *l += w;
            }
        }
        let sum = lanes
            .iter()
            .chain(eights.remainder())
            .map(|&w| f64::from(w))
            .sum::<f64>();
        let first = (r * RUN) as u32;
        if u < sum {
            // (Rounding may leave the exact scan short of `u`: then the run's last weight.)
            let i = crossing(run, u).or_else(|| last_positive(run)).unwrap_or(0);
            return first + i;
        }
        u -= sum;
        if let Some(i) = last_positive(run) {
            last = first + i;
        }
    }
    last
}

/// The index in `run` where the running sum of weights passes `u`, if it does.
fn crossing(run: &[f32], mut u: f64) -> Option<u32> {
    for (w, i) in run.iter().zip(0u32..) {
        if *w > 0.0 {
            u -= f64::from(*w);
            if u < 0.0 {
                return Some(i);
            }
        }
    }
    None
}

/// The index of the last positive weight of `run`.
fn last_positive(run: &[f32]) -> Option<u32> {
    run.iter().rposition(|&w| w > 0.0).map(|i| i as u32)
}

/// One draw proportional to the weights; falls back to the last positive weight on rounding.
fn draw(weights: impl Iterator<Item = (f32, u32)>, total: f64, rng: &mut SeededRng) -> u32 {
    let mut u = rng.next_f64() * total;
    let mut last = 0;
    for (w, i) in weights {
        if w > 0.0 {
            last = i;
            u -= f64::from(w);
            if u < 0.0 {
                return i;
            }
        }
    }
    last
}

/// Log-softmax of the raw row for the chosen token, its rank, and the `k` most likely tokens.
pub(crate) fn raw_logprobs(
    raw: &[f32],
    chosen: u32,
    k: usize,
    scratch: &mut Vec<(f32, u32)>,
) -> Logprobs {
    let max = raw.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = raw.iter().map(|&x| f64::from((x - max).exp())).sum();
    let lse = max + sum.ln() as f32;
    let chosen_logit = raw[chosen as usize];
    let rank = 1 + raw.iter().filter(|&&x| x > chosen_logit).count() as u32;

    scratch.clear();
    if k > 0 {
        for (&x, i) in raw.iter().zip(0u32..) {
            if scratch.len() < k || x > scratch[k - 1].0 {
                let at = scratch.partition_point(|&(y, _)| y >= x);
                scratch.insert(at, (x, i));
                scratch.truncate(k);
            }
        }
    }
    Logprobs {
        logprob: chosen_logit - lse,
        rank,
        top: scratch.iter().map(|&(x, i)| (i, x - lse)).collect(),
    }
}

#[cfg(test)]
mod tests;
