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
        paged_matches_dense(11, 8, window, None);
    }
    // Rows of more than one `PART` of positions (their partials merged), windows that start
    // inside a part and span several, and a head width of the real models.
    for window in [None, Some(70), Some(130), Some(200)] {
        paged_matches_dense(150, 64, window, None);
    }
}

/// gpt-oss's sinks: one large (most of the weight to nothing), one small, one near the
/// scores; with full and windowed attention.
#[test]
fn attention_sinks_take_their_share_of_each_softmax() {
    let sinks = [3.0f32, -20.0, 0.4, 1.2];
    for window in [None, Some(3)] {
        paged_matches_dense(11, 8, window, Some(&sinks));
    }
    for window in [None, Some(90)] {
        paged_matches_dense(140, 16, window, Some(&sinks));
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

/// `n` tokens of head width `d` written and attended in three chunks (6 tokens, the rest but
/// one, then one decode step), over blocks placed out of order, against [`naive`].
fn paged_matches_dense(n: usize, d: usize, window: Option<usize>, sinks: Option<&[f32]>) {
    let (heads, kvh, bs) = (4, 2, 4);
    let mut rng = SeededRng::new(3, 0);
    let (q, k, v) = (
        randn(n * heads * d, &mut rng),
        randn(n * kvh * d, &mut rng),
        randn(n * kvh * d, &mut rng),
    );
    let expected = naive(&q, &k, &v, n, heads, kvh, d, window, sinks);

    let blocks = n.div_ceil(bs);
    let layout = KvLayout {
        num_blocks: blocks + 1,
        block_size: bs,
        num_kv_heads: kvh,
        head_dim: d,
    };
    let mut cache = KvCache::new(layout, 1);
    // Non-contiguous, out of order: the first half's blocks ascending, the second's descending,
    // interleaved.
    let table: Vec<u32> = (0..blocks)
        .map(|b| if b % 2 == 0 { b / 2 } else { blocks - 1 - b / 2 } as u32 + 1)
        .collect();
    let slots: Vec<u32> = (0..n)
        .map(|p| table[p / bs] * bs as u32 + (p % bs) as u32)
        .collect();
    let mut got = Vec::new();
    for (start, end) in [(0usize, 6usize), (6, n - 1), (n - 1, n)] {
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
                block_table: 0..blocks,
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
    assert_eq!(got.len(), expected.len());
    for (i, (a, b)) in got.iter().zip(&expected).enumerate() {
        assert!(
            (a - b).abs() < 1e-5,
            "n {n} d {d} window {window:?}, value {i}: {a} vs {b}"
        );
    }
}
