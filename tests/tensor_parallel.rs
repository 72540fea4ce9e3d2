//! Tensor parallelism on the CPU: the sharded model's arithmetic and its shard-aware loading.
//! Each rank of a [`LocalGroup`] (threads in this process, the CPU stand-in for NCCL) loads only
//! its part of every split tensor and runs the same forward pass; their logits must match the
//! whole model's. The fixtures cover KV heads split across ranks, KV heads replicated (fewer of
//! them than ranks), biases, tied and untied LM heads, and a vocabulary that does not split.

use candle_core::{DType, Device, Tensor};
use pagewise::engine::sequence::SeqId;
use pagewise::loader::{self, GgufMatmul, LoadFormat, LoadOptions};
use pagewise::model::weights::Part;
use pagewise::model::{self, ForwardBatch, KvCache, KvLayout};
use pagewise::parallel::{LocalGroup, Parallel, TpRank};
use pagewise::scheduler::{ScheduledSeq, SchedulerOutput};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

fn options(format: LoadFormat) -> LoadOptions {
    LoadOptions {
        load_format: format,
        dtype: DType::F32,
        device: Device::Cpu,
        gguf_matmul: GgufMatmul::Auto,
        seed: 7,
    }
}

/// One prefill of `tokens` (block table in reverse order, so slots are not contiguous).
fn prefill(tokens: &[u32], bs: usize) -> SchedulerOutput {
    let n = tokens.len();
    let num_blocks = n.div_ceil(bs);
    let table: Vec<u32> = (1..=num_blocks as u32).rev().collect();
    SchedulerOutput {
        seqs: vec![ScheduledSeq {
            seq_id: SeqId(0),
            num_computed_tokens: 0,
            num_new_tokens: n,
            tokens: 0..n,
            block_table: 0..num_blocks,
            samples: true,
        }],
        token_ids: tokens.to_vec(),
        positions: (0..n as u32).collect(),
        slot_mapping: (0..n)
            .map(|p| table[p / bs] * bs as u32 + (p % bs) as u32)
            .collect(),
        block_tables: table,
        preempted: Vec::new(),
    }
}

/// Rank `par.rank`'s logits at every position of `tokens` (every rank returns the full rows).
fn rank_logits(path: &str, format: LoadFormat, tokens: &[u32], par: &Parallel) -> Vec<Vec<f32>> {
    let loaded = loader::load(path, &options(format)).unwrap();
    let cfg = &loaded.config;
    let m = model::build_sharded(cfg, &loaded.weights, tokens.len(), par).unwrap();
    assert_eq!(m.tp_rank(), par.rank);
    let bs = 16;
    let out = prefill(tokens, bs);
    let layout = KvLayout {
        num_blocks: tokens.len().div_ceil(bs) + 1,
        block_size: bs,
        num_kv_heads: par.rank.kv_heads(cfg).len(),
        head_dim: cfg.head_dim,
    };
    let mut kv =
        KvCache::on_device(layout, cfg.num_hidden_layers, DType::F32, &Device::Cpu).unwrap();
    let mut batch = ForwardBatch::new(&out, &Device::Cpu).unwrap();
    let n = tokens.len();
    let rows: Vec<u32> = (0..n as u32).collect();
    batch.sample_rows = Tensor::from_slice(&rows, n, &Device::Cpu).unwrap();
    batch.num_sample_rows = n;
    m.forward(&batch, &mut kv)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap()
}

/// Every rank's logits for a group of `size` threads.
fn sharded_logits(
    path: &str,
    format: LoadFormat,
    tokens: &[u32],
    size: usize,
) -> Vec<Vec<Vec<f32>>> {
    let group = LocalGroup::new(size);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..size)
            .map(|rank| {
                let par = Parallel::new(TpRank { rank, size }, group.member(rank));
                s.spawn(move || rank_logits(path, format, tokens, &par))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn assert_close(a: &[Vec<f32>], b: &[Vec<f32>], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: rows");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.len(), y.len(), "{what}: vocab");
        for (j, (p, q)) in x.iter().zip(y).enumerate() {
            let tol = 1e-4 * (1.0 + p.abs().max(q.abs()));
            assert!((p - q).abs() <= tol, "{what}: row {i} col {j}: {p} vs {q}");
        }
    }
}

fn check(path: &str, format: LoadFormat, sizes: &[usize]) {
    let tokens: Vec<u32> = (0..37).map(|i| (i * 17 + 3) % 300).collect();
    let whole = rank_logits(path, format, &tokens, &Parallel::single());
    for &size in sizes {
        let ranks = sharded_logits(path, format, &tokens, size);
        for (rank, logits) in ranks.iter().enumerate() {
            assert_close(logits, &whole, &format!("{path} tp={size} rank {rank}"));
        }
        // The ranks agree bit for bit (the sums are taken in the same order everywhere).
        assert!(
            ranks.iter().all(|r| r == &ranks[0]),
            "tp={size}: ranks differ"
        );
    }
}

#[test]
fn sharded_llama_matches_the_whole_model() {
    // 4 query heads, 2 KV heads (split at 2 ranks, replicated at 4), tied embeddings.
    check(
        &format!("{FIXTURES}/llama-gqa-tied"),
        LoadFormat::Auto,
        &[2, 4],
    );
}

#[test]
fn sharded_qwen2_with_biases_and_one_kv_head_matches_the_whole_model() {
    check(&format!("{FIXTURES}/qwen2-bias"), LoadFormat::Auto, &[2, 4]);
}

#[test]
fn sharded_dummy_weights_are_the_same_model_at_every_size() {
    check(
        &format!("{FIXTURES}/llama-gqa-tied"),
        LoadFormat::Dummy,
        &[2],
    );
}

#[test]
fn a_rank_reads_only_its_part_of_a_safetensors_tensor() {
    let path = format!("{FIXTURES}/qwen2-bias");
    let w = loader::load(&path, &options(LoadFormat::Auto))
        .unwrap()
        .weights;
    let name = "model.layers.0.mlp.down_proj.weight";
    let full = w.tensor(name, (64, 128)).unwrap();
    let rows = w.tensor_part(name, (64, 128), &Part::Rows(16..48)).unwrap();
    let cols = w.tensor_part(name, (64, 128), &Part::Cols(32..96)).unwrap();
    assert_eq!(rows.dims(), &[32, 128]);
    assert_eq!(cols.dims(), &[64, 64]);
    let narrow = |t: Tensor| t.to_vec2::<f32>().unwrap();
    assert_eq!(narrow(rows), narrow(full.narrow(0, 16, 32).unwrap()));
    assert_eq!(narrow(cols), narrow(full.narrow(1, 32, 64).unwrap()));
    let e = w
        .tensor_part(name, (128, 64), &Part::Rows(0..8))
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("has shape [64, 128], expected [128, 64]"),
        "{e}"
    );
}

#[test]
fn a_model_that_does_not_split_is_refused_with_the_reason() {
    let path = format!("{FIXTURES}/qwen2-bias");
    let loaded = loader::load(&path, &options(LoadFormat::Auto)).unwrap();
    let group = LocalGroup::new(8);
    let par = Parallel::new(TpRank { rank: 0, size: 8 }, group.member(0));
    let e = model::build_sharded(&loaded.config, &loaded.weights, 16, &par)
        .err()
        .unwrap();
    assert!(
        e.to_string()
            .contains("must divide the number of attention heads (4)"),
        "{e}"
    );
}
