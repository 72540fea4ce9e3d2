//! Tensor parallelism on the CPU: the sharded model's arithmetic and its shard-aware loading.
//! Each rank of a [`LocalGroup`] (threads in this process, the CPU stand-in for NCCL) loads only
//! its part of every split tensor and runs the same forward pass; their logits must match the
//! whole model's. The fixtures cover KV heads split across ranks, KV heads replicated (fewer of
//! them than ranks), biases, tied and untied LM heads, and a vocabulary that does not split.

mod common;

use candle_core::Tensor;
use common::sharded::{check, options};
use pagewise::loader::{self, LoadFormat};
use pagewise::model;
use pagewise::model::weights::Part;
use pagewise::parallel::{LocalGroup, Parallel, TpRank};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

#[test]
fn sharded_llama_matches_the_whole_model() {
    // 4 query heads, 2 KV heads (split at 2 ranks, replicated at 4), tied embeddings.
    check(
        &format!("{FIXTURES}/llama-gqa-tied"),
        LoadFormat::Auto,
        &[2, 4],
        false,
    );
}

#[test]
fn sharded_qwen2_with_biases_and_one_kv_head_matches_the_whole_model() {
    check(
        &format!("{FIXTURES}/qwen2-bias"),
        LoadFormat::Auto,
        &[2, 4],
        false,
    );
}

#[test]
fn sharded_qwen3_with_per_head_qk_norm_matches_the_whole_model() {
    // 4 query heads of width 32, 2 KV heads (split at 2 ranks, replicated at 4); the per-head
    // norms' scales are replicated.
    check(
        &format!("{FIXTURES}/qwen3-qknorm"),
        LoadFormat::Auto,
        &[2, 4],
        false,
    );
}

/// Mixtures of experts: every expert split by its intermediate features (gate and up rows, down
/// columns) as a dense MLP is, the router whole on every rank. Mixtral (4 experts of 128, top
/// 2) and Qwen3-MoE (8 experts of 32, top 3, a dense layer among the sparse ones).
#[test]
fn sharded_mixtures_of_experts_match_the_whole_model() {
    check(
        &format!("{FIXTURES}/mixtral"),
        LoadFormat::Auto,
        &[2, 4],
        false,
    );
    check(
        &format!("{FIXTURES}/qwen3-moe"),
        LoadFormat::Auto,
        &[2, 4],
        false,
    );
}

/// Gemma 3 (4 query heads, 2 KV heads; GeGLU; norms after o and after the MLP, which take the
/// ranks' summed outputs; q/k norms; sliding and global layers with their own rotary bases; tied
/// embeddings, a vocabulary-parallel head), from safetensors.
#[test]
fn sharded_gemma3_matches_the_whole_model() {
    check(
        &format!("{FIXTURES}/gemma3"),
        LoadFormat::Auto,
        &[2, 4],
        false,
    );
}

/// gpt-oss (4 experts of 32, top 2; biases on attention and experts, whose down bias only the
/// leading rank adds; a sink per query head, split with the heads; sliding and full layers), from
/// its MXFP4 checkpoint and from the dequantized one. Its GGUF is refused by name.
#[test]
fn sharded_gpt_oss_matches_the_whole_model() {
    check(
        &format!("{FIXTURES}/gpt-oss"),
        LoadFormat::Auto,
        &[2, 4],
        false,
    );
    check(
        &format!("{FIXTURES}/gpt-oss/dequantized"),
        LoadFormat::Auto,
        &[2],
        false,
    );
    let e = sharding_error(&format!("{FIXTURES}/gpt-oss/model-MXFP4.gguf"), 2);
    assert!(e.contains("GGUF files are not sharded"), "{e}");
}

/// Why rank 0 of `size` ranks cannot build the model at `path` (panics if it can).
fn sharding_error(path: &str, size: usize) -> String {
    let loaded = loader::load(path, &options(LoadFormat::Auto)).unwrap();
    let group = LocalGroup::new(size);
    let par = Parallel::new(TpRank { rank: 0, size }, group.member(0));
    model::build_sharded(&loaded.config, &loaded.weights, 16, &par)
        .err()
        .unwrap()
        .to_string()
}

#[test]
fn sharded_dummy_weights_are_the_same_model_at_every_size() {
    check(
        &format!("{FIXTURES}/llama-gqa-tied"),
        LoadFormat::Dummy,
        &[2],
        false,
    );
}

/// A Llama config of `heads` query and `kv_heads` KV heads (head dim 8) in a fresh folder, for
/// dummy weights (the tokenizer is the llama-gqa-tied fixture's).
fn dummy_llama(name: &str, heads: usize, kv_heads: usize, vocab: usize) -> String {
    let dir = std::env::temp_dir().join(format!("pagewise-tp-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "head_dim": 8, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "intermediate_size": 192, "num_hidden_layers": 2, "vocab_size": vocab,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "tie_word_embeddings": false
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    std::fs::copy(
        format!("{FIXTURES}/llama-gqa-tied/tokenizer.json"),
        dir.join("tokenizer.json"),
    )
    .unwrap();
    dir.to_string_lossy().into_owned()
}

#[test]
fn four_and_eight_ranks_match_the_whole_model() {
    // 16 query heads, 8 KV heads: KV heads split at 2, 4 and 8 ranks; the 320-token vocabulary
    // splits 8 ways (vocabulary-parallel LM head at every size).
    let kv8 = dummy_llama("kv8", 16, 8, 320);
    check(&kv8, LoadFormat::Dummy, &[2, 4, 8], false);
    // 8 query heads, 2 KV heads: split at 2 ranks, each replicated on 2 ranks at 4 and on 4 at 8;
    // 300 tokens split 2 and 4 ways but not 8 (every rank then keeps the whole head).
    let kv2 = dummy_llama("kv2", 8, 2, 300);
    check(&kv2, LoadFormat::Dummy, &[2, 4, 8], false);
    for dir in [kv8, kv2] {
        std::fs::remove_dir_all(dir).unwrap();
    }
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
    let e = sharding_error(&format!("{FIXTURES}/qwen2-bias"), 8);
    assert!(
        e.contains("must divide the number of attention heads (4)"),
        "{e}"
    );
}

mod rendezvous {
    use std::time::{Duration, Instant};

    use pagewise::parallel::ParallelConfig;
    use pagewise::parallel::rendezvous::{self, Settings};
    use pagewise::parallel::wire::{Kind, decode_step, encode_step};
    use pagewise::scheduler::SchedulerOutput;

    fn config(
        size: usize,
        port: Option<u16>,
        local_rank: usize,
        timeout_ms: u64,
    ) -> ParallelConfig {
        ParallelConfig {
            tensor_parallel_size: size,
            master_port: port,
            local_rank,
            join_timeout: Duration::from_millis(timeout_ms),
            ..Default::default()
        }
    }

    fn settings(model: &str) -> Settings {
        [("model", model), ("dtype", "bf16")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn ranks_meet_get_the_id_and_receive_step_plans() {
        let lead_cfg = config(4, None, 0, 10_000);
        let listener = rendezvous::listen(&lead_cfg).unwrap();
        let port = listener.local_addr().unwrap().port();
        // Workers start in any order, some before rank 0 listens for them.
        let workers: Vec<_> = [3, 1, 2]
            .into_iter()
            .map(|r| {
                std::thread::spawn(move || {
                    let cfg = config(4, Some(port), r, 10_000);
                    let (mut link, id) = rendezvous::join(&cfg, &settings("m")).unwrap();
                    let (kind, bytes) = link.recv().unwrap();
                    assert_eq!(kind, Kind::Step);
                    let mut out = SchedulerOutput::default();
                    decode_step(&bytes, &mut out).unwrap();
                    (r, id, out.token_ids)
                })
            })
            .collect();
        let mut links = rendezvous::lead(
            &lead_cfg,
            &listener,
            &settings("m"),
            b"nccl-id",
            &mut || Ok(()),
        )
        .unwrap();
        assert_eq!(links.len(), 3);
        let mut buf = Vec::new();
        for (i, link) in links.iter_mut().enumerate() {
            // A distinct plan per link shows that link i is rank i + 1.
            let plan = SchedulerOutput {
                token_ids: vec![i as u32 + 1],
                positions: vec![0],
                slot_mapping: vec![0],
                ..Default::default()
            };
            encode_step(&plan, &mut buf);
            link.send(Kind::Step, &buf).unwrap();
        }
        for w in workers {
            let (rank, id, tokens) = w.join().unwrap();
            assert_eq!(id, b"nccl-id");
            assert_eq!(tokens, vec![rank as u32]);
        }
    }

    #[test]
    fn a_rank_that_never_comes_is_an_error_naming_it_within_the_timeout() {
        let lead_cfg = config(4, None, 0, 1_000);
        let listener = rendezvous::listen(&lead_cfg).unwrap();
        let port = listener.local_addr().unwrap().port();
        let joined: Vec<_> = [1, 3]
            .into_iter()
            .map(|r| {
                std::thread::spawn(move || {
                    rendezvous::join(&config(4, Some(port), r, 3_000), &settings("m"))
                })
            })
            .collect();
        let start = Instant::now();
        let e = rendezvous::lead(&lead_cfg, &listener, &settings("m"), b"id", &mut || Ok(()))
            .err()
            .unwrap();
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "{:?}",
            start.elapsed()
        );
        assert!(
            e.to_string().contains("rank(s) [2] of 4 did not join"),
            "{e}"
        );
        // The ranks that came get no welcome: their own timeout ends their wait.
        drop(listener);
        for j in joined {
            assert!(j.join().unwrap().is_err());
        }
    }

    #[test]
    fn a_worker_with_no_rank_0_gives_up_at_its_deadline() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let start = Instant::now();
        let e = rendezvous::join(&config(2, Some(port), 1, 500), &settings("m"))
            .err()
            .unwrap();
        assert!(start.elapsed() < Duration::from_secs(3));
        assert!(
            e.to_string()
                .contains("rank 1 could not reach rank 0 at 127.0.0.1:"),
            "{e}"
        );
    }

    #[test]
    fn mismatched_settings_are_caught_and_named_on_both_sides() {
        let lead_cfg = config(2, None, 0, 5_000);
        let listener = rendezvous::listen(&lead_cfg).unwrap();
        let port = listener.local_addr().unwrap().port();
        let worker = std::thread::spawn(move || {
            rendezvous::join(&config(2, Some(port), 1, 5_000), &settings("other"))
        });
        let e = rendezvous::lead(&lead_cfg, &listener, &settings("m"), b"id", &mut || Ok(()))
            .err()
            .unwrap();
        let want = "rank 1 was started with model = \"other\", rank 0 with \"m\"";
        assert!(e.to_string().contains(want), "{e}");
        let e = worker.join().unwrap().err().unwrap();
        assert!(e.to_string().contains("rank 0 refused rank 1"), "{e}");
        assert!(e.to_string().contains(want), "{e}");
    }

    #[test]
    fn a_different_group_size_is_refused() {
        let lead_cfg = config(2, None, 0, 5_000);
        let listener = rendezvous::listen(&lead_cfg).unwrap();
        let port = listener.local_addr().unwrap().port();
        let worker = std::thread::spawn(move || {
            // Node 1 of 2 nodes with 2 GPUs each: rank 2 of 4.
            let cfg = ParallelConfig {
                nnodes: 2,
                node_rank: 1,
                ..config(4, Some(port), 0, 5_000)
            };
            rendezvous::join(&cfg, &settings("m"))
        });
        let e = rendezvous::lead(&lead_cfg, &listener, &settings("m"), b"id", &mut || Ok(()))
            .err()
            .unwrap();
        assert!(
            e.to_string()
                .contains("rank 2 was started with --tensor-parallel-size 4, rank 0 with 2"),
            "{e}"
        );
        assert!(worker.join().unwrap().is_err());
    }

    #[test]
    fn a_local_rank_that_exits_before_joining_fails_the_rendezvous_at_once() {
        // A real process that dies at startup, as a rank with a bad GPU or library would.
        let mut children = vec![
            std::process::Command::new("sh")
                .args(["-c", "exit 3"])
                .spawn()
                .unwrap(),
        ];
        let lead_cfg = config(2, None, 0, 60_000);
        let listener = rendezvous::listen(&lead_cfg).unwrap();
        let start = Instant::now();
        let mut still_coming = || pagewise::parallel::group::local_ranks_alive(&mut children);
        let e = rendezvous::lead(
            &lead_cfg,
            &listener,
            &settings("m"),
            b"id",
            &mut still_coming,
        )
        .err()
        .unwrap();
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            start.elapsed()
        );
        assert!(e.to_string().contains("local rank 1"), "{e}");
        assert!(e.to_string().contains("exit status: 3"), "{e}");
    }
}
