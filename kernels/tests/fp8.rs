//! FP8 (e4m3) weights: the decode GEMVs streaming them against the same products on the host
//! (every e4m3 code decoded by an independent decoder), their dequantized copies, and the
//! row-wise quantization of `--quantization fp8` (run on the GPU machine: scripts/gpu/run.sh).

use crate::common::{Lcg, e4m3, host_f32, max_rel_diff, random, random_codes};
use candle_core::{DType, Device, Tensor};
use pagewise_kernels::{Fp8Matrix, GemvInput, GemvWeight, fp8_dequantize, fp8_quantize_rows};

/// Scales `[ceil(out / bn), ceil(k / bk)]`: random positive, or powers of two.
fn random_scales(rng: &mut Lcg, shape: (usize, usize), pow2: bool, dev: &Device) -> Tensor {
    let v: Vec<f32> = (0..shape.0 * shape.1)
        .map(|_| match pow2 {
            true => 2f32.powi((rng.next() * 6.0) as i32 - 8),
            false => 1e-3 + (rng.next() + 1.0) * 4e-3,
        })
        .collect();
    Tensor::from_vec(v, shape, dev).unwrap()
}

/// Element (o, c)'s scale.
fn scale_at(s: &[f32], (bn, bk): (usize, usize), k: usize, o: usize, c: usize) -> f32 {
    s[(o / bn) * k.div_ceil(bk) + c / bk]
}

/// The weight's values on the host, scales applied, f32 `[out, k]`.
fn host_weight(values: &[f32], scales: &Tensor, block: (usize, usize), k: usize) -> Vec<f32> {
    let s = host_f32(scales);
    values
        .iter()
        .enumerate()
        .map(|(i, v)| v * scale_at(&s, block, k, i / k, i % k))
        .collect()
}

/// Shapes and scale blocks the models have: per row, per tensor, 128 x 128 blocks (with partial
/// ones), and a head-sized k.
/// `[out, k]` and the rows x columns a scale covers.
type Case = ((usize, usize), (usize, usize));

const CASES: &[Case] = &[
    ((4096, 4096), (1, 4096)),
    ((6144, 4096), (6144, 4096)),
    ((1000, 2048), (128, 128)),
    ((4096, 14336), (128, 128)),
    ((576, 1536), (1, 1536)),
    ((64, 64), (32, 32)),
];

#[test]
fn fp8_gemv_matches_the_host_products() {
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(23);
    for dtype in [DType::BF16, DType::F16] {
        for &((out, k), block) in CASES {
            let (data, values) = random_codes(&mut rng, (out, k), &dev);
            let shape = (out.div_ceil(block.0), k.div_ceil(block.1));
            let scales = random_scales(&mut rng, shape, false, &dev);
            let w = host_weight(&values, &scales, block, k);
            let m = Fp8Matrix {
                data: &data,
                scales: &scales,
                block,
            };
            for rows in [1, 2, 3, 8] {
                if !pagewise_kernels::gemv_fits(rows, k, dtype) {
                    continue;
                }
                let x = random(&mut rng, (rows, k), 1.0, dtype, &dev);
                let got = pagewise_kernels::gemv_fused(&x, m, GemvInput::Plain, None).unwrap();
                let xv = host_f32(&x);
                let want: Vec<f32> = (0..rows * out)
                    .map(|i| {
                        let (r, o) = (i / out, i % out);
                        (0..k).map(|c| xv[r * k + c] * w[o * k + c]).sum()
                    })
                    .collect();
                let err = max_rel_diff(&host_f32(&got), &want);
                assert!(
                    err < 1e-2,
                    "{dtype:?} {rows}x[{out}, {k}] {block:?}: off by {err}"
                );
            }
        }
    }
}

/// The GEMV's folded inputs and residual with FP8 weights: against the dense GEMV of the
/// dequantized weight, exact in the dtype when the scales are powers of two, so only the
/// summation order differs.
#[test]
fn fp8_gemv_folds_what_the_dense_gemv_folds() {
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(29);
    let dtype = DType::BF16;
    for &((out, k), block) in &CASES[..4] {
        let (data, _) = random_codes(&mut rng, (out, k), &dev);
        let shape = (out.div_ceil(block.0), k.div_ceil(block.1));
        let scales = random_scales(&mut rng, shape, true, &dev);
        let m = Fp8Matrix {
            data: &data,
            scales: &scales,
            block,
        };
        let dense = fp8_dequantize(m, dtype).unwrap();
        let norm = random(&mut rng, (1, k), 1.0, dtype, &dev)
            .squeeze(0)
            .unwrap();
        for rows in [1, 2] {
            let x = random(&mut rng, (rows, k), 1.0, dtype, &dev);
            let gated = random(&mut rng, (rows, 2 * k), 2.0, dtype, &dev);
            let residual = random(&mut rng, (rows, out), 1.0, dtype, &dev);
            let rms = GemvInput::RmsNorm {
                weight: &norm,
                eps: 1e-5,
            };
            for (name, x, input, res) in [
                ("rms norm", &x, rms, None),
                ("plain + residual", &x, GemvInput::Plain, Some(&residual)),
                (
                    "silu-mul + residual",
                    &gated,
                    GemvInput::SiluMul,
                    Some(&residual),
                ),
                ("gelu-mul", &gated, GemvInput::GeluTanhMul, None),
            ] {
                let got = pagewise_kernels::gemv_fused(x, m, input, res).unwrap();
                let want = pagewise_kernels::gemv_fused(x, &dense, input, res).unwrap();
                let err = max_rel_diff(&host_f32(&got), &host_f32(&want));
                assert!(
                    err < 2e-2,
                    "{name} {rows}x[{out}, {k}] {block:?}: off by {err}"
                );
            }
        }
    }
}

#[test]
fn fp8_dequantize_applies_each_blocks_scale() {
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(31);
    for dtype in [DType::BF16, DType::F16] {
        for &((out, k), block) in CASES {
            let (data, values) = random_codes(&mut rng, (out, k), &dev);
            let shape = (out.div_ceil(block.0), k.div_ceil(block.1));
            let scales = random_scales(&mut rng, shape, false, &dev);
            let m = Fp8Matrix {
                data: &data,
                scales: &scales,
                block,
            };
            let got = fp8_dequantize(m, dtype).unwrap();
            let want = Tensor::from_vec(
                host_weight(&values, &scales, block, k),
                (out, k),
                &Device::Cpu,
            )
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
            assert_eq!(
                host_f32(&got),
                host_f32(&want),
                "{dtype:?} [{out}, {k}] {block:?}"
            );
        }
    }
}

#[test]
fn fp8_quantize_rows_rounds_each_row_by_its_largest_magnitude() {
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(37);
    for dtype in [DType::BF16, DType::F16] {
        for (out, k) in [(512, 4096), (3, 14336), (64, 64)] {
            let mut w = random(&mut rng, (out, k), 0.05, dtype, &dev);
            if out == 3 {
                // A row of zeros takes scale 1.
                w = Tensor::cat(
                    &[
                        w.narrow(0, 0, 2).unwrap(),
                        w.narrow(0, 0, 1).unwrap().zeros_like().unwrap(),
                    ],
                    0,
                )
                .unwrap();
            }
            let (q, s) = fp8_quantize_rows(&w).unwrap();
            assert_eq!((q.dims(), s.dims()), (&[out, k][..], &[out, 1][..]));
            let (wv, sv) = (host_f32(&w), host_f32(&s));
            let codes = q.flatten_all().unwrap().to_vec1::<u8>().unwrap();
            for o in 0..out {
                let row = &wv[o * k..(o + 1) * k];
                let absmax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
                let scale = if absmax > 0.0 { absmax / 448.0 } else { 1.0 };
                assert_eq!(sv[o], scale, "row {o} scale");
                // e4m3 of x / scale, rounded to nearest even by candle's host conversion.
                let want = Tensor::from_vec(
                    row.iter().map(|v| v / scale).collect::<Vec<_>>(),
                    k,
                    &Device::Cpu,
                )
                .unwrap()
                .to_dtype(DType::F8E4M3)
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
                let got: Vec<f32> = codes[o * k..(o + 1) * k].iter().map(|&b| e4m3(b)).collect();
                assert_eq!(got, want, "{dtype:?} row {o} of [{out}, {k}]");
            }
            // And the GEMV reads what was written.
            let m = Fp8Matrix {
                data: &q,
                scales: &s,
                block: (1, k),
            };
            assert!(GemvWeight::Fp8(m).takes(dtype));
        }
    }
}

/// The FP8 GEMV against the bf16 one at the 1B and 8B batch-1 projection shapes (inputs folded as
/// the decode path folds them), replayed from a CUDA graph over enough copies of each weight to
/// defeat L2; bytes read per second. Per-row scales, and 128 x 128 blocks (`PAGEWISE_FP8_BLOCKS`).
/// Run by `bash .gpu/run.sh fp8`.
#[test]
#[ignore]
fn fp8_gemv_bandwidth() {
    let dev = Device::new_cuda(0).unwrap();
    let stream = dev.as_cuda_device().unwrap().cuda_stream();
    let mut rng = Lcg(41);
    let blocks = std::env::var("PAGEWISE_FP8_BLOCKS").is_ok();
    let time = |run: &dyn Fn(usize)| {
        for i in 0..4 {
            run(i);
        }
        crate::common::graph_replay_seconds(&stream, 64, run)
    };
    println!("| shape | projection (out x k) | bf16 (µs) | TB/s | FP8 (µs) | TB/s | speed-up |");
    println!("|---|---|---|---|---|---|---|");
    for (model, name, out, k) in [
        ("1B", "qkv", 3072, 2048),
        ("1B", "o", 2048, 2048),
        ("1B", "gate/up", 16384, 2048),
        ("1B", "down", 2048, 8192),
        ("8B", "qkv", 6144, 4096),
        ("8B", "o", 4096, 4096),
        ("8B", "gate/up", 28672, 4096),
        ("8B", "down", 4096, 14336),
    ] {
        let block = if blocks { (128, 128) } else { (1, k) };
        let copies = (128e6 / (out * k) as f64).ceil() as usize;
        let dense: Vec<Tensor> = (0..copies)
            .map(|_| random(&mut rng, (out, k), 0.05, DType::BF16, &dev))
            .collect();
        let codes: Vec<(Tensor, Tensor)> = (0..copies)
            .map(|_| {
                let (data, _) = random_codes(&mut rng, (out, k), &dev);
                let shape = (out.div_ceil(block.0), k.div_ceil(block.1));
                (data, random_scales(&mut rng, shape, false, &dev))
            })
            .collect();
        let norm = random(&mut rng, (1, k), 1.0, DType::BF16, &dev)
            .squeeze(0)
            .unwrap();
        let x = random(&mut rng, (1, k), 1.0, DType::BF16, &dev);
        let gu = random(&mut rng, (1, 2 * k), 1.0, DType::BF16, &dev);
        let res = random(&mut rng, (1, out), 1.0, DType::BF16, &dev);
        let call = |w: GemvWeight<'_>| {
            let y = match name {
                "qkv" | "gate/up" => {
                    let input = GemvInput::RmsNorm {
                        weight: &norm,
                        eps: 1e-5,
                    };
                    pagewise_kernels::gemv_fused(&x, w, input, None)
                }
                "o" => pagewise_kernels::gemv_fused(&x, w, GemvInput::Plain, Some(&res)),
                _ => pagewise_kernels::gemv_fused(&gu, w, GemvInput::SiluMul, Some(&res)),
            };
            y.unwrap();
        };
        let bf16 = time(&|i| call(GemvWeight::Dense(&dense[i % copies])));
        let fp8 = time(&|i| {
            let (data, scales) = &codes[i % copies];
            call(GemvWeight::Fp8(Fp8Matrix {
                data,
                scales,
                block,
            }))
        });
        let bytes = (out * k) as f64;
        println!(
            "| {model} | {name} ({out} x {k}) | {:.2} | {:.2} | {:.2} | {:.2} | {:.2}x |",
            bf16 * 1e6,
            2.0 * bytes / bf16 / 1e12,
            fp8 * 1e6,
            bytes / fp8 / 1e12,
            bf16 / fp8
        );
    }
}

/// The e4m3 tensor-core matmul (activations quantized per token, cuBLASLt scaling rows and
/// columns) against the host's products of the same quantized activations and weights.
#[test]
fn fp8_gemm_matches_the_host_products_of_quantized_activations() {
    let dev = Device::new_cuda(0).unwrap();
    let gemm = pagewise_kernels::fp8_gemm(&dev).expect("cuBLASLt's scaled e4m3 matmul on the H200");
    let mut rng = Lcg(43);
    for dtype in [DType::BF16, DType::F16] {
        for (m, n, k) in [
            (9, 64, 64),
            (16, 4096, 4096),
            (100, 6144, 4096),
            (333, 1024, 14336),
        ] {
            let (data, values) = random_codes(&mut rng, (n, k), &dev);
            let scales = random_scales(&mut rng, (n, 1), false, &dev);
            let w = host_weight(&values, &scales, (1, k), k);
            let x = random(&mut rng, (m, k), 1.0, dtype, &dev);
            let m8 = Fp8Matrix {
                data: &data,
                scales: &scales,
                block: (1, k),
            };
            let got = host_f32(&gemm.matmul(&x, m8).unwrap());
            let (xq, xs) = fp8_quantize_rows(&x).unwrap();
            let xs = host_f32(&xs);
            let xv: Vec<f32> = xq
                .flatten_all()
                .unwrap()
                .to_vec1::<u8>()
                .unwrap()
                .iter()
                .enumerate()
                .map(|(i, &b)| e4m3(b) * xs[i / k])
                .collect();
            let want: Vec<f32> = (0..m * n)
                .map(|i| {
                    let (r, o) = (i / n, i % n);
                    (0..k).map(|c| xv[r * k + c] * w[o * k + c]).sum()
                })
                .collect();
            let err = max_rel_diff(&got, &want);
            assert!(
                err < 1e-2,
                "{dtype:?} [{m}, {k}] x [{n}, {k}]: off by {err}"
            );
        }
    }
}

/// The e4m3 matmul (its activation quantization included) against cuBLAS's bf16 one at the 8B
/// projections, for steps of 16 to 4096 rows: TFLOP/s. Run by `bash .gpu/run.sh fp8`.
#[test]
#[ignore]
fn fp8_gemm_speed() {
    let dev = Device::new_cuda(0).unwrap();
    let stream = dev.as_cuda_device().unwrap().cuda_stream();
    let gemm = pagewise_kernels::fp8_gemm(&dev).unwrap();
    let mut rng = Lcg(47);
    let time = |run: &dyn Fn(usize)| {
        for i in 0..4 {
            run(i);
        }
        crate::common::graph_replay_seconds(&stream, 20, run)
    };
    println!(
        "| rows | projection (out x k) | bf16 cuBLAS (µs) | TFLOP/s | FP8 (µs) | TFLOP/s | speed-up |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (name, out, k) in [
        ("qkv", 6144, 4096),
        ("gate/up", 28672, 4096),
        ("down", 4096, 14336),
    ] {
        let dense = random(&mut rng, (out, k), 0.05, DType::BF16, &dev);
        let (data, _) = random_codes(&mut rng, (out, k), &dev);
        let scales = random_scales(&mut rng, (out, 1), false, &dev);
        for rows in [16, 64, 256, 1024, 4096] {
            let x = random(&mut rng, (rows, k), 1.0, DType::BF16, &dev);
            let bf16 = time(&|_| {
                x.matmul(&dense.t().unwrap()).unwrap();
            });
            let fp8 = time(&|_| {
                let w = Fp8Matrix {
                    data: &data,
                    scales: &scales,
                    block: (1, k),
                };
                gemm.matmul(&x, w).unwrap();
            });
            let flops = 2.0 * (rows * out * k) as f64;
            println!(
                "| {rows} | {name} ({out} x {k}) | {:.1} | {:.0} | {:.1} | {:.0} | {:.2}x |",
                bf16 * 1e6,
                flops / bf16 / 1e12,
                fp8 * 1e6,
                flops / fp8 / 1e12,
                bf16 / fp8
            );
        }
    }
}
