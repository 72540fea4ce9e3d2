//! Helpers shared by the kernel tests.

use candle_core::{DType, Tensor};

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
