//! Expert parallelism on the CPU (`--enable-expert-parallel`): the ranks of a tensor-parallel
//! group hold a mixture's experts whole, a run of them each, instead of a slice of every expert;
//! attention and dense layers are split as under tensor parallelism, and the same all-reduce
//! sums the ranks' expert outputs. Each rank's logits must match the whole model's (1e-4), at 2
//! ranks and at 4 (one expert a rank for the 4-expert fixtures).

mod common;

use common::sharded::check;
use pagewise::loader::LoadFormat;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

/// Mixtral: 4 experts of 128, top 2.
#[test]
fn mixtral_with_whole_experts_per_rank_matches_the_whole_model() {
    check(
        &format!("{FIXTURES}/mixtral"),
        LoadFormat::Auto,
        &[2, 4],
        true,
    );
}

/// Qwen3-MoE: 8 experts of 32, top 3, a dense layer among the sparse ones (split as under tensor
/// parallelism).
#[test]
fn qwen3_moe_with_whole_experts_per_rank_matches_the_whole_model() {
    check(
        &format!("{FIXTURES}/qwen3-moe"),
        LoadFormat::Auto,
        &[2, 4],
        true,
    );
}

/// gpt-oss: 4 experts of 32, top 2, with biases (each expert's down bias added by the rank that
/// holds it), from its MXFP4 checkpoint and the dequantized one.
#[test]
fn gpt_oss_with_whole_experts_per_rank_matches_the_whole_model() {
    check(
        &format!("{FIXTURES}/gpt-oss"),
        LoadFormat::Auto,
        &[2, 4],
        true,
    );
    check(
        &format!("{FIXTURES}/gpt-oss/dequantized"),
        LoadFormat::Auto,
        &[2],
        true,
    );
}

/// Dummy weights are the same model split either way.
#[test]
fn dummy_weights_split_by_experts_are_the_same_model() {
    check(
        &format!("{FIXTURES}/qwen3-moe"),
        LoadFormat::Dummy,
        &[2],
        true,
    );
}
