//! Helpers shared by the kernel tests.

pub mod affine;

use candle_core::{DType, Device, Tensor};

/// A small deterministic generator (no dependency): uniform in [-1, 1).
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// A tensor's values as f32 on the host.
pub fn host_f32(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
}

/// GPU seconds per call of `run(i)` for i in 0..iters, the calls captured once into a CUDA graph
/// on `stream` (as the engine's decode steps run) and the graph replayed once untimed, then
/// once between two events. The caller warms up whatever `run` needs first.
#[allow(dead_code)] // (not every test binary times graphs)
pub fn graph_replay_seconds(
    stream: &std::sync::Arc<candle_core::cuda_backend::cudarc::driver::CudaStream>,
    iters: usize,
    run: &dyn Fn(usize),
) -> f64 {
    use candle_core::cuda_backend::cudarc::driver::sys::{
        CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode,
    };
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .unwrap();
    for i in 0..iters {
        run(i);
    }
    let graph = stream
        .end_capture(CUgraphInstantiate_flags(0))
        .unwrap()
        .unwrap();
    graph.launch().unwrap();
    let timing = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let start = stream.record_event(timing).unwrap();
    graph.launch().unwrap();
    let end = stream.record_event(timing).unwrap();
    f64::from(start.elapsed_ms(&end).unwrap()) / 1e3 / iters as f64
}

/// A `shape` tensor of `dtype` on `dev` with values uniform in [-scale, scale).
#[allow(dead_code)] // (not every test binary makes random tensors)
pub fn random(
    rng: &mut Lcg,
    shape: (usize, usize),
    scale: f32,
    dtype: DType,
    dev: &Device,
) -> Tensor {
    if shape.0 * shape.1 == 0 {
        return Tensor::zeros(shape, dtype, dev).unwrap();
    }
    let v: Vec<f32> = (0..shape.0 * shape.1).map(|_| rng.next() * scale).collect();
    Tensor::from_vec(v, shape, dev)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

/// Largest |got - want| over the largest |want|.
#[allow(dead_code)] // (not every test binary compares this way)
pub fn max_rel_diff(got: &[f32], want: &[f32]) -> f32 {
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    got.iter()
        .zip(want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
        / scale
}

/// Random MXFP4 matrices (scales 2^-12 to 2^-3) and their values on the host.
#[allow(dead_code)] // (only the expert tests use MXFP4)
pub fn random_mxfp4(
    rng: &mut Lcg,
    dims: (usize, usize, usize),
    dev: &Device,
) -> (pagewise_kernels::Mxfp4Stack, Vec<f32>) {
    const FP4: [f32; 16] = [
        0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
    ];
    let (n, rows, cols) = dims;
    let byte = |rng: &mut Lcg| ((rng.next() + 1.0) * 128.0) as u8;
    let codes: Vec<u8> = (0..n * rows * cols / 2).map(|_| byte(rng)).collect();
    let scales: Vec<u8> = (0..n * rows * cols / 32)
        .map(|_| 115 + byte(rng) % 10)
        .collect();
    let values = codes
        .iter()
        .enumerate()
        .flat_map(|(i, &c)| {
            let s = 2f32.powi(i32::from(scales[i / 16]) - 127);
            [FP4[usize::from(c & 15)] * s, FP4[usize::from(c >> 4)] * s]
        })
        .collect();
    (
        pagewise_kernels::Mxfp4Stack::from_host(&codes, &scales, dims, dev).unwrap(),
        values,
    )
}

/// The value of e4m3 code `b` (e4m3fn: no infinities; 0x7f and 0xff are NaN).
#[allow(dead_code)] // (the FP8 test binaries only)
pub fn e4m3(b: u8) -> f32 {
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
pub fn random_codes(rng: &mut Lcg, (out, k): (usize, usize), dev: &Device) -> (Tensor, Vec<f32>) {
    let codes: Vec<u8> = (0..out * k)
        .map(|_| {
            let b = ((rng.next() + 1.0) * 128.0) as u8;
            if b & 0x7f == 0x7f { b - 1 } else { b }
        })
        .collect();
    let values = codes.iter().map(|&b| e4m3(b)).collect();
    (Tensor::from_vec(codes, (out, k), dev).unwrap(), values)
}
