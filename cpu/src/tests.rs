use candle_core::quantized::GgmlDType;
use half::f16;

use super::QLinear;
use super::iq4::Iq4Type;
use super::kernels::Isa;
use super::team::Team;
use super::tests_iq4;

/// A tiny deterministic generator (xorshift).
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in [-1, 1).
    pub(crate) fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// GGUF bytes of a random `[rows, cols]` tensor of `dtype`.
fn gguf_bytes(dtype: GgmlDType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..rows * cols / 32 {
        let d = f16::from_f32(0.01 + 0.02 * rng.unit().abs());
        out.extend(d.to_le_bytes());
        match dtype {
            GgmlDType::Q4_1 => {
                out.extend(f16::from_f32(-0.1 * rng.unit().abs()).to_le_bytes());
                out.extend((0..16).map(|_| rng.next() as u8));
            }
            GgmlDType::Q4_0 => out.extend((0..16).map(|_| rng.next() as u8)),
            GgmlDType::Q5_1 => {
                out.extend(f16::from_f32(-0.2 * rng.unit().abs()).to_le_bytes());
                out.extend((0..20).map(|_| rng.next() as u8));
            }
            GgmlDType::Q5_0 => out.extend((0..20).map(|_| rng.next() as u8)),
            GgmlDType::Q8_0 => out.extend((0..32).map(|_| rng.next() as u8)),
            other => panic!("no generator for {other:?}"),
        }
    }
    out
}

fn random_layer(dtype: GgmlDType, rows: usize, cols: usize, seed: u64) -> QLinear {
    let mut rng = Rng(seed);
    let bytes = gguf_bytes(dtype, rows, cols, &mut rng);
    QLinear::from_gguf(dtype, &bytes, rows, cols).expect("a supported layer")
}

pub(crate) fn random_input(len: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed);
    (0..len).map(|_| rng.unit()).collect()
}

pub(crate) fn max_rel_diff(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    a.iter()
        .zip(b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs() / scale))
}

/// `x W^T` in f32 from the dequantized weight.
pub(crate) fn float_reference(layer: &QLinear, x: &[f32], m: usize) -> Vec<f32> {
    let w = layer.dequantize();
    let (rows, cols) = (layer.rows(), layer.cols());
    let mut out = Vec::with_capacity(m * rows);
    for xi in x.chunks_exact(cols) {
        for wr in w.chunks_exact(cols) {
            out.push(xi.iter().zip(wr).map(|(a, b)| a * b).sum());
        }
    }
    out
}

/// Ours and candle's quantized matmul of the same weight `q` by `x` (`m` rows): how far they are
/// from each other, and each from the f32 product of the dequantized weight.
fn against_candle(
    label: &str,
    ours: &QLinear,
    q: candle_core::quantized::QTensor,
    x: &[f32],
    m: usize,
) -> (f32, f32, f32) {
    use candle_core::{Device, Module, Tensor};
    let input = Tensor::from_vec(x.to_vec(), (m, ours.cols()), &Device::Cpu).unwrap();
    let theirs: Vec<f32> = candle_core::quantized::QMatMul::from_qtensor(q)
        .unwrap()
        .forward(&input)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let (got, exact) = (ours.matmul(x, m), float_reference(ours, x, m));
    let (between, ours_err, theirs_err) = (
        max_rel_diff(&got, &theirs),
        max_rel_diff(&got, &exact),
        max_rel_diff(&theirs, &exact),
    );
    eprintln!(
        "{label}: {between:.2e} from candle's; from f32: ours {ours_err:.2e}, candle's {theirs_err:.2e}"
    );
    (between, ours_err, theirs_err)
}

const TYPES: [GgmlDType; 5] = [
    GgmlDType::Q4_0,
    GgmlDType::Q4_1,
    GgmlDType::Q5_0,
    GgmlDType::Q5_1,
    GgmlDType::Q8_0,
];

/// A weight format the kernels take: one of candle's GGML types, or an IQ4 type (which candle
/// does not know).
#[derive(Clone, Copy, Debug)]
enum Format {
    Ggml(GgmlDType),
    Iq4(Iq4Type),
}

impl Format {
    /// The layer of `bytes` (`[rows, cols]` in the format's blocks).
    fn layer(self, bytes: &[u8], rows: usize, cols: usize) -> QLinear {
        match self {
            Format::Ggml(dtype) => QLinear::from_gguf(dtype, bytes, rows, cols),
            Format::Iq4(ty) => QLinear::from_iq4(ty, bytes, rows, cols),
        }
        .expect("a well-formed tensor")
    }
}

/// Every 32-weight block type and the IQ4 types, with the columns of their random layers.
fn formats_with_columns() -> Vec<(Format, usize)> {
    let ggml = TYPES.map(|t| (Format::Ggml(t), 96));
    let iq4 = [Iq4Type::Nl, Iq4Type::Xs].map(|t| (Format::Iq4(t), tests_iq4::width(t)));
    [ggml.as_slice(), &iq4].concat()
}

#[test]
fn every_isa_and_team_size_matches_the_scalar_reference() {
    let isas = Isa::available();
    for (format, cols) in formats_with_columns() {
        // 37 rows: a last group padded to 8; 40: whole groups.
        for rows in [37, 40] {
            let mut rng = Rng(7);
            let bytes = match format {
                Format::Ggml(dtype) => gguf_bytes(dtype, rows, cols, &mut rng),
                Format::Iq4(ty) => tests_iq4::iq4_bytes(ty, rows, cols, &mut rng),
            };
            let layer = format.layer(&bytes, rows, cols);
            // 1 to 15 rows: the 8-, 4-, 2- and 1-row tiles and their mixes.
            for m in 1..=15 {
                let x = random_input(m * cols, 100 + m as u64);
                let want = layer.matmul_reference(&x, m);
                for &isa in &isas {
                    for size in [1, 2, 3] {
                        let got = layer.matmul_with(isa, &Team::new(size), &x, m);
                        let diff = max_rel_diff(&got, &want);
                        assert!(
                            diff < 1e-5,
                            "{format:?} {rows} rows {isa:?} m={m} team={size}: {diff}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn quantized_matmul_is_within_quantization_error_of_f32() {
    for dtype in TYPES {
        let layer = random_layer(dtype, 64, 576, 11);
        let x = random_input(3 * 576, 12);
        let got = layer.matmul(&x, 3);
        let want = float_reference(&layer, &x, 3);
        // The activations' 8 bits lose about 1/254 of each block's largest value.
        let diff = max_rel_diff(&got, &want);
        assert!(diff < 2e-2, "{dtype:?}: {diff}");
        assert!(diff > 0.0, "{dtype:?}: the activations were not quantized");
    }
}

#[test]
fn q4_0_is_q4_1_with_an_offset_of_minus_eight_scales() {
    let mut rng = Rng(3);
    let q40 = gguf_bytes(GgmlDType::Q4_0, 2, 64, &mut rng);
    let mut q41 = Vec::new();
    for b in q40.chunks_exact(18) {
        let d = f16::from_le_bytes([b[0], b[1]]);
        q41.extend(d.to_le_bytes());
        q41.extend(f16::from_f32(-8.0 * d.to_f32()).to_le_bytes());
        q41.extend(&b[2..]);
    }
    let a = QLinear::from_gguf(GgmlDType::Q4_0, &q40, 2, 64).unwrap();
    let b = QLinear::from_gguf(GgmlDType::Q4_1, &q41, 2, 64).unwrap();
    assert_eq!(a.dequantize(), b.dequantize());
    // And the dequantized values are GGUF's: (q - 8) * d.
    let d = f16::from_le_bytes([q40[0], q40[1]]).to_f32();
    let first = (q40[2] & 15) as f32;
    assert_eq!(a.dequantize()[0], (first - 8.0) * d);
}

#[test]
fn stacked_layers_give_the_parts_side_by_side() {
    let q = random_layer(GgmlDType::Q4_1, 8, 64, 1);
    let k = random_layer(GgmlDType::Q4_1, 4, 64, 2);
    let both = QLinear::concat(&[&q, &k]).expect("same format and width");
    assert_eq!(both.rows(), 12);
    let x = random_input(2 * 64, 5);
    let (a, b, ab) = (q.matmul(&x, 2), k.matmul(&x, 2), both.matmul(&x, 2));
    // The 4 rows padded to a group of 8 in both.
    for i in 0..2 {
        assert_eq!(&ab[i * 12..i * 12 + 8], &a[i * 8..i * 8 + 8]);
        assert_eq!(&ab[i * 12 + 8..i * 12 + 12], &b[i * 4..i * 4 + 4]);
    }
    assert!(
        QLinear::concat(&[&k, &q]).is_none(),
        "a padded group before the last part"
    );
    let k8 = random_layer(GgmlDType::Q4_1, 8, 64, 2);
    let both8 = QLinear::concat(&[&q, &k8]).expect("same format and width");
    let (b8, ab8) = (k8.matmul(&x, 2), both8.matmul(&x, 2));
    for i in 0..2 {
        assert_eq!(&ab8[i * 16..i * 16 + 8], &a[i * 8..i * 8 + 8]);
        assert_eq!(&ab8[i * 16 + 8..i * 16 + 16], &b8[i * 8..i * 8 + 8]);
    }
    let other = random_layer(GgmlDType::Q8_0, 4, 64, 3);
    assert!(QLinear::concat(&[&q, &other]).is_none(), "mixed formats");
    let narrow = random_layer(GgmlDType::Q4_1, 4, 32, 4);
    assert!(QLinear::concat(&[&q, &narrow]).is_none(), "mixed widths");
}

#[test]
fn unsupported_or_misshapen_tensors_are_refused() {
    assert!(QLinear::from_gguf(GgmlDType::Q8_1, &[0; 36], 1, 32).is_none());
    assert!(QLinear::from_gguf(GgmlDType::F32, &[0; 128], 1, 32).is_none());
    // A Q5_0 scale whose offset -16 d is past f16's range.
    let mut big = vec![0u8; 22];
    big[..2].copy_from_slice(&f16::from_f32(8192.0).to_le_bytes());
    assert!(QLinear::from_gguf(GgmlDType::Q5_0, &big, 1, 32).is_none());
    assert!(QLinear::from_gguf(GgmlDType::Q4_1, &[0; 20], 1, 48).is_none());
    assert!(QLinear::from_gguf(GgmlDType::Q4_1, &[0; 19], 1, 32).is_none());
}

/// candle's own quantized matmul (its dot products, activations also quantized to 8 bits) is
/// an independent implementation of the same arithmetic: ours is as close to the f32 product.
#[test]
fn as_accurate_as_candles_quantized_matmul() {
    use candle_core::Device;
    use candle_core::quantized::{QStorage, QTensor};
    for dtype in TYPES {
        let (rows, cols, m) = (48, 256, 5);
        let bytes = gguf_bytes(dtype, rows, cols, &mut Rng(21));
        let ours = QLinear::from_gguf(dtype, &bytes, rows, cols).unwrap();
        let storage = QStorage::from_data(bytes.into(), &Device::Cpu, dtype).unwrap();
        let q = QTensor::new(storage, (rows, cols)).unwrap();
        // Our reading of the blocks (through the interleaved layouts) is GGML's, as candle ports it.
        let weights: Vec<f32> = q
            .dequantize(&Device::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(ours.dequantize(), weights, "{dtype:?}");
        let x = random_input(m * cols, 22);
        let (between, ours_err, theirs_err) =
            against_candle(&format!("{dtype:?}"), &ours, q, &x, m);
        assert!(between < 1e-2, "{dtype:?}: {between}");
        assert!(
            ours_err < 1.25 * theirs_err,
            "{dtype:?}: {ours_err} vs {theirs_err}"
        );
    }
}

/// k-quant rows (quantized here from random floats by candle) through the team, 12 rows (a padded
/// group) and 24. Q2_K and Q3_K take candle's dot products: equal to candle's quantized matmul.
/// The k-quants are interleaved 8 by 8 for our kernels: their weights are candle's dequantized
/// ones, their SIMD and scalar paths agree, and they are as close to the f32 product as candle's
/// quantized matmul (with activations per 256 as GGML's, equal to it).
#[test]
fn k_quants_match_candles_quantized_matmul() {
    use candle_core::quantized::QTensor;
    use candle_core::{Device, Tensor};
    let (cols, m) = (512, 11);
    let x = random_input(m * cols, 32);
    for rows in [12, 24] {
        let w =
            Tensor::from_vec(random_input(rows * cols, 31), (rows, cols), &Device::Cpu).unwrap();
        for dtype in [
            GgmlDType::Q2K,
            GgmlDType::Q3K,
            GgmlDType::Q4K,
            GgmlDType::Q5K,
            GgmlDType::Q6K,
        ] {
            let q = QTensor::quantize(&w, dtype).unwrap();
            let ours = QLinear::from_gguf(dtype, &q.data().unwrap(), rows, cols).unwrap();
            // Our reading of the blocks (and of the interleaved layouts) is candle's.
            let weights: Vec<f32> = q
                .dequantize(&Device::Cpu)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            assert_eq!(ours.dequantize(), weights, "{dtype:?} {rows} rows");
            // 1, 3 and 11 rows: every tile (8, 4, 2, 1).
            for (size, isa) in [1, 2, 3]
                .into_iter()
                .zip(Isa::available().into_iter().cycle())
            {
                for mm in [1, 3, m] {
                    let got = ours.matmul_with(isa, &Team::new(size), &x[..mm * cols], mm);
                    let want = ours.matmul_reference(&x[..mm * cols], mm);
                    let diff = max_rel_diff(&got, &want);
                    assert!(
                        diff < 1e-5,
                        "{dtype:?} {rows} rows, team {size}, {isa:?}, m {mm}: {diff}"
                    );
                }
            }
            for isa in Isa::available() {
                let got = ours.matmul_with(isa, &Team::new(2), &x, m);
                let diff = max_rel_diff(&got, &ours.matmul_reference(&x, m));
                assert!(diff < 1e-5, "{dtype:?} {rows} rows, {isa:?}: {diff}");
            }
            let (between, ours_err, theirs_err) =
                against_candle(&format!("{dtype:?} {rows} rows"), &ours, q, &x, m);
            // The k-quants take GGML's Q8_K activations (one scale a 256) and its arithmetic:
            // candle's products to float rounding.
            assert!(between < 1e-5, "{dtype:?} {rows} rows: {between}");
            // Ours land at 1.1-1.5x candle's error (its Q8_K activations, one scale a 256, are
            // no coarser in practice); both are the activations' rounding alone.
            assert!(
                ours_err < 1.6 * theirs_err,
                "{dtype:?}: {ours_err} vs {theirs_err}"
            );
        }
    }
    let w = Tensor::from_vec(random_input(16 * cols, 33), (16, cols), &Device::Cpu).unwrap();
    let bytes = QTensor::quantize(&w, GgmlDType::Q4K)
        .unwrap()
        .data()
        .unwrap()
        .to_vec();
    let a = QLinear::from_gguf(GgmlDType::Q4K, &bytes, 16, cols).unwrap();
    let both = QLinear::concat(&[&a, &a]).expect("same format");
    let (one, two) = (a.matmul(&x, m), both.matmul(&x, m));
    for i in 0..m {
        assert_eq!(&two[i * 32..i * 32 + 16], &one[i * 16..(i + 1) * 16]);
    }
}

/// A long prompt's activations go through the weights in runs that fit the cache: every run
/// length gives the same dots as one pass.
#[test]
fn activation_runs_give_the_same_dots() {
    use super::blocks::{Nibbles, Nibbles8, quantize_row};
    use super::kernels::{act_run, dot_groups_in_runs};
    let (rows, cols, m) = (16, 64, 19);
    let bytes = gguf_bytes(GgmlDType::Q4_1, rows, cols, &mut Rng(41));
    let plain = Nibbles::parse_q4_1(&bytes);
    let w: Vec<Nibbles8> = plain
        .chunks_exact(8 * cols / 32)
        .flat_map(|g| Nibbles8::interleave(g, cols / 32))
        .collect();
    let mut acts = Vec::new();
    quantize_row(&random_input(m * cols, 42), &mut acts);
    let dots = |run: usize| {
        let mut out = vec![0f32; m * rows];
        dot_groups_in_runs(
            Isa::detect(),
            &w,
            &acts,
            cols,
            0..rows / 8,
            run,
            |i, r, v| out[i * rows + r] = v,
        );
        out
    };
    let whole = dots(m);
    for run in [1, 4, 8, 16] {
        assert_eq!(dots(run), whole, "runs of {run}");
    }
    assert_eq!(act_run(64) % 8, 0);
    assert!(act_run(1 << 20) >= 8, "at least one tile");
}

/// An embedding lookup reads rows of the table as the matmul reads them: the dequantized rows.
#[test]
fn looked_up_rows_are_the_dequantized_rows() {
    use candle_core::quantized::QTensor;
    use candle_core::{Device, Tensor};
    let (rows, cols) = (37, 256);
    let w = Tensor::from_vec(random_input(rows * cols, 51), (rows, cols), &Device::Cpu).unwrap();
    for dtype in [
        TYPES.as_slice(),
        &[GgmlDType::Q2K, GgmlDType::Q4K, GgmlDType::Q6K],
    ]
    .concat()
    {
        let bytes = QTensor::quantize(&w, dtype)
            .unwrap()
            .data()
            .unwrap()
            .to_vec();
        let layer = QLinear::from_gguf(dtype, &bytes, rows, cols).unwrap();
        let all = layer.dequantize();
        let ids = [0, 36, 5, 5, 8];
        let got = layer.dequantize_rows(&ids);
        let want: Vec<f32> = ids
            .iter()
            .flat_map(|&r| all[r * cols..(r + 1) * cols].to_vec())
            .collect();
        assert_eq!(got, want, "{dtype:?}");
    }
}

/// A changed byte anywhere in a block changes its own row's outputs and no other row's, for every
/// format our kernels take: the kernels read every field (scales, offsets, each bit plane,
/// IQ4_XS's packed 6-bit scales), each into the right row. (Own row: some of 4 activation rows,
/// as one row's changes may cancel.)
#[test]
fn every_byte_reaches_its_own_row_and_no_other() {
    use candle_core::quantized::QTensor;
    use candle_core::{Device, Tensor};
    let (rows, m) = (11, 4);
    let w = Tensor::from_vec(random_input(rows * 256, 61), (rows, 256), &Device::Cpu).unwrap();
    let k_quants = [
        GgmlDType::Q2K,
        GgmlDType::Q3K,
        GgmlDType::Q4K,
        GgmlDType::Q5K,
        GgmlDType::Q6K,
    ];
    let ggml = [TYPES.as_slice(), &k_quants].concat().into_iter();
    let iq4 = [Iq4Type::Nl, Iq4Type::Xs].into_iter();
    let cases = ggml
        .map(|dtype| {
            let q = QTensor::quantize(&w, dtype).unwrap();
            (Format::Ggml(dtype), q.data().unwrap().to_vec(), 256)
        })
        .chain(iq4.map(|ty| {
            let cols = tests_iq4::width(ty);
            let bytes = tests_iq4::iq4_bytes(ty, rows, cols, &mut Rng(21));
            (Format::Iq4(ty), bytes, cols)
        }));
    for (format, bytes, cols) in cases {
        let x = random_input(m * cols, 62);
        let row_bytes = bytes.len() / rows;
        let matmul = |b: &[u8]| format.layer(b, rows, cols).matmul(&x, m);
        let base = matmul(&bytes);
        for at in (0..bytes.len()).step_by(5).chain([1, 3, 7]) {
            let mut changed = bytes.clone();
            // Both nibbles and a high bit change (a scale's exponent, IQ4_XS's scales_h).
            changed[at] ^= 0x91;
            let got = matmul(&changed);
            let row = at / row_bytes;
            let differs = |r: usize| {
                (0..m)
                    .filter(|i| got[i * rows + r] != base[i * rows + r])
                    .count()
            };
            assert!(
                differs(row) > 0,
                "{format:?}: byte {at} (row {row}) changed nothing"
            );
            for r in (0..rows).filter(|&r| r != row) {
                assert_eq!(
                    differs(r),
                    0,
                    "{format:?}: byte {at} (row {row}) changed row {r}"
                );
            }
        }
    }
}
