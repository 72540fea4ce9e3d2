//! The fused decoder-layer kernels against the same math done by candle's separate ops in f32
//! (run on the GPU machine: scripts/gpu/run.sh).

use crate::common::{Lcg, host_f32, max_rel_diff, random};
use candle_core::{DType, Device, Tensor};

#[test]
fn add_rms_norm_matches_add_then_rms_norm() {
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(11);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (rows, hidden) in [(1, 576), (3, 2048), (37, 4096), (5, 8192), (0, 64)] {
            let x = random(&mut rng, (rows, hidden), 4.0, dtype, &dev);
            let delta = random(&mut rng, (rows, hidden), 1.0, dtype, &dev);
            let w = random(&mut rng, (1, hidden), 1.0, dtype, &dev)
                .squeeze(0)
                .unwrap();
            let (sum, normed) = pagewise_kernels::add_rms_norm(&x, &delta, &w, 1e-5).unwrap();
            if rows == 0 {
                assert_eq!((sum.dims(), normed.dims()), (x.dims(), x.dims()));
                continue;
            }
            // Reference: the sum rounded to the dtype (as the unfused add stores it), normalized
            // in f32 on the host.
            let want_sum = (&x + &delta).unwrap();
            let (s, wv) = (host_f32(&want_sum), host_f32(&w));
            let mut want_norm = vec![0f32; s.len()];
            for r in 0..rows {
                let row = &s[r * hidden..(r + 1) * hidden];
                let ms = row.iter().map(|v| v * v).sum::<f32>() / hidden as f32;
                let inv = 1.0 / (ms + 1e-5).sqrt();
                for i in 0..hidden {
                    want_norm[r * hidden + i] = row[i] * inv * wv[i];
                }
            }
            assert_eq!(
                host_f32(&sum),
                host_f32(&want_sum),
                "{dtype:?} {rows}x{hidden} sum"
            );
            let tol = if dtype == DType::F32 { 1e-5 } else { 1e-2 };
            let err = max_rel_diff(&host_f32(&normed), &want_norm);
            assert!(err < tol, "{dtype:?} {rows}x{hidden}: normed off by {err}");
        }
    }
}

/// Gemma's residual add of a normalized output: `x + rms_norm(delta) * w`, against the same
/// computed on the host from the dtype's values (the normalized delta rounded to the dtype, as
/// the separate norm kernel stores it, then the add rounded).
#[test]
fn add_rms_normed_matches_norm_then_add() {
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(17);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (rows, hidden) in [(1, 1152), (2, 3840), (5, 5376), (3, 100), (0, 64)] {
            let x = random(&mut rng, (rows, hidden), 4.0, dtype, &dev);
            let delta = random(&mut rng, (rows, hidden), 1.0, dtype, &dev);
            let w = random(&mut rng, (1, hidden), 1.0, dtype, &dev)
                .squeeze(0)
                .unwrap();
            let got = pagewise_kernels::add_rms_normed(&x, &delta, &w, 1e-6).unwrap();
            assert_eq!(got.dims(), x.dims());
            if rows == 0 {
                continue;
            }
            let (xv, dv, wv) = (host_f32(&x), host_f32(&delta), host_f32(&w));
            let mut normed = vec![0f32; dv.len()];
            for r in 0..rows {
                let row = &dv[r * hidden..(r + 1) * hidden];
                let inv =
                    1.0 / (row.iter().map(|v| v * v).sum::<f32>() / hidden as f32 + 1e-6).sqrt();
                for i in 0..hidden {
                    normed[r * hidden + i] = row[i] * inv * wv[i];
                }
            }
            let round = |v: Vec<f32>| {
                let t = Tensor::from_vec(v, (rows, hidden), &Device::Cpu).unwrap();
                host_f32(&t.to_dtype(dtype).unwrap())
            };
            let normed = round(normed);
            let want = round(xv.iter().zip(&normed).map(|(a, b)| a + b).collect());
            let tol = if dtype == DType::F32 { 1e-5 } else { 2e-2 };
            let err = max_rel_diff(&host_f32(&got), &want);
            assert!(err < tol, "{dtype:?} {rows}x{hidden}: off by {err}");
        }
    }
    let x = Tensor::zeros((2, 64), DType::BF16, &dev).unwrap();
    let w = Tensor::zeros(32, DType::BF16, &dev).unwrap();
    let err = pagewise_kernels::add_rms_normed(&x, &x, &w, 1e-6)
        .unwrap_err()
        .to_string();
    assert!(err.contains("do not match"), "{err}");
}

#[test]
fn silu_mul_matches_silu_times_up() {
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(5);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        // (100 and 33: widths the 16-byte vector path does not take)
        for (rows, inter) in [
            (1, 1536),
            (7, 8192),
            (300, 14336),
            (3, 100),
            (2, 33),
            (0, 64),
        ] {
            let gu = random(&mut rng, (rows, 2 * inter), 6.0, dtype, &dev);
            let got = pagewise_kernels::silu_mul(&gu).unwrap();
            assert_eq!(got.dims(), [rows, inter]);
            if rows == 0 {
                continue;
            }
            let h = host_f32(&gu);
            let want: Vec<f32> = (0..rows * inter)
                .map(|idx| {
                    let (r, i) = (idx / inter, idx % inter);
                    let g = h[r * 2 * inter + i];
                    g / (1.0 + (-g).exp()) * h[r * 2 * inter + inter + i]
                })
                .collect();
            let tol = if dtype == DType::F32 { 1e-5 } else { 1e-2 };
            let err = max_rel_diff(&host_f32(&got), &want);
            assert!(err < tol, "{dtype:?} {rows}x{inter}: off by {err}");
        }
    }
}

#[test]
fn fused_kernels_refuse_mismatched_inputs() {
    let dev = Device::new_cuda(0).unwrap();
    let x = Tensor::zeros((2, 64), DType::BF16, &dev).unwrap();
    let w = Tensor::zeros(32, DType::BF16, &dev).unwrap();
    let e = pagewise_kernels::add_rms_norm(&x, &x, &w, 1e-5).unwrap_err();
    assert!(e.to_string().contains("do not match"), "{e}");
    let w32 = Tensor::zeros(64, DType::F32, &dev).unwrap();
    let e = pagewise_kernels::add_rms_norm(&x, &x, &w32, 1e-5).unwrap_err();
    assert!(e.to_string().contains("one dtype"), "{e}");
    let odd = Tensor::zeros((2, 63), DType::BF16, &dev).unwrap();
    let e = pagewise_kernels::silu_mul(&odd).unwrap_err();
    assert!(e.to_string().contains("even width"), "{e}");
}

#[test]
fn gemv_matches_a_host_matmul() {
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(3);
    for dtype in [DType::F16, DType::BF16] {
        for (rows, out, k) in [
            (1, 1000, 576),
            (3, 4096, 2048),
            (8, 777, 4096),
            (2, 64, 14336),
            (5, 2048, 8192),
        ] {
            let x = random(&mut rng, (rows, k), 1.0, dtype, &dev);
            let w = random(&mut rng, (out, k), 0.05, dtype, &dev);
            let got = host_f32(&pagewise_kernels::gemv(&x, &w).unwrap());
            // Batch invariance: each row as it comes out alone, bit for bit (the warps an output
            // takes depend on the shape, not on the rows).
            for r in 0..rows {
                let row = x.narrow(0, r, 1).unwrap();
                let alone = pagewise_kernels::gemv(&row, &w)
                    .unwrap()
                    .narrow(0, 0, 1)
                    .unwrap();
                let case = format!("{dtype:?} {rows}x{out}x{k} row {r}");
                assert_eq!(host_f32(&alone), got[r * out..(r + 1) * out], "{case}");
            }
            let (xh, wh) = (host_f32(&x), host_f32(&w));
            let want: Vec<f32> = (0..rows * out)
                .map(|i| {
                    let (r, o) = (i / out, i % out);
                    (0..k).map(|j| xh[r * k + j] * wh[o * k + j]).sum()
                })
                .collect();
            let err = max_rel_diff(&got, &want);
            assert!(err < 1e-2, "{dtype:?} {rows}x{out}x{k}: off by {err}");
        }
    }
    let x = Tensor::zeros((9, 64), DType::BF16, &dev).unwrap();
    let w = Tensor::zeros((4, 64), DType::BF16, &dev).unwrap();
    assert!(pagewise_kernels::gemv(&x, &w).is_err(), "9 rows");
    let x = Tensor::zeros((1, 60), DType::BF16, &dev).unwrap();
    let w = Tensor::zeros((4, 60), DType::BF16, &dev).unwrap();
    assert!(
        pagewise_kernels::gemv(&x, &w).is_err(),
        "k not a multiple of 8"
    );
    // 8 rows of 14336 do not fit the staging space: refused, not truncated.
    assert!(!pagewise_kernels::gemv_fits(8, 14336, DType::BF16));
    let x = Tensor::zeros((8, 14336), DType::BF16, &dev).unwrap();
    let w = Tensor::zeros((4, 14336), DType::BF16, &dev).unwrap();
    let err = pagewise_kernels::gemv(&x, &w).unwrap_err().to_string();
    assert!(err.contains("staging space"), "{err}");
}

/// The folded-in steps against the separate kernels they replace: RMSNorm then GEMV, SiLU-and-mul
/// then GEMV, GEMV then the residual add. The staged input is rounded as the separate kernels
/// store theirs, so only the 1/rms (reduced in another order) can differ.
#[test]
fn fused_gemv_matches_the_separate_kernels() {
    use pagewise_kernels::{GemvInput, add_rms_norm, gemv, gemv_fused, silu_mul};
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(11);
    for dtype in [DType::F16, DType::BF16] {
        for (rows, out, k) in [
            (1, 1000, 576),
            (3, 4104, 2048),
            (8, 777, 4096),
            (2, 96, 14336),
        ] {
            let x = random(&mut rng, (rows, k), 1.0, dtype, &dev);
            let w = random(&mut rng, (out, k), 0.05, dtype, &dev);
            let g = random(&mut rng, (1, k), 1.0, dtype, &dev)
                .squeeze(0)
                .unwrap();
            let res = random(&mut rng, (rows, out), 1.0, dtype, &dev);
            let case = format!("{dtype:?} {rows}x{out}x{k}");

            let zeros = x.zeros_like().unwrap();
            let (_, normed) = add_rms_norm(&zeros, &x, &g, 1e-5).unwrap();
            let want = host_f32(&gemv(&normed, &w).unwrap());
            let input = GemvInput::RmsNorm {
                weight: &g,
                eps: 1e-5,
            };
            let got = host_f32(&gemv_fused(&x, &w, input, None).unwrap());
            let err = max_rel_diff(&got, &want);
            assert!(err < 2e-2, "{case} RMSNorm: off by {err}");

            let gu = random(&mut rng, (rows, 2 * k), 2.0, dtype, &dev);
            let want = host_f32(&gemv(&silu_mul(&gu).unwrap(), &w).unwrap());
            let got = host_f32(&gemv_fused(&gu, &w, GemvInput::SiluMul, None).unwrap());
            assert_eq!(got, want, "{case} SiLU-and-mul");

            // GeGLU against candle's GELU (tanh approximation) and product, then the GEMV.
            let (gate, up) = (gu.narrow(1, 0, k).unwrap(), gu.narrow(1, k, k).unwrap());
            let act = (gate.gelu().unwrap() * up).unwrap().contiguous().unwrap();
            let want = host_f32(&gemv(&act, &w).unwrap());
            let got = host_f32(&gemv_fused(&gu, &w, GemvInput::GeluTanhMul, None).unwrap());
            let err = max_rel_diff(&got, &want);
            assert!(err < 2e-2, "{case} GELU-and-mul: off by {err}");

            let want = host_f32(&(gemv(&x, &w).unwrap() + &res).unwrap());
            let got = host_f32(&gemv_fused(&x, &w, GemvInput::Plain, Some(&res)).unwrap());
            let err = max_rel_diff(&got, &want);
            assert!(err < 1e-2, "{case} residual add: off by {err}");
        }
    }
    // Shapes that do not fit are refused clearly.
    let x = Tensor::zeros((1, 64), DType::BF16, &dev).unwrap();
    let w = Tensor::zeros((4, 64), DType::BF16, &dev).unwrap();
    let r = Tensor::zeros((1, 5), DType::BF16, &dev).unwrap();
    let err = gemv_fused(&x, &w, GemvInput::Plain, Some(&r))
        .unwrap_err()
        .to_string();
    assert!(err.contains("residual"), "{err}");
    let err = gemv_fused(&x, &w, GemvInput::SiluMul, None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("does not fit"), "{err}");
    let x2 = Tensor::zeros((1, 128), DType::BF16, &dev).unwrap();
    let r1 = Tensor::zeros((1, 4), DType::BF16, &dev).unwrap();
    let err = gemv_fused(&x2, &w, GemvInput::GeluTanhMul, Some(&r1))
        .unwrap_err()
        .to_string();
    assert!(err.contains("no residual"), "{err}");
}

/// Gemma's normalized residual add folded into the next projection's staging, against the two
/// kernels it replaces (add_rms_normed, then the GEMV with the norm folded in): the same stream
/// and the same product, up to the 1/rms values (reduced in another order) and what their
/// rounding moves.
#[test]
fn gemv_add_normed_matches_add_normed_then_the_norm_gemv() {
    use pagewise_kernels::{GemvInput, add_rms_normed, gemv_add_normed, gemv_fused};
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(23);
    for dtype in [DType::F16, DType::BF16] {
        for (rows, out, k) in [
            (1, 8192, 3840),
            (2, 1000, 3840),
            (8, 96, 1152),
            (3, 4104, 2048),
        ] {
            let stream = random(&mut rng, (rows, k), 4.0, dtype, &dev);
            let delta = random(&mut rng, (rows, k), 1.0, dtype, &dev);
            let vector = |rng: &mut Lcg| random(rng, (1, k), 1.0, dtype, &dev).squeeze(0).unwrap();
            let (dw, nw) = (vector(&mut rng), vector(&mut rng));
            let w = random(&mut rng, (out, k), 0.05, dtype, &dev);
            let case = format!("{dtype:?} {rows}x{out}x{k}");
            let want_sum = add_rms_normed(&stream, &delta, &dw, 1e-6).unwrap();
            let input = GemvInput::RmsNorm {
                weight: &nw,
                eps: 1e-6,
            };
            let want = gemv_fused(&want_sum, &w, input, None).unwrap();
            let (got, got_sum) = gemv_add_normed(&delta, &stream, &dw, &nw, 1e-6, &w).unwrap();
            assert_eq!(got_sum.dims(), [rows, k]);
            let err = max_rel_diff(&host_f32(&got_sum), &host_f32(&want_sum));
            assert!(err < 1e-2, "{case} stream: off by {err}");
            let err = max_rel_diff(&host_f32(&got), &host_f32(&want));
            assert!(err < 2e-2, "{case} product: off by {err}");
        }
    }
    // Inputs that do not fit are refused by name.
    let z = |shape: (usize, usize)| Tensor::zeros(shape, DType::BF16, &dev).unwrap();
    let (x, w) = (z((1, 64)), z((4, 64)));
    let (n64, n32) = (
        z((1, 64)).squeeze(0).unwrap(),
        z((1, 32)).squeeze(0).unwrap(),
    );
    let err = gemv_add_normed(&x, &x, &n64, &n32, 1e-6, &w)
        .unwrap_err()
        .to_string();
    assert!(err.contains("norm weights"), "{err}");
    let err = gemv_add_normed(&x, &z((2, 64)), &n64, &n64, 1e-6, &w)
        .unwrap_err()
        .to_string();
    assert!(err.contains("do not fit"), "{err}");
    let err = gemv_add_normed(&x, &x, &n64, &n64, 1e-6, &z((0, 64)))
        .unwrap_err()
        .to_string();
    assert!(err.contains("no rows"), "{err}");
}

/// GEMV bandwidth at the Llama-3.2-1B, Llama-3.1-8B and Gemma-3-12B decode shapes (bf16, batch 1
/// by default; Gemma's LM head too, its final norm staged): weight bytes read per second by
/// `gemv_fused` (`gemv_add_normed` for Gemma's qkv and gate/up) with the input each projection
/// takes in the fused layer, against cuBLAS on the same plain product. 64 launches are replayed
/// from a CUDA graph (as the engine's decode steps run), rotating over copies of the weight
/// totalling at least 128 MB so that none is served from the 50 MB L2. Run on the GPU machine:
/// `fused-tests --ignored --nocapture gemv_bandwidth` (`PAGEWISE_GEMV_BW_ROWS=8`: that many rows;
/// shapes whose rows do not fit the staging space are left out).
#[test]
#[ignore]
fn gemv_bandwidth() {
    use pagewise_kernels::{GemvInput, gemv_fused};
    let dev = Device::new_cuda(0).unwrap();
    let stream = dev.as_cuda_device().unwrap().cuda_stream();
    let mut rng = Lcg(5);
    // Seconds per launch of `run(i)`, i in 0..64, replayed from a graph after a warm-up.
    let time = |run: &dyn Fn(usize)| {
        for i in 0..4 {
            run(i);
        }
        crate::common::graph_replay_seconds(&stream, 64, run)
    };
    println!(
        "| shape | projection (out x k) | gemv_fused (µs) | TB/s | cuBLAS plain (µs) | TB/s |"
    );
    println!("|---|---|---|---|---|---|");
    let shapes = [
        ("1B", "qkv", 3072, 2048),
        ("1B", "o", 2048, 2048),
        ("1B", "gate/up", 16384, 2048),
        ("1B", "down", 2048, 8192),
        ("8B", "qkv", 6144, 4096),
        ("8B", "o", 4096, 4096),
        ("8B", "gate/up", 28672, 4096),
        ("8B", "down", 4096, 14336),
        ("Gemma-3-12B", "qkv", 8192, 3840),
        ("Gemma-3-12B", "o", 3840, 4096),
        ("Gemma-3-12B", "gate/up", 30720, 3840),
        ("Gemma-3-12B", "down", 3840, 15360),
        ("Gemma-3-12B", "head", 262144, 3840),
    ];
    let rows: usize = std::env::var("PAGEWISE_GEMV_BW_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    for (model, name, out, k) in shapes {
        if !pagewise_kernels::gemv_fits(rows, k, DType::BF16) {
            continue;
        }
        let bytes = (out * k * 2) as f64;
        let copies = (128e6 / bytes).ceil() as usize;
        let ws: Vec<Tensor> = (0..copies)
            .map(|_| random(&mut rng, (out, k), 0.05, DType::BF16, &dev))
            .collect();
        let g = random(&mut rng, (1, k), 1.0, DType::BF16, &dev)
            .squeeze(0)
            .unwrap();
        let x = random(&mut rng, (rows, k), 1.0, DType::BF16, &dev);
        let gu = random(&mut rng, (rows, 2 * k), 1.0, DType::BF16, &dev);
        let res = random(&mut rng, (rows, out), 1.0, DType::BF16, &dev);
        let gemma = model.starts_with("Gemma");
        let fused = |i: usize| {
            let w = &ws[i % copies];
            let y = match name {
                // Gemma: the normalized residual add staged before qkv and gate/up, GeGLU before
                // down, no residual after o or down.
                "qkv" | "gate/up" if gemma => {
                    pagewise_kernels::gemv_add_normed(&x, &x, &g, &g, 1e-6, w).map(|(y, _)| y)
                }
                "o" if gemma => gemv_fused(&x, w, GemvInput::Plain, None),
                "down" if gemma => gemv_fused(&gu, w, GemvInput::GeluTanhMul, None),
                "qkv" | "gate/up" | "head" => gemv_fused(
                    &x,
                    w,
                    GemvInput::RmsNorm {
                        weight: &g,
                        eps: 1e-5,
                    },
                    None,
                ),
                "o" => gemv_fused(&x, w, GemvInput::Plain, Some(&res)),
                _ => gemv_fused(&gu, w, GemvInput::SiluMul, Some(&res)),
            };
            y.unwrap();
        };
        let cublas = |i: usize| {
            x.matmul(&ws[i % copies].t().unwrap()).unwrap();
        };
        let (a, b) = (time(&fused), time(&cublas));
        println!(
            "| {model} | {name} ({out} x {k}) | {:.2} | {:.2} | {:.2} | {:.2} |",
            a * 1e6,
            bytes / a / 1e12,
            b * 1e6,
            bytes / b / 1e12
        );
    }
}
