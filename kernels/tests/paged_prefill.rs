//! The tensor-core prefill kernel (FlashAttention-2 style) against a naive f32
//! reference: several sequences per launch, each a chunk after a cached prefix of its own length
//! (0 to 1000), shuffled blocks, poisoned (NaN) unused cache slots and output rows the kernel must
//! not touch, GQA 1/4/8, head dims 64/128/256, f16 and bf16. Needs a CUDA GPU.

use candle_core::cuda_backend::cudarc::driver::sys::CUevent_flags;
use candle_core::{DType, Device, Tensor};
use pagewise_kernels::{PagedKv, PrefillSeqs, paged_prefill_attention, reshape_and_cache};

use crate::common::{Lcg, host_f32};

/// `seqs`: (cached prefix, chunk length) per sequence. Returns the relative L2 error.
fn case(
    dtype: DType,
    d: usize,
    heads: usize,
    kvh: usize,
    seqs: &[(usize, usize)],
    seed: u64,
) -> f64 {
    let dev = Device::new_cuda(0).unwrap();
    let bs = 16;
    let mut rng = Lcg(seed);
    let ctx: Vec<usize> = seqs.iter().map(|(p, c)| p + c).collect();
    let blocks: usize = ctx.iter().map(|c| c.div_ceil(bs)).sum();
    let mut ids: Vec<i32> = (1..=blocks as i32).collect();
    for i in (1..ids.len()).rev() {
        let j = ((rng.next() + 1.0) * 0.5 * (i + 1) as f32) as usize % (i + 1);
        ids.swap(i, j);
    }
    let max_blocks = ctx.iter().map(|c| c.div_ceil(bs)).max().unwrap();
    // Sequence s uses block table row (s + 1) % n: the table row is not the sequence index.
    let n = seqs.len();
    let mut tables = vec![0i32; n * max_blocks];
    let mut slots = Vec::new();
    let mut next = 0;
    for (s, &c) in ctx.iter().enumerate() {
        let row = (s + 1) % n;
        for b in 0..c.div_ceil(bs) {
            tables[row * max_blocks + b] = ids[next];
            next += 1;
        }
        for p in 0..c {
            slots.push(tables[row * max_blocks + p / bs] as i64 * bs as i64 + (p % bs) as i64);
        }
    }
    let all = slots.len();
    let rand = |n: usize, rng: &mut Lcg| (0..n).map(|_| rng.next()).collect::<Vec<f32>>();
    let to = |v: Vec<f32>, shape: (usize, usize, usize)| {
        let t = Tensor::from_vec(v, shape, &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let h = host_f32(&t);
        (t.to_device(&dev).unwrap(), h)
    };
    let (k, kh) = to(rand(all * kvh * d, &mut rng), (all, kvh, d));
    let (v, vh) = to(rand(all * kvh * d, &mut rng), (all, kvh, d));
    let poison = Tensor::full(f32::NAN, (blocks + 1, bs, kvh, d), &dev)
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    let (kc, vc) = (poison.copy().unwrap(), poison.copy().unwrap());
    unsafe {
        reshape_and_cache(
            &k,
            &v,
            PagedKv::new(&kc, &vc),
            &Tensor::from_vec(slots, all, &dev).unwrap(),
        )
    }
    .unwrap();

    // Query rows: the chunks back to back, after 3 leading rows that belong to nobody.
    let lead = 3;
    let rows = lead + seqs.iter().map(|(_, c)| c).sum::<usize>();
    let (q, qh) = to(rand(rows * heads * d, &mut rng), (rows, heads, d));
    let out = Tensor::full(f32::NAN, (rows, heads, d), &dev)
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    let i32s = |v: Vec<usize>| {
        Tensor::from_vec(v.into_iter().map(|x| x as i32).collect::<Vec<_>>(), n, &dev).unwrap()
    };
    let mut starts = Vec::new();
    let mut at = lead;
    for (_, c) in seqs {
        starts.push(at);
        at += c;
    }
    let (qs, ql) = (
        i32s(starts.clone()),
        i32s(seqs.iter().map(|s| s.1).collect()),
    );
    let (cl, tr) = (
        i32s(ctx.clone()),
        i32s((0..n).map(|s| (s + 1) % n).collect()),
    );
    let bt = Tensor::from_vec(tables, (n, max_blocks), &dev).unwrap();
    let scale = 1.0 / (d as f32).sqrt();
    let meta = PrefillSeqs {
        q_start: &qs,
        q_len: &ql,
        ctx_len: &cl,
        table_row: &tr,
        max_q_len: seqs.iter().map(|s| s.1).max().unwrap(),
    };
    unsafe { paged_prefill_attention(&out, &q, PagedKv::new(&kc, &vc), &bt, &meta, scale) }
        .unwrap();
    let got = host_f32(&out);
    assert!(
        got[..lead * heads * d].iter().all(|x| x.is_nan()),
        "rows outside the chunks were written"
    );

    let (mut num, mut den) = (0f64, 0f64);
    let mut first = 0; // this sequence's first token in kh/vh
    for (s, &(prefix, chunk)) in seqs.iter().enumerate() {
        for i in 0..chunk {
            let pos = prefix + i;
            let row = starts[s] + i;
            for h in 0..heads {
                let g = h / (heads / kvh);
                let qv = &qh[(row * heads + h) * d..][..d];
                let sc: Vec<f32> = (0..=pos)
                    .map(|p| {
                        let kv = &kh[((first + p) * kvh + g) * d..][..d];
                        qv.iter().zip(kv).map(|(a, b)| a * b).sum::<f32>() * scale
                    })
                    .collect();
                let m = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let z: f32 = sc.iter().map(|x| (x - m).exp()).sum();
                for j in 0..d {
                    let want: f32 = sc
                        .iter()
                        .enumerate()
                        .map(|(p, x)| (x - m).exp() / z * vh[((first + p) * kvh + g) * d + j])
                        .sum();
                    let g = got[(row * heads + h) * d + j];
                    assert!(!g.is_nan(), "NaN at seq {s} row {i} head {h}");
                    num += f64::from(g - want).powi(2);
                    den += f64::from(want).powi(2);
                }
            }
        }
        first += prefix + chunk;
    }
    (num / den).sqrt()
}

#[test]
fn prefill_matches_the_reference() {
    let seqs = [(0, 1), (0, 100), (37, 64), (200, 130), (5, 3), (1000, 257)];
    for (dtype, tol) in [(DType::BF16, 2e-2), (DType::F16, 4e-3)] {
        for (d, heads, kvh) in [
            (128, 32, 8),
            (64, 8, 8),
            (128, 8, 2),
            (256, 4, 4),
            (256, 8, 2),
        ] {
            let err = case(dtype, d, heads, kvh, &seqs, d as u64 + heads as u64);
            eprintln!("{dtype:?} d{d} {heads}/{kvh}: rel. err. {err:.2e}");
            assert!(err < tol, "{dtype:?} d{d} {heads}/{kvh}: {err}");
        }
    }
}

#[test]
fn a_float32_prefill_is_refused_clearly() {
    let dev = Device::new_cuda(0).unwrap();
    let q = Tensor::zeros((4, 2, 64), DType::F32, &dev).unwrap();
    let cache = Tensor::zeros((2, 16, 2, 64), DType::F32, &dev).unwrap();
    let i = Tensor::zeros(1, DType::I32, &dev).unwrap();
    let bt = Tensor::zeros((1, 1), DType::I32, &dev).unwrap();
    let meta = PrefillSeqs {
        q_start: &i,
        q_len: &i,
        ctx_len: &i,
        table_row: &i,
        max_q_len: 1,
    };
    let err =
        unsafe { paged_prefill_attention(&q, &q, PagedKv::new(&cache, &cache), &bt, &meta, 1.0) }
            .unwrap_err();
    assert!(err.to_string().contains("f16 or bf16"), "{err}");
}

/// Prefill attention's speed on the 8B shape (32 query heads, 8 KV heads, d128, bf16; or
/// `PAGEWISE_BW_SHAPE`): 8
/// sequences of 1024 new tokens with no prefix (the engine's 8192-token prefill step), timed with CUDA events over 20 launches, as TFLOP/s of the causal product (4 x d
/// FLOPs per visible query-key pair per head). Run on the GPU machine:
/// `prefill-tests --ignored --nocapture prefill_speed`.
#[test]
#[ignore]
fn prefill_speed() {
    let dev = Device::new_cuda(0).unwrap();
    let stream = dev.as_cuda_device().unwrap().cuda_stream();
    // PAGEWISE_BW_SHAPE="16x8x256" (query heads x KV heads x head dim): another geometry, as
    // decode_bandwidth takes it (Gemma-3-12B's).
    let shape = std::env::var("PAGEWISE_BW_SHAPE").unwrap_or_else(|_| "32x8x128".into());
    let dims: Vec<usize> = shape.split('x').map(|v| v.parse().unwrap()).collect();
    let [heads, kvh, d] = dims[..] else {
        panic!("PAGEWISE_BW_SHAPE: HEADSxKV_HEADSxHEAD_DIM, not {shape}")
    };
    let (seqs, len, bs) = (8usize, 1024usize, 16usize);
    let tokens = seqs * len;
    let blocks = tokens / bs;
    let cache = Tensor::ones((blocks + 1, bs, kvh, d), DType::BF16, &dev).unwrap();
    let (kc, vc) = (cache.copy().unwrap(), cache);
    let tables: Vec<i32> = (0..blocks)
        .map(|b| 1 + ((b * 7919) % blocks) as i32)
        .collect();
    let bt = Tensor::from_vec(tables, (seqs, len / bs), &dev).unwrap();
    let q = (Tensor::ones((tokens, heads, d), DType::BF16, &dev).unwrap() * 0.01).unwrap();
    let out = q.zeros_like().unwrap();
    let i32s = |v: Vec<usize>| {
        let v: Vec<i32> = v.into_iter().map(|x| x as i32).collect();
        Tensor::from_vec(v, seqs, &dev).unwrap()
    };
    let qs = i32s((0..seqs).map(|s| s * len).collect());
    let ql = i32s(vec![len; seqs]);
    let tr = i32s((0..seqs).collect());
    let meta = PrefillSeqs {
        q_start: &qs,
        q_len: &ql,
        ctx_len: &ql,
        table_row: &tr,
        max_q_len: len,
    };
    let flops = (4 * d * heads * seqs * len * (len + 1) / 2) as f64;
    let timing = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let run = || {
        unsafe { paged_prefill_attention(&out, &q, PagedKv::new(&kc, &vc), &bt, &meta, 0.088) }
            .unwrap()
    };
    for _ in 0..3 {
        run();
    }
    let iters = 20;
    let start = stream.record_event(timing).unwrap();
    for _ in 0..iters {
        run();
    }
    let end = stream.record_event(timing).unwrap();
    let secs = f64::from(start.elapsed_ms(&end).unwrap()) / 1e3 / iters as f64;
    println!(
        "{shape}: {:.1} µs per 8 x 1024-token prefill, {:.0} TFLOP/s",
        secs * 1e6,
        flops / secs / 1e12
    );
}
