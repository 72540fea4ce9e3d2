//! CUDA graphs for decode steps. A decode step of a small batch is launch-bound: hundreds of small
//! kernels, each costing more on the CPU than on the GPU. At startup the runner captures one
//! forward pass per batch-size bucket and context-length bucket (src/graph_buckets.rs;
//! `PAGEWISE_GRAPH_CONTEXTS` sets the context bounds) into a CUDA graph; a decode step then
//! uploads its inputs into fixed buffers and replays the graph of the smallest bucket that holds it, one launch for the
//! whole model. Padding rows write nothing (slot -1) and attend over nothing (context 0).
//! Steps with prefill chunks, more sequences than the largest bucket or contexts longer than
//! `max_seq_len_to_capture` run eagerly.

use candle_core::cuda_backend::cudarc::driver::{CudaGraph, sys};
use candle_core::{DType, Device, Tensor};

use crate::graph_buckets::{
    batch_buckets, context_bounds_from_env, context_buckets, smallest_holding,
};
use crate::model::attention::KvCache;
use crate::model::batch::{AttentionMeta, DeviceAttentionMeta, padded_block_tables};
use crate::model::{CausalLm, ForwardBatch, ModelError};
use crate::scheduler::SchedulerOutput;

/// The fixed-address inputs every graph reads (sized for the largest bucket; bucket `b` reads
/// the first `b` rows) and the logits every graph writes.
struct Buffers {
    input_ids: Tensor,
    positions: Tensor,
    slot_mapping: Tensor,
    block_tables: Tensor,
    row_seq: Tensor,
    sample_rows: Tensor,
    context_lens: Tensor,
    logits: Tensor,
}

impl Buffers {
    fn new(
        rows: usize,
        max_blocks: usize,
        vocab: usize,
        device: &Device,
    ) -> candle_core::Result<Self> {
        let rows_i32: Vec<i32> = (0..rows as i32).collect();
        let rows_u32: Vec<u32> = (0..rows as u32).collect();
        Ok(Buffers {
            input_ids: Tensor::zeros(rows, DType::U32, device)?,
            positions: Tensor::zeros(rows, DType::U32, device)?,
            slot_mapping: Tensor::full(-1i64, rows, device)?,
            block_tables: Tensor::zeros((rows, max_blocks), DType::I32, device)?,
            sample_rows: Tensor::from_vec(rows_u32, rows, device)?,
            row_seq: Tensor::from_vec(rows_i32, rows, device)?,
            context_lens: Tensor::zeros(rows, DType::I32, device)?,
            logits: Tensor::zeros((rows, vocab), DType::F32, device)?,
        })
    }

    /// The forward batch of bucket `b` over these buffers, with the split plan its graph uses.
    fn batch(
        &self,
        b: usize,
        split: (usize, usize),
        max_context_len: usize,
    ) -> candle_core::Result<ForwardBatch<'static>> {
        let rows = |t: &Tensor| t.narrow(0, 0, b);
        Ok(ForwardBatch {
            input_ids: rows(&self.input_ids)?,
            positions: rows(&self.positions)?,
            sample_rows: rows(&self.sample_rows)?,
            num_sample_rows: b,
            attention: AttentionMeta {
                slot_mapping: &[],
                block_tables: &[],
                seqs: Vec::new(),
                device: Some(DeviceAttentionMeta {
                    slot_mapping: rows(&self.slot_mapping)?,
                    block_tables: rows(&self.block_tables)?,
                    row_seq: rows(&self.row_seq)?,
                    context_lens: rows(&self.context_lens)?,
                    max_context_len,
                    split: Some(split),
                    prefill: None,
                    decode: None,
                }),
            },
        })
    }
}

/// Captured decode graphs, one per (batch bucket, context bucket), and the buffers they read and
/// write.
pub struct DecodeGraphs {
    buckets: Vec<usize>,
    contexts: Vec<usize>,
    /// Bucket `b`'s graph for context bucket `c` at `b * contexts.len() + c`.
    graphs: Vec<CudaGraph>,
    buffers: Buffers,
    max_blocks: usize,
}

/// What capturing needs to know about the engine.
pub struct CaptureSpec {
    /// Most sequences per step.
    pub max_num_seqs: usize,
    /// Longest context a graph serves.
    pub max_seq_len: usize,
    /// Token slots per KV block.
    pub block_size: usize,
}

impl DecodeGraphs {
    /// Captures a graph per bucket (largest first, so smaller graphs reuse its memory). Fails
    /// when a forward pass cannot be captured; the caller then runs eagerly.
    pub fn capture(
        model: &dyn CausalLm,
        kv: &mut KvCache,
        device: &Device,
        spec: &CaptureSpec,
    ) -> Result<Self, ModelError> {
        let cfg = model.config();
        let buckets = batch_buckets(spec.max_num_seqs);
        let bounds = context_bounds_from_env().map_err(ModelError::Unsupported)?;
        let contexts = context_buckets(spec.max_seq_len, &bounds);
        let rows = *buckets.last().unwrap_or(&1);
        let max_blocks = spec.max_seq_len.div_ceil(spec.block_size).max(1);
        let buffers = Buffers::new(rows, max_blocks, cfg.vocab_size, device)?;
        let cuda = device.as_cuda_device()?;
        // Warm-up passes fill candle's cache of small host uploads (shapes, strides), which a
        // capture must not perform, and load every kernel.
        let _htod_cache = cuda.enable_cuda_graph_htod_cache();
        let stream = cuda.cuda_stream();
        let mut graphs = Vec::with_capacity(buckets.len() * contexts.len());
        let dtype = match kv.device_layer(0) {
            Some((k, _)) => k.dtype(),
            None => {
                return Err(ModelError::Unsupported(
                    "CUDA graphs need a GPU KV cache".into(),
                ));
            }
        };
        let group = cfg.num_attention_heads / cfg.num_key_value_heads.max(1);
        let slots = pagewise_kernels::decode_slots(dtype, cfg.head_dim, group)?;
        for (&b, &context) in buckets
            .iter()
            .flat_map(|b| contexts.iter().map(move |c| (b, c)))
            .rev()
        {
            let split =
                pagewise_kernels::graph_split_plan(b, cfg.num_key_value_heads, context, slots);
            let batch = buffers.batch(b, split, context)?;
            drop(model.forward(&batch, kv)?);
            device.synchronize()?;
            stream
                .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                .map_err(driver_error)?;
            let captured = model
                .forward(&batch, kv)
                .and_then(|logits| Ok(buffers.logits.slice_set(&logits, 0, 0)?));
            let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0));
            captured?;
            let graph = graph.map_err(driver_error)?.ok_or_else(|| {
                ModelError::Unsupported("CUDA graph capture produced no graph".into())
            })?;
            graph.upload().map_err(driver_error)?;
            graphs.push(graph);
        }
        graphs.reverse();
        device.synchronize()?;
        Ok(DecodeGraphs {
            buckets,
            contexts,
            graphs,
            buffers,
            max_blocks,
        })
    }

    /// The captured batch sizes.
    pub fn buckets(&self) -> &[usize] {
        &self.buckets
    }

    /// The captured context bounds (the last is the longest context a graph serves).
    pub fn contexts(&self) -> &[usize] {
        &self.contexts
    }

    /// Uploads `out`'s inputs when it is a decode step a graph serves; returns the bucket's
    /// index for [`DecodeGraphs::replay`], or `None` to run the step eagerly.
    pub fn prepare(&mut self, out: &SchedulerOutput) -> Result<Option<usize>, ModelError> {
        let n = out.seqs.len();
        let Some(slot) = smallest_holding(&self.buckets, n) else {
            return Ok(None);
        };
        let decode = out.seqs.iter().all(|s| s.num_new_tokens == 1 && s.samples);
        if n == 0 || !decode {
            return Ok(None);
        }
        let (tables, width) = padded_block_tables(out);
        if width > self.max_blocks {
            return Ok(None);
        }
        let b = self.buckets[slot];
        // Rows past `n` are padding: no slot to write, nothing to attend over.
        let mut ids = vec![0u32; b];
        let mut positions = vec![0u32; b];
        let mut slots = vec![-1i64; b];
        let mut context_lens = vec![0i32; b];
        for (i, s) in out.seqs.iter().enumerate() {
            let row = s.tokens.start;
            ids[i] = out.token_ids[row];
            positions[i] = out.positions[row];
            slots[i] = i64::from(out.slot_mapping[row]);
            context_lens[i] = (s.num_computed_tokens + 1) as i32;
        }
        let buf = &self.buffers;
        pagewise_kernels::upload(&buf.input_ids, &ids)?;
        pagewise_kernels::upload(&buf.positions, &positions)?;
        pagewise_kernels::upload(&buf.slot_mapping, &slots)?;
        pagewise_kernels::upload(&buf.context_lens, &context_lens)?;
        pagewise_kernels::upload_rows(&buf.block_tables, &tables, n, width)?;
        // The last context bucket also takes contexts that round up to its last block.
        let longest = context_lens.iter().copied().max().unwrap_or(0) as usize;
        let c = smallest_holding(&self.contexts, longest).unwrap_or(self.contexts.len() - 1);
        Ok(Some(slot * self.contexts.len() + c))
    }

    /// Replays graph `slot` (from [`DecodeGraphs::prepare`]) over the uploaded inputs; returns the
    /// first `n` rows of the logits (`[n, vocab]` f32, valid until the next replay).
    pub fn replay(&self, slot: usize, n: usize) -> Result<Tensor, ModelError> {
        self.graphs[slot].launch().map_err(driver_error)?;
        Ok(self.buffers.logits.narrow(0, 0, n)?)
    }
}

fn driver_error(e: candle_core::cuda_backend::cudarc::driver::DriverError) -> ModelError {
    ModelError::Candle(candle_core::Error::Msg(format!("CUDA graph: {e:?}")))
}
