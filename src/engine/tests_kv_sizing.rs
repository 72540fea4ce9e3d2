//! KV sizing: the CPU's memory budget, the window groups' split and the longest context that fits.

use super::*;

/// A gpt-oss-like model: 4 layers, sliding and full in turn, an 8-position window, 2 KV heads
/// of 16.
fn gpt_oss_like() -> ModelConfig {
    ModelConfig::from_hf_json(
        r#"{"architectures":["GptOssForCausalLM"],"vocab_size":10,"hidden_size":64,
        "intermediate_size":32,"num_hidden_layers":4,"num_attention_heads":4,
        "num_key_value_heads":2,"head_dim":16,"num_local_experts":4,"num_experts_per_tok":2,
        "max_position_embeddings":4096,"sliding_window":8,"rope_theta":150000}"#,
    )
    .unwrap()
}

/// A budget alone decides the layout, window group included: the ranks of a tensor-parallel
/// group, given the least of their budgets, lay their caches out alike.
#[test]
fn a_budget_decides_the_layout_and_its_window_group() {
    let cfg = gpt_oss_like();
    let args = EngineArgs {
        max_num_seqs: 4,
        block_size: 16,
        ..EngineArgs::default()
    };
    let sizing = KvSizing {
        args: &args,
        cfg: &cfg,
        kv_heads: 2,
        max_model_len: 4096,
        max_num_batched_tokens: 256,
        dtype: DType::F32,
    };
    // A block of one layer: 2 (K and V) x 2 heads x 16 x 4 bytes x 16 positions = 4 KiB.
    let plan = sizing.plan_for(4 << 20, "kv_cache_memory").unwrap();
    // 4 windows of (7 / 16 rounded up + 2) blocks, 256 / 16 for a step, the null block.
    let window = plan.window.unwrap();
    assert_eq!((window.window, window.num_blocks), (8, 4 * 3 + 16 + 1));
    // The rest of 1024 layer blocks: (1024 - 2 x 29) / 2 full blocks.
    assert_eq!(plan.num_blocks, (1024 - 2 * 29) / 2);
    assert_eq!(plan.layer_blocks, [29, 483, 29, 483]);
    assert_eq!(sizing.plan_for(4 << 20, "kv_cache_memory").unwrap(), plan);
    // 64 layer blocks hold no 4096-token sequence: refused, naming the length, when the
    // user asked for 4096; else laid out for the 256 tokens they hold.
    let asked = EngineArgs {
        max_model_len: Some(4096),
        ..args.clone()
    };
    let small = KvSizing {
        args: &asked,
        ..sizing
    };
    let e = small.plan_for(256 << 10, "kv_cache_memory").unwrap_err();
    assert!(e.to_string().contains("max seq len (4096)"), "{e}");
    let fitted = sizing.plan_for(256 << 10, "kv_cache_memory").unwrap();
    assert_eq!(fitted.capacity_tokens(16), 256);
    // For 256-token sequences a group would leave the full layers 3 blocks: none, every
    // layer alike.
    let short = KvSizing {
        max_model_len: 256,
        ..sizing
    };
    let plan = short.plan_for(256 << 10, "kv_cache_memory").unwrap();
    assert_eq!(plan.window, None);
    assert_eq!(plan.layer_blocks, [17; 4]);
}

/// When a window group for `max_num_seqs` windows leaves no room for a sequence of the full
/// context, and none would fit without a group either, it is planned for fewer windows.
#[test]
fn the_window_group_plans_fewer_windows_before_the_context_stops_fitting() {
    let cfg = gpt_oss_like();
    let args = EngineArgs {
        max_num_seqs: 64,
        block_size: 16,
        ..EngineArgs::default()
    };
    let sizing = KvSizing {
        args: &args,
        cfg: &cfg,
        kv_heads: 2,
        max_model_len: 4096,
        max_num_batched_tokens: 256,
        dtype: DType::F32,
    };
    // 800 layer blocks of 4 KiB. 64 windows take 2 x (64 x 3 + 16 + 1) and leave each full
    // layer 191 blocks, short of 4096 tokens (257 with the null block); without a group
    // each layer gets 200. 32 windows: 2 x 113, leaving 287.
    let plan = sizing.plan_for(800 * 4096, "kv_cache_memory").unwrap();
    assert_eq!(plan.window.map(|w| w.num_blocks), Some(32 * 3 + 16 + 1));
    assert_eq!(plan.num_blocks, (800 - 2 * 113) / 2);
    assert!(plan.capacity_tokens(16) >= 4096);
}

/// `--kv-cache-dtype fp8` stores a value in one byte: twice the blocks of bf16 in a budget.
#[test]
fn an_fp8_cache_gets_twice_the_blocks_of_bf16() {
    let cfg = ModelConfig::from_hf_json(
        r#"{"architectures":["LlamaForCausalLM"],"vocab_size":10,"hidden_size":64,
        "intermediate_size":32,"num_hidden_layers":4,"num_attention_heads":4,
        "num_key_value_heads":2,"head_dim":16,"max_position_embeddings":4096}"#,
    )
    .unwrap();
    let blocks = |kv_cache_dtype| {
        let args = EngineArgs {
            kv_cache_dtype,
            ..EngineArgs::default()
        };
        let sizing = KvSizing {
            args: &args,
            cfg: &cfg,
            kv_heads: 2,
            max_model_len: 4096,
            max_num_batched_tokens: 256,
            dtype: DType::BF16,
        };
        sizing
            .plan_for(8 << 20, "kv_cache_memory")
            .unwrap()
            .num_blocks
    };
    // bf16: 2 x 2 heads x 16 x 2 bytes x 16 positions = 2 KiB a layer block, 4 layers; and
    // the null block.
    assert_eq!(blocks(KvCacheDtype::Auto), (8 << 20) / (4 * 2048) + 1);
    assert_eq!(blocks(KvCacheDtype::Fp8E4m3), (8 << 20) / (4 * 1024) + 1);
}

#[test]
fn the_profile_step_spreads_tokens_over_sequences_on_distinct_blocks() {
    let out = profile_step(100, 8, 64, 16);
    assert_eq!(out.num_batched_tokens(), 100);
    assert_eq!(out.seqs.len(), 8);
    assert_eq!(out.num_sampling(), 8);
    let mut slots = out.slot_mapping.clone();
    slots.sort_unstable();
    slots.dedup();
    assert_eq!(slots.len(), 100, "every token has its own slot");
    assert!(
        out.slot_mapping.iter().all(|&s| s >= 16),
        "the null block stays unused"
    );
    // Capped by max_len: 2 sequences of at most 10 tokens.
    let out = profile_step(100, 2, 10, 16);
    assert_eq!(out.num_batched_tokens(), 20);
}
