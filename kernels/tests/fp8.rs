//! FP8 (e4m3) weights: the decode GEMVs streaming them against the same products on the host
//! (every e4m3 code decoded by an independent decoder), their dequantized copies, and the
//! row-wise quantization of `--quantization fp8` (run on the GPU machine: scripts/gpu/run.sh).

mod common;

use candle_core::{DType, Device, Tensor};
use common::{Lcg, host_f32, max_rel_diff, random};
use pagewise_kernels::{Fp8Matrix, GemvInput, GemvWeight, fp8_dequantize, fp8_quantize_rows};

/// The value of e4m3 code `b` (e4m3fn: no infinities; 0x7f and 0xff are NaN).
fn e4m3(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let (exp, man) = (((b >> 3) & 0xf) as i32, (b & 7) as f32);
    if exp == 0 && man == 0.0 {
        return 0.0;
    }
    if exp == 0xf && b & 7 == 7 {
        return f32::NAN;
    }
    let v = if exp == 0 {
        man / 8.0 * 2f32.powi(-6)
    } else {
        (1.0 + man / 8.0) * 2f32.powi(exp - 7)
    };
    sign * v
}

/// Random e4m3 codes (no NaN) `[out, k]` as u8 on `dev`, and their values.
fn random_codes(rng: &mut Lcg, (out, k): (usize, usize), dev: &Device) -> (Tensor, Vec<f32>) {
    let codes: Vec<u8> = (0..out * k)
        .map(|_| {
            let b = ((rng.next() + 1.0) * 128.0) as u8;
            if b & 0x7f == 0x7f { b - 1 } else { b }
        })
        .collect();
    let values = codes.iter().map(|&b| e4m3(b)).collect();
    (Tensor::from_vec(codes, (out, k), dev).unwrap(), values)
}

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
