//! `ModelRunner`: a scheduled step in, sampled tokens out. Owns the model, the paged KV cache and
//! the sampler; builds the packed batch, runs the model for logits of the sampling rows only, and
//! samples each row with its sequence's own parameters and random stream.

use std::time::Instant;

use candle_core::Device;

use crate::engine::sequence::Sequence;
use crate::engine::step_times::{Phase, StepTimes};
use crate::model::{CausalLm, ForwardBatch, KvCache, ModelError};
use crate::sampler::{SampledToken, Sampler};
use crate::scheduler::SchedulerOutput;

/// Runs steps of one model.
pub struct ModelRunner {
    model: Box<dyn CausalLm>,
    kv: KvCache,
    device: Device,
    sampler: Sampler,
    /// Captured decode graphs (GPU, unless eager).
    #[cfg(feature = "cuda")]
    graphs: Option<crate::cuda_graphs::DecodeGraphs>,
}

impl ModelRunner {
    /// A runner over `model` with the paged cache `kv`, inputs placed on `device`.
    pub fn new(model: Box<dyn CausalLm>, kv: KvCache, device: Device) -> Self {
        ModelRunner {
            model,
            kv,
            device,
            sampler: Sampler::default(),
            #[cfg(feature = "cuda")]
            graphs: None,
        }
    }

    /// Captures CUDA graphs for decode steps (GPU only; a no-op on the CPU). A model whose forward
    /// pass cannot be captured keeps running eagerly, with a warning.
    pub fn capture_graphs(&mut self, max_num_seqs: usize, max_seq_len: usize, block_size: usize) {
        #[cfg(feature = "cuda")]
        if !self.device.is_cpu() {
            let start = Instant::now();
            let spec = crate::cuda_graphs::CaptureSpec {
                max_num_seqs,
                max_seq_len,
                block_size,
            };
            match crate::cuda_graphs::DecodeGraphs::capture(
                self.model.as_ref(),
                &mut self.kv,
                &self.device,
                &spec,
            ) {
                Ok(g) => {
                    tracing::info!(
                        buckets = ?g.buckets(),
                        contexts = ?g.contexts(),
                        seconds = start.elapsed().as_secs_f64(),
                        "captured CUDA graphs for decode steps"
                    );
                    self.graphs = Some(g);
                }
                Err(e) => tracing::warn!("running eagerly: CUDA graph capture failed: {e}"),
            }
        }
        #[cfg(not(feature = "cuda"))]
        let _ = (max_num_seqs, max_seq_len, block_size);
    }

    /// The model.
    pub fn model(&self) -> &dyn CausalLm {
        self.model.as_ref()
    }

    /// Computes `out` and samples one token per sampling sequence. `seqs` are the scheduled
    /// sequences in `out.seqs` order ([`crate::Scheduler::scheduled_mut`]). `overlap` runs once,
    /// while the forward pass is on the GPU (after it on the CPU): the engine's text phase of the
    /// previous step. Phases are timed into `times`: forward is the launch plus the wait for the
    /// GPU that `overlap` did not cover, and `overlap` counts as text.
    pub fn execute(
        &mut self,
        out: &SchedulerOutput,
        seqs: &mut [Sequence],
        times: &mut StepTimes,
        overlap: &mut dyn FnMut(),
    ) -> Result<Vec<SampledToken>, ModelError> {
        if out.is_empty() {
            overlap();
            return Ok(Vec::new());
        }
        let (logits, start) = self.launch(out, times)?;
        let start = times.lap(Phase::Forward, start);
        overlap();
        let start = times.lap(Phase::Text, start);
        self.device.synchronize()?;
        let start = times.lap(Phase::Forward, start);
        let sampled = self.sample(out, seqs, &logits)?;
        times.lap(Phase::Sample, start);
        Ok(sampled)
    }

    /// Prepares `out`'s inputs (timed as prepare) and launches its forward pass: a CUDA-graph
    /// replay when a graph serves the step, else the model eagerly. Returns the logits, not yet
    /// waited for, and when the launch began.
    fn launch(
        &mut self,
        out: &SchedulerOutput,
        times: &mut StepTimes,
    ) -> Result<(candle_core::Tensor, Instant), ModelError> {
        let start = Instant::now();
        #[cfg(feature = "cuda")]
        if let Some(graphs) = self.graphs.as_mut()
            && let Some(bucket) = graphs.prepare(out)?
        {
            let start = times.lap(Phase::Prepare, start);
            let logits = graphs.replay(bucket, out.seqs.len())?;
            times.count_graph_step();
            return Ok((logits, start));
        }
        let batch = ForwardBatch::new(out, &self.device)?;
        let start = times.lap(Phase::Prepare, start);
        Ok((self.model.forward(&batch, &mut self.kv)?, start))
    }

    fn sample(
        &mut self,
        out: &SchedulerOutput,
        seqs: &mut [Sequence],
        logits: &candle_core::Tensor,
    ) -> Result<Vec<SampledToken>, ModelError> {
        let (rows, vocab) = logits.dims2()?;
        debug_assert_eq!(rows, out.num_sampling());
        let requests = out
            .seqs
            .iter()
            .zip(seqs.iter_mut())
            .filter(|(s, _)| s.samples)
            .map(|(_, seq)| seq.sample_request());
        #[cfg(feature = "cuda")]
        if !self.device.is_cpu() {
            return Ok(crate::sampler::device::sample_on_device(
                &mut self.sampler,
                logits,
                requests,
            )?);
        }
        let mut data = logits.flatten_all()?.to_vec1::<f32>()?;
        Ok(self.sampler.sample_batch(&mut data, vocab, requests))
    }
}
