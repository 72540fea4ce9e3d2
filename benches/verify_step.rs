//! What a speculative verify step costs on the CPU: one forward pass of SmolLM2 (Q4_1) over a
//! chunk of 1 + k rows at a context of 340 tokens, all rows' logits, against a 1-row decode step
//! (and two sequences decoding one row each). Needs the SmolLM2 GGUF (scripts/fetch_smollm2.py;
//! `PAGEWISE_SMOLLM2_GGUF`); skips without it.
//!
//! `cargo bench --bench verify_step`; results in benches/RESULTS.md.

use candle_core::{DType, Device};
use criterion::{Criterion, criterion_group, criterion_main};
use pagewise::loader::{self, GgufMatmul, LoadOptions};
use pagewise::model::{self, ForwardBatch, KvCache, KvLayout};
use pagewise::scheduler::{ScheduledSeq, SchedulerOutput};
use pagewise::sequence::SeqId;

const BLOCK: usize = 16;
const BLOCKS_PER_SEQ: u32 = 32;

/// A step of `(sequence, first position, rows)`: sequence `i` holds blocks `32 i + 1 ..`; every
/// row is sampled (the rows after a sequence's first are its drafts).
fn step(seqs: &[(usize, usize, usize)]) -> SchedulerOutput {
    let mut out = SchedulerOutput::default();
    for &(i, first, n) in seqs {
        let table: Vec<u32> = (0..BLOCKS_PER_SEQ)
            .map(|b| i as u32 * BLOCKS_PER_SEQ + 1 + b)
            .collect();
        let (t0, b0) = (out.token_ids.len(), out.block_tables.len());
        for p in first..first + n {
            out.token_ids.push((p as u32 * 7 + 3) % 40_000);
            out.positions.push(p as u32);
            out.slot_mapping
                .push(table[p / BLOCK] * BLOCK as u32 + (p % BLOCK) as u32);
        }
        out.block_tables.extend(&table);
        out.seqs.push(ScheduledSeq {
            seq_id: SeqId(i as u64),
            num_computed_tokens: first,
            num_new_tokens: n,
            num_draft_tokens: n - 1,
            tokens: t0..t0 + n,
            block_table: b0..b0 + table.len(),
            samples: true,
            num_prompt_rows: 0,
        });
    }
    out
}

fn verify_step(c: &mut Criterion) {
    let Ok(path) = std::env::var("PAGEWISE_SMOLLM2_GGUF") else {
        eprintln!("verify_step: set PAGEWISE_SMOLLM2_GGUF (scripts/fetch_smollm2.py); skipped");
        return;
    };
    let opts = LoadOptions {
        load_format: loader::LoadFormat::Auto,
        dtype: DType::F32,
        device: Device::Cpu,
        gguf_matmul: GgufMatmul::Auto,
        seed: 0,
        quantization: None,
    };
    let loaded = loader::load(&path, &opts).unwrap();
    let cfg = loaded.config.clone();
    let m = model::build(&cfg, &loaded.weights, 512).unwrap();
    let layout = KvLayout {
        num_blocks: 2 * BLOCKS_PER_SEQ as usize + 1,
        block_size: BLOCK,
        num_kv_heads: cfg.num_key_value_heads,
        head_dim: cfg.head_dim,
    };
    let mut kv =
        KvCache::on_device(layout, cfg.num_hidden_layers, DType::F32, &Device::Cpu).unwrap();
    for i in 0..2 {
        let out = step(&[(i, 0, 340)]);
        m.forward(&ForwardBatch::new(&out, &Device::Cpu).unwrap(), &mut kv)
            .unwrap();
    }
    let mut group = c.benchmark_group("SmolLM2 Q4_1 step at context 340");
    group.sample_size(20);
    for (name, seqs) in [
        ("decode 1 row", vec![(0, 340, 1)]),
        ("verify 2 rows", vec![(0, 340, 2)]),
        ("verify 4 rows", vec![(0, 340, 4)]),
        ("verify 5 rows", vec![(0, 340, 5)]),
        ("decode 2 sequences", vec![(0, 340, 1), (1, 340, 1)]),
    ] {
        let out = step(&seqs);
        let batch = ForwardBatch::new(&out, &Device::Cpu).unwrap();
        group.bench_function(name, |b| b.iter(|| m.forward(&batch, &mut kv).unwrap()));
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().without_plots();
    targets = verify_step
}
criterion_main!(benches);
