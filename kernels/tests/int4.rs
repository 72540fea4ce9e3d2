//! 4-bit integer weights (AWQ, GPTQ, W4A16 repacked at load): the decode GEMVs streaming them
//! against the same products on the host, with the codes packed here by the layout's own
//! description (not by the app's packer), and their dequantized copies (run on the GPU machine:
//! scripts/gpu/run.sh).

use crate::common::{Lcg, host_f32, max_rel_diff, random};
use candle_core::{DType, Device, Tensor};
use pagewise_kernels::{GemvInput, GemvWeight, Int4Layout, Int4Matrix, int4_dequantize};

/// `[out, k]` and the columns a group covers (`k`: one group a row).
const CASES: &[((usize, usize), usize)] = &[
    ((4096, 4096), 128),
    ((6144, 4096), 128),
    ((1000, 2048), 32),
    ((4096, 14336), 128),
    ((576, 1536), 1536),
    ((512, 4096), 64),
    ((64, 64), 32),
];

/// A random 4-bit weight on `dev`: its codes (packed), (scale, zero) pairs, and values on the
/// host. Scales random f16 values, or powers of two (`pow2`: every value then exact in bf16).
struct Weight {
    codes: Tensor,
    /// The same codes in tiles, when the shape and groups allow them.
    tiles: Option<Tensor>,
    pairs: Tensor,
    group: usize,
    values: Vec<f32>,
}

impl Weight {
    fn new(
        rng: &mut Lcg,
        (out, k): (usize, usize),
        group: usize,
        pow2: bool,
        dev: &Device,
    ) -> Self {
        let groups = k.div_ceil(group);
        let q: Vec<u8> = (0..out * k)
            .map(|_| ((rng.next() + 1.0) * 8.0) as u8 % 16)
            .collect();
        let mut pairs = Vec::with_capacity(out * groups * 2);
        for _ in 0..out * groups {
            let scale = match pow2 {
                true => 2f32.powi((rng.next() * 4.0) as i32 - 7),
                false => half_round(1e-3 + (rng.next() + 1.0) * 4e-3),
            };
            let zero = ((rng.next() + 1.0) * 8.0) as u8 % 16;
            pairs.extend([scale, f32::from(zero)]);
        }
        let values = (0..out * k)
            .map(|i| {
                let (o, c) = (i / k, i % k);
                let at = 2 * (o * groups + c / group);
                pairs[at] * (f32::from(q[i]) - pairs[at + 1])
            })
            .collect();
        // Word j of a row: column 8j + 2i in nibble i, column 8j + 2i + 1 in nibble 4 + i.
        let mut bytes = vec![0u8; out * k / 2];
        for (i, &code) in q.iter().enumerate() {
            let (word, c) = (i / 8, i % 8);
            let nibble = if c % 2 == 0 { c / 2 } else { 4 + c / 2 };
            bytes[4 * word + nibble / 2] |= code << (4 * (nibble % 2));
        }
        let tiles = Int4Layout::tiles_fit((out, k), group).then(|| {
            // Tile (row tile, chunk) of 16 rows x 64 columns: 512 bytes, lane l's 16 at 16 l;
            // its word m covers columns 16m..16m + 16 of the chunk, pair p starting at row
            // g + 8 (p % 2), column 2t + 8 (p / 2) (g = l / 4, t = l % 4), in nibbles p and 4 + p.
            let chunks = k / 64;
            let mut bytes = vec![0u8; out * k / 2];
            for word in 0..out * k / 8 {
                let (m, lane, tile) = (word % 4, word / 4 % 32, word / 128);
                let (row_tile, chunk, g, t) = (tile / chunks, tile % chunks, lane / 4, lane % 4);
                let mut v = 0u32;
                for p in 0..4 {
                    let row = row_tile * 16 + g + 8 * (p % 2);
                    let col = chunk * 64 + m * 16 + 2 * t + 8 * (p / 2);
                    v |= u32::from(q[row * k + col]) << (4 * p)
                        | u32::from(q[row * k + col + 1]) << (16 + 4 * p);
                }
                bytes[4 * word..4 * word + 4].copy_from_slice(&v.to_le_bytes());
            }
            Tensor::from_vec(bytes, (out, k / 2), dev).unwrap()
        });
        let pairs = Tensor::from_vec(pairs, (out, groups, 2), &Device::Cpu).unwrap();
        Weight {
            tiles,
            codes: Tensor::from_vec(bytes, (out, k / 2), dev).unwrap(),
            pairs: pairs.to_dtype(DType::F16).unwrap().to_device(dev).unwrap(),
            group,
            values,
        }
    }

    fn matrix(&self) -> Int4Matrix<'_> {
        Int4Matrix {
            codes: &self.codes,
            scale_zero: &self.pairs,
            group: self.group,
            layout: Int4Layout::Rows,
        }
    }

    /// The weight in tiles, if its shape allows them.
    fn tiled(&self) -> Option<Int4Matrix<'_>> {
        Some(Int4Matrix {
            codes: self.tiles.as_ref()?,
            layout: Int4Layout::Tiles,
            ..self.matrix()
        })
    }

    /// The weight in each layout it has.
    fn layouts(&self) -> Vec<Int4Matrix<'_>> {
        std::iter::once(self.matrix()).chain(self.tiled()).collect()
    }
}

/// `v` rounded to f16.
fn half_round(v: f32) -> f32 {
    Tensor::new(&[v], &Device::Cpu)
        .unwrap()
        .to_dtype(DType::F16)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()[0]
}

#[test]
fn int4_gemv_matches_the_host_products() {
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(43);
    for dtype in [DType::BF16, DType::F16] {
        for &((out, k), group) in CASES {
            let w = Weight::new(&mut rng, (out, k), group, false, &dev);
            for m in w.layouts() {
                assert!(GemvWeight::Int4(m).takes(dtype));
            }
            for rows in [1, 2, 3, 8] {
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
                for m in w.layouts() {
                    let got = pagewise_kernels::gemv_fused(&x, m, GemvInput::Plain, None).unwrap();
                    let err = max_rel_diff(&host_f32(&got), &want);
                    assert!(
                        err < 1e-2,
                        "{dtype:?} {rows}x[{out}, {k}] groups of {group}, {:?}: off by {err}",
                        m.layout
                    );
                }
            }
        }
    }
}

/// The GEMV's folded inputs and residual with 4-bit weights: against the dense GEMV of the
/// dequantized weight (power-of-two scales: exact in bf16), so only the summation order differs.
#[test]
fn int4_gemv_folds_what_the_dense_gemv_folds() {
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(47);
    let dtype = DType::BF16;
    for &((out, k), group) in &CASES[..4] {
        let w = Weight::new(&mut rng, (out, k), group, true, &dev);
        let dense = int4_dequantize(w.matrix(), dtype).unwrap();
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
                let want = pagewise_kernels::gemv_fused(x, &dense, input, res).unwrap();
                for m in w.layouts() {
                    let got = pagewise_kernels::gemv_fused(x, m, input, res).unwrap();
                    let err = max_rel_diff(&host_f32(&got), &host_f32(&want));
                    assert!(
                        err < 2e-2,
                        "{name} {rows}x[{out}, {k}] groups of {group}, {:?}: off by {err}",
                        m.layout
                    );
                }
            }
        }
    }
}

#[test]
fn int4_dequantize_applies_each_groups_scale_and_zero() {
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(53);
    for dtype in [DType::BF16, DType::F16] {
        for &((out, k), group) in CASES {
            let w = Weight::new(&mut rng, (out, k), group, false, &dev);
            let want = Tensor::from_vec(w.values.clone(), (out, k), &Device::Cpu)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            for m in w.layouts() {
                let got = int4_dequantize(m, dtype).unwrap();
                assert_eq!(
                    host_f32(&got),
                    host_f32(&want),
                    "{dtype:?} [{out}, {k}] groups of {group}, {:?}",
                    m.layout
                );
            }
        }
    }
}

/// The 4-bit GEMV against the bf16 one at the 8B batch-1 projection shapes (inputs folded as the
/// decode path folds them, groups of 128), replayed from a CUDA graph over enough copies of each
/// weight to defeat L2; bytes read per second (codes and pairs). Run by `bash .gpu/run.sh int4`.
#[test]
#[ignore]
fn int4_gemv_bandwidth() {
    let dev = Device::new_cuda(0).unwrap();
    let stream = dev.as_cuda_device().unwrap().cuda_stream();
    let mut rng = Lcg(59);
    let time = |run: &dyn Fn(usize)| {
        for i in 0..4 {
            run(i);
        }
        crate::common::graph_replay_seconds(&stream, 64, run)
    };
    println!(
        "| projection (out x k) | bf16 (µs) | TB/s | 4-bit rows (µs) | TB/s | 4-bit tiles (µs) | TB/s | tiles' speed-up over bf16 |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (name, out, k) in [
        ("qkv", 6144, 4096),
        ("o", 4096, 4096),
        ("gate/up", 28672, 4096),
        ("down", 4096, 14336),
    ] {
        let copies = (128e6 / (out * k) as f64).ceil() as usize;
        let dense: Vec<Tensor> = (0..copies)
            .map(|_| random(&mut rng, (out, k), 0.05, DType::BF16, &dev))
            .collect();
        let packed: Vec<Weight> = (0..(128e6 / (out * k / 2) as f64).ceil() as usize)
            .map(|_| Weight::new(&mut rng, (out, k), 128, false, &dev))
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
        let bf16 = time(&|i| call(GemvWeight::Dense(&dense[i % copies])));
        let int4 = time(&|i| call(GemvWeight::Int4(packed[i % packed.len()].matrix())));
        let tiles = time(&|i| {
            call(GemvWeight::Int4(
                packed[i % packed.len()].tiled().expect("tiles fit"),
            ))
        });
        let (dense_bytes, int4_bytes) = ((out * k * 2) as f64, (out * k / 2 + out * k / 32) as f64);
        println!(
            "| {name} ({out} x {k}) | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2}x |",
            bf16 * 1e6,
            dense_bytes / bf16 / 1e12,
            int4 * 1e6,
            int4_bytes / int4 / 1e12,
            tiles * 1e6,
            int4_bytes / tiles / 1e12,
            bf16 / tiles
        );
    }
}
