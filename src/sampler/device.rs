//! Sampling on the GPU: rows that need only a temperature (and min-p) are picked by our sampling
//! kernel, so one id per row crosses to the host; rows needing logprobs, logit edits, top-k or
//! top-p copy just their own logits back for the host sampler. A GPU row's randomness is one draw
//! from its sequence's own stream per step, so seeded requests stay reproducible and independent
//! of the batch.
//!
//! [`DeviceRows`] splits a step's rows before its forward pass, so a CUDA graph can sample inside
//! the replay (src/runner/cuda_graphs.rs); eager steps run the kernel after the forward pass.
//!
//! Constrained rows (`crate::guided`) that the GPU could sample are masked rows: their masks are
//! computed on the CPU while the forward pass runs ([`DeviceRows::compute_masks`]), then one more
//! launch of the kernel samples just those rows under their bitmasks, queued behind the forward
//! pass (or the graph replay, which sampled them unmasked and whose ids for them are dropped).
//! Masks thus cost the GPU one small launch and stay off the critical path.

use candle_core::{DType, Device, Tensor};

use super::{SampleRequest, SampledToken, Sampler};

/// A step's sampling rows, as the GPU sampler's per-row inputs plus the rows the host samples.
pub struct DeviceRows<'a> {
    /// Per row: the GPU temperature (0 = argmax; 0 also for host rows, whose id is replaced).
    pub temperatures: Vec<f32>,
    /// Per row: the min-p floor.
    pub min_ps: Vec<f32>,
    /// Per row: this step's seed (one draw from the sequence's stream when it samples at t > 0).
    pub seeds: Vec<i64>,
    /// The rows the host samples, and their requests.
    host_rows: Vec<u32>,
    host_requests: Vec<SampleRequest<'a>>,
    /// The constrained rows the GPU samples under their masks.
    masked: Masked<'a>,
}

/// Constrained rows sampled on the GPU: their rows, requests and kernel inputs, and once
/// launched, their ids (on the device).
#[derive(Default)]
struct Masked<'a> {
    rows: Vec<u32>,
    requests: Vec<SampleRequest<'a>>,
    temperatures: Vec<f32>,
    min_ps: Vec<f32>,
    seeds: Vec<i64>,
    ids: Option<Tensor>,
}

impl<'a> DeviceRows<'a> {
    /// The rows of `requests`, one per sampling row in order; draws each GPU row's seed now.
    pub fn new(requests: impl IntoIterator<Item = SampleRequest<'a>>) -> Self {
        let mut rows = DeviceRows {
            temperatures: Vec::new(),
            min_ps: Vec::new(),
            seeds: Vec::new(),
            host_rows: Vec::new(),
            host_requests: Vec::new(),
            masked: Masked::default(),
        };
        for (row, mut req) in requests.into_iter().enumerate() {
            match req.device_temperature() {
                Some(t) if req.guide.is_some() => {
                    // Sampled by the masked launch; the main launch's id is dropped.
                    rows.temperatures.push(0.0);
                    rows.min_ps.push(0.0);
                    rows.seeds.push(0);
                    let m = &mut rows.masked;
                    m.rows.push(row as u32);
                    m.temperatures.push(t);
                    m.min_ps.push(req.params.min_p);
                    m.seeds.push(seed(&mut req, t));
                    m.requests.push(req);
                }
                Some(t) => {
                    rows.temperatures.push(t);
                    rows.min_ps.push(req.params.min_p);
                    rows.seeds.push(seed(&mut req, t));
                }
                None => {
                    // Ignored by `finish`: the host sampler decides this row.
                    rows.temperatures.push(0.0);
                    rows.min_ps.push(0.0);
                    rows.seeds.push(0);
                    rows.host_rows.push(row as u32);
                    rows.host_requests.push(req);
                }
            }
        }
        rows
    }

    /// `n` rows the GPU samples by argmax and nobody reads: a tensor-parallel worker replays rank
    /// 0's decode graphs, which sample inside, but only rank 0's ids count.
    pub fn unread(n: usize) -> Self {
        DeviceRows {
            temperatures: vec![0.0; n],
            min_ps: vec![0.0; n],
            seeds: vec![0; n],
            host_rows: Vec::new(),
            host_requests: Vec::new(),
            masked: Masked::default(),
        }
    }

    /// Computes the masks of the constrained rows, meant for while the GPU runs the forward pass.
    pub fn compute_masks(&mut self) {
        super::compute_masks(&mut self.host_requests);
        super::compute_masks(&mut self.masked.requests);
    }

    /// Queues the sampling of the masked rows from `logits` (`[rows, vocab]` on the GPU), behind
    /// whatever the stream runs now; their ids are read in [`DeviceRows::finish`]. A no-op
    /// without masked rows, or once done.
    pub fn launch_masked(&mut self, logits: &Tensor) -> candle_core::Result<()> {
        let m = &mut self.masked;
        if m.rows.is_empty() || m.ids.is_some() {
            return Ok(());
        }
        let (n, device) = (m.rows.len(), logits.device());
        let vocab = logits.dim(1)?;
        let words = vocab.div_ceil(32);
        let mut bits = vec![0u32; n * words];
        for (req, row) in m.requests.iter_mut().zip(bits.chunks_exact_mut(words)) {
            // A failed guide has no mask: nothing allowed (its sequence ends with the error).
            if let Some(mask) = req.guide.as_deref_mut().and_then(|g| g.mask()) {
                let src = mask.as_slice();
                let k = src.len().min(words);
                row[..k].copy_from_slice(&src[..k]);
            }
        }
        let picked = logits.index_select(&Tensor::from_slice(&m.rows, n, device)?, 0)?;
        m.ids = Some(pagewise_kernels::sample_masked(
            &picked,
            &Tensor::from_slice(&m.temperatures, n, device)?,
            &Tensor::from_slice(&m.min_ps, n, device)?,
            &Tensor::from_slice(&m.seeds, n, device)?,
            &Tensor::from_vec(bits, (n, words), device)?,
        )?);
        Ok(())
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.temperatures.len()
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.temperatures.is_empty()
    }

    /// Samples every row of `logits` (`[rows, vocab]` on a GPU, f32 or the model's half type):
    /// the kernel for the GPU rows, then [`DeviceRows::finish`].
    pub fn sample(
        mut self,
        sampler: &mut Sampler,
        logits: &Tensor,
    ) -> candle_core::Result<Vec<SampledToken>> {
        if self.is_empty() {
            // (A step where nothing samples: its logits, if any, are a placeholder row.)
            return Ok(Vec::new());
        }
        self.launch_masked(logits)?;
        let device = logits.device();
        let rows = self.len();
        let ids = pagewise_kernels::sample(
            logits,
            &Tensor::from_slice(&self.temperatures, rows, device)?,
            &Tensor::from_slice(&self.min_ps, rows, device)?,
            &Tensor::from_slice(&self.seeds, rows, device)?,
        )?
        .to_vec1::<u32>()?;
        self.finish(sampler, &ids, logits)
    }

    /// The step's tokens from the GPU's `ids` (one per row), the masked rows' ids from their
    /// launch, and the host sampler deciding the rows that need it from their own `logits` rows
    /// (copied back as f32).
    pub fn finish(
        mut self,
        sampler: &mut Sampler,
        ids: &[u32],
        logits: &Tensor,
    ) -> candle_core::Result<Vec<SampledToken>> {
        if ids.len() != self.len() {
            candle_core::bail!("{} sampled ids for {} rows", ids.len(), self.len());
        }
        let mut out: Vec<SampledToken> = ids
            .iter()
            .map(|&token_id| SampledToken {
                token_id,
                logprobs: None,
            })
            .collect();
        self.launch_masked(logits)?;
        if let Some(ids) = self.masked.ids.take() {
            for (&row, id) in self.masked.rows.iter().zip(ids.to_vec1::<u32>()?) {
                out[row as usize].token_id = id;
            }
        }
        if !self.host_rows.is_empty() {
            let device = logits.device();
            let n = self.host_rows.len();
            let picked =
                logits.index_select(&Tensor::from_slice(&self.host_rows, n, device)?, 0)?;
            let mut data = picked
                .to_dtype(DType::F32)?
                .to_device(&Device::Cpu)?
                .to_vec2::<f32>()?;
            let rows = self.host_rows.into_iter().zip(self.host_requests);
            for ((row, req), logits) in rows.zip(data.iter_mut()) {
                out[row as usize] = sampler.sample(logits, req);
            }
        }
        Ok(out)
    }
}

/// This step's seed of a row sampled at temperature `t` on the GPU: one draw from its sequence's
/// stream when it samples at random, else 0 (argmax needs none).
fn seed(req: &mut SampleRequest<'_>, t: f32) -> i64 {
    if t > 0.0 {
        req.rng.next_u64() as i64
    } else {
        0
    }
}
