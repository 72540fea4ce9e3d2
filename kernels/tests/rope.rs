//! Rotary embedding with the KV-cache write: `rope_qkv_cache` against a host reference, and the
//! qkv GEMV with both folded in (`gemv_rope_cache`) against the kernels it replaces, bit for bit.
//! Needs a CUDA GPU.

use crate::common::{Lcg, host_f32, max_rel_diff, random, random_codes};
use candle_core::{DType, Device, Tensor};
use pagewise_kernels::PagedKv;

/// Rotary cos and sin rows (`[rows, d / 2]`, `dtype`) at random angles.
fn rotary_rows(
    rng: &mut Lcg,
    rows: usize,
    d: usize,
    dtype: DType,
    dev: &Device,
) -> (Tensor, Tensor) {
    let angles: Vec<f32> = (0..rows * d / 2).map(|_| rng.next() * 3.0).collect();
    let table = |f: fn(f32) -> f32| {
        let v: Vec<f32> = angles.iter().map(|&a| f(a)).collect();
        Tensor::from_vec(v, (rows, d / 2), dev)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
    };
    (table(f32::cos), table(f32::sin))
}

/// Host reference of one rotary pair rotation.
fn rotate(x1: f32, x2: f32, c: f32, s: f32) -> (f32, f32) {
    (x1 * c - x2 * s, x1 * s + x2 * c)
}

#[test]
fn rope_qkv_cache_rotates_q_and_writes_the_cache_at_each_slot() {
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(9);
    for dtype in [DType::F32, DType::BF16] {
        for (interleaved, heads, kv_heads, d) in
            [(false, 8, 2, 64), (true, 4, 4, 128), (false, 32, 8, 128)]
        {
            let (tokens, blocks, bs) = (5, 4, 16);
            let width = (heads + 2 * kv_heads) * d;
            let qkv = random(&mut rng, (tokens, width), 1.0, dtype, &dev);
            let (cos, sin) = rotary_rows(&mut rng, tokens, d, dtype, &dev);
            // Scattered slots; token 3 is padding (-1) and must write nothing.
            let slots_host = vec![37i64, 2, 63, -1, 16];
            let slots = Tensor::new(slots_host.as_slice(), &dev).unwrap();
            let k_cache = Tensor::zeros((blocks, bs, kv_heads, d), dtype, &dev).unwrap();
            let v_cache = Tensor::zeros((blocks, bs, kv_heads, d), dtype, &dev).unwrap();
            let x = pagewise_kernels::QkvRope {
                qkv: &qkv,
                heads,
                kv_heads,
                cos: &cos,
                sin: &sin,
                positions: None,
                interleaved,
                head_norms: None,
            };
            let q = unsafe {
                pagewise_kernels::rope_qkv_cache(&x, PagedKv::new(&k_cache, &v_cache), &slots)
            }
            .unwrap();
            assert_eq!(q.dims(), [tokens, heads, d]);
            let (src, c, s) = (host_f32(&qkv), host_f32(&cos), host_f32(&sin));
            let (q, kc, vc) = (host_f32(&q), host_f32(&k_cache), host_f32(&v_cache));
            // The rotated head `h` of token `t`, from the fused row.
            let rotated = |t: usize, h: usize| {
                let row = &src[t * width + h * d..t * width + (h + 1) * d];
                let mut out = vec![0f32; d];
                for i in 0..d / 2 {
                    let (a, b) = if interleaved {
                        (2 * i, 2 * i + 1)
                    } else {
                        (i, i + d / 2)
                    };
                    let (y1, y2) = rotate(row[a], row[b], c[t * d / 2 + i], s[t * d / 2 + i]);
                    out[a] = y1;
                    out[b] = y2;
                }
                out
            };
            let tol = if dtype == DType::F32 { 1e-5 } else { 2e-2 };
            let mut want_k = vec![0f32; kc.len()];
            let mut want_v = vec![0f32; vc.len()];
            for t in 0..tokens {
                for h in 0..heads {
                    let err = max_rel_diff(
                        &q[(t * heads + h) * d..(t * heads + h + 1) * d],
                        &rotated(t, h),
                    );
                    assert!(err < tol, "{dtype:?} q token {t} head {h}: {err}");
                }
                let Ok(slot) = usize::try_from(slots_host[t]) else {
                    continue;
                };
                for h in 0..kv_heads {
                    let at = (slot * kv_heads + h) * d;
                    want_k[at..at + d].copy_from_slice(&rotated(t, heads + h));
                    let v0 = t * width + (heads + kv_heads + h) * d;
                    want_v[at..at + d].copy_from_slice(&src[v0..v0 + d]);
                }
            }
            assert!(max_rel_diff(&kc, &want_k) < tol, "{dtype:?} k cache");
            assert_eq!(
                vc, want_v,
                "{dtype:?} v cache: exact copies, nothing else written"
            );
        }
    }
}

/// Qwen3's and Gemma 3's per-head q/k RMSNorm folded into the rotary kernel, against a host
/// reference (normalize each head, round to the dtype, rotate), with the rotary tables read at
/// each token's position; a mismatched norm weight is refused.
#[test]
fn rope_qkv_cache_normalizes_each_head_before_rotating() {
    use pagewise_kernels::{HeadNorms, QkvRope, rope_qkv_cache};
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(33);
    for dtype in [DType::F32, DType::BF16] {
        for (heads, kv_heads, d) in [(8, 2, 64), (32, 8, 128), (16, 8, 256)] {
            let (tokens, blocks, bs, eps) = (3, 4, 16, 1e-6f32);
            let width = (heads + 2 * kv_heads) * d;
            let qkv = random(&mut rng, (tokens, width), 3.0, dtype, &dev);
            let table_rows = 20;
            let (cos, sin) = rotary_rows(&mut rng, table_rows, d, dtype, &dev);
            let pos_host = [17u32, 3, 40]; // the last past the table: reads its last row
            let positions = Tensor::new(&pos_host, &dev).unwrap();
            let qn = random(&mut rng, (1, d), 1.0, dtype, &dev)
                .squeeze(0)
                .unwrap();
            let kn = random(&mut rng, (1, d), 1.0, dtype, &dev)
                .squeeze(0)
                .unwrap();
            let slots_host = [5i64, -1, 33];
            let slots = Tensor::new(&slots_host, &dev).unwrap();
            let k_cache = Tensor::zeros((blocks, bs, kv_heads, d), dtype, &dev).unwrap();
            let v_cache = Tensor::zeros((blocks, bs, kv_heads, d), dtype, &dev).unwrap();
            let x = QkvRope {
                qkv: &qkv,
                heads,
                kv_heads,
                cos: &cos,
                sin: &sin,
                positions: Some(&positions),
                interleaved: false,
                head_norms: Some(HeadNorms {
                    q: &qn,
                    k: &kn,
                    eps,
                }),
            };
            let q =
                unsafe { rope_qkv_cache(&x, PagedKv::new(&k_cache, &v_cache), &slots) }.unwrap();
            let (src, c, s) = (host_f32(&qkv), host_f32(&cos), host_f32(&sin));
            let (qnw, knw) = (host_f32(&qn), host_f32(&kn));
            let round = |v: f32| {
                Tensor::new(&[v], &Device::Cpu)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap()
                    .to_dtype(DType::F32)
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()[0]
            };
            let expect = |t: usize, h: usize| {
                let row = &src[t * width + h * d..][..d];
                let w = if h < heads { &qnw } else { &knw };
                let ms = row.iter().map(|v| v * v).sum::<f32>() / d as f32;
                let inv = 1.0 / (ms + eps).sqrt();
                let normed: Vec<f32> = (0..d).map(|i| round(row[i] * inv * w[i])).collect();
                let tr = (pos_host[t] as usize).min(table_rows - 1);
                let mut out = vec![0f32; d];
                for i in 0..d / 2 {
                    let (cc, ss) = (c[tr * d / 2 + i], s[tr * d / 2 + i]);
                    let (y1, y2) = rotate(normed[i], normed[i + d / 2], cc, ss);
                    out[i] = y1;
                    out[i + d / 2] = y2;
                }
                out
            };
            let tol = if dtype == DType::F32 { 1e-5 } else { 2e-2 };
            let (q, kc) = (host_f32(&q), host_f32(&k_cache));
            for t in 0..tokens {
                for h in 0..heads {
                    let err = max_rel_diff(&q[(t * heads + h) * d..][..d], &expect(t, h));
                    assert!(err < tol, "{dtype:?} d{d} q token {t} head {h}: {err}");
                }
                let Ok(slot) = usize::try_from(slots_host[t]) else {
                    continue;
                };
                for h in 0..kv_heads {
                    let got = &kc[(slot * kv_heads + h) * d..][..d];
                    let err = max_rel_diff(got, &expect(t, heads + h));
                    assert!(err < tol, "{dtype:?} d{d} k token {t} head {h}: {err}");
                }
            }
        }
    }
    // A norm weight of the wrong width is refused by name.
    let z = |shape: &[usize]| Tensor::zeros(shape, DType::BF16, &dev).unwrap();
    let (qkv, c, w) = (z(&[1, 6 * 64]), z(&[1, 32]), z(&[32]));
    let (kc, slots) = (z(&[2, 16, 1, 64]), Tensor::new(&[0i64], &dev).unwrap());
    let x = QkvRope {
        qkv: &qkv,
        heads: 4,
        kv_heads: 1,
        cos: &c,
        sin: &c,
        positions: None,
        interleaved: false,
        head_norms: Some(HeadNorms {
            q: &w,
            k: &w,
            eps: 1e-6,
        }),
    };
    let err = unsafe { rope_qkv_cache(&x, PagedKv::new(&kc, &kc), &slots) }
        .unwrap_err()
        .to_string();
    assert!(err.contains("q norm"), "{err}");
}

/// The qkv GEMV with rotary and the cache write folded in against the two kernels it replaces
/// (RMSNorm-then-GEMV, then rope + cache write): the same q and caches, bit for bit, since it
/// sums each output in the GEMV's order and rounds as the projection stores qkv. Dense weights,
/// and FP8 ones with a scale a row.
#[test]
fn gemv_rope_cache_equals_the_gemv_then_rope_and_cache() {
    use pagewise_kernels::{
        Fp8Matrix, GemvInput, GemvWeight, QkvRope, RopeCacheTarget, gemv_fused, gemv_rope_cache,
        rope_qkv_cache,
    };
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(21);
    for dtype in [DType::F16, DType::BF16] {
        for (rows, interleaved, heads, kv_heads, d, k) in [
            (1, false, 32, 8, 128, 4096),
            (3, true, 4, 4, 128, 576),
            (8, false, 8, 2, 64, 2048),
            (2, false, 14, 2, 64, 896),
        ] {
            let case = format!("{dtype:?} rows {rows} {heads}/{kv_heads} d{d} k{k}");
            let (blocks, bs) = (4, 16);
            let width = (heads + 2 * kv_heads) * d;
            let x = random(&mut rng, (rows, k), 1.0, dtype, &dev);
            let dense = random(&mut rng, (width, k), 0.05, dtype, &dev);
            let (codes, _) = random_codes(&mut rng, (width, k), &dev);
            let scales = random(&mut rng, (width, 1), 0.01, DType::F32, &dev)
                .abs()
                .unwrap();
            let fp8 = Fp8Matrix {
                data: &codes,
                scales: &scales,
                block: (1, k),
            };
            let g = random(&mut rng, (1, k), 1.0, dtype, &dev)
                .squeeze(0)
                .unwrap();
            let (cos, sin) = rotary_rows(&mut rng, rows, d, dtype, &dev);
            // Scattered slots, the second row padding (-1: writes nothing).
            let slots_host: Vec<i64> = [37i64, -1, 63, 2, 16, 40, 5, 50][..rows].to_vec();
            let slots = Tensor::new(slots_host.as_slice(), &dev).unwrap();
            let k0 = random(&mut rng, (blocks * bs, kv_heads * d), 9.0, dtype, &dev);
            let v0 = random(&mut rng, (blocks * bs, kv_heads * d), 9.0, dtype, &dev);
            let cache = |t: &Tensor| {
                t.reshape((blocks, bs, kv_heads, d))
                    .unwrap()
                    .copy()
                    .unwrap()
            };

            // Whole tables read at each row's position, for the second half of each case (rows in
            // reverse order near the end of a longer table; the last row's position past it reads
            // its end).
            let table_rows = rows + 5;
            let positions: Vec<u32> = (0..rows as u32)
                .map(|r| table_rows as u32 - 1 - r)
                .collect();
            let mut whole = |t: &Tensor| {
                let mut v = vec![rng.next(); table_rows * d / 2];
                let rows_host = host_f32(t);
                for (r, &p) in positions.iter().enumerate() {
                    v[p as usize * d / 2..][..d / 2]
                        .copy_from_slice(&rows_host[r * d / 2..][..d / 2]);
                }
                Tensor::from_vec(v, (table_rows, d / 2), &dev)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap()
            };
            let (cos_t, sin_t) = (whole(&cos), whole(&sin));
            let mut at = positions.clone();
            at[0] += 7; // row 0's row is the table's last: clamped there
            let at = Tensor::new(at.as_slice(), &dev).unwrap();
            for (kind, w) in [("dense", GemvWeight::Dense(&dense)), ("FP8", fp8.into())] {
                let case = format!("{case} {kind}");
                let (want_k, want_v) = (cache(&k0), cache(&v0));
                let norm = GemvInput::RmsNorm {
                    weight: &g,
                    eps: 1e-5,
                };
                let qkv = gemv_fused(&x, w, norm, None).unwrap();
                let rope = QkvRope {
                    qkv: &qkv,
                    heads,
                    kv_heads,
                    cos: &cos,
                    sin: &sin,
                    positions: None,
                    interleaved,
                    head_norms: None,
                };
                let want_q =
                    unsafe { rope_qkv_cache(&rope, PagedKv::new(&want_k, &want_v), &slots) }
                        .unwrap();

                let (got_k, got_v) = (cache(&k0), cache(&v0));
                let target = RopeCacheTarget {
                    heads,
                    kv_heads,
                    cos: &cos,
                    sin: &sin,
                    positions: None,
                    interleaved,
                    k_cache: &got_k,
                    v_cache: &got_v,
                    slot_mapping: &slots,
                };
                let got_q = unsafe { gemv_rope_cache(&x, w, &g, 1e-5, &target) }.unwrap();
                assert_eq!(host_f32(&got_q), host_f32(&want_q), "{case}: q");
                assert_eq!(host_f32(&got_k), host_f32(&want_k), "{case}: k cache");
                assert_eq!(host_f32(&got_v), host_f32(&want_v), "{case}: v cache");

                // The same from whole tables read at each row's position.
                let (got_k, got_v) = (cache(&k0), cache(&v0));
                let target = RopeCacheTarget {
                    cos: &cos_t,
                    sin: &sin_t,
                    positions: Some(&at),
                    k_cache: &got_k,
                    v_cache: &got_v,
                    ..target
                };
                let got_q = unsafe { gemv_rope_cache(&x, w, &g, 1e-5, &target) }.unwrap();
                assert_eq!(
                    host_f32(&got_q),
                    host_f32(&want_q),
                    "{case}: q at positions"
                );
                assert_eq!(
                    host_f32(&got_k),
                    host_f32(&want_k),
                    "{case}: k cache at positions"
                );
                assert_eq!(
                    host_f32(&got_v),
                    host_f32(&want_v),
                    "{case}: v cache at positions"
                );
            }
        }
    }
    // Mismatched shapes are refused clearly.
    let z = |shape: &[usize]| Tensor::zeros(shape, DType::BF16, &dev).unwrap();
    let (x, g, c) = (z(&[1, 64]), z(&[64]), z(&[1, 32]));
    let (kc, slots) = (z(&[2, 16, 2, 64]), Tensor::new(&[0i64], &dev).unwrap());
    let target = pagewise_kernels::RopeCacheTarget {
        heads: 4,
        kv_heads: 2,
        cos: &c,
        sin: &c,
        positions: None,
        interleaved: false,
        k_cache: &kc,
        v_cache: &kc,
        slot_mapping: &slots,
    };
    let err =
        unsafe { pagewise_kernels::gemv_rope_cache(&x, &z(&[7 * 64, 64]), &g, 1e-5, &target) }
            .unwrap_err()
            .to_string();
    assert!(err.contains("heads"), "{err}");
}
