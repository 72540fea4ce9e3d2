//! `ModelRunner`: a scheduled step in, sampled tokens out. Owns the model, the paged KV cache and
//! the sampler; builds the packed batch, runs the model for logits of the sampling rows only, and
//! samples each row with its sequence's own parameters and random stream.

pub mod batch;
#[cfg(feature = "cuda")]
pub mod cuda_graphs;
pub mod draft;
pub mod eagle;
pub mod graph_buckets;
mod prompt_logprobs;
pub mod step_times;
mod verify;

use std::time::Instant;

use candle_core::Device;

use crate::model::{CausalLm, ForwardBatch, KvCache, ModelError};
use crate::parallel::group::Leader;
use crate::runner::step_times::{Phase, StepTimes};
use crate::sampler::{Logprobs, SampledToken, Sampler};
use crate::scheduler::SchedulerOutput;
use crate::sequence::{SeqId, Sequence};

/// A step's sampled tokens.
#[derive(Debug, Default)]
pub struct Sampled {
    /// Each sampling sequence's tokens, back to back, in `out.seqs` order.
    pub tokens: Vec<SampledToken>,
    /// How many tokens each sampling sequence emitted (its accepted drafts, then one of the
    /// target's own); empty when the step verified no drafts (one each).
    pub emitted: Vec<usize>,
    /// The prompt logprobs of sequences that sampled their first token this step and asked for
    /// them (`SamplingParams::prompt_logprobs`): those of prompt tokens `1..`.
    pub prompt_logprobs: Vec<(SeqId, Vec<Logprobs>)>,
}

/// Runs steps of one model.
pub struct ModelRunner {
    /// Under tensor parallelism, on rank 0: the other ranks, sent each step's plan. (First, so
    /// it is dropped first: the other ranks are told to stop before this rank's NCCL
    /// communicator goes.)
    leader: Option<Leader>,
    model: Box<dyn CausalLm>,
    kv: KvCache,
    device: Device,
    sampler: Sampler,
    /// Captured decode graphs (GPU, unless eager).
    #[cfg(feature = "cuda")]
    graphs: Option<cuda_graphs::DecodeGraphs>,
    /// The layers whose incoming residual streams each step keeps (an EAGLE-3 head reads them),
    /// and the last step's.
    keep: Option<(Vec<usize>, Option<candle_core::Tensor>)>,
}

impl ModelRunner {
    /// The device the model runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// A runner over `model` with the paged cache `kv`, inputs placed on `device`.
    pub fn new(model: Box<dyn CausalLm>, kv: KvCache, device: Device) -> Self {
        ModelRunner {
            model,
            kv,
            device,
            sampler: Sampler::default(),
            #[cfg(feature = "cuda")]
            graphs: None,
            leader: None,
            keep: None,
        }
    }

    /// Makes every step keep the residual streams entering the model's `layers` (for an EAGLE-3
    /// head; [`CausalLm::forward_keeping`]), CUDA graph replays included (call before
    /// [`ModelRunner::capture_graphs`]).
    pub fn keep_hidden_states(&mut self, layers: Vec<usize>) {
        self.keep = Some((layers, None));
    }

    /// The last step's kept residual streams, one row per token of its batch (see
    /// [`ModelRunner::keep_hidden_states`]).
    pub fn take_hidden_states(&mut self) -> Option<candle_core::Tensor> {
        self.keep.as_mut().and_then(|(_, h)| h.take())
    }

    /// The eager forward pass: the sampled rows' logits in the model dtype, keeping the hidden
    /// states when asked.
    fn forward_eager(
        &mut self,
        batch: &ForwardBatch<'_>,
    ) -> Result<candle_core::Tensor, ModelError> {
        match self.keep.as_mut() {
            Some((layers, kept)) => {
                let (logits, hidden) = self.model.forward_keeping(batch, &mut self.kv, layers)?;
                *kept = Some(hidden);
                Ok(logits)
            }
            None => self.model.forward_native(batch, &mut self.kv),
        }
    }

    /// Makes this runner rank 0 of a tensor-parallel group: every step's plan goes to the other
    /// ranks before this rank computes it.
    pub fn lead(&mut self, leader: Leader) {
        self.leader = Some(leader);
    }

    /// Rank 0's side of the tensor-parallel group, if any.
    pub fn leader(&self) -> Option<&Leader> {
        self.leader.as_ref()
    }

    /// Captures CUDA graphs for decode steps (GPU only; a no-op on the CPU), reading a window
    /// group's slots and tables when `window`. A model whose forward pass cannot be captured
    /// keeps running eagerly, with a warning.
    pub fn capture_graphs(
        &mut self,
        max_num_seqs: usize,
        max_seq_len: usize,
        block_size: usize,
        window: bool,
    ) {
        #[cfg(feature = "cuda")]
        if !self.device.is_cpu() {
            let start = Instant::now();
            let spec = cuda_graphs::CaptureSpec {
                max_num_seqs,
                max_seq_len,
                block_size,
                window,
                keep: self.keep.as_ref().map(|(layers, _)| layers.clone()),
            };
            match cuda_graphs::DecodeGraphs::capture(
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
        let _ = (max_num_seqs, max_seq_len, block_size, window);
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
    ) -> Result<Sampled, ModelError> {
        let mut sampled = self.execute_step(out, seqs, times, overlap)?;
        // A sequence's first sample comes after its whole prompt was computed.
        for (s, seq) in out.seqs.iter().zip(seqs.iter_mut()) {
            if s.samples
                && let Some(lps) = seq.take_prompt_logprobs()
            {
                sampled.prompt_logprobs.push((s.seq_id, lps));
            }
        }
        Ok(sampled)
    }

    fn execute_step(
        &mut self,
        out: &SchedulerOutput,
        seqs: &mut [Sequence],
        times: &mut StepTimes,
        overlap: &mut dyn FnMut(),
    ) -> Result<Sampled, ModelError> {
        if out.is_empty() {
            overlap();
            return Ok(Sampled::default());
        }
        if let Some(leader) = self.leader.as_mut() {
            leader
                .broadcast(out)
                .map_err(|e| ModelError::Unsupported(e.to_string()))?;
        }
        #[cfg(feature = "cuda")]
        if !self.device.is_cpu() && out.num_draft_tokens() == 0 && out.num_prompt_rows() == 0 {
            let requests = out
                .seqs
                .iter()
                .zip(seqs.iter_mut())
                .filter(|(s, _)| s.samples)
                .map(|(_, seq)| seq.sample_request());
            let tokens = self.execute_on_gpu(out, requests, times, overlap)?;
            return Ok(Sampled {
                tokens,
                ..Sampled::default()
            });
        }
        self.execute_on_host(out, seqs, times, overlap)
    }

    /// [`ModelRunner::execute`] on the CPU, and on a GPU for a step that verifies draft tokens
    /// or computes prompt logprobs: an eager forward pass (a verify step's sequences are short
    /// prefill chunks to the attention), the rows' logits brought to the host, the prompt rows'
    /// logprobs stored in their sequences, then each sampling sequence's rows sampled in order
    /// (until the first rejected draft).
    fn execute_on_host(
        &mut self,
        out: &SchedulerOutput,
        seqs: &mut [Sequence],
        times: &mut StepTimes,
        overlap: &mut dyn FnMut(),
    ) -> Result<Sampled, ModelError> {
        let (mut data, vocab) = self.host_logits(out, times)?;
        let start = Instant::now();
        prompt_logprobs::take_prompt_rows(&mut data, vocab, out, seqs);
        overlap();
        let start = times.lap(Phase::Text, start);
        if out.num_draft_tokens() > 0 {
            let (tokens, emitted) =
                verify::sample_verify(&mut self.sampler, &mut data, vocab, out, seqs);
            times.lap(Phase::Sample, start);
            return Ok(Sampled {
                tokens,
                emitted,
                ..Sampled::default()
            });
        }
        let mut requests: Vec<_> = out
            .seqs
            .iter()
            .zip(seqs.iter_mut())
            .filter(|(s, _)| s.samples)
            .map(|(_, seq)| seq.sample_request())
            .collect();
        crate::sampler::compute_masks(&mut requests);
        let start = times.lap(Phase::Guide, start);
        let tokens = self.sampler.sample_batch(&mut data, vocab, requests);
        times.lap(Phase::Sample, start);
        Ok(Sampled {
            tokens,
            ..Sampled::default()
        })
    }

    /// An eager forward pass of `out` (prepare and forward timed into `times`), its sampled
    /// rows' logits on the host in f32: `(rows back to back, vocab)`.
    fn host_logits(
        &mut self,
        out: &SchedulerOutput,
        times: &mut StepTimes,
    ) -> Result<(Vec<f32>, usize), ModelError> {
        let start = Instant::now();
        let batch = ForwardBatch::new(out, &self.device)?;
        let start = times.lap(Phase::Prepare, start);
        let logits = self.forward_eager(&batch)?;
        let (rows, vocab) = logits.dims2()?;
        debug_assert_eq!(rows, out.num_sample_rows() + out.num_prompt_rows());
        let data = logits
            .to_dtype(candle_core::DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        times.lap(Phase::Forward, start);
        Ok((data, vocab))
    }

    /// [`ModelRunner::execute`] on a GPU: the rows' sampling inputs are set before the launch, so
    /// a graph replay samples too and ends with the ids on the host; an eager step samples after
    /// its forward pass.
    #[cfg(feature = "cuda")]
    fn execute_on_gpu<'a>(
        &mut self,
        out: &SchedulerOutput,
        requests: impl Iterator<Item = crate::sampler::SampleRequest<'a>>,
        times: &mut StepTimes,
        overlap: &mut dyn FnMut(),
    ) -> Result<Vec<SampledToken>, ModelError> {
        let start = Instant::now();
        let mut rows = crate::sampler::device::DeviceRows::new(requests);
        let (logits, slot, start) = self.launch_on_gpu(out, &rows, times, start)?;
        let graph = slot.zip(self.graphs.as_ref());
        let start = times.lap(Phase::Forward, start);
        rows.compute_masks();
        let start = times.lap(Phase::Guide, start);
        overlap();
        let start = times.lap(Phase::Text, start);
        rows.launch_masked(&logits)?;
        self.device.synchronize()?;
        let start = times.lap(Phase::Forward, start);
        // (A step where nothing samples has a placeholder row: `ForwardBatch::new`.)
        debug_assert!(rows.is_empty() || logits.dim(0)? == rows.len());
        let sampled = match graph {
            Some((_, graphs)) => {
                let ids = graphs.sampled_ids(out.seqs.len())?;
                rows.finish(&mut self.sampler, &ids, &logits)?
            }
            None => rows.sample(&mut self.sampler, &logits)?,
        };
        times.lap(Phase::Sample, start);
        Ok(sampled)
    }

    /// Launches `out` on the GPU: the replay of the graph whose bucket holds it (its inputs and
    /// `rows`' sampling parameters staged first), else an eager forward pass. Returns the
    /// logits, the graph's slot if one replayed, and the time the prepare lap ended.
    #[cfg(feature = "cuda")]
    fn launch_on_gpu(
        &mut self,
        out: &SchedulerOutput,
        rows: &crate::sampler::device::DeviceRows<'_>,
        times: &mut StepTimes,
        start: Instant,
    ) -> Result<(candle_core::Tensor, Option<usize>, Instant), ModelError> {
        let replayed = match self.graphs.as_mut() {
            Some(graphs) => graphs.prepare(out, rows)?,
            None => None,
        };
        Ok(match replayed.zip(self.graphs.as_ref()) {
            Some((slot, graphs)) => {
                let start = times.lap(Phase::Prepare, start);
                times.count_graph_step();
                let logits = graphs.replay(slot, out.seqs.len())?;
                if let Some((_, kept)) = self.keep.as_mut() {
                    *kept = graphs.hidden(out.seqs.len())?;
                }
                (logits, Some(slot), start)
            }
            None => {
                let batch = ForwardBatch::new(out, &self.device)?;
                let start = times.lap(Phase::Prepare, start);
                let logits = self.forward_eager(&batch)?;
                (logits, None, start)
            }
        })
    }

    /// A tensor-parallel worker rank's step: the same forward pass as rank 0 on this rank's
    /// shard (the same graph replay or eager pass, so the collectives pair up), ending when the
    /// device is done; the logits are rank 0's to sample.
    pub fn forward_only(&mut self, out: &SchedulerOutput) -> Result<(), ModelError> {
        if out.is_empty() {
            return Ok(());
        }
        #[cfg(feature = "cuda")]
        if !self.device.is_cpu() {
            let rows = crate::sampler::device::DeviceRows::unread(out.num_sampling());
            let mut times = StepTimes::default();
            self.launch_on_gpu(out, &rows, &mut times, Instant::now())?;
            self.device.synchronize()?;
            return Ok(());
        }
        let batch = ForwardBatch::new(out, &self.device)?;
        self.model.forward_native(&batch, &mut self.kv)?;
        Ok(())
    }
}
