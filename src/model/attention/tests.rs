//! The CPU reference attention against a direct computation.

use super::*;
use crate::model::batch::SeqSpan;
use crate::sampler::SeededRng;

fn randn(n: usize, rng: &mut SeededRng) -> Vec<f32> {
    (0..n).map(|_| rng.next_f64() as f32 * 2.0 - 1.0).collect()
}

/// Dense causal attention for one sequence, the textbook way: token `t` over positions
/// `0..=t`, or over the last `window` of them.
#[allow(clippy::too_many_arguments)]
fn naive(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n: usize,
    heads: usize,
    kvh: usize,
    d: usize,
    window: Option<usize>,
    sinks: Option<&[f32]>,
) -> Vec<f32> {
    let mut out = vec![0.0; n * heads * d];
    for t in 0..n {
        let first = window.map_or(0, |w| (t + 1).saturating_sub(w));
        for h in 0..heads {
            let g = h / (heads / kvh);
            let s: Vec<f32> = (first..=t)
                .map(|p| {
                    (0..d)
                        .map(|i| q[(t * heads + h) * d + i] * k[(p * kvh + g) * d + i])
                        .sum::<f32>()
                        / (d as f32).sqrt()
                })
                .collect();
            let sink = sinks.map(|s| s[h]);
            let m = s
                .iter()
                .copied()
                .chain(sink)
                .fold(f32::NEG_INFINITY, f32::max);
            let z: f32 = s.iter().chain(&sink).map(|x| (x - m).exp()).sum();
            for (p, x) in (first..).zip(&s) {
                for i in 0..d {
                    out[(t * heads + h) * d + i] += (x - m).exp() / z * v[(p * kvh + g) * d + i];
                }
            }
        }
    }
    out
}

/// Full attention, and sliding windows shorter than a chunk, than the prefix, and longer
/// than the sequence.
#[test]
fn chunked_paged_attention_over_shuffled_blocks_matches_dense_attention() {
    for window in [None, Some(1), Some(3), Some(7), Some(20)] {
        paged_matches_dense(window, None);
    }
}

/// gpt-oss's sinks: one large (most of the weight to nothing), one small, one near the
/// scores; with full and windowed attention.
#[test]
fn attention_sinks_take_their_share_of_each_softmax() {
    let sinks = [3.0f32, -20.0, 0.4, 1.2];
    for window in [None, Some(3)] {
        paged_matches_dense(window, Some(&sinks));
    }
    let e = KvCache::new(
        KvLayout {
            num_blocks: 2,
            block_size: 4,
            num_kv_heads: 1,
            head_dim: 8,
        },
        1,
    )
    .attend_with_sinks(
        0,
        &Tensor::zeros((1, 4, 8), DType::F32, &Device::Cpu).unwrap(),
        &Tensor::zeros((1, 1, 8), DType::F32, &Device::Cpu).unwrap(),
        &Tensor::zeros((1, 1, 8), DType::F32, &Device::Cpu).unwrap(),
        &AttentionMeta {
            slot_mapping: &[4],
            block_tables: &[1],
            seqs: vec![SeqSpan {
                query_start: 0,
                query_len: 1,
                context_len: 1,
                block_table: 0..1,
            }],
            window: None,
            device: None,
        },
        1.0,
        None,
        Some(&Tensor::zeros(3, DType::F32, &Device::Cpu).unwrap()),
    )
    .unwrap_err();
    assert!(e.to_string().contains("sinks [3] for 4 heads"), "{e}");
}

fn paged_matches_dense(window: Option<usize>, sinks: Option<&[f32]>) {
    let (heads, kvh, d, bs) = (4, 2, 8, 4);
    let n = 11;
    let mut rng = SeededRng::new(3, 0);
    let (q, k, v) = (
        randn(n * heads * d, &mut rng),
        randn(n * kvh * d, &mut rng),
        randn(n * kvh * d, &mut rng),
    );
    let expected = naive(&q, &k, &v, n, heads, kvh, d, window, sinks);

    let layout = KvLayout {
        num_blocks: 8,
        block_size: bs,
        num_kv_heads: kvh,
        head_dim: d,
    };
    let mut cache = KvCache::new(layout, 1);
    let table = [5u32, 2, 7]; // non-contiguous, out of order
    let slots: Vec<u32> = (0..n)
        .map(|p| table[p / bs] * bs as u32 + (p % bs) as u32)
        .collect();
    // Two chunks: positions 0..6, then 6..11 attending over the cached first chunk.
    let mut got = Vec::new();
    for (start, end) in [(0usize, 6usize), (6, n)] {
        let len = end - start;
        let t = |x: &[f32], h: usize| {
            Tensor::from_slice(&x[start * h * d..end * h * d], (len, h, d), &Device::Cpu).unwrap()
        };
        let meta = AttentionMeta {
            slot_mapping: &slots[start..end],
            block_tables: &table,
            seqs: vec![SeqSpan {
                query_start: 0,
                query_len: len,
                context_len: end,
                block_table: 0..3,
            }],
            window: None,
            device: None,
        };
        let o = cache
            .attend_with_sinks(
                0,
                &t(&q, heads),
                &t(&k, kvh),
                &t(&v, kvh),
                &meta,
                1.0 / (d as f32).sqrt(),
                window,
                sinks
                    .map(|s| Tensor::from_slice(s, s.len(), &Device::Cpu))
                    .transpose()
                    .unwrap()
                    .as_ref(),
            )
            .unwrap();
        got.extend(o.flatten_all().unwrap().to_vec1::<f32>().unwrap());
    }
    for (a, b) in got.iter().zip(&expected) {
        assert!((a - b).abs() < 1e-5, "window {window:?}: {a} vs {b}");
    }
}

/// The lanes and the tail of `dot` each count once, whatever the length.
#[test]
fn dot_is_the_sum_of_products_at_every_length() {
    let mut rng = SeededRng::new(5, 0);
    for n in [0, 1, 7, 8, 15, 16, 17, 31, 32, 64, 80, 100, 128, 256] {
        let (a, b) = (randn(n, &mut rng), randn(n, &mut rng));
        let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
        let got = dot(&a, &b) as f64;
        assert!(
            (got - want).abs() < 1e-5 * (1.0 + want.abs()),
            "{n}: {got} vs {want}"
        );
    }
}
