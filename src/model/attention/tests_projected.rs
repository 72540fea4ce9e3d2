//! Attention from the projections' buffers (`KvCache::attend_projected_host`) against the tensor
//! path it replaces on the CPU: q and k rotated by `RotaryRows::apply`, then
//! `KvCache::attend_with_sinks`.

use super::*;
use crate::model::batch::SeqSpan;
use crate::model::config::ModelConfig;
use crate::model::norm::HostNorm;
use crate::model::rotary::Rotary;
use crate::sampler::SeededRng;

/// Two sequences in one step (a 5-token chunk after a cached prefix of 3, and a 1-token decode
/// after 6), each layout of the projections (fused rows, and q, k, v apart), each rotary style,
/// whole and partial, with and without per-head norms of q and k: the outputs, and the cache
/// they leave, are the tensor path's, bit for bit.
#[test]
fn projected_buffers_give_the_tensor_paths_attention() {
    for interleaved in [false, true] {
        for rotary_dim in [16, 8] {
            for fused in [true, false] {
                for norms in [false, true] {
                    compare(interleaved, rotary_dim, fused, norms);
                }
            }
        }
    }
}

fn compare(interleaved: bool, rotary_dim: usize, fused: bool, norms: bool) {
    let (heads, kvh, d, bs) = (4, 2, 16, 4);
    let mut cfg = ModelConfig::from_hf_json(
        r#"{"architectures":["LlamaForCausalLM"],"vocab_size":10,"hidden_size":64,
        "intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":4,
        "num_key_value_heads":2,"rope_theta":100.0}"#,
    )
    .unwrap();
    (cfg.rope_interleaved, cfg.rotary_dim) = (interleaved, rotary_dim);
    let rotary = Rotary::new(&cfg, 16, DType::F32, &Device::Cpu).unwrap();
    let layout = KvLayout {
        num_blocks: 5,
        block_size: bs,
        num_kv_heads: kvh,
        head_dim: d,
    };
    // The prefixes: sequence 0's first 3 tokens (blocks 3, 1), sequence 1's first 6 (4, 2).
    let table = [3u32, 1, 4, 2];
    let slot = |seq: usize, p: usize| table[2 * seq + p / bs] * bs as u32 + (p % bs) as u32;
    let mut rng = SeededRng::new(7, 0);
    let mut randn =
        |n: usize| -> Vec<f32> { (0..n).map(|_| rng.next_f64() as f32 * 2.0 - 1.0).collect() };
    let prefix = |cache: &mut KvCache, k: &[f32], v: &[f32]| {
        let slots: Vec<u32> = (0..3)
            .map(|p| slot(0, p))
            .chain((0..6).map(|p| slot(1, p)))
            .collect();
        reshape_and_cache(k, v, cache.host_layer(0), &slots, layout).unwrap();
    };
    let (pk, pv) = (randn(9 * kvh * d), randn(9 * kvh * d));
    let (n, qw, kw) = (6, heads * d, kvh * d);
    let qkv = randn(n * (qw + 2 * kw));
    let slots: Vec<u32> = (3..8).map(|p| slot(0, p)).chain([slot(1, 6)]).collect();
    let positions: Vec<u32> = (3..8).chain([6]).collect();
    let meta = AttentionMeta {
        slot_mapping: &slots,
        block_tables: &table,
        seqs: vec![
            SeqSpan {
                query_start: 0,
                query_len: 5,
                context_len: 8,
                block_table: 0..2,
            },
            SeqSpan {
                query_start: 5,
                query_len: 1,
                context_len: 7,
                block_table: 2..4,
            },
        ],
        window: None,
        device: None,
    };
    let rows = rotary
        .at(&Tensor::new(positions.as_slice(), &Device::Cpu).unwrap())
        .unwrap();
    let sinks = [0.5f32, -1.0, 2.0, 0.0];
    let part = |offset: usize, width: usize| -> Vec<f32> {
        qkv.chunks_exact(qw + 2 * kw)
            .flat_map(|r| r[offset..offset + width].to_vec())
            .collect()
    };
    let (q, k, v) = (part(0, qw), part(qw, kw), part(qw + kw, kw));
    // Per-head norms as the models' `RmsNorm::forward` applies them (candle's op, one row a
    // head), with different scales for q and k.
    let (q_scale, k_scale, eps) = (randn(d), randn(d), 1e-5);
    let norm = |x: Tensor, h: usize, scale: &[f32]| -> Tensor {
        if !norms {
            return x;
        }
        let scale = Tensor::new(scale, &Device::Cpu).unwrap();
        candle_nn::ops::rms_norm(&x.reshape((n * h, d)).unwrap(), &scale, eps)
            .unwrap()
            .reshape((n, h, d))
            .unwrap()
    };

    let mut want_cache = KvCache::new(layout, 1);
    prefix(&mut want_cache, &pk, &pv);
    let t = |x: &[f32], h: usize| Tensor::from_slice(x, (n, h, d), &Device::Cpu).unwrap();
    let want = want_cache
        .attend_with_sinks(
            0,
            &rows.apply(&norm(t(&q, heads), heads, &q_scale)).unwrap(),
            &rows.apply(&norm(t(&k, kvh), kvh, &k_scale)).unwrap(),
            &t(&v, kvh),
            &meta,
            0.3,
            None,
            Some(&Tensor::new(&sinks, &Device::Cpu).unwrap()),
        )
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();

    let mut got_cache = KvCache::new(layout, 1);
    prefix(&mut got_cache, &pk, &pv);
    let stride = qw + 2 * kw;
    let at = |offset| Rows {
        data: &qkv,
        stride,
        offset,
    };
    let parts = if fused {
        [at(0), at(qw), at(qw + kw)]
    } else {
        [
            Rows::packed(&q, qw),
            Rows::packed(&k, kw),
            Rows::packed(&v, kw),
        ]
    };
    let projected = |sinks| Projected {
        heads,
        kv_heads: kvh,
        head_dim: d,
        rotary: rows.host().unwrap().unwrap(),
        scale: 0.3,
        window: None,
        sinks,
        norms: norms.then_some(
            [(&q_scale, eps), (&k_scale, eps)].map(|(scale, eps)| HostNorm { scale, eps }),
        ),
    };
    let got = got_cache
        .attend_projected_host(0, n, parts, &meta, projected(Some(&sinks)))
        .unwrap()
        .unwrap();
    let case =
        format!("interleaved {interleaved}, rotary {rotary_dim}, fused {fused}, norms {norms}");
    assert_eq!(got, want, "{case}");
    let (g, w) = (got_cache.host_layer(0), want_cache.host_layer(0));
    assert!(
        g.k[..] == w.k[..] && g.v[..] == w.v[..],
        "{case}: caches differ"
    );

    // Rows that do not fit the cache's layout are refused, not read past.
    let short = Rows::packed(&q[..qw * 5], qw);
    let e = got_cache
        .attend_projected_host(0, n, [short, parts[1], parts[2]], &meta, projected(None))
        .unwrap_err();
    assert!(
        e.to_string().contains("do not match the cache layout"),
        "{e}"
    );
}

impl KvCache {
    /// Layer `i` of a host cache.
    fn host_layer(&mut self, i: usize) -> &mut LayerKv {
        #[allow(irrefutable_let_patterns)] // a second variant exists with `cuda`
        let Store::Host(layers) = &mut self.store else {
            panic!("a host cache");
        };
        &mut layers[i]
    }
}
