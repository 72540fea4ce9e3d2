//! `paged_attention_fresh` (decode attention reading the step's new tokens straight from the qkv
//! projection) against the two kernels it replaces, `rope_qkv_cache` then the decode kernel: the
//! same output and the same caches, bit for bit, over head dims, group sizes, per-head norms,
//! both rotary layouts, sliding windows and split plans (one block, clusters, the merge kernel).
//! Needs a CUDA GPU.

use crate::common::{Lcg, host_f32, random};
use candle_core::{DType, Device, Tensor};
use pagewise_kernels::{
    HeadNorms, PagedKv, QkvRope, paged_attention_fresh, paged_attention_rows, rope_qkv_cache,
};

/// One layout of heads and how the step is attended.
struct Case {
    heads: usize,
    kv_heads: usize,
    d: usize,
    interleaved: bool,
    norms: bool,
    window: Option<usize>,
    plan: (usize, usize),
}

/// The rows' block tables (shuffled blocks of `bs` slots, 1-based: block 0 stays unused) and
/// the slot of each row's newest position.
fn tables(rng: &mut Lcg, ctx: &[usize], bs: usize, dev: &Device) -> (Tensor, Vec<i64>, usize) {
    let per_row = ctx.iter().map(|c| c.div_ceil(bs)).max().unwrap();
    let blocks = ctx.len() * per_row + 1;
    let mut ids: Vec<i32> = (1..blocks as i32).collect();
    for i in (1..ids.len()).rev() {
        let j = (rng.next().abs() * 1e4) as usize % (i + 1);
        ids.swap(i, j);
    }
    let newest = ctx
        .iter()
        .enumerate()
        .map(|(r, &c)| ids[r * per_row + (c - 1) / bs] as i64 * bs as i64 + ((c - 1) % bs) as i64)
        .collect();
    let t = Tensor::from_vec(ids, (ctx.len(), per_row), dev).unwrap();
    (t, newest, blocks)
}

/// The fused kernel against the two it replaces for rows of contexts `ctx`; with `gathered`, the
/// rotary tables as rows gathered at the step's positions instead of whole tables read there.
fn check(case: &Case, dtype: DType, ctx: &[usize], gathered: bool, seed: u64) {
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(seed);
    let (heads, kv_heads, d, bs) = (case.heads, case.kv_heads, case.d, 16);
    let rows = ctx.len();
    let (bt, newest, blocks) = tables(&mut rng, ctx, bs, &dev);
    // Old context in the caches; each row's newest slot poisoned: whatever reads it before the
    // step's K/V lands shows up as NaN.
    let mut k_old = host_f32(&random(
        &mut rng,
        (blocks * bs * kv_heads, d),
        1.0,
        dtype,
        &dev,
    ));
    let mut v_old = host_f32(&random(
        &mut rng,
        (blocks * bs * kv_heads, d),
        1.0,
        dtype,
        &dev,
    ));
    for &s in &newest {
        let at = s as usize * kv_heads * d;
        k_old[at..at + kv_heads * d].fill(f32::NAN);
        v_old[at..at + kv_heads * d].fill(f32::NAN);
    }
    let cache = |v: &[f32]| {
        Tensor::from_vec(v.to_vec(), (blocks, bs, kv_heads, d), &dev)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
    };
    let qkv = random(
        &mut rng,
        (rows, (heads + 2 * kv_heads) * d),
        2.0,
        dtype,
        &dev,
    );
    let table_rows = ctx.iter().max().unwrap() + 3;
    let angles: Vec<f32> = (0..table_rows * d / 2).map(|_| rng.next() * 3.0).collect();
    let rotary = |f: fn(f32) -> f32| {
        let v: Vec<f32> = angles.iter().map(|&a| f(a)).collect();
        let t = Tensor::from_vec(v, (table_rows, d / 2), &dev).unwrap();
        t.to_dtype(dtype).unwrap()
    };
    let (cos, sin) = (rotary(f32::cos), rotary(f32::sin));
    let positions: Vec<u32> = ctx.iter().map(|&c| c as u32 - 1).collect();
    let positions = Tensor::new(positions.as_slice(), &dev).unwrap();
    let (cos, sin, positions) = match gathered {
        true => (
            cos.index_select(&positions, 0).unwrap(),
            sin.index_select(&positions, 0).unwrap(),
            None,
        ),
        false => (cos, sin, Some(positions)),
    };
    let lens: Vec<i32> = ctx.iter().map(|&c| c as i32).collect();
    let lens = Tensor::new(lens.as_slice(), &dev).unwrap();
    let slots = Tensor::new(newest.as_slice(), &dev).unwrap();
    let (qn, kn) = (
        random(&mut rng, (1, d), 1.0, dtype, &dev)
            .reshape(d)
            .unwrap(),
        random(&mut rng, (1, d), 1.0, dtype, &dev)
            .reshape(d)
            .unwrap(),
    );
    let x = QkvRope {
        qkv: &qkv,
        heads,
        kv_heads,
        cos: &cos,
        sin: &sin,
        positions: positions.as_ref(),
        interleaved: case.interleaved,
        head_norms: case.norms.then_some(HeadNorms {
            q: &qn,
            k: &kn,
            eps: 1e-6,
        }),
    };
    let scale = 1.0 / (d as f32).sqrt();

    // The two kernels the fused one replaces.
    let (kw, vw) = (cache(&k_old), cache(&v_old));
    let q = unsafe { rope_qkv_cache(&x, PagedKv::new(&kw, &vw), &slots) }.unwrap();
    // (Without a window, the decode kernel over the whole context: paged_attention_planned's.)
    let want = unsafe {
        paged_attention_rows(
            &q,
            PagedKv::new(&kw, &vw),
            &bt,
            None,
            &lens,
            case.plan,
            case.window,
            None,
            scale,
        )
    }
    .unwrap();

    let (kg, vg) = (cache(&k_old), cache(&v_old));
    let got = unsafe {
        paged_attention_fresh(
            &x,
            (&kg, &vg),
            &slots,
            &bt,
            None,
            &lens,
            case.plan,
            case.window,
            scale,
        )
    }
    .unwrap();
    let what = format!(
        "{dtype:?} {}x{}x{} interleaved {} norms {} window {:?} plan {:?} contexts {ctx:?} \
         gathered {gathered}",
        heads, kv_heads, d, case.interleaved, case.norms, case.window, case.plan
    );
    let (g, w) = (host_f32(&got), host_f32(&want));
    assert!(
        w.iter().all(|v| v.is_finite()),
        "{what}: reference not finite"
    );
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&g), bits(&w), "{what}: output");
    assert_eq!(
        bits(&host_f32(&kg)),
        bits(&host_f32(&kw)),
        "{what}: K cache"
    );
    assert_eq!(
        bits(&host_f32(&vg)),
        bits(&host_f32(&vw)),
        "{what}: V cache"
    );
}

#[test]
fn fresh_rows_equal_rope_then_attention() {
    let cases = [
        // Qwen3-30B-A3B's heads (group 8), one block a row, clusters of splits, the merge kernel.
        (32, 4, 128, false, true, None, (1, 1)),
        (32, 4, 128, false, true, None, (4, 16)),
        (32, 4, 128, false, true, None, (12, 16)),
        // Qwen3-8B's (group 4); no norms; interleaved pairs; head dims 64 and 256 (Gemma 3, with
        // its sliding window).
        (32, 8, 128, false, false, None, (3, 32)),
        (8, 8, 128, true, true, None, (2, 64)),
        (16, 2, 64, false, true, None, (5, 16)),
        (16, 8, 256, false, true, Some(160), (2, 16)),
        (16, 8, 256, false, true, None, (9, 16)),
    ];
    let mut seed = 1;
    for (heads, kv_heads, d, interleaved, norms, window, plan) in cases {
        let case = Case {
            heads,
            kv_heads,
            d,
            interleaved,
            norms,
            window,
            plan,
        };
        for dtype in [DType::BF16, DType::F16] {
            // The newest position first, last and inside a tile of 64 (32 at d256), a single
            // position, and a context past the window.
            for (ctx, gathered) in [
                (&[1usize, 65][..], false),
                (&[64, 129], true),
                (&[200, 37], false),
            ] {
                check(&case, dtype, ctx, gathered, seed);
                seed += 1;
            }
        }
    }
}

#[test]
fn fresh_rows_refuse_what_the_kernel_cannot_take() {
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(3);
    let (heads, kv_heads, d) = (4, 2, 64);
    let qkv = random(
        &mut rng,
        (1, (heads + 2 * kv_heads) * d),
        1.0,
        DType::F32,
        &dev,
    );
    let cos = random(&mut rng, (8, d / 2), 1.0, DType::F32, &dev);
    let cache = Tensor::zeros((2, 16, kv_heads, d), DType::F32, &dev).unwrap();
    let pos = Tensor::new(&[0u32], &dev).unwrap();
    let slots = Tensor::new(&[16i64], &dev).unwrap();
    let bt = Tensor::new(&[[1i32]], &dev).unwrap();
    let lens = Tensor::new(&[1i32], &dev).unwrap();
    let run = |x: &QkvRope<'_>| unsafe {
        paged_attention_fresh(
            x,
            (&cache, &cache),
            &slots,
            &bt,
            None,
            &lens,
            (1, 1),
            None,
            1.0,
        )
    };
    let mut x = QkvRope {
        qkv: &qkv,
        heads,
        kv_heads,
        cos: &cos,
        sin: &cos,
        positions: Some(&pos),
        interleaved: false,
        head_norms: None,
    };
    let err = run(&x).unwrap_err().to_string();
    assert!(err.contains("bf16 or f16"), "{err}");
    x.qkv = &cos;
    let err = run(&x).unwrap_err().to_string();
    assert!(err.contains("does not hold"), "{err}");
}
