pub mod fake_model;
pub mod parity;
pub mod server;
pub mod sharded;
pub mod speculation;

use candle_core::{DType, Device, Tensor};
use pagewise::loader::{self, GgufMatmul, LoadOptions, Quantization};
use pagewise::model::{self, ForwardBatch, KvCache, KvLayout};
use pagewise::scheduler::{ScheduledSeq, SchedulerOutput};
use pagewise::sequence::SeqId;

/// f32 logits at every position of `tokens`, as one prefill through the paged cache with the
/// blocks in reverse order (a non-trivial block table), on the CPU in f32.
#[allow(dead_code)]
pub fn logits_at_every_position(
    model_path: &str,
    matmul: GgufMatmul,
    tokens: &[u32],
) -> Vec<Vec<f32>> {
    logits_at_every_position_on(model_path, matmul, tokens, &Device::Cpu, DType::F32)
}

/// The model at `model_path` in `dtype` on `device`, with rotary tables for `max_len` positions,
/// and its config.
#[allow(dead_code)]
fn load_model(
    model_path: &str,
    (matmul, quantization): (GgufMatmul, Option<Quantization>),
    device: &Device,
    dtype: DType,
    max_len: usize,
) -> (model::ModelConfig, Box<dyn model::CausalLm>) {
    let opts = LoadOptions {
        load_format: loader::LoadFormat::Auto,
        dtype,
        device: device.clone(),
        gguf_matmul: matmul,
        seed: 0,
        quantization,
    };
    let loaded = loader::load(model_path, &opts).unwrap();
    let m = model::build(&loaded.config, &loaded.weights, max_len).unwrap();
    (loaded.config, m)
}

/// [`logits_at_every_position`] with the model in `dtype` on `device`.
#[allow(dead_code)]
pub fn logits_at_every_position_on(
    model_path: &str,
    matmul: GgufMatmul,
    tokens: &[u32],
    device: &Device,
    dtype: DType,
) -> Vec<Vec<f32>> {
    logits_at_every_position_quantized(model_path, (matmul, None), tokens, device, dtype)
}

/// [`logits_at_every_position_on`] with the weights quantized at load (`--quantization`).
#[allow(dead_code)]
pub fn logits_at_every_position_quantized(
    model_path: &str,
    load: (GgufMatmul, Option<Quantization>),
    tokens: &[u32],
    device: &Device,
    dtype: DType,
) -> Vec<Vec<f32>> {
    let (cfg, m) = load_model(model_path, load, device, dtype, tokens.len());
    let cfg = &cfg;
    let bs = 16;
    let n = tokens.len();
    let num_blocks = n.div_ceil(bs);
    let out = prefill_step(tokens, bs);
    let layout = KvLayout {
        num_blocks: num_blocks + 1,
        block_size: bs,
        num_kv_heads: cfg.num_key_value_heads,
        head_dim: cfg.head_dim,
    };
    let mut kv = KvCache::on_device(layout, cfg.num_hidden_layers, dtype, device).unwrap();
    let mut batch = ForwardBatch::new(&out, device).unwrap();
    let rows: Vec<u32> = (0..n as u32).collect();
    batch.sample_rows = Tensor::from_slice(&rows, n, device).unwrap();
    batch.num_sample_rows = n;
    m.forward(&batch, &mut kv)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap()
}

/// f32 logits of `seqs` (all of one length) decoded one token per sequence per step, all
/// sequences in every step (each step a batch of `seqs.len()` decode rows), with the model in
/// `dtype` on `device`: `[sequence][position][vocab]`.
#[allow(dead_code)]
pub fn logits_decoding_step_by_step(
    model_path: &str,
    seqs: &[Vec<u32>],
    device: &Device,
    dtype: DType,
) -> Vec<Vec<Vec<f32>>> {
    logits_decoding_step_by_step_quantized(model_path, seqs, device, dtype, None)
}

/// [`logits_decoding_step_by_step`] with the weights quantized at load (`--quantization`).
#[allow(dead_code)]
pub fn logits_decoding_step_by_step_quantized(
    model_path: &str,
    seqs: &[Vec<u32>],
    device: &Device,
    dtype: DType,
    quantization: Option<Quantization>,
) -> Vec<Vec<Vec<f32>>> {
    let n = seqs[0].len();
    assert!(seqs.iter().all(|s| s.len() == n), "one length");
    let (cfg, m) = load_model(
        model_path,
        (GgufMatmul::Auto, quantization),
        device,
        dtype,
        n,
    );
    let cfg = &cfg;
    let bs = 16;
    let per_seq = n.div_ceil(bs);
    // Sequence i's blocks, interleaved with the others' (block 0 is the null block).
    let table = |i: usize| -> Vec<u32> {
        (0..per_seq)
            .map(|b| (1 + b * seqs.len() + i) as u32)
            .collect()
    };
    let layout = KvLayout {
        num_blocks: per_seq * seqs.len() + 1,
        block_size: bs,
        num_kv_heads: cfg.num_key_value_heads,
        head_dim: cfg.head_dim,
    };
    let mut kv = KvCache::on_device(layout, cfg.num_hidden_layers, dtype, device).unwrap();
    let mut logits = vec![Vec::with_capacity(n); seqs.len()];
    for p in 0..n {
        let out = SchedulerOutput {
            seqs: (0..seqs.len())
                .map(|i| ScheduledSeq {
                    seq_id: SeqId(i as u64),
                    num_computed_tokens: p,
                    num_new_tokens: 1,
                    num_draft_tokens: 0,
                    tokens: i..i + 1,
                    block_table: i * per_seq..(i + 1) * per_seq,
                    samples: true,
                    num_prompt_rows: 0,
                })
                .collect(),
            token_ids: seqs.iter().map(|s| s[p]).collect(),
            positions: vec![p as u32; seqs.len()],
            slot_mapping: (0..seqs.len())
                .map(|i| table(i)[p / bs] * bs as u32 + (p % bs) as u32)
                .collect(),
            block_tables: (0..seqs.len()).flat_map(table).collect(),
            preempted: Vec::new(),
            ..SchedulerOutput::default()
        };
        let batch = ForwardBatch::new(&out, device).unwrap();
        let step = m
            .forward(&batch, &mut kv)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        for (i, row) in step.into_iter().enumerate() {
            logits[i].push(row);
        }
    }
    logits
}

/// The most rows a decode step of the model at `model_path`, in `dtype` on `device`, may hold to
/// take the fused decode path (`CausalLm::fused_decode_rows`; 0 for none).
#[allow(dead_code)]
pub fn fused_decode_rows(
    model_path: &str,
    device: &Device,
    dtype: DType,
    quantization: Option<Quantization>,
) -> usize {
    let (cfg, m) = load_model(
        model_path,
        (GgufMatmul::Auto, quantization),
        device,
        dtype,
        16,
    );
    let layout = KvLayout {
        num_blocks: 2,
        block_size: 16,
        num_kv_heads: cfg.num_key_value_heads,
        head_dim: cfg.head_dim,
    };
    let kv = KvCache::on_device(layout, cfg.num_hidden_layers, dtype, device).unwrap();
    m.fused_decode_rows(&kv)
}

/// Path of the SmolLM2-135M-Instruct GGUF: `$PAGEWISE_SMOLLM2_GGUF`, else the cache that
/// `scripts/fetch_smollm2.py` fills. `None` (test skipped) only outside CI.
/// transformers' reference for a GPU test model (scripts/gpu/make_gpu_models.py writes
/// `hf_logits.safetensors`): the token ids `[seqs, tokens]`, the float32 logits and the bfloat16
/// ones, each `[seqs, tokens, vocab]`.
#[allow(dead_code)]
pub struct HfReference {
    pub tokens: Vec<Vec<u32>>,
    pub logits: Vec<Vec<Vec<f32>>>,
    pub logits_bf16: Vec<Vec<Vec<f32>>>,
}

/// Reads `model_dir`'s `hf_logits.safetensors`.
#[allow(dead_code)]
pub fn hf_reference(model_dir: &str) -> HfReference {
    let t =
        candle_core::safetensors::load(format!("{model_dir}/hf_logits.safetensors"), &Device::Cpu)
            .unwrap();
    HfReference {
        tokens: t["tokens"].to_dtype(DType::U32).unwrap().to_vec2().unwrap(),
        logits: t["logits"].to_vec3().unwrap(),
        logits_bf16: t["logits_bf16"].to_vec3().unwrap(),
    }
}

#[allow(dead_code)]
pub fn smollm2_gguf() -> Option<String> {
    let path = std::env::var("PAGEWISE_SMOLLM2_GGUF").ok().or_else(|| {
        let home = std::env::var("HOME").ok()?;
        let p = format!("{home}/.cache/pagewise/models/SmolLM2-135M-Instruct.Q4_1.gguf");
        std::path::Path::new(&p).is_file().then_some(p)
    });
    if path.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must provide SmolLM2 (scripts/fetch_smollm2.py); set PAGEWISE_SMOLLM2_GGUF"
        );
        eprintln!("SmolLM2 GGUF not found: run scripts/fetch_smollm2.py; skipping");
    }
    path
}

/// After a batched run: the scheduler preempted, the shared prefix was served from the prefix
/// cache, and every block is free again. `label` prefixes the printed counts.
#[allow(dead_code)]
pub fn assert_preempted_cached_and_freed(llm: &pagewise::Llm, label: &str) {
    let s = llm.core().scheduler();
    let hits = s.kv().prefix_cache_stats().num_hit_tokens;
    eprintln!(
        "{label}preemptions {}, prefix-cache hit tokens {hits}",
        s.num_preemptions_total()
    );
    assert!(
        s.num_preemptions_total() > 0,
        "the cache must be small enough to preempt"
    );
    assert!(hits > 0, "the shared prefix must be served from cache");
    assert_eq!(s.kv().pool().num_free(), s.kv().pool().num_usable());
}

/// One prefill of all of `tokens` as a single sequence, its blocks in reverse order (1.. from the
/// end, so the block table is non-trivial and slots are not contiguous).
#[allow(dead_code)]
pub fn prefill_step(tokens: &[u32], bs: usize) -> SchedulerOutput {
    let n = tokens.len();
    let num_blocks = n.div_ceil(bs);
    let table: Vec<u32> = (1..=num_blocks as u32).rev().collect();
    SchedulerOutput {
        seqs: vec![ScheduledSeq {
            seq_id: SeqId(0),
            num_computed_tokens: 0,
            num_new_tokens: n,
            num_draft_tokens: 0,
            tokens: 0..n,
            block_table: 0..num_blocks,
            samples: true,
            num_prompt_rows: 0,
        }],
        token_ids: tokens.to_vec(),
        positions: (0..n as u32).collect(),
        slot_mapping: (0..n)
            .map(|p| table[p / bs] * bs as u32 + (p % bs) as u32)
            .collect(),
        block_tables: table,
        preempted: Vec::new(),
        ..SchedulerOutput::default()
    }
}

/// Relative L2 error of `got` against `want` over all rows.
#[allow(dead_code)]
pub fn rel_err(got: &[Vec<f32>], want: &[Vec<f32>]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (g, w) in got.iter().zip(want) {
        for (a, b) in g.iter().zip(w) {
            num += f64::from(a - b).powi(2);
            den += f64::from(*b).powi(2);
        }
    }
    (num / den).sqrt()
}

/// Index of the largest entry (the first of equals).
#[allow(dead_code)]
pub fn argmax(row: &[f32]) -> usize {
    (0..row.len()).fold(0, |best, i| if row[i] > row[best] { i } else { best })
}

/// Rows of `a` and `b` whose largest entries are at the same index.
#[allow(dead_code)]
pub fn same_argmax(a: &[Vec<f32>], b: &[Vec<f32>]) -> usize {
    a.iter()
        .zip(b)
        .filter(|(x, y)| argmax(x) == argmax(y))
        .count()
}

/// Greedy sampling of `max_tokens` tokens, past any end-of-sequence token.
#[allow(dead_code)]
pub fn greedy(max_tokens: usize) -> pagewise::SamplingParams {
    pagewise::SamplingParams {
        temperature: 0.0,
        max_tokens,
        ignore_eos: true,
        ..Default::default()
    }
}
