//! The page table manager: gives each sequence a block table over a shared [`BlockPool`], serves
//! prefix-cache hits, and maps token positions to physical KV slots.
//!
//! Every allocation is check-then-act: [`KvCacheManager::can_allocate`] answers exactly whether
//! [`KvCacheManager::allocate_slots`] would succeed, and a failing `allocate_slots` changes nothing.

pub mod block_hash;
pub mod block_pool;
mod window;

pub use block_hash::{BlockHash, Parent, ParentKey};
pub use block_pool::{BlockId, BlockPool, BlockState};
pub use window::WindowConfig;

use std::sync::Arc;

use block_hash::{hash_block, root_key};

/// Block sizes (token slots per block) the engine accepts.
pub const BLOCK_SIZES: [usize; 3] = [8, 16, 32];

/// One sequence's view of the KV cache: its blocks in order, and the hashes of its full blocks.
#[derive(Clone, Debug, Default)]
pub struct BlockTable {
    blocks: Vec<BlockId>,
    /// Hash of each full block of the sequence's tokens so far (computed once, as blocks fill).
    hashes: Vec<BlockHash>,
    /// Parent key of the first block (derived from the request's cache salt).
    root: ParentKey,
    /// The request's cache salt (compared exactly on a first block's hit).
    salt: Option<Arc<str>>,
    /// Leading blocks already registered in the prefix cache (or taken from it).
    num_committed: usize,
    /// The prefix-cache serial of each committed block: the exact identity of the prefix up to
    /// and including it (`num_committed` of them).
    serials: Vec<u64>,
    /// With a window group: the sliding-window layers' blocks, one entry per block of `blocks`
    /// (same logical index); entries that fell out of the window are the null block.
    window: Vec<BlockId>,
    /// Leading entries of `window` already released.
    window_released: usize,
}

impl BlockTable {
    /// An empty table; `salt` isolates this sequence's prefix-cache entries from other salts.
    pub fn new(salt: Option<&str>) -> Self {
        BlockTable {
            root: root_key(salt),
            salt: salt.map(Arc::from),
            ..Default::default()
        }
    }

    /// The exact prefix before committed block `index`.
    fn exact_parent(&self, index: usize) -> Parent {
        match index {
            0 => Parent::Root(self.salt.clone()),
            i => Parent::Block(self.serials[i - 1]),
        }
    }

    /// The sequence's blocks, in token order.
    pub fn blocks(&self) -> &[BlockId] {
        &self.blocks
    }

    /// The sliding-window layers' blocks, one per entry of [`Self::blocks`], the null block where
    /// a block fell out of the window (empty without a window group).
    pub fn window_blocks(&self) -> &[BlockId] {
        &self.window
    }

    /// Number of blocks held.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether the table holds no block.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    fn parent_of(&self, index: usize) -> ParentKey {
        if index == 0 {
            self.root
        } else {
            self.hashes[index - 1].0
        }
    }

    /// Extends `hashes` over every full block of `tokens` not hashed yet.
    fn hash_full_blocks(&mut self, tokens: &[u32], block_size: usize) {
        while (self.hashes.len() + 1) * block_size <= tokens.len() {
            let i = self.hashes.len();
            let hash = hash_block(
                self.parent_of(i),
                &tokens[i * block_size..(i + 1) * block_size],
            );
            self.hashes.push(hash);
        }
    }
}

/// Blocks found in the prefix cache for a sequence that holds no blocks yet.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CachedPrefix {
    /// The cached blocks, in token order.
    pub blocks: Vec<BlockId>,
    /// Tokens covered (`blocks.len() * block_size`).
    pub num_tokens: usize,
    /// Each block's prefix-cache serial (see [`BlockTable`]).
    serials: Vec<u64>,
    /// With a window group: its cached blocks for entries `window_start..blocks.len()`, the
    /// ones the first computed token's window reaches.
    window_blocks: Vec<BlockId>,
    /// The first entry the window group needs.
    window_start: usize,
}

/// Prefix-cache counters, in tokens (what vLLM's `prefix_cache_queries/hits` count).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Tokens looked up in the prefix cache.
    pub num_queried_tokens: u64,
    /// Tokens served from it.
    pub num_hit_tokens: u64,
}

/// Why `allocate_slots` refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("not enough free KV-cache blocks: {needed} needed, {free} free")]
pub struct NoFreeBlocks {
    /// Whether the sliding-window layers' group ran out (else the full layers').
    pub window: bool,
    /// Blocks the allocation needed off the free list.
    pub needed: usize,
    /// Blocks that were free.
    pub free: usize,
}

/// Free blocks of `pool` that growing a table to `wanted` entries takes when it `has` some
/// (adopted ones included): the new ones, plus the adopted `cached` blocks now on the free list.
fn free_blocks_taken(pool: &BlockPool, wanted: usize, has: usize, cached: &[BlockId]) -> usize {
    wanted.saturating_sub(has) + cached.iter().filter(|&&b| pool.is_free(b)).count()
}

/// The page table manager.
#[derive(Clone, Debug)]
pub struct KvCacheManager {
    pool: BlockPool,
    /// The sliding-window layers' own blocks, when the model has such layers and their window
    /// is shorter than the context.
    window: Option<window::WindowGroup>,
    enable_prefix_caching: bool,
    stats: PrefixCacheStats,
}

impl KvCacheManager {
    /// A manager over `num_blocks` blocks (block 0 reserved) of `block_size` slots.
    pub fn new(num_blocks: usize, block_size: usize, enable_prefix_caching: bool) -> Self {
        Self::with_window(num_blocks, block_size, enable_prefix_caching, None)
    }

    /// A manager whose sliding-window layers, when `window` is given, take their blocks from a
    /// pool of their own (`window.num_blocks`) and give back those that fall out of the window.
    pub fn with_window(
        num_blocks: usize,
        block_size: usize,
        enable_prefix_caching: bool,
        window: Option<WindowConfig>,
    ) -> Self {
        KvCacheManager {
            pool: BlockPool::new(num_blocks, block_size, enable_prefix_caching),
            window: window.map(|w| window::WindowGroup::new(w, block_size, enable_prefix_caching)),
            enable_prefix_caching,
            stats: PrefixCacheStats::default(),
        }
    }

    /// Token slots per block.
    pub fn block_size(&self) -> usize {
        self.pool.block_size()
    }

    /// The underlying pool (read-only: counts, usage, ref counts).
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Prefix-cache counters since start.
    pub fn prefix_cache_stats(&self) -> PrefixCacheStats {
        self.stats
    }

    /// Tokens the whole cache can hold (usable blocks × block size).
    pub fn capacity_tokens(&self) -> usize {
        self.pool.num_usable() * self.block_size()
    }

    /// Blocks needed to hold `num_tokens` tokens.
    pub fn blocks_for(&self, num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.block_size())
    }

    /// The longest cached prefix of `tokens` for a sequence that holds no blocks yet, in whole blocks.
    /// The last token is never served from cache: the model must compute it to produce logits.
    pub fn cached_prefix(&mut self, table: &mut BlockTable, tokens: &[u32]) -> CachedPrefix {
        debug_assert!(table.is_empty());
        let mut found = CachedPrefix::default();
        if !self.enable_prefix_caching || tokens.is_empty() {
            return found;
        }
        let bs = self.block_size();
        table.hash_full_blocks(tokens, bs);
        let max_blocks = (tokens.len() - 1) / bs;
        let mut parent = Parent::Root(table.salt.clone());
        for i in 0..max_blocks {
            let chunk = &tokens[i * bs..(i + 1) * bs];
            match self.pool.lookup(table.hashes[i], &parent, chunk) {
                Some((id, serial)) => {
                    found.blocks.push(id);
                    found.serials.push(serial);
                    parent = Parent::Block(serial);
                }
                None => break,
            }
        }
        self.window_prefix(table, tokens, &mut found);
        found.num_tokens = found.blocks.len() * bs;
        found
    }

    /// Counts one admitted lookup of `num_tokens` tokens of which `num_hit` came from the cache.
    pub fn record_prefix_lookup(&mut self, num_tokens: usize, num_hit: usize) {
        if self.enable_prefix_caching {
            self.stats.num_queried_tokens += num_tokens as u64;
            self.stats.num_hit_tokens += num_hit as u64;
        }
    }

    /// Free blocks an allocation would take: new blocks plus cached blocks now on the free list.
    fn blocks_needed(&self, table: &BlockTable, cached: &CachedPrefix, num_tokens: usize) -> usize {
        let have = table.len() + cached.blocks.len();
        free_blocks_taken(
            &self.pool,
            self.blocks_for(num_tokens),
            have,
            &cached.blocks,
        )
    }

    /// Why `allocate_slots(table, cached, num_tokens)` would fail, if it would.
    fn shortfall(
        &self,
        table: &BlockTable,
        cached: &CachedPrefix,
        num_tokens: usize,
    ) -> Option<NoFreeBlocks> {
        let needed = self.blocks_needed(table, cached, num_tokens);
        if needed > self.pool.num_free() {
            return Some(NoFreeBlocks {
                window: false,
                needed,
                free: self.pool.num_free(),
            });
        }
        let group = self.window.as_ref()?;
        let needed = self.window_blocks_needed(group, table, cached, num_tokens);
        (needed > group.pool.num_free()).then(|| NoFreeBlocks {
            window: true,
            needed,
            free: group.pool.num_free(),
        })
    }

    /// Whether `allocate_slots(table, cached, num_tokens)` would succeed.
    pub fn can_allocate(
        &self,
        table: &BlockTable,
        cached: &CachedPrefix,
        num_tokens: usize,
    ) -> bool {
        self.shortfall(table, cached, num_tokens).is_none()
    }

    /// Grows `table` so it covers `num_tokens` token slots in all, first adopting `cached` (a prefix
    /// found by [`Self::cached_prefix`] for this empty table). All or nothing.
    pub fn allocate_slots(
        &mut self,
        table: &mut BlockTable,
        cached: &CachedPrefix,
        num_tokens: usize,
    ) -> Result<(), NoFreeBlocks> {
        if let Some(e) = self.shortfall(table, cached, num_tokens) {
            return Err(e);
        }
        debug_assert!(cached.blocks.is_empty() || table.is_empty());
        // Take the cached blocks first so allocating new ones cannot evict them.
        for &b in &cached.blocks {
            self.pool.touch(b);
            table.blocks.push(b);
        }
        if !cached.blocks.is_empty() {
            table.num_committed = cached.blocks.len();
            table.serials.clone_from(&cached.serials);
        }
        while table.blocks.len() < self.blocks_for(num_tokens) {
            let b = self.pool.allocate().expect("checked free count");
            table.blocks.push(b);
        }
        self.allocate_window(table, cached);
        Ok(())
    }

    /// Registers in the prefix cache every full block whose KV is now written (the first
    /// `num_computed_tokens` of `tokens`).
    pub fn commit_full_blocks(
        &mut self,
        table: &mut BlockTable,
        tokens: &[u32],
        num_computed_tokens: usize,
    ) {
        if !self.enable_prefix_caching {
            return;
        }
        let bs = self.block_size();
        let num_full = (num_computed_tokens / bs).min(table.blocks.len());
        if num_full <= table.num_committed {
            return;
        }
        table.hash_full_blocks(&tokens[..num_full * bs], bs);
        debug_assert_eq!(table.serials.len(), table.num_committed);
        for i in table.num_committed..num_full {
            let chunk = &tokens[i * bs..(i + 1) * bs];
            let parent = table.exact_parent(i);
            let serial = self
                .pool
                .register(table.blocks[i], table.hashes[i], &parent, chunk);
            table.serials.push(serial);
            self.commit_window_block(table, i, &parent, chunk);
        }
        table.num_committed = num_full;
    }

    /// Releases every block of `table`, tail first so a sequence's last blocks are evicted first.
    /// The table keeps its hashes (still valid for the same tokens) and can be reused.
    pub fn free(&mut self, table: &mut BlockTable) {
        self.free_window(table);
        for &b in table.blocks.iter().rev() {
            self.pool.release(b);
        }
        table.blocks.clear();
        table.num_committed = 0;
        table.serials.clear();
    }

    /// Gives back the blocks of `table` past the first `num_tokens` token slots, tail first (the
    /// ones only rejected draft tokens reached). Returns how many were freed. Blocks past
    /// `num_tokens` were never committed to the prefix cache.
    pub fn truncate(&mut self, table: &mut BlockTable, num_tokens: usize) -> usize {
        let keep = self.blocks_for(num_tokens);
        let mut freed = 0;
        while table.blocks.len() > keep {
            debug_assert!(table.blocks.len() > table.num_committed);
            let b = table.blocks.pop().expect("longer than keep");
            self.pool.release(b);
            freed += 1;
        }
        self.truncate_window(table, keep);
        freed
    }

    /// Physical slot of token position `pos`: block `slot / block_size`, row `slot % block_size`.
    pub fn slot(&self, table: &BlockTable, pos: usize) -> u32 {
        let bs = self.block_size();
        table.blocks[pos / bs].0 * bs as u32 + (pos % bs) as u32
    }
}

#[cfg(test)]
mod tests;
