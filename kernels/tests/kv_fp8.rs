//! The FP8 (e4m3) KV cache: the writers round each value to the nearest e4m3 of `value / scale`,
//! and every attention kernel over an FP8 cache gives, bit for bit, what it gives over a 16-bit
//! cache holding the same rounded values (`e4m3 * scale` in the model's dtype): decode with one
//! and several splits, sliding windows and sinks, and prefill; bf16 and f16, head dims 64, 128
//! and 256, GQA groups 1 to 8. K and V have different scales, so swapping them fails. Needs a
//! CUDA GPU.

use candle_core::{DType, Device, Tensor};
use pagewise_kernels::{
    CacheWrites, KvScales, PagedKv, PrefillSeqs, QkvRope, paged_attention_planned,
    paged_attention_rows, paged_prefill_attention, reshape_and_cache, rope_qkv_cache,
};

use crate::common::{Lcg, e4m3, host_f32, random};

/// That byte `b` is an e4m3 nearest to `y` (|y| within the format's 448): no other finite byte
/// is closer.
fn assert_nearest(b: u8, y: f32, what: &str) {
    let got = (e4m3(b) - y).abs();
    let best = (0..=255u8)
        .map(e4m3)
        .filter(|v| v.is_finite())
        .map(|v| (v - y).abs())
        .fold(f32::INFINITY, f32::min);
    assert!(
        got <= best,
        "{what}: {y} stored as {b:#04x} = {}, {best} away is possible",
        e4m3(b)
    );
}

/// A 16-bit cache holding what FP8 cache `bytes` stands for with `scale`.
fn widened(bytes: &Tensor, scale: f32, dtype: DType, dev: &Device) -> Tensor {
    let raw = bytes.flatten_all().unwrap().to_vec1::<u8>().unwrap();
    let values: Vec<f32> = raw.iter().map(|&b| e4m3(b) * scale).collect();
    Tensor::from_vec(values, bytes.dims(), &Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
        .to_device(dev)
        .unwrap()
}

/// Block tables over shuffled blocks for sequences of `ctx` tokens: the tables `[seqs,
/// max_blocks]` and each token's slot, sequence by sequence.
fn tables(ctx: &[usize], bs: usize, rng: &mut Lcg) -> (Vec<i32>, usize, Vec<i64>, usize) {
    let blocks: usize = ctx.iter().map(|c| c.div_ceil(bs)).sum();
    let mut ids: Vec<i32> = (1..=blocks as i32).collect();
    for i in (1..ids.len()).rev() {
        let j = ((rng.next() + 1.0) * 0.5 * (i + 1) as f32) as usize % (i + 1);
        ids.swap(i, j);
    }
    let max_blocks = ctx.iter().map(|c| c.div_ceil(bs)).max().unwrap();
    let mut table = vec![0i32; ctx.len() * max_blocks];
    let (mut slots, mut next) = (Vec::new(), 0);
    for (s, &c) in ctx.iter().enumerate() {
        for b in 0..c.div_ceil(bs) {
            table[s * max_blocks + b] = ids[next];
            next += 1;
        }
        for p in 0..c {
            slots.push(i64::from(table[s * max_blocks + p / bs]) * bs as i64 + (p % bs) as i64);
        }
    }
    (table, max_blocks, slots, blocks + 1)
}

#[test]
fn fp8_caches_attend_as_16_bit_caches_holding_their_rounded_values() {
    let dev = Device::new_cuda(0).unwrap();
    let bs = 16;
    let scales = KvScales { k: 0.02, v: 0.05 };
    for dtype in [DType::BF16, DType::F16] {
        for (d, heads, kvh) in [(64, 8, 8), (128, 32, 8), (128, 16, 8), (256, 16, 2)] {
            let mut rng = Lcg(d as u64 * 7 + heads as u64);
            // (cached prefix, chunk) per sequence; the decode rows are each one's last token.
            let seqs = [(0usize, 37usize), (100, 1), (700, 64), (1500, 3)];
            let ctx: Vec<usize> = seqs.iter().map(|(p, c)| p + c).collect();
            let (table, max_blocks, slots, num_blocks) = tables(&ctx, bs, &mut rng);
            let all = slots.len();
            // K up to 3 (150 / 0.02's 448 range), V up to 8 (160).
            let k = random(&mut rng, (all, kvh * d), 3.0, dtype, &dev);
            let v = random(&mut rng, (all, kvh * d), 8.0, dtype, &dev);
            let (k, v) = (
                k.reshape((all, kvh, d)).unwrap(),
                v.reshape((all, kvh, d)).unwrap(),
            );
            let shape = (num_blocks, bs, kvh, d);
            let kc = Tensor::zeros(shape, DType::U8, &dev).unwrap();
            let vc = Tensor::zeros(shape, DType::U8, &dev).unwrap();
            let fp8 = PagedKv::fp8(&kc, &vc, scales);
            let slot_t = Tensor::from_vec(slots.clone(), all, &dev).unwrap();
            unsafe { reshape_and_cache(&k, &v, fp8, &slot_t) }.unwrap();

            // Each written value is the nearest e4m3 of value / scale.
            let (kb, vb) = (
                kc.flatten_all().unwrap().to_vec1::<u8>().unwrap(),
                vc.flatten_all().unwrap().to_vec1::<u8>().unwrap(),
            );
            let (kh, vh) = (host_f32(&k), host_f32(&v));
            let w = kvh * d;
            for (t, &slot) in slots.iter().enumerate().step_by(7) {
                for i in (0..w).step_by(5) {
                    let at = slot as usize * w + i;
                    assert_nearest(kb[at], kh[t * w + i] / scales.k, "K");
                    assert_nearest(vb[at], vh[t * w + i] / scales.v, "V");
                }
            }
            let (kw, vw) = (
                widened(&kc, scales.k, dtype, &dev),
                widened(&vc, scales.v, dtype, &dev),
            );
            let wide = PagedKv::new(&kw, &vw);
            let label = format!("{dtype:?} d{d} {heads}/{kvh}");
            let same = |got: &Tensor, want: &Tensor, what: &str| {
                let (g, w) = (host_f32(got), host_f32(want));
                assert!(
                    g.iter().all(|x| x.is_finite()),
                    "{label} {what}: not finite"
                );
                assert!(g == w, "{label} {what}: FP8 differs from its widened cache");
            };

            // Decode: one row per sequence, at its last position.
            let n = seqs.len();
            let bt = Tensor::from_vec(table.clone(), (n, max_blocks), &dev).unwrap();
            let i32s = |v: &[usize]| {
                let v: Vec<i32> = v.iter().map(|&x| x as i32).collect();
                Tensor::from_vec(v, n, &dev).unwrap()
            };
            let cl = i32s(&ctx);
            let q = random(&mut rng, (n, heads * d), 1.0, dtype, &dev)
                .reshape((n, heads, d))
                .unwrap();
            let scale = 1.0 / (d as f32).sqrt();
            for plan in [(1, 2048), (4, 128), (16, 128)] {
                let run = |kv| {
                    unsafe {
                        paged_attention_planned(
                            &q,
                            kv,
                            &bt,
                            None,
                            &cl,
                            plan,
                            CacheWrites::Anywhere,
                            scale,
                        )
                    }
                    .unwrap()
                };
                same(&run(fp8), &run(wide), &format!("decode {plan:?}"));
            }
            let sinks: Vec<f32> = (0..heads).map(|_| rng.next() * 2.0).collect();
            let sinks = Tensor::from_vec(sinks, heads, &dev).unwrap();
            let rows = |kv| {
                unsafe {
                    paged_attention_rows(
                        &q,
                        kv,
                        &bt,
                        None,
                        &cl,
                        (4, 128),
                        Some(100),
                        Some(&sinks),
                        scale,
                    )
                }
                .unwrap()
            };
            same(&rows(fp8), &rows(wide), "window and sinks");

            // Prefill: each sequence's chunk after its prefix.
            let total: usize = seqs.iter().map(|s| s.1).sum();
            let qp = random(&mut rng, (total, heads * d), 1.0, dtype, &dev)
                .reshape((total, heads, d))
                .unwrap();
            let mut starts = Vec::new();
            let mut at = 0;
            for (_, c) in seqs {
                starts.push(at);
                at += c;
            }
            let chunks: Vec<usize> = seqs.iter().map(|s| s.1).collect();
            let (qs, ql, tr) = (i32s(&starts), i32s(&chunks), i32s(&[0, 1, 2, 3]));
            let meta = PrefillSeqs {
                q_start: &qs,
                q_len: &ql,
                ctx_len: &cl,
                table_row: &tr,
                max_q_len: *chunks.iter().max().unwrap(),
            };
            let prefill = |kv| {
                let out = Tensor::zeros(qp.shape(), dtype, &dev).unwrap();
                unsafe { paged_prefill_attention(&out, &qp, kv, &bt, &meta, scale) }.unwrap();
                out
            };
            same(&prefill(fp8), &prefill(wide), "prefill");

            // Swapped scales read other values: the comparison above can fail.
            let swapped = PagedKv::fp8(
                &kc,
                &vc,
                KvScales {
                    k: scales.v,
                    v: scales.k,
                },
            );
            let (g, w) = (host_f32(&prefill(swapped)), host_f32(&prefill(wide)));
            assert!(g != w, "{label}: swapped K/V scales gave the same output");
        }
    }
}

#[test]
fn rope_qkv_cache_writes_the_nearest_e4m3_of_what_a_16_bit_cache_gets() {
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(91);
    let scales = KvScales { k: 0.25, v: 0.5 };
    for dtype in [DType::BF16, DType::F16] {
        let (heads, kvh, d, tokens, blocks, bs) = (8, 2, 128, 5, 4, 16);
        let width = (heads + 2 * kvh) * d;
        let qkv = random(&mut rng, (tokens, width), 4.0, dtype, &dev);
        let angles: Vec<f32> = (0..tokens * d / 2).map(|_| rng.next() * 3.0).collect();
        let table = |f: fn(f32) -> f32| {
            let v: Vec<f32> = angles.iter().map(|&a| f(a)).collect();
            Tensor::from_vec(v, (tokens, d / 2), &dev)
                .unwrap()
                .to_dtype(dtype)
                .unwrap()
        };
        let (cos, sin) = (table(f32::cos), table(f32::sin));
        let slots = Tensor::new(&[5i64, -1, 33, 17, 60], &dev).unwrap();
        let x = QkvRope {
            qkv: &qkv,
            heads,
            kv_heads: kvh,
            cos: &cos,
            sin: &sin,
            positions: None,
            interleaved: false,
            head_norms: None,
        };
        let shape = (blocks, bs, kvh, d);
        let (k16, v16) = (
            Tensor::zeros(shape, dtype, &dev).unwrap(),
            Tensor::zeros(shape, dtype, &dev).unwrap(),
        );
        let (k8, v8) = (
            Tensor::zeros(shape, DType::U8, &dev).unwrap(),
            Tensor::zeros(shape, DType::U8, &dev).unwrap(),
        );
        let q16 = unsafe { rope_qkv_cache(&x, PagedKv::new(&k16, &v16), &slots) }.unwrap();
        let q8 = unsafe { rope_qkv_cache(&x, PagedKv::fp8(&k8, &v8, scales), &slots) }.unwrap();
        assert_eq!(host_f32(&q16), host_f32(&q8), "{dtype:?}: q differs");
        for (c16, c8, s, what) in [(&k16, &k8, scales.k, "K"), (&v16, &v8, scales.v, "V")] {
            let (want, got) = (
                host_f32(c16),
                c8.flatten_all().unwrap().to_vec1::<u8>().unwrap(),
            );
            let mut written = 0;
            for (y, b) in want.iter().zip(&got) {
                if *y != 0.0 {
                    written += 1;
                }
                assert_nearest(*b, y / s, what);
            }
            assert!(written > 3 * kvh * d, "{what}: too few values written");
        }
        // An f32 projection has no FP8 cache.
        let x32 = qkv.to_dtype(DType::F32).unwrap();
        let (c32, s32) = (
            cos.to_dtype(DType::F32).unwrap(),
            sin.to_dtype(DType::F32).unwrap(),
        );
        let bad = QkvRope {
            qkv: &x32,
            cos: &c32,
            sin: &s32,
            ..x
        };
        let err = unsafe { rope_qkv_cache(&bad, PagedKv::fp8(&k8, &v8, scales), &slots) }
            .unwrap_err()
            .to_string();
        assert!(err.contains("f16 or bf16"), "{err}");
    }
}
