//! The kernels against a naive f32 reference on the CPU: shuffled, non-contiguous blocks, several
//! batch sizes, context lengths from 1 to 16k, GQA ratios 1/4/8, head dims 64 and 128, three dtypes.
//! Needs a CUDA GPU: `cargo test -p pagewise-kernels` on the accelerator machine.

use candle_core::{DType, Device, Tensor};
use pagewise_kernels::{
    CacheWrites, DecodeWorkspace, KvScales, PagedKv, decode_slots, paged_attention_planned,
    paged_attention_planned_into, paged_attention_rows, paged_decode_attention, plan_for,
    reshape_and_cache,
};

use crate::common::{Lcg, graph_replay_seconds, host_f32};

fn case(
    dtype: DType,
    head_dim: usize,
    heads: usize,
    kv_heads: usize,
    ctx_lens: &[usize],
    bs: usize,
    seed: u64,
) -> f32 {
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(seed);
    let blocks: usize = ctx_lens.iter().map(|c| c.div_ceil(bs)).sum();
    let num_blocks = blocks + 1;
    // A shuffled assignment of blocks 1..=blocks.
    let mut ids: Vec<i32> = (1..=blocks as i32).collect();
    for i in (1..ids.len()).rev() {
        let j = ((rng.next() + 1.0) * 0.5 * (i + 1) as f32) as usize % (i + 1);
        ids.swap(i, j);
    }
    let max_blocks = ctx_lens.iter().map(|c| c.div_ceil(bs)).max().unwrap();
    let mut tables = vec![0i32; ctx_lens.len() * max_blocks];
    let mut slots = Vec::new();
    let mut next = 0;
    for (s, &c) in ctx_lens.iter().enumerate() {
        for b in 0..c.div_ceil(bs) {
            tables[s * max_blocks + b] = ids[next];
            next += 1;
        }
        for p in 0..c {
            slots.push(tables[s * max_blocks + p / bs] as i64 * bs as i64 + (p % bs) as i64);
        }
    }
    let tokens = slots.len();
    let width = kv_heads * head_dim;
    let round = |v: Vec<f32>, shape: &[usize]| -> (Tensor, Vec<f32>) {
        let t = Tensor::from_vec(v, shape, &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let back = host_f32(&t);
        (t.to_device(&dev).unwrap(), back)
    };
    let (k, kh) = round(
        (0..tokens * width).map(|_| rng.next()).collect(),
        &[tokens, kv_heads, head_dim],
    );
    let (v, vh) = round(
        (0..tokens * width).map(|_| rng.next()).collect(),
        &[tokens, kv_heads, head_dim],
    );
    let (q, qh) = round(
        (0..ctx_lens.len() * heads * head_dim)
            .map(|_| rng.next())
            .collect(),
        &[ctx_lens.len(), heads, head_dim],
    );
    // Poisoned caches: any slot the kernels read but nobody wrote shows up as NaN.
    let poison = Tensor::full(f32::NAN, (num_blocks, bs, kv_heads, head_dim), &dev)
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    let (kc, vc) = (poison.copy().unwrap(), poison.copy().unwrap());
    let slot_t = Tensor::from_vec(slots, tokens, &dev).unwrap();
    unsafe { reshape_and_cache(&k, &v, PagedKv::new(&kc, &vc), &slot_t) }.unwrap();
    let bt = Tensor::from_vec(tables, (ctx_lens.len(), max_blocks), &dev).unwrap();
    let cl = Tensor::from_vec(
        ctx_lens.iter().map(|&c| c as i32).collect::<Vec<_>>(),
        ctx_lens.len(),
        &dev,
    )
    .unwrap();
    let scale = 1.0 / (head_dim as f32).sqrt();
    let max_ctx = *ctx_lens.iter().max().unwrap();
    let out =
        unsafe { paged_decode_attention(&q, PagedKv::new(&kc, &vc), &bt, &cl, max_ctx, scale) }
            .unwrap();
    let got = host_f32(&out);
    // The same with K/V copied before the wait on the kernel before (all of it has ended here):
    // the same values, bit for bit.
    dev.synchronize().unwrap();
    let plan = plan_for(&q, &kc, max_ctx).unwrap();
    let writes = CacheWrites::LastPosition;
    let early = unsafe {
        paged_attention_planned(
            &q,
            PagedKv::new(&kc, &vc),
            &bt,
            None,
            &cl,
            plan,
            writes,
            scale,
        )
    };
    assert_eq!(
        host_f32(&early.unwrap()),
        got,
        "copies before the wait changed the result"
    );
    // With attention sinks (gpt-oss): each head's logit joins its softmax.
    let sinks: Vec<f32> = (0..heads).map(|_| rng.next() * 2.0).collect();
    let sinks_t = Tensor::from_slice(&sinks, heads, &dev).unwrap();
    let sunk = unsafe {
        paged_attention_rows(
            &q,
            PagedKv::new(&kc, &vc),
            &bt,
            None,
            &cl,
            plan,
            None,
            Some(&sinks_t),
            scale,
        )
    };
    let sunk = host_f32(&sunk.unwrap());

    let mut max_err = 0f32;
    let mut first = 0;
    for (s, &c) in ctx_lens.iter().enumerate() {
        for h in 0..heads {
            let g = h / (heads / kv_heads);
            let qv = &qh[(s * heads + h) * head_dim..][..head_dim];
            let scores: Vec<f32> = (0..c)
                .map(|p| {
                    let kv = &kh[((first + p) * kv_heads + g) * head_dim..][..head_dim];
                    qv.iter().zip(kv).map(|(a, b)| a * b).sum::<f32>() * scale
                })
                .collect();
            let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let z: f32 = scores.iter().map(|x| (x - m).exp()).sum();
            // The share the sink leaves the positions.
            let kept = z / (z + (sinks[h] - m).exp());
            for d in 0..head_dim {
                let want: f32 = scores
                    .iter()
                    .enumerate()
                    .map(|(p, x)| {
                        (x - m).exp() / z * vh[((first + p) * kv_heads + g) * head_dim + d]
                    })
                    .sum();
                let have = got[(s * heads + h) * head_dim + d];
                assert!(have.is_finite(), "NaN/inf at seq {s} head {h} dim {d}");
                max_err = max_err.max((have - want).abs());
                let have = sunk[(s * heads + h) * head_dim + d];
                assert!(
                    have.is_finite(),
                    "sinks: NaN/inf at seq {s} head {h} dim {d}"
                );
                max_err = max_err.max((have - want * kept).abs());
            }
        }
        first += c;
    }
    max_err
}

#[test]
fn decode_attention_matches_the_reference() {
    let mut seed = 1;
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        let tol = if dtype == DType::F32 { 1e-4 } else { 2e-2 };
        for head_dim in [64, 128, 256] {
            for (heads, kv_heads) in [(8, 8), (8, 2), (32, 4)] {
                for lens in [
                    vec![1],
                    vec![17, 3, 250],
                    vec![512; 8],
                    vec![1000, 1, 2048, 33],
                ] {
                    seed += 1;
                    let err = case(dtype, head_dim, heads, kv_heads, &lens, 16, seed);
                    assert!(
                        err <= tol,
                        "{dtype:?} d{head_dim} {heads}/{kv_heads} {lens:?}: max err {err}"
                    );
                }
            }
        }
    }
    // One long context.
    let err = case(DType::BF16, 128, 32, 8, &[16384], 16, 99);
    assert!(err <= 2e-2, "16k context: {err}");
    // Block size 32 and head dim 256 (two stages of 32 KB per block).
    for (dtype, tol) in [(DType::BF16, 2e-2), (DType::F32, 1e-4)] {
        for (head_dim, heads, kv_heads) in [(128, 32, 8), (256, 8, 1), (64, 16, 2)] {
            let lens = [1, 31, 33, 700, 4099];
            let err = case(dtype, head_dim, heads, kv_heads, &lens, 32, 7);
            assert!(
                err <= tol,
                "{dtype:?} d{head_dim} {heads}/{kv_heads} bs 32: {err}"
            );
        }
    }
}

#[test]
fn bad_arguments_are_refused_clearly() {
    let dev = Device::new_cuda(0).unwrap();
    let q = Tensor::zeros((2, 8, 96), DType::BF16, &dev).unwrap();
    let kc = Tensor::zeros((4, 16, 2, 96), DType::BF16, &dev).unwrap();
    let bt = Tensor::zeros((2, 1), DType::I32, &dev).unwrap();
    let cl = Tensor::zeros(2, DType::I32, &dev).unwrap();
    let err = unsafe { paged_decode_attention(&q, PagedKv::new(&kc, &kc), &bt, &cl, 16, 1.0) }
        .unwrap_err()
        .to_string();
    assert!(err.contains("head_dim 96"), "{err}");
    let q = Tensor::zeros((2, 8, 64), DType::F32, &dev).unwrap();
    let kc = Tensor::zeros((4, 16, 2, 64), DType::BF16, &dev).unwrap();
    let err = unsafe { paged_decode_attention(&q, PagedKv::new(&kc, &kc), &bt, &cl, 16, 1.0) }
        .unwrap_err()
        .to_string();
    assert!(err.contains("k_cache is BF16 but must be F32"), "{err}");
    // An FP8 cache (e4m3 bytes) takes 16-bit queries only.
    let k8 = Tensor::zeros((4, 16, 2, 64), DType::U8, &dev).unwrap();
    let fp8 = PagedKv::fp8(&k8, &k8, KvScales::ONE);
    let err = unsafe { paged_decode_attention(&q, fp8, &bt, &cl, 16, 1.0) }
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("an FP8 KV cache takes f16 or bf16 values"),
        "{err}"
    );
    let cpu = Tensor::zeros((2, 8, 64), DType::BF16, &Device::Cpu).unwrap();
    let err = unsafe { paged_decode_attention(&cpu, PagedKv::new(&kc, &kc), &bt, &cl, 16, 1.0) }
        .unwrap_err()
        .to_string();
    assert!(err.contains("CUDA"), "{err}");
}

/// Decode attention bandwidth: KV bytes read per second, batch × context, GQA 32/8, head dim 128
/// (or `PAGEWISE_BW_SHAPE`), bf16, block size 16, scattered block tables. Buffers are allocated once and the kernel is timed
/// with CUDA events over 64 launches, issued one by one and replayed from a CUDA graph (the GPU's
/// time: the table's bandwidth); the launches rotate over
/// copies of the cache totalling at least 128 MB, so small cases do not run out of the 50 MB L2.
/// Each case runs with a bf16 cache, then with an FP8 (e4m3) one: half the bytes. Run on the GPU
/// machine: `kernel-tests --ignored --nocapture decode_bandwidth`.
#[test]
#[ignore]
fn decode_bandwidth() {
    let dev = Device::new_cuda(0).unwrap();
    let stream = dev.as_cuda_device().unwrap().cuda_stream();
    let timing =
        Some(candle_core::cuda_backend::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    // PAGEWISE_BW_SHAPE="16x8x256" (query heads x KV heads x head dim) times another geometry:
    // Gemma-3-12B's, whose head dim 256 takes the CUDA-core kernel.
    let shape = std::env::var("PAGEWISE_BW_SHAPE").unwrap_or_else(|_| "32x8x128".into());
    let dims: Vec<usize> = shape.split('x').map(|v| v.parse().unwrap()).collect();
    let [heads, kv_heads, d] = dims[..] else {
        panic!("PAGEWISE_BW_SHAPE: HEADSxKV_HEADSxHEAD_DIM, not {shape}")
    };
    let bs = 16;
    let group = heads / kv_heads;
    let slots = decode_slots(DType::BF16, d, group).unwrap();
    println!("decode blocks at once (bf16, d{d}, group {group}): {slots}");
    // PAGEWISE_BW_CASES="64x2048 1x8192" times those cases instead (tuning, profiling).
    let only = std::env::var("PAGEWISE_BW_CASES").unwrap_or_default();
    let cases: Vec<(usize, usize)> = if only.is_empty() {
        let grid = [1usize, 8, 64, 256].map(|b| [512usize, 2048, 8192].map(|c| (b, c)));
        grid.concat()
    } else {
        only.split_whitespace()
            .map(|c| {
                let (b, ctx) = c.split_once('x').expect("PAGEWISE_BW_CASES: BATCHxCONTEXT");
                (b.parse().unwrap(), ctx.parse().unwrap())
            })
            .collect()
    };
    println!(
        "| batch | context | KV cache | launched one by one (µs) | graph replay (µs) | KV read (TB/s) | share of 3.97 TB/s |"
    );
    println!("|---|---|---|---|---|---|---|");
    for ((batch, ctx), fp8) in cases.iter().flat_map(|&case| [(case, false), (case, true)]) {
        let bytes = (batch * ctx * kv_heads * d * 2 * if fp8 { 1 } else { 2 }) as f64;
        let setup = Setup::new(&dev, batch, ctx, (heads, kv_heads, d, bs), fp8);
        let copies = setup.caches.len();
        let run = |i: usize| setup.run(i);
        for i in 0..copies.max(3) {
            run(i);
        }
        let iters = 64;
        // Launched one by one (the host's submission can be the bottleneck at small sizes)...
        let start = stream.record_event(timing).unwrap();
        for i in 0..iters {
            run(i);
        }
        let end = stream.record_event(timing).unwrap();
        let eager = f64::from(start.elapsed_ms(&end).unwrap()) / 1e3 / iters as f64;
        // ...and replayed from a CUDA graph, as the engine's decode steps run: GPU time.
        let secs = graph_replay_seconds(&stream, iters, &run);
        let rate = bytes / secs;
        println!(
            "| {batch} | {ctx} | {} | {:.1} | {:.2} | {:.3} | {:.1}% |",
            if fp8 { "fp8" } else { "bf16" },
            eager * 1e6,
            secs * 1e6,
            rate / 1e12,
            rate / 3.97e12 * 100.0
        );
    }
}

/// A decode launch over `batch` sequences of `ctx` positions (bf16 queries, a bf16 or FP8 cache;
/// zeros: only the time counts) with copies of the cache totalling at least 128 MB, so that
/// launches rotating over them do not run out of the 50 MB L2.
struct Setup {
    caches: Vec<(Tensor, Tensor)>,
    fp8: bool,
    bt: Tensor,
    cl: Tensor,
    q: Tensor,
    out: Tensor,
    ws: DecodeWorkspace,
    plan: (usize, usize),
}

impl Setup {
    fn new(
        dev: &Device,
        batch: usize,
        ctx: usize,
        shape: (usize, usize, usize, usize),
        fp8: bool,
    ) -> Self {
        let (heads, kv_heads, d, bs) = shape;
        let blocks_per_seq = ctx / bs;
        let num_blocks = batch * blocks_per_seq + 1;
        let element = if fp8 { DType::U8 } else { DType::BF16 };
        let bytes = (batch * ctx * kv_heads * d * 2 * element.size_in_bytes()) as f64;
        // PAGEWISE_BW_COPIES overrides the count (1: every launch reads the same cache).
        let copies = std::env::var("PAGEWISE_BW_COPIES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(((128e6 / bytes).ceil() as usize).clamp(1, 64));
        let caches: Vec<(Tensor, Tensor)> = (0..copies)
            .map(|_| {
                let kc = Tensor::zeros((num_blocks, bs, kv_heads, d), element, dev).unwrap();
                (kc.copy().unwrap(), kc)
            })
            .collect();
        // Each sequence's blocks in a scattered order.
        let tables: Vec<i32> = (0..batch * blocks_per_seq)
            .map(|i| 1 + ((i * 7919) % (batch * blocks_per_seq)) as i32)
            .collect();
        let bt = Tensor::from_vec(tables, (batch, blocks_per_seq), dev).unwrap();
        let cl = Tensor::from_vec(vec![ctx as i32; batch], batch, dev).unwrap();
        let q = Tensor::zeros((batch, heads, d), DType::BF16, dev).unwrap();
        let out = q.zeros_like().unwrap();
        // PAGEWISE_BW_SPLITS=N times N splits instead of the planned count (tuning the plan).
        let plan = match std::env::var("PAGEWISE_BW_SPLITS").map(|s| s.parse::<usize>()) {
            Ok(Ok(n)) => (n, ctx.div_ceil(n)),
            _ => plan_for(&q, &caches[0].0, ctx).unwrap(),
        };
        let ws = DecodeWorkspace::new(batch, heads, plan.0, d, dev).unwrap();
        Setup {
            caches,
            fp8,
            bt,
            cl,
            q,
            out,
            ws,
            plan,
        }
    }

    /// Launch `i`, on copy `i` of the cache (round robin).
    fn run(&self, i: usize) {
        let (kc, vc) = &self.caches[i % self.caches.len()];
        // As the engine's decode steps: K/V copied before the wait (nothing on the stream writes
        // the caches, so a decode step's contract holds).
        let writes = CacheWrites::LastPosition;
        let kv = if self.fp8 {
            PagedKv::fp8(kc, vc, KvScales::ONE)
        } else {
            PagedKv::new(kc, vc)
        };
        unsafe {
            paged_attention_planned_into(
                &self.out, &self.ws, &self.q, kv, &self.bt, None, &self.cl, self.plan, writes, 0.1,
            )
        }
        .unwrap()
    }
}
