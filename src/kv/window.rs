//! The sliding-window layers' blocks (vLLM's sliding-window KV group). A layer that attends over
//! only the last `window` positions never reads a block again once every position in it is out
//! of the window of the next token, so those layers keep their K/V in a pool of their own, and a
//! sequence gives such a block back as soon as it falls out of the window. A long conversation on
//! Gemma 3 then holds its whole context only in the global layers, and about a window's worth of
//! blocks in the local ones.
//!
//! A [`BlockTable`]'s `window` list has one entry per entry of its `blocks` (the same logical
//! block: the same block tables' shape and slot arithmetic for both groups), with the null block
//! where a block fell out. The window kernels read only the last `window` positions of a row, so
//! they never read those entries.
//!
//! Prefix caching: a window block is registered under the same hash, exact parent and tokens as
//! the full block at its index, so a hit on the full blocks' prefix is also exact for the window
//! blocks. A prefix is served only as far as the window blocks its first computed token needs
//! are still cached (released blocks stay cached until reused, as full ones do).

use super::block_hash::Parent;
use super::{BlockId, BlockPool, BlockTable, CachedPrefix, KvCacheManager, free_blocks_taken};

/// The window group's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowConfig {
    /// Positions a sliding-window layer attends over: the query at `p` reads `p + 1 - window ..= p`.
    pub window: usize,
    /// Blocks in the group's pool, including its null block.
    pub num_blocks: usize,
}

/// The pool of the sliding-window layers.
#[derive(Clone, Debug)]
pub(super) struct WindowGroup {
    pub(super) pool: BlockPool,
    window: usize,
}

impl WindowGroup {
    pub(super) fn new(config: WindowConfig, block_size: usize, caching: bool) -> Self {
        WindowGroup {
            pool: BlockPool::new(config.num_blocks, block_size, caching),
            window: config.window,
        }
    }

    /// The first block a query at position `pos` or later can still read.
    fn first_live(&self, pos: usize) -> usize {
        (pos + 1).saturating_sub(self.window) / self.pool.block_size()
    }
}

impl KvCacheManager {
    /// The window group's pool, when the model has one (read-only: counts, usage).
    pub fn window_pool(&self) -> Option<&BlockPool> {
        self.window.as_ref().map(|g| &g.pool)
    }

    /// The window group's settings, when the model has one.
    pub fn window(&self) -> Option<WindowConfig> {
        self.window.as_ref().map(|g| WindowConfig {
            window: g.window,
            num_blocks: g.pool.num_blocks(),
        })
    }

    /// Physical slot of position `pos` in the window group (a position still in the window).
    pub fn window_slot(&self, table: &BlockTable, pos: usize) -> u32 {
        let bs = self.block_size();
        table.window[pos / bs].0 * bs as u32 + (pos % bs) as u32
    }

    /// Shortens the cached prefix `found` of `tokens` until the window blocks its first computed
    /// token needs are cached too, and records them.
    pub(super) fn window_prefix(
        &self,
        table: &BlockTable,
        tokens: &[u32],
        found: &mut CachedPrefix,
    ) {
        let Some(group) = &self.window else { return };
        let bs = self.block_size();
        let mut k = found.blocks.len();
        while k > 0 {
            let start = group.first_live(k * bs);
            found.window_blocks.clear();
            let missing = (start..k).find(|&i| {
                let parent = match i {
                    0 => Parent::Root(table.salt.clone()),
                    i => Parent::Block(found.serials[i - 1]),
                };
                let chunk = &tokens[i * bs..(i + 1) * bs];
                match group.pool.lookup(table.hashes[i], &parent, chunk) {
                    Some((id, _)) => {
                        found.window_blocks.push(id);
                        false
                    }
                    None => true,
                }
            });
            match missing {
                // No prefix reaching past block i can be served.
                Some(i) => k = i,
                None => {
                    found.window_start = start;
                    break;
                }
            }
        }
        if k == 0 {
            found.window_blocks.clear();
            found.window_start = 0;
        }
        found.blocks.truncate(k);
        found.serials.truncate(k);
    }

    /// Free window blocks an allocation would take: new entries plus cached blocks now free.
    pub(super) fn window_blocks_needed(
        &self,
        group: &WindowGroup,
        table: &BlockTable,
        cached: &CachedPrefix,
        num_tokens: usize,
    ) -> usize {
        let has = table.window.len().max(cached.blocks.len());
        free_blocks_taken(
            &group.pool,
            self.blocks_for(num_tokens),
            has,
            &cached.window_blocks,
        )
    }

    /// Grows the window entries of `table` to match its blocks (after adopting `cached`'s).
    /// Called once the free counts are checked.
    pub(super) fn allocate_window(&mut self, table: &mut BlockTable, cached: &CachedPrefix) {
        let Some(group) = &mut self.window else {
            return;
        };
        if !cached.blocks.is_empty() {
            table.window.resize(cached.window_start, BlockId(0));
            table.window_released = cached.window_start;
            for &b in &cached.window_blocks {
                group.pool.touch(b);
                table.window.push(b);
            }
        }
        while table.window.len() < table.blocks.len() {
            let b = group.pool.allocate().expect("checked free count");
            table.window.push(b);
        }
    }

    /// Registers window block `i` (its KV written) like the full block at the same index.
    pub(super) fn commit_window_block(
        &mut self,
        table: &BlockTable,
        i: usize,
        parent: &Parent,
        chunk: &[u32],
    ) {
        let Some(group) = &mut self.window else {
            return;
        };
        match table.window.get(i) {
            Some(&b) if b.0 != 0 => {
                group.pool.register(b, table.hashes[i], parent, chunk);
            }
            _ => {}
        }
    }

    /// Gives back the window blocks no token after the first `num_computed` can read any more.
    /// Returns how many were released.
    pub fn release_out_of_window(&mut self, table: &mut BlockTable, num_computed: usize) -> usize {
        let Some(group) = &mut self.window else {
            return 0;
        };
        let end = group.first_live(num_computed).min(table.window.len());
        let mut released = 0;
        for i in table.window_released..end {
            let b = std::mem::replace(&mut table.window[i], BlockId(0));
            if b.0 != 0 {
                group.pool.release(b);
                released += 1;
            }
        }
        table.window_released = table.window_released.max(end);
        released
    }

    /// Releases the window entries of `table` past its first `keep`, tail first.
    pub(super) fn truncate_window(&mut self, table: &mut BlockTable, keep: usize) {
        if let Some(group) = &mut self.window {
            while table.window.len() > keep {
                let b = table.window.pop().expect("longer than keep");
                if b.0 != 0 {
                    group.pool.release(b);
                }
            }
            table.window_released = table.window_released.min(keep);
        }
    }

    /// Releases every window block of `table`, tail first.
    pub(super) fn free_window(&mut self, table: &mut BlockTable) {
        if let Some(group) = &mut self.window {
            for &b in table.window.iter().rev().filter(|b| b.0 != 0) {
                group.pool.release(b);
            }
        }
        table.window.clear();
        table.window_released = 0;
    }
}

#[cfg(test)]
mod tests;
