//! CUDA graphs for decode steps. A decode step of a small batch is launch-bound: hundreds of small
//! kernels, each costing more on the CPU than on the GPU. At startup the runner captures one
//! forward pass per batch-size bucket and context-length bucket (`graph_buckets.rs`) into a CUDA
//! graph; a decode step then
//! stages its inputs (one mapped host buffer, copied into fixed tensors by the graph's first
//! kernel) and replays the graph of the smallest bucket that holds it, one launch for the whole
//! model. Padding rows write nothing (slot -1) and attend over nothing (context 0).
//! Steps with prefill chunks, more sequences than the largest bucket or contexts longer than
//! `max_seq_len_to_capture` run eagerly.
//!
//! A graph also samples: its last kernel picks each row's token from the logits (the model's
//! dtype, no cast) with the temperatures, min-p floors and seeds staged with the step's inputs,
//! and writes the ids straight into mapped page-locked host memory, so when the replay is done
//! the ids are on the host. Rows the GPU cannot sample (logprobs, penalties, top-k/top-p) are
//! redone by the host sampler from their logits rows.

use candle_core::cuda_backend::cudarc::driver::{CudaGraph, sys};
use candle_core::{DType, Device, Tensor};

use super::batch::block_table_width;
use super::graph_buckets::{CONTEXT_BOUNDS, batch_buckets, context_buckets, smallest_holding};
use crate::model::attention::KvCache;
use crate::model::batch::{AttentionMeta, DeviceAttentionMeta};
use crate::model::{CausalLm, ForwardBatch, ModelError};
use crate::sampler::device::DeviceRows;
use crate::scheduler::SchedulerOutput;

/// The fixed-address inputs every graph reads (sized for the largest bucket; bucket `b` reads
/// the first `b` rows), the logits and token ids every graph writes, and the sampler's scratch.
struct Buffers {
    input_ids: Tensor,
    positions: Tensor,
    slot_mapping: Tensor,
    block_tables: Tensor,
    /// With a window group: its slot mapping and block tables.
    window: Option<(Tensor, Tensor)>,
    row_seq: Tensor,
    sample_rows: Tensor,
    context_lens: Tensor,
    logits: Tensor,
    /// With [`CaptureSpec::keep`]: the kept hidden states every graph writes.
    hidden: Option<Tensor>,
    temperatures: Tensor,
    min_ps: Tensor,
    seeds: Tensor,
    sampled: Tensor,
    sample_parts: Tensor,
    /// Where each replay leaves its sampled ids on the host.
    ids_host: pagewise_kernels::PinnedIds,
    /// The step's inputs as the host writes them (see [`Layout`]); each graph's first kernel
    /// copies them into the tensors above.
    staging: pagewise_kernels::Staging,
    layout: Layout,
}

/// Where each input sits in the staging buffer, in 32-bit words, for `rows` rows: word 0 is the
/// step's block-table width, then one run of `rows` words per 4-byte field and `2 * rows` per
/// 8-byte one, then the block tables, `max_blocks` words a row; with a window group, then its
/// slots (two words a row) and its block tables.
#[derive(Clone, Copy)]
struct Layout {
    rows: usize,
    max_blocks: usize,
    window: bool,
}

impl Layout {
    const IDS: usize = 0;
    const POSITIONS: usize = 1;
    const CONTEXT_LENS: usize = 2;
    const TEMPERATURES: usize = 3;
    const MIN_PS: usize = 4;
    /// Two words a row.
    const SLOTS: usize = 5;
    /// Two words a row.
    const SEEDS: usize = 7;
    const TABLES: usize = 9;

    /// First word of the field at run `field` (the constants above).
    fn at(&self, field: usize) -> usize {
        1 + field * self.rows
    }

    fn window_slots(&self) -> usize {
        self.at(Self::TABLES) + self.rows * self.max_blocks
    }

    fn window_tables(&self) -> usize {
        self.window_slots() + 2 * self.rows
    }

    fn words(&self) -> usize {
        match self.window {
            true => self.window_tables() + self.rows * self.max_blocks,
            false => self.window_slots(),
        }
    }
}

impl Buffers {
    fn new(
        layout: Layout,
        (vocab, logits_dtype): (usize, DType),
        device: &Device,
    ) -> candle_core::Result<Self> {
        let Layout {
            rows, max_blocks, ..
        } = layout;
        let rows_i32: Vec<i32> = (0..rows as i32).collect();
        let rows_u32: Vec<u32> = (0..rows as u32).collect();
        Ok(Buffers {
            input_ids: Tensor::zeros(rows, DType::U32, device)?,
            positions: Tensor::zeros(rows, DType::U32, device)?,
            slot_mapping: Tensor::full(-1i64, rows, device)?,
            block_tables: Tensor::zeros((rows, max_blocks), DType::I32, device)?,
            window: match layout.window {
                true => Some((
                    Tensor::full(-1i64, rows, device)?,
                    Tensor::zeros((rows, max_blocks), DType::I32, device)?,
                )),
                false => None,
            },
            sample_rows: Tensor::from_vec(rows_u32, rows, device)?,
            row_seq: Tensor::from_vec(rows_i32, rows, device)?,
            context_lens: Tensor::zeros(rows, DType::I32, device)?,
            logits: Tensor::zeros((rows, vocab), logits_dtype, device)?,
            hidden: None,
            temperatures: Tensor::zeros(rows, DType::F32, device)?,
            min_ps: Tensor::zeros(rows, DType::F32, device)?,
            seeds: Tensor::zeros(rows, DType::I64, device)?,
            sampled: Tensor::zeros(rows, DType::U32, device)?,
            sample_parts: Tensor::zeros(
                pagewise_kernels::sample_workspace_len(rows, vocab).max(1),
                DType::F32,
                device,
            )?,
            ids_host: pagewise_kernels::PinnedIds::new(rows)?,
            staging: pagewise_kernels::Staging::new(layout.words())?,
            layout,
        })
    }

    /// Bucket `b`'s head of a graph: the staged inputs of `b` rows into the input tensors.
    fn unpack(&self, b: usize) -> candle_core::Result<()> {
        let l = self.layout;
        let run = |dst, field, words_per_row| pagewise_kernels::StagedField {
            dst,
            src_word: l.at(field),
            rows: 1,
            row_words: Some(b * words_per_row),
            src_row_words: 0,
            dst_row_words: 0,
        };
        let tables = |dst, src_word| pagewise_kernels::StagedField {
            dst,
            src_word,
            rows: b,
            row_words: None,
            src_row_words: l.max_blocks,
            dst_row_words: l.max_blocks,
        };
        let mut fields = vec![
            run(&self.input_ids, Layout::IDS, 1),
            run(&self.positions, Layout::POSITIONS, 1),
            run(&self.context_lens, Layout::CONTEXT_LENS, 1),
            run(&self.temperatures, Layout::TEMPERATURES, 1),
            run(&self.min_ps, Layout::MIN_PS, 1),
            run(&self.slot_mapping, Layout::SLOTS, 2),
            run(&self.seeds, Layout::SEEDS, 2),
            tables(&self.block_tables, l.at(Layout::TABLES)),
        ];
        if let Some((slots, window_tables)) = &self.window {
            fields.push(pagewise_kernels::StagedField {
                src_word: l.window_slots(),
                ..run(slots, 0, 2)
            });
            fields.push(tables(window_tables, l.window_tables()));
        }
        self.staging.unpack(&fields)
    }

    /// Writes a decode step's inputs into the staging buffer: `n` sequences, padded to `b` rows
    /// (padding writes no slot and attends over nothing).
    fn stage(&mut self, out: &SchedulerOutput, rows: &DeviceRows<'_>, b: usize, width: usize) {
        let l = self.layout;
        let w = self.staging.words_mut();
        w[0] = width as u32;
        let n = out.seqs.len();
        for i in 0..b {
            let (id, pos, slot, ctx) = match out.seqs.get(i) {
                Some(s) => {
                    let row = s.tokens.start;
                    let ctx = (s.num_computed_tokens + 1) as u32;
                    (
                        out.token_ids[row],
                        out.positions[row],
                        i64::from(out.slot_mapping[row]),
                        ctx,
                    )
                }
                None => (0, 0, -1, 0),
            };
            w[l.at(Layout::IDS) + i] = id;
            w[l.at(Layout::POSITIONS) + i] = pos;
            w[l.at(Layout::CONTEXT_LENS) + i] = ctx;
            let (t, m, seed) = if i < n {
                (rows.temperatures[i], rows.min_ps[i], rows.seeds[i])
            } else {
                (0.0, 0.0, 0)
            };
            w[l.at(Layout::TEMPERATURES) + i] = t.to_bits();
            w[l.at(Layout::MIN_PS) + i] = m.to_bits();
            put_i64(&mut w[l.at(Layout::SLOTS) + 2 * i..], slot);
            put_i64(&mut w[l.at(Layout::SEEDS) + 2 * i..], seed);
            if l.window {
                let slot = out
                    .seqs
                    .get(i)
                    .map_or(-1, |s| i64::from(out.window_slot_mapping[s.tokens.start]));
                put_i64(&mut w[l.window_slots() + 2 * i..], slot);
            }
        }
        let mut put_tables = |first: usize, tables: &[u32]| {
            for (i, s) in out.seqs.iter().enumerate() {
                let row = &mut w[first + i * l.max_blocks..][..width];
                for (dst, &block) in row.iter_mut().zip(&tables[s.block_table.clone()]) {
                    *dst = block;
                }
            }
        };
        put_tables(l.at(Layout::TABLES), &out.block_tables);
        if l.window {
            put_tables(l.window_tables(), &out.window_block_tables);
        }
    }

    /// Bucket `b`'s tail of a graph: each row's token sampled from the forward pass's `logits`
    /// into `sampled` and the host's `ids_host`, the logits copied into the logits buffer as the
    /// sampler reads them (for rows the host samples).
    fn sample(&self, b: usize, logits: &Tensor) -> candle_core::Result<()> {
        let rows = |t: &Tensor| t.narrow(0, 0, b);
        let to = pagewise_kernels::SampleOutputs {
            ids: &self.sampled,
            host_ids: Some(&self.ids_host),
            logits_copy: Some(&self.logits),
            workspace: &self.sample_parts,
        };
        pagewise_kernels::sample_into(
            &to,
            logits,
            &rows(&self.temperatures)?,
            &rows(&self.min_ps)?,
            &rows(&self.seeds)?,
        )
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
                window: None,
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
                    window: self
                        .window
                        .as_ref()
                        .map(|(s, t)| Ok::<_, candle_core::Error>((rows(s)?, rows(t)?)))
                        .transpose()?,
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
    /// Whether the steps carry a window group's slots and tables (sliding-window layers with
    /// blocks of their own).
    pub window: bool,
    /// The layers whose incoming residual streams each replay keeps
    /// ([`CausalLm::forward_keeping`]), if any.
    pub keep: Option<Vec<usize>>,
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
        let contexts = context_buckets(spec.max_seq_len, &CONTEXT_BOUNDS);
        let rows = *buckets.last().unwrap_or(&1);
        let max_blocks = spec.max_seq_len.div_ceil(spec.block_size).max(1);
        let dtype = match kv.elements() {
            Some(elements) => elements.value_dtype(),
            None => {
                return Err(ModelError::Unsupported(
                    "CUDA graphs need a GPU KV cache".into(),
                ));
            }
        };
        // (Logits come in the activations' dtype, the KV cache's; checked at the first pass.)
        let layout = Layout {
            rows,
            max_blocks,
            window: spec.window,
        };
        let mut buffers = Buffers::new(layout, (cfg.vocab_size, dtype), device)?;
        let cuda = device.as_cuda_device()?;
        // Warm-up passes fill candle's cache of small host uploads (shapes, strides), which a
        // capture must not perform, and load every kernel.
        let _htod_cache = cuda.enable_cuda_graph_htod_cache();
        let stream = cuda.cuda_stream();
        let mut graphs = Vec::with_capacity(buckets.len() * contexts.len());
        // This rank's heads (all of them without tensor parallelism).
        let tp = model.tp_rank();
        let kv_heads = cfg.kv_heads(tp).len();
        let group = cfg.q_heads(tp).len() / kv_heads.max(1);
        let slots = pagewise_kernels::decode_slots(dtype, cfg.head_dim, group)?;
        for (&b, &context) in buckets
            .iter()
            .flat_map(|b| contexts.iter().map(move |c| (b, c)))
            .rev()
        {
            let split =
                pagewise_kernels::graph_split_plan(b, kv_heads, context, slots, cfg.head_dim);
            let batch = buffers.batch(b, split, context)?;
            // (The forward pass, its kept hidden states copied into their buffer.)
            let forward = |buffers: &mut Buffers, kv: &mut KvCache| match &spec.keep {
                Some(layers) => {
                    let (logits, hidden) = model.forward_keeping(&batch, kv, layers)?;
                    let buffer = match buffers.hidden.take() {
                        Some(h) => h,
                        None => Tensor::zeros((rows, hidden.dim(1)?), hidden.dtype(), device)?,
                    };
                    buffer.slice_set(&hidden, 0, 0)?;
                    buffers.hidden = Some(buffer);
                    Ok(logits)
                }
                None => model.forward_native(&batch, kv),
            };
            let logits_dtype = forward(&mut buffers, kv)?.dtype();
            if logits_dtype != buffers.logits.dtype() {
                if !graphs.is_empty() {
                    return Err(ModelError::Unsupported(format!(
                        "logits change dtype between buckets ({logits_dtype:?})"
                    )));
                }
                buffers.logits = Tensor::zeros((rows, cfg.vocab_size), logits_dtype, device)?;
            }
            device.synchronize()?;
            stream
                .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                .map_err(driver_error)?;
            let captured = buffers
                .unpack(b)
                .map_err(ModelError::from)
                .and_then(|()| forward(&mut buffers, kv))
                .and_then(|logits| Ok(buffers.sample(b, &logits)?));
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

    /// Stages `out`'s inputs and its sampling rows when it is a decode step a graph serves;
    /// returns the bucket's index for [`DecodeGraphs::replay`], or `None` to run the step eagerly.
    pub fn prepare(
        &mut self,
        out: &SchedulerOutput,
        rows: &DeviceRows<'_>,
    ) -> Result<Option<usize>, ModelError> {
        let n = out.seqs.len();
        let Some(slot) = smallest_holding(&self.buckets, n) else {
            return Ok(None);
        };
        let decode = out.seqs.iter().all(|s| s.num_new_tokens == 1 && s.samples);
        if n == 0 || !decode || out.has_window() != self.buffers.layout.window {
            return Ok(None);
        }
        if rows.len() != n {
            return Err(ModelError::Unsupported(format!(
                "a decode step of {n} sequences with {} sampling rows",
                rows.len()
            )));
        }
        let width = block_table_width(out);
        if width > self.max_blocks {
            return Ok(None);
        }
        self.buffers.stage(out, rows, self.buckets[slot], width);
        let longest = out
            .seqs
            .iter()
            .map(|s| s.num_computed_tokens + 1)
            .max()
            .unwrap_or(0);
        // The last context bucket also takes contexts that round up to its last block.
        let c = smallest_holding(&self.contexts, longest).unwrap_or(self.contexts.len() - 1);
        Ok(Some(slot * self.contexts.len() + c))
    }

    /// Replays graph `slot` (from [`DecodeGraphs::prepare`]) over the staged inputs; returns the
    /// first `n` rows of the logits (`[n, vocab]`, the model's dtype, valid until the next replay).
    pub fn replay(&self, slot: usize, n: usize) -> Result<Tensor, ModelError> {
        self.graphs[slot].launch().map_err(driver_error)?;
        Ok(self.buffers.logits.narrow(0, 0, n)?)
    }

    /// The first `n` rows of the hidden states the last replay kept, when the graphs keep them.
    pub fn hidden(&self, n: usize) -> Result<Option<Tensor>, ModelError> {
        Ok(self
            .buffers
            .hidden
            .as_ref()
            .map(|h| h.narrow(0, 0, n))
            .transpose()?)
    }

    /// The first `n` token ids the last replay sampled; call after synchronizing the device.
    pub fn sampled_ids(&self, n: usize) -> Result<Vec<u32>, ModelError> {
        Ok(self.buffers.ids_host.read(n)?)
    }
}

fn driver_error(e: candle_core::cuda_backend::cudarc::driver::DriverError) -> ModelError {
    ModelError::Candle(candle_core::Error::Msg(format!("CUDA graph: {e:?}")))
}

/// `v` as two 32-bit words, low first (the GPU's little-endian i64).
fn put_i64(w: &mut [u32], v: i64) {
    w[0] = v as u32;
    w[1] = (v >> 32) as u32;
}
