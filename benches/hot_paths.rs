//! CPU hot paths besides the scheduler step: page table operations, sampling one row of a
//! 49,152-token vocabulary, and one incremental detokenization step.
//!
//! `cargo bench --bench hot_paths`; results in benches/RESULTS.md.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use pagewise::SamplingParams;
use pagewise::engine::detokenizer::IncrementalDetokenizer;
use pagewise::kv::{BlockTable, CachedPrefix, KvCacheManager};
use pagewise::sampler::{SampleRequest, Sampler, SeededRng};
use pagewise::testing::byte_level_tokenizer;

fn page_table(c: &mut Criterion) {
    let mut kv = KvCacheManager::new(4097, 16, true);
    let tokens: Vec<u32> = (0..2048).collect();
    let none = CachedPrefix::default();
    c.bench_function("page table: allocate 2048 tokens, commit, free", |b| {
        b.iter(|| {
            let mut t = BlockTable::new(None);
            kv.allocate_slots(&mut t, &none, 2048).unwrap();
            kv.commit_full_blocks(&mut t, &tokens, 2048);
            kv.free(&mut t);
        })
    });
    c.bench_function("page table: prefix lookup of 2048 cached tokens", |b| {
        b.iter(|| {
            let mut t = BlockTable::new(None);
            black_box(kv.cached_prefix(&mut t, &tokens));
        })
    });
}

fn sampler(c: &mut Criterion) {
    let vocab = 49_152;
    let mut noise = SeededRng::new(1, 0);
    let row: Vec<f32> = (0..vocab)
        .map(|_| (noise.next_f64() * 20.0 - 10.0) as f32)
        .collect();
    let output: Vec<u32> = (0..256).collect();
    let cases = [
        (
            "greedy",
            SamplingParams {
                temperature: 0.0,
                ..Default::default()
            },
        ),
        ("temperature", SamplingParams::default()),
        (
            "top-p 0.95 + top-k 50",
            SamplingParams {
                top_p: 0.95,
                top_k: 50,
                ..Default::default()
            },
        ),
        (
            "top-p 0.9",
            SamplingParams {
                top_p: 0.9,
                ..Default::default()
            },
        ),
        (
            "penalties",
            SamplingParams {
                presence_penalty: 0.5,
                frequency_penalty: 0.5,
                repetition_penalty: 1.1,
                ..Default::default()
            },
        ),
    ];
    let mut s = Sampler::default();
    let mut rng = SeededRng::new(2, 0);
    let mut work = row.clone();
    for (name, params) in cases {
        c.bench_function(&format!("sample one 49k row: {name}"), |b| {
            b.iter(|| {
                work.copy_from_slice(&row);
                let req = SampleRequest {
                    params: &params,
                    prompt_tokens: &[],
                    output_tokens: &output,
                    suppressed: &[],
                    rng: &mut rng,
                    guide: None,
                };
                black_box(s.sample(&mut work, req))
            })
        });
    }
}

fn detokenizer(c: &mut Criterion) {
    let tok = byte_level_tokenizer(&[("h", "e"), ("l", "l"), ("he", "ll")]);
    let ids = tok
        .encode("hello wörld, héllo 世界 ".repeat(64).as_str(), false)
        .unwrap()
        .get_ids()
        .to_vec();
    c.bench_function("detokenize one token (incremental)", |b| {
        let mut d = IncrementalDetokenizer::new(&[], true);
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % ids.len();
            black_box(d.step(&tok, ids[i]).unwrap())
        })
    });
}

criterion_group!(benches, page_table, sampler, detokenizer);
criterion_main!(benches);
