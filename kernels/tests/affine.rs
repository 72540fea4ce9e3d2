//! Integer codes with a (scale, offset) pair per group (the GGUF types repacked at load): the
//! decode GEMVs streaming them against the same products on the host, with the codes packed here
//! by the layout's own description, and their dequantized copies (run on the GPU machine:
//! scripts/gpu/run.sh).

use crate::common::affine::Weight;
use crate::common::{Lcg, host_f32, max_rel_diff, random};
use candle_core::{DType, Device, Tensor};
use pagewise_kernels::{CodeBits, GemvInput, GemvWeight, affine_dequantize};

/// Code width, `[out, k]` and the columns a group covers (`k`: one group a row). Groups of 32
/// (Q4_0, Q4_K, Q5_K, Q8_0) and 16 (Q6_K), as GGUF files have them.
const CASES: &[(CodeBits, (usize, usize), usize)] = &[
    (CodeBits::Four, (4096, 4096), 32),
    (CodeBits::Four, (1000, 2048), 32),
    (CodeBits::Four, (576, 1536), 1536),
    (CodeBits::Four, (64, 14336), 64),
    (CodeBits::Eight, (4096, 4096), 16),
    (CodeBits::Eight, (1000, 2048), 32),
    (CodeBits::Eight, (576, 1536), 1536),
    (CodeBits::Eight, (64, 14336), 16),
    (CodeBits::Eight, (48, 48), 16),
];

#[test]
fn affine_gemv_matches_the_host_products() {
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(61);
    for dtype in [DType::BF16, DType::F16] {
        for &(bits, (out, k), group) in CASES {
            let w = Weight::new(&mut rng, bits, (out, k), group, false, &dev);
            assert!(GemvWeight::Affine(w.matrix()).takes(dtype));
            for rows in [1, 2] {
                if !pagewise_kernels::gemv_fits(rows, k, dtype) {
                    continue;
                }
                let x = random(&mut rng, (rows, k), 1.0, dtype, &dev);
                let xv = host_f32(&x);
                let want: Vec<f32> = (0..rows * out)
                    .map(|i| {
                        let (r, o) = (i / out, i % out);
                        (0..k).map(|c| xv[r * k + c] * w.values[o * k + c]).sum()
                    })
                    .collect();
                let got =
                    pagewise_kernels::gemv_fused(&x, w.matrix(), GemvInput::Plain, None).unwrap();
                let err = max_rel_diff(&host_f32(&got), &want);
                assert!(
                    err < 1e-2,
                    "{dtype:?} {rows}x[{out}, {k}] {bits:?} groups of {group}: off by {err}"
                );
            }
        }
    }
}

/// The GEMV's folded inputs and residual with codes: against the dense GEMV of the dequantized
/// weight (exact in bf16), so only the summation order differs.
#[test]
fn affine_gemv_folds_what_the_dense_gemv_folds() {
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(67);
    let dtype = DType::BF16;
    for &(bits, (out, k), group) in CASES {
        let w = Weight::new(&mut rng, bits, (out, k), group, true, &dev);
        let dense = affine_dequantize(w.matrix(), dtype).unwrap();
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
                if !pagewise_kernels::gemv_fits(rows, x.dims()[1], dtype) {
                    continue;
                }
                let want = pagewise_kernels::gemv_fused(x, &dense, input, res).unwrap();
                let got = pagewise_kernels::gemv_fused(x, w.matrix(), input, res).unwrap();
                let err = max_rel_diff(&host_f32(&got), &host_f32(&want));
                assert!(
                    err < 2e-2,
                    "{name} {rows}x[{out}, {k}] {bits:?} groups of {group}: off by {err}"
                );
            }
        }
    }
}

#[test]
fn affine_gemv_refuses_rows_past_its_limit() {
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(79);
    let w = Weight::new(&mut rng, CodeBits::Four, (64, 256), 32, false, &dev);
    let rows = pagewise_kernels::AFFINE_GEMV_MAX_ROWS + 1;
    let x = random(&mut rng, (rows, 256), 1.0, DType::BF16, &dev);
    let err = pagewise_kernels::gemv(&x, w.matrix()).unwrap_err();
    assert!(err.to_string().contains("rows"), "{err}");
}

#[test]
fn affine_dequantize_applies_each_groups_scale_and_offset() {
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(71);
    for dtype in [DType::BF16, DType::F16] {
        for &(bits, (out, k), group) in CASES {
            let w = Weight::new(&mut rng, bits, (out, k), group, false, &dev);
            let want = Tensor::from_vec(w.values.clone(), (out, k), &Device::Cpu)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let got = affine_dequantize(w.matrix(), dtype).unwrap();
            let (got, want) = (host_f32(&got), host_f32(&want));
            // (s * q + b in f32 on the device, possibly fused; rounded once to the dtype.)
            let err = max_rel_diff(&got, &want);
            assert!(
                err < 1e-2,
                "{dtype:?} [{out}, {k}] {bits:?} groups of {group}: {err}"
            );
        }
    }
}

/// The codes' GEMV against the bf16 one at the 8B batch-1 projection shapes (inputs folded as
/// the decode path folds them; 4-bit codes in groups of 32 as Q4_K, bytes in groups of 16 as
/// Q6_K), replayed from a CUDA graph over enough copies of each weight to defeat L2; bytes read
/// per second (codes and pairs). Run by `bash .gpu/run.sh gguf-gpu`.
#[test]
#[ignore]
fn affine_gemv_bandwidth() {
    let dev = Device::new_cuda(0).unwrap();
    let stream = dev.as_cuda_device().unwrap().cuda_stream();
    let mut rng = Lcg(73);
    let time = |run: &dyn Fn(usize)| {
        for i in 0..4 {
            run(i);
        }
        crate::common::graph_replay_seconds(&stream, 64, run)
    };
    println!(
        "| projection (out x k) | bf16 (µs) | TB/s | 4-bit g32 (µs) | TB/s | 8-bit g16 (µs) | TB/s |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (name, out, k) in [
        ("qkv", 6144, 4096),
        ("o", 4096, 4096),
        ("gate/up", 28672, 4096),
        ("down", 4096, 14336),
    ] {
        let copies = |bytes: usize| (128e6 / bytes as f64).ceil() as usize;
        let dense: Vec<Tensor> = (0..copies(out * k * 2))
            .map(|_| random(&mut rng, (out, k), 0.05, DType::BF16, &dev))
            .collect();
        let four: Vec<Weight> = (0..copies(out * k / 2))
            .map(|_| Weight::new(&mut rng, CodeBits::Four, (out, k), 32, false, &dev))
            .collect();
        let eight: Vec<Weight> = (0..copies(out * k))
            .map(|_| Weight::new(&mut rng, CodeBits::Eight, (out, k), 16, false, &dev))
            .collect();
        let norm = random(&mut rng, (1, k), 1.0, DType::BF16, &dev)
            .squeeze(0)
            .unwrap();
        let x = random(&mut rng, (1, k), 1.0, DType::BF16, &dev);
        let gu = random(&mut rng, (1, 2 * k), 1.0, DType::BF16, &dev);
        let res = random(&mut rng, (1, out), 1.0, DType::BF16, &dev);
        let call = |w: GemvWeight<'_>| {
            let rms = GemvInput::RmsNorm {
                weight: &norm,
                eps: 1e-5,
            };
            match name {
                "qkv" | "gate/up" => pagewise_kernels::gemv_fused(&x, w, rms, None),
                "o" => pagewise_kernels::gemv_fused(&x, w, GemvInput::Plain, Some(&res)),
                _ => pagewise_kernels::gemv_fused(&gu, w, GemvInput::SiluMul, Some(&res)),
            }
            .unwrap();
        };
        let bf16 = time(&|i| call(GemvWeight::Dense(&dense[i % dense.len()])));
        let t4 = time(&|i| call(GemvWeight::Affine(four[i % four.len()].matrix())));
        let t8 = time(&|i| call(GemvWeight::Affine(eight[i % eight.len()].matrix())));
        let n = (out * k) as f64;
        let (b16, b4, b8) = (2.0 * n, n / 2.0 + n / 32.0 * 4.0, n + n / 16.0 * 4.0);
        println!(
            "| {name} ({out} x {k}) | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            bf16 * 1e6,
            b16 / bf16 / 1e12,
            t4 * 1e6,
            b4 / t4 / 1e12,
            t8 * 1e6,
            b8 / t8 / 1e12,
        );
    }
}
