//! Sampling on the GPU: rows that need only a temperature (and min-p) are picked by our sampling
//! kernel, so one id per row crosses to the host; rows needing logprobs, logit edits, top-k or
//! top-p copy just their own logits back for the host sampler. A GPU row's randomness is one draw
//! from its sequence's own stream per step, so seeded requests stay reproducible and independent
//! of the batch.

use candle_core::{Device, Tensor};

use super::{SampleRequest, SampledToken, Sampler};

/// Samples every row of `logits` (`[rows, vocab]` f32 on a GPU), one request per row in order.
pub fn sample_on_device<'a>(
    sampler: &mut Sampler,
    logits: &Tensor,
    requests: impl IntoIterator<Item = SampleRequest<'a>>,
) -> candle_core::Result<Vec<SampledToken>> {
    let device = logits.device();
    let mut host_rows: Vec<(u32, SampleRequest<'a>)> = Vec::new();
    let (mut temps, mut min_ps, mut seeds) = (Vec::new(), Vec::new(), Vec::new());
    for (row, req) in requests.into_iter().enumerate() {
        match req.device_temperature() {
            Some(t) => {
                temps.push(t);
                min_ps.push(req.params.min_p);
                seeds.push(if t > 0.0 {
                    req.rng.next_u64() as i64
                } else {
                    0
                });
            }
            None => {
                // Ignored by the kernel's caller below; the host sampler decides this row.
                temps.push(0.0);
                min_ps.push(0.0);
                seeds.push(0);
                host_rows.push((row as u32, req));
            }
        }
    }
    let rows = temps.len();
    let ids = pagewise_kernels::sample(
        logits,
        &Tensor::from_vec(temps, rows, device)?,
        &Tensor::from_vec(min_ps, rows, device)?,
        &Tensor::from_vec(seeds, rows, device)?,
    )?
    .to_vec1::<u32>()?;
    let mut out: Vec<SampledToken> = ids
        .into_iter()
        .map(|token_id| SampledToken {
            token_id,
            logprobs: None,
        })
        .collect();
    if !host_rows.is_empty() {
        let index: Vec<u32> = host_rows.iter().map(|(r, _)| *r).collect();
        let picked = logits.index_select(&Tensor::from_vec(index, host_rows.len(), device)?, 0)?;
        let mut data = picked.to_device(&Device::Cpu)?.to_vec2::<f32>()?;
        for ((row, req), logits) in host_rows.into_iter().zip(data.iter_mut()) {
            out[row as usize] = sampler.sample(logits, req);
        }
    }
    Ok(out)
}
