//! Each sequence's own random stream, so a seeded request samples the same tokens whatever else
//! shares its batch, and across pagewise releases (the algorithm is fixed here, not by a dependency).
//!
//! The generator is xoshiro256** seeded through SplitMix64, both public-domain designs by Blackman
//! and Vigna: fast, small state, and good enough statistics for sampling.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A per-sequence pseudo-random stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeededRng {
    s: [u64; 4],
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl SeededRng {
    /// The stream for `seed`. `stream` separates the `n` completions of one seeded request.
    pub fn new(seed: u64, stream: u64) -> Self {
        let mut state = seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03);
        SeededRng {
            s: std::array::from_fn(|_| splitmix64(&mut state)),
        }
    }

    /// A stream for a request without a seed: distinct per call within and across processes.
    pub fn from_entropy() -> Self {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let count = COUNTER.fetch_add(1, Ordering::Relaxed);
        SeededRng::new(nanos ^ u64::from(std::process::id()).rotate_left(32), count)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_streams_differ() {
        let a: Vec<u64> = {
            let mut r = SeededRng::new(42, 0);
            (0..4).map(|_| r.next_u64()).collect()
        };
        let mut r = SeededRng::new(42, 0);
        assert_eq!(a, (0..4).map(|_| r.next_u64()).collect::<Vec<_>>());
        let mut other = SeededRng::new(42, 1);
        assert_ne!(a[0], other.next_u64());
        assert_ne!(SeededRng::from_entropy(), SeededRng::from_entropy());
    }

    #[test]
    fn uniform_is_in_range_and_roughly_uniform() {
        let mut r = SeededRng::new(7, 0);
        let mut buckets = [0u32; 10];
        for _ in 0..100_000 {
            let x = r.next_f64();
            assert!((0.0..1.0).contains(&x));
            buckets[(x * 10.0) as usize] += 1;
        }
        for b in buckets {
            assert!((9_500..10_500).contains(&b), "{buckets:?}");
        }
    }
}
