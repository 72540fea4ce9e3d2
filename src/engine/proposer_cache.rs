//! The paged KV cache of a speculative proposer, a draft model or an EAGLE-3 head: its share of
//! the KV budget and its allocation, alike for both. Its blocks come from a block manager of its
//! own (the proposer's runner), in the same block size as the target's.

use candle_core::{DType, Device};

use super::args::EngineError;
use crate::model::{KvCache, KvLayout, ModelConfig};

/// Bytes a token of `cfg`'s cache takes in `dtype`.
fn bytes_per_token(cfg: &ModelConfig, dtype: DType) -> u64 {
    cfg.kv_bytes_per_token(cfg.num_key_value_heads, dtype.size_in_bytes()) as u64
}

/// The proposer's share of `budget` bytes, for a target whose cache takes `target_per_token` bytes
/// a token: what holds as many tokens as the target's share. (Both caches hold each verified
/// sequence's guesses; the target's prefix cache shares blocks between sequences, the proposer's
/// does not, so under pressure a sequence may go without guesses for a step.)
pub fn budget_share(
    budget: u64,
    target_per_token: u64,
    proposer: &ModelConfig,
    dtype: DType,
) -> u64 {
    let own = bytes_per_token(proposer, dtype);
    (budget as u128 * own as u128 / (target_per_token + own) as u128) as u64
}

/// The proposer's cache of `bytes` on `device`, for `cfg`'s layers in blocks of `block_size`, with
/// its number of blocks (block 0 included, as the target's). `what` names the proposer in the
/// error and the log line.
pub fn allocate(
    what: &str,
    cfg: &ModelConfig,
    bytes: u64,
    block_size: usize,
    dtype: DType,
    device: &Device,
) -> Result<(KvCache, usize), EngineError> {
    let per_block = bytes_per_token(cfg, dtype) * block_size as u64;
    let num_blocks = (bytes / per_block) as usize + 1;
    if num_blocks < 2 {
        return Err(EngineError::Config(format!(
            "{what}'s share of the KV cache ({bytes} bytes) holds no block of {per_block} bytes: \
             give the cache more memory"
        )));
    }
    let layout = KvLayout {
        num_blocks,
        block_size,
        num_kv_heads: cfg.num_key_value_heads,
        head_dim: cfg.head_dim,
    };
    let kv = KvCache::on_device(layout, cfg.num_hidden_layers, dtype, device)?;
    tracing::info!(
        num_blocks = num_blocks - 1,
        block_size,
        bytes = (num_blocks - 1) as u64 * per_block,
        "{what}'s KV cache allocated"
    );
    Ok((kv, num_blocks))
}
