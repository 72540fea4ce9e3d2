//! How fast each GGUF type's matmul reads its weights at decode (one activation row), against
//! how fast this machine reads memory at all. A measurement, not a check: run it by hand,
//!
//! ```text
//! cargo test --release -p pagewise-cpu --test bandwidth -- --ignored --nocapture
//! ```
//!
//! and record the table in benches/RESULTS.md with the CPU model. Each kernel runs with every
//! instruction set the CPU has (AVX2, and AVX2 with AVX-VNNI where present), side by side.
//! `PAGEWISE_BW_TYPES=Q8_0,Q5K,IQ4_XS` measures only those types (names as the table prints
//! them), for A/B runs of one kernel. `scripts/bench/ggml_matmul.sh` is llama.cpp's table.

use std::time::Instant;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use pagewise_cpu::QLinear;
use pagewise_cpu::iq4::Iq4Type;
use pagewise_cpu::kernels::Isa;
use pagewise_cpu::team::Team;

/// Rows and columns of the matrix: 4864 x 896 is one of Qwen2.5-0.5B's MLP matrices (no
/// k-quants: 896 is not a multiple of 256); 8192 x 2048 one of Llama-3.2-1B's.
const SHAPES: [(usize, usize); 2] = [(4864, 896), (8192, 2048)];

/// Bytes of weights a decode pass reads, over copies of the matrix: past the caches, as a
/// model's are.
const PASS_BYTES: usize = 384 << 20;

/// Whether the table measures type `name` (`PAGEWISE_BW_TYPES`, a comma-separated list; all
/// when unset).
fn wanted(name: &str) -> bool {
    std::env::var("PAGEWISE_BW_TYPES")
        .map_or(true, |list| list.split(',').any(|t| t.trim() == name))
}

/// Seconds one call of `f` takes, the best of `reps` after a warm-up.
fn best_of(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// GB/s of reading a 512 MiB buffer once, split between the team's shares.
fn memory_read_gbs(team: &Team) -> f64 {
    let words = vec![1u64; 64 << 20];
    let shares = team.shares();
    let sums: Vec<std::sync::atomic::AtomicU64> = (0..shares).map(|_| 0.into()).collect();
    let secs = best_of(5, || {
        team.run(&|m: usize| {
            let share = &words[words.len() * m / shares..words.len() * (m + 1) / shares];
            let s = share.iter().fold(0u64, |a, &w| a.wrapping_add(w));
            sums[m].store(s, std::sync::atomic::Ordering::Relaxed);
        })
    });
    (words.len() * 8) as f64 / secs / 1e9
}

#[test]
#[ignore = "a measurement: run by hand with --release --ignored --nocapture"]
fn kernel_bandwidth() {
    let team = Team::global();
    println!(
        "team of {}; memory read {:.1} GB/s",
        team.size(),
        memory_read_gbs(team)
    );
    println!(
        "| type | isa | matrix | bytes | decode (1 row) | GB/s | prefill (64 rows) | GMAC/s |"
    );
    println!(
        "(decode: a pass over copies of the matrix, {} MiB in all, a matrix at a time)",
        PASS_BYTES >> 20
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (rows, cols) in SHAPES {
        let values: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 2654435761) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        let w = Tensor::from_vec(values, (rows, cols), &Device::Cpu).unwrap();
        for dtype in [
            GgmlDType::Q4_0,
            GgmlDType::Q4_1,
            GgmlDType::Q5_0,
            GgmlDType::Q5_1,
            GgmlDType::Q8_0,
            GgmlDType::Q2K,
            GgmlDType::Q3K,
            GgmlDType::Q4K,
            GgmlDType::Q5K,
            GgmlDType::Q6K,
            GgmlDType::F16,
            GgmlDType::BF16,
        ] {
            if !cols.is_multiple_of(dtype.block_size()) || !wanted(&format!("{dtype:?}")) {
                continue;
            }
            let bytes = QTensor::quantize(&w, dtype)
                .unwrap()
                .data()
                .unwrap()
                .to_vec();
            let layer = QLinear::from_gguf(dtype, &bytes, rows, cols).unwrap();
            measure(&format!("{dtype:?}"), &layer, bytes.len());
        }
        // What F16 and BF16 files ran on before their kernels: candle's f32 matmul.
        if wanted("F32") {
            measure_f32(&w);
        }
        // IQ4 types: random blocks (pagewise reads them; it does not write them).
        for ty in [Iq4Type::Nl, Iq4Type::Xs] {
            let Some(row_bytes) = ty.bytes_of(cols).filter(|_| wanted(ty.name())) else {
                continue;
            };
            let bytes: Vec<u8> = (0..rows * row_bytes)
                .map(|i| match i % ty.block_bytes() {
                    1 => 0x1c, // an f16 d of about 0.004, for any other byte below it
                    _ => ((i * 2654435761) >> 7) as u8,
                })
                .collect();
            let layer = QLinear::from_iq4(ty, &bytes, rows, cols).unwrap();
            measure(ty.name(), &layer, bytes.len());
        }
    }
}

/// The row of candle's f32 matmul of `w` (`[rows, cols]`), as [`measure`] times it.
fn measure_f32(w: &Tensor) {
    let (rows, cols) = w.dims2().unwrap();
    let bytes = rows * cols * 4;
    let copies: Vec<Tensor> = (0..PASS_BYTES.div_ceil(bytes))
        .map(|_| w.copy().unwrap())
        .collect();
    let x = Tensor::arange(0u32, 64 * cols as u32, &Device::Cpu)
        .and_then(|t| t.to_dtype(candle_core::DType::F32))
        .and_then(|t| t.reshape((64, cols)))
        .unwrap();
    let one_x = x.narrow(0, 0, 1).unwrap();
    let one = best_of(5, || {
        for c in &copies {
            drop(one_x.matmul(&c.t().unwrap()).unwrap());
        }
    }) / copies.len() as f64;
    let many = best_of(3, || drop(x.matmul(&w.t().unwrap()).unwrap()));
    print_row("F32 (candle) | -", (rows, cols), bytes, (one, many));
}

/// Rows of the table, one a SIMD instruction set: `layer` (`bytes` of weights) at decode, over
/// copies of it, and in a 64-row prefill.
fn measure(label: &str, layer: &QLinear, bytes: usize) {
    let (rows, cols) = (layer.rows(), layer.cols());
    let copies: Vec<QLinear> = (0..PASS_BYTES.div_ceil(bytes))
        .map(|_| layer.clone())
        .collect();
    let x: Vec<f32> = (0..64 * cols).map(|i| (i % 17) as f32 / 17.0).collect();
    let team = Team::global();
    for isa in Isa::available().into_iter().filter(|&i| i != Isa::Scalar) {
        let one = best_of(5, || {
            for c in &copies {
                drop(c.matmul_with(isa, team, &x[..cols], 1));
            }
        }) / copies.len() as f64;
        let many = best_of(3, || drop(layer.matmul_with(isa, team, &x, 64)));
        print_row(
            &format!("{label} | {isa:?}"),
            (rows, cols),
            bytes,
            (one, many),
        );
    }
}

/// One row of the table: `what` (type and ISA columns), a `[rows, cols]` matrix of `bytes`, the
/// seconds of one decode pass and of one 64-row prefill.
fn print_row(what: &str, (rows, cols): (usize, usize), bytes: usize, (one, many): (f64, f64)) {
    println!(
        "| {what} | {rows} x {cols} | {:.1} MB | {:.0} µs | {:.1} | {:.1} ms | {:.1} |",
        bytes as f64 / 1e6,
        one * 1e6,
        bytes as f64 / one / 1e9,
        many * 1e3,
        (64 * rows * cols) as f64 / many / 1e9,
    );
}
