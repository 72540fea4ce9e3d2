//! Sharded forward passes in one process: each rank of a [`LocalGroup`] (threads, the stand-in
//! for NCCL) loads only its part of every split tensor and runs the same forward pass; their
//! logits must match the whole model's. On the CPU in f32 (tests/tensor_parallel.rs,
//! tests/expert_parallel.rs), or with every rank on one GPU (the gpu_engine tests).
#![allow(dead_code)] // (each test binary uses its own part)

use candle_core::{DType, Device, Tensor};
use pagewise::loader::{self, GgufMatmul, LoadFormat, LoadOptions};
use pagewise::model::{self, ForwardBatch, KvCache, KvLayout};
use pagewise::parallel::{LocalGroup, Parallel, TpRank};
use pagewise::scheduler::{ScheduledSeq, SchedulerOutput};
use pagewise::sequence::SeqId;

/// Where and in which dtype the ranks run.
#[derive(Clone, Debug)]
pub struct On {
    pub device: Device,
    pub dtype: DType,
}

impl On {
    /// The CPU in f32, the reference.
    pub fn cpu() -> On {
        On {
            device: Device::Cpu,
            dtype: DType::F32,
        }
    }

    /// Where one rank of a group runs: on a GPU, its own stream of the same GPU (the layers'
    /// per-stream scratch and handles are then the rank's own).
    fn for_rank(&self) -> On {
        let device = match self.device.location() {
            candle_core::DeviceLocation::Cuda { gpu_id } => {
                Device::new_cuda_with_stream(gpu_id).unwrap()
            }
            _ => self.device.clone(),
        };
        On {
            device,
            dtype: self.dtype,
        }
    }
}

pub fn options(format: LoadFormat) -> LoadOptions {
    options_on(format, &On::cpu())
}

fn options_on(format: LoadFormat, on: &On) -> LoadOptions {
    LoadOptions {
        load_format: format,
        dtype: on.dtype,
        device: on.device.clone(),
        gguf_matmul: GgufMatmul::Auto,
        seed: 7,
        quantization: None,
    }
}

const BS: usize = 16;

/// The step of `tokens[start..start + len]` of one sequence whose blocks are 1.. from the end
/// (a non-trivial block table) for all of `tokens`, every row sampled.
fn step(tokens: &[u32], start: usize, len: usize) -> SchedulerOutput {
    let table: Vec<u32> = (1..=tokens.len().div_ceil(BS) as u32).rev().collect();
    let end = start + len;
    SchedulerOutput {
        seqs: vec![ScheduledSeq {
            seq_id: SeqId(0),
            num_computed_tokens: start,
            num_new_tokens: len,
            num_draft_tokens: 0,
            tokens: 0..len,
            block_table: 0..table.len(),
            samples: true,
            num_prompt_rows: 0,
        }],
        token_ids: tokens[start..end].to_vec(),
        positions: (start as u32..end as u32).collect(),
        slot_mapping: (start..end)
            .map(|p| table[p / BS] * BS as u32 + (p % BS) as u32)
            .collect(),
        block_tables: table,
        preempted: Vec::new(),
        ..SchedulerOutput::default()
    }
}

/// Rank `par.rank`'s logits at every position of `tokens` (every rank returns the full rows):
/// a prefill of all but the last token, then a one-token decode step.
pub fn rank_logits(
    path: &str,
    format: LoadFormat,
    tokens: &[u32],
    par: &Parallel,
) -> Vec<Vec<f32>> {
    rank_logits_on(path, format, tokens, par, &On::cpu())
}

/// [`rank_logits`] on `on`'s device and dtype.
pub fn rank_logits_on(
    path: &str,
    format: LoadFormat,
    tokens: &[u32],
    par: &Parallel,
    on: &On,
) -> Vec<Vec<f32>> {
    let loaded = loader::load(path, &options_on(format, on)).unwrap();
    let cfg = &loaded.config;
    let n = tokens.len();
    let m = model::build_sharded(cfg, &loaded.weights, n, par).unwrap();
    assert_eq!(m.tp_rank(), par.rank);
    let layout = KvLayout {
        num_blocks: n.div_ceil(BS) + 1,
        block_size: BS,
        num_kv_heads: cfg.kv_heads(par.rank).len(),
        head_dim: cfg.head_dim,
    };
    let mut kv = KvCache::on_device(layout, cfg.num_hidden_layers, on.dtype, &on.device).unwrap();
    let mut logits = Vec::new();
    for (start, len) in [(0, n - 1), (n - 1, 1)] {
        let out = step(tokens, start, len);
        let mut batch = ForwardBatch::new(&out, &on.device).unwrap();
        let rows: Vec<u32> = (0..len as u32).collect();
        batch.sample_rows = Tensor::from_slice(&rows, len, &on.device).unwrap();
        batch.num_sample_rows = len;
        let step_logits = m.forward(&batch, &mut kv).unwrap();
        logits.extend(
            step_logits
                .to_dtype(DType::F32)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap(),
        );
    }
    logits
}

/// Every rank's logits for a group of `size` threads, a mixture's experts held whole
/// (`expert_parallel`) or sliced.
pub fn sharded_logits(
    path: &str,
    format: LoadFormat,
    tokens: &[u32],
    size: usize,
    expert_parallel: bool,
) -> Vec<Vec<Vec<f32>>> {
    sharded_logits_on(path, format, tokens, (size, expert_parallel), &On::cpu())
}

/// [`sharded_logits`] with every rank on `on`'s device (a stream each on a GPU) and dtype.
pub fn sharded_logits_on(
    path: &str,
    format: LoadFormat,
    tokens: &[u32],
    (size, expert_parallel): (usize, bool),
    on: &On,
) -> Vec<Vec<Vec<f32>>> {
    let group = LocalGroup::new(size);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..size)
            .map(|rank| {
                let par = Parallel::new(TpRank { rank, size }, group.member(rank))
                    .with_expert_parallel(expert_parallel);
                s.spawn(move || rank_logits_on(path, format, tokens, &par, &on.for_rank()))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

pub fn assert_close(a: &[Vec<f32>], b: &[Vec<f32>], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: rows");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.len(), y.len(), "{what}: vocab");
        for (j, (p, q)) in x.iter().zip(y).enumerate() {
            let tol = 1e-4 * (1.0 + p.abs().max(q.abs()));
            assert!((p - q).abs() <= tol, "{what}: row {i} col {j}: {p} vs {q}");
        }
    }
}

/// Every rank's logits over 37 tokens (a 36-token prefill and a decode step) at each group size
/// of `sizes` against the whole model's (1e-4), and the ranks' against each other's (bit for
/// bit).
pub fn check(path: &str, format: LoadFormat, sizes: &[usize], expert_parallel: bool) {
    let tokens: Vec<u32> = (0..37).map(|i| (i * 17 + 3) % 300).collect();
    let whole = rank_logits(path, format, &tokens, &Parallel::single());
    for &size in sizes {
        let ranks = sharded_logits(path, format, &tokens, size, expert_parallel);
        for (rank, logits) in ranks.iter().enumerate() {
            let what = format!("{path} tp={size} (expert parallel {expert_parallel}) rank {rank}");
            assert_close(logits, &whole, &what);
        }
        // The ranks agree bit for bit (the sums are taken in the same order everywhere).
        assert!(
            ranks.iter().all(|r| r == &ranks[0]),
            "tp={size}: ranks differ"
        );
    }
}
