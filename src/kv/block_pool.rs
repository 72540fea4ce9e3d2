//! The physical KV-cache blocks: ref counts, an intrusive O(1) LRU free list, and the prefix-cache index.
//!
//! Block 0 is reserved as the null block (padding in block tables) and is never handed out. A block
//! whose ref count drops to zero goes onto the free list but keeps its prefix-cache hash until it is
//! handed out again (lazy eviction): a later request with the same prefix can take it back off the
//! free list. The free list is a doubly linked list threaded through the block metadata, so every
//! operation is O(1) and allocates nothing.

use std::collections::HashMap;

use super::block_hash::{BlockHash, BuildPassThrough, Parent};

/// What a block holds, as [`BlockPool::states_into`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum BlockState {
    /// On the free list, holding nothing reusable.
    Free = 0,
    /// Held by one sequence.
    Used = 1,
    /// On the free list, still holding a cached prefix a later prompt may reuse.
    Cached = 2,
    /// Held by several sequences (a shared prefix).
    Shared = 3,
}

/// Index of a physical block in the KV cache tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub u32);

impl BlockId {
    /// The reserved padding block; never allocated.
    pub const NULL: BlockId = BlockId(0);
}

const NIL: u32 = u32::MAX;

/// Bookkeeping for one block. `prev`/`next` link the free list and are `NIL` when not on it.
#[derive(Clone, Debug)]
struct BlockMeta {
    ref_count: u32,
    prev: u32,
    next: u32,
    on_free_list: bool,
    /// Set once the block is full, its KV written, and it is registered in the prefix cache.
    cached: Option<Cached>,
}

/// A registered block's prefix-cache entry.
#[derive(Clone, Debug)]
struct Cached {
    hash: BlockHash,
    /// The exact prefix before the block.
    parent: Parent,
    /// This entry's serial number: the exact identity of the prefix up to and including the block.
    serial: u64,
}

/// A fixed set of KV blocks of `block_size` token slots each.
#[derive(Clone, Debug)]
pub struct BlockPool {
    block_size: usize,
    meta: Vec<BlockMeta>,
    head: u32,
    tail: u32,
    num_free: usize,
    enable_caching: bool,
    /// Prefix-cache index: hash of a full block -> the block holding that content.
    index: HashMap<BlockHash, BlockId, BuildPassThrough>,
    /// The token ids of every registered block (`block_size` per block), to verify hits.
    tokens: Vec<u32>,
    /// The next registration's serial number.
    next_serial: u64,
    /// Each block's [`BlockState`] code, kept current by every operation that changes a ref
    /// count or a cache entry, so the live view copies it instead of walking the metadata.
    states: Vec<u8>,
}

impl BlockPool {
    /// A pool of `num_blocks` blocks (block 0 included, reserved) with all usable blocks free.
    pub fn new(num_blocks: usize, block_size: usize, enable_caching: bool) -> Self {
        assert!(
            num_blocks >= 2,
            "a block pool needs the null block and at least one more"
        );
        assert!(num_blocks < NIL as usize, "too many blocks");
        let mut pool = BlockPool {
            block_size,
            meta: vec![
                BlockMeta {
                    ref_count: 0,
                    prev: NIL,
                    next: NIL,
                    on_free_list: false,
                    cached: None,
                };
                num_blocks
            ],
            head: NIL,
            tail: NIL,
            num_free: 0,
            enable_caching,
            index: HashMap::default(),
            tokens: if enable_caching {
                vec![0; num_blocks * block_size]
            } else {
                Vec::new()
            },
            next_serial: 1,
            states: vec![BlockState::Free as u8; num_blocks],
        };
        for id in 1..num_blocks as u32 {
            pool.push_back(id);
        }
        pool
    }

    /// Token slots per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// All blocks, the reserved null block included.
    pub fn num_blocks(&self) -> usize {
        self.meta.len()
    }

    /// Blocks that can ever be handed out (all but the null block).
    pub fn num_usable(&self) -> usize {
        self.meta.len() - 1
    }

    /// Blocks with ref count zero (some may still hold reusable cached prefixes).
    pub fn num_free(&self) -> usize {
        self.num_free
    }

    /// Fraction of usable blocks in use, 0.0..=1.0.
    pub fn usage(&self) -> f64 {
        1.0 - self.num_free as f64 / self.num_usable() as f64
    }

    /// Current ref count of a block.
    pub fn ref_count(&self, id: BlockId) -> u32 {
        self.meta[id.0 as usize].ref_count
    }

    /// Number of blocks registered in the prefix cache (held or free).
    pub fn num_cached(&self) -> usize {
        self.index.len()
    }

    /// Takes the least recently freed block, evicting its cached prefix if it had one.
    /// Returns `None` when no block is free; callers check [`Self::num_free`] first.
    pub fn allocate(&mut self) -> Option<BlockId> {
        let id = self.head;
        if id == NIL {
            return None;
        }
        self.unlink(id);
        let meta = &mut self.meta[id as usize];
        meta.ref_count = 1;
        if let Some(c) = meta.cached.take() {
            self.index.remove(&c.hash);
        }
        self.refresh_state(id);
        Some(BlockId(id))
    }

    /// Adds a reference to a block, taking it off the free list if it was there (a prefix-cache hit).
    pub fn touch(&mut self, id: BlockId) {
        if self.meta[id.0 as usize].on_free_list {
            self.unlink(id.0);
        }
        self.meta[id.0 as usize].ref_count += 1;
        self.refresh_state(id.0);
    }

    /// Drops one reference. At zero the block is freed: a cached block goes to the back of the LRU
    /// list (evicted last), a block with nothing worth keeping goes to the front (reused first).
    pub fn release(&mut self, id: BlockId) {
        let meta = &mut self.meta[id.0 as usize];
        assert!(meta.ref_count > 0, "double free of block {}", id.0);
        meta.ref_count -= 1;
        if meta.ref_count == 0 {
            if meta.cached.is_some() {
                self.push_back(id.0);
            } else {
                self.push_front(id.0);
            }
        }
        self.refresh_state(id.0);
    }

    /// Registers a full block whose KV has been written: `tokens` after the prefix `parent`, under
    /// `hash`. Returns the serial number that identifies this exact prefix (up to and including
    /// the block), which the next block of the sequence chains from: the existing entry's when the
    /// same content is registered already, a new one otherwise. A block whose hash is taken by
    /// other content (a collision) or registered while caching is off gets a fresh serial and no
    /// entry: it is never served, and neither is anything chained from it.
    pub fn register(
        &mut self,
        id: BlockId,
        hash: BlockHash,
        parent: &Parent,
        tokens: &[u32],
    ) -> u64 {
        debug_assert_eq!(tokens.len(), self.block_size);
        if let Some(c) = &self.meta[id.0 as usize].cached {
            return c.serial; // already registered: it holds this same content
        }
        if let Some((_, serial)) = self.lookup(hash, parent, tokens) {
            return serial;
        }
        let serial = self.next_serial;
        self.next_serial += 1;
        if !self.enable_caching || self.index.contains_key(&hash) {
            return serial;
        }
        self.index.insert(hash, id);
        self.meta[id.0 as usize].cached = Some(Cached {
            hash,
            parent: parent.clone(),
            serial,
        });
        let start = id.0 as usize * self.block_size;
        self.tokens[start..start + self.block_size].copy_from_slice(tokens);
        self.refresh_state(id.0);
        serial
    }

    /// The cached block holding exactly `tokens` after exactly the prefix `parent`, if any, with
    /// its serial. Verified, not just hashed.
    pub fn lookup(
        &self,
        hash: BlockHash,
        parent: &Parent,
        tokens: &[u32],
    ) -> Option<(BlockId, u64)> {
        let id = *self.index.get(&hash)?;
        let c = self.meta[id.0 as usize].cached.as_ref()?;
        let start = id.0 as usize * self.block_size;
        let stored = &self.tokens[start..start + self.block_size];
        (c.parent == *parent && stored == tokens).then_some((id, c.serial))
    }

    /// Whether a block is currently on the free list.
    pub fn is_free(&self, id: BlockId) -> bool {
        self.meta[id.0 as usize].on_free_list
    }

    /// Each usable block's state (block 1 first) as [`BlockState`] codes, into `out` (cleared):
    /// the live view of the pool (`/dashboard`).
    pub fn states_into(&self, out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(&self.states[1..]);
    }

    /// Block `id`'s state as its metadata says.
    fn state_of(&self, id: u32) -> BlockState {
        let m = &self.meta[id as usize];
        match (m.ref_count, m.cached.is_some()) {
            (0, false) => BlockState::Free,
            (0, true) => BlockState::Cached,
            (1, _) => BlockState::Used,
            _ => BlockState::Shared,
        }
    }

    fn refresh_state(&mut self, id: u32) {
        self.states[id as usize] = self.state_of(id) as u8;
    }

    /// Sum of all ref counts (for leak checks).
    pub fn total_refs(&self) -> u64 {
        self.meta.iter().map(|m| u64::from(m.ref_count)).sum()
    }

    /// Free-list order, front (next to be reused) first. For tests and debugging; O(n).
    pub fn free_order(&self) -> Vec<BlockId> {
        let mut out = Vec::with_capacity(self.num_free);
        let mut cur = self.head;
        while cur != NIL {
            out.push(BlockId(cur));
            cur = self.meta[cur as usize].next;
        }
        out
    }

    fn push_back(&mut self, id: u32) {
        let old_tail = self.tail;
        let meta = &mut self.meta[id as usize];
        meta.prev = old_tail;
        meta.next = NIL;
        meta.on_free_list = true;
        if old_tail == NIL {
            self.head = id;
        } else {
            self.meta[old_tail as usize].next = id;
        }
        self.tail = id;
        self.num_free += 1;
    }

    fn push_front(&mut self, id: u32) {
        let old_head = self.head;
        let meta = &mut self.meta[id as usize];
        meta.prev = NIL;
        meta.next = old_head;
        meta.on_free_list = true;
        if old_head == NIL {
            self.tail = id;
        } else {
            self.meta[old_head as usize].prev = id;
        }
        self.head = id;
        self.num_free += 1;
    }

    fn unlink(&mut self, id: u32) {
        let (prev, next) = {
            let meta = &mut self.meta[id as usize];
            debug_assert!(meta.on_free_list);
            meta.on_free_list = false;
            (
                std::mem::replace(&mut meta.prev, NIL),
                std::mem::replace(&mut meta.next, NIL),
            )
        };
        match prev {
            NIL => self.head = next,
            p => self.meta[p as usize].next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.meta[n as usize].prev = prev,
        }
        self.num_free -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::block_hash::{hash_block, root_key};

    const ROOT: Parent = Parent::Root(None);

    fn id(found: Option<(BlockId, u64)>) -> Option<BlockId> {
        found.map(|(b, _)| b)
    }

    #[test]
    fn null_block_is_never_allocated_and_counts_are_exact() {
        let mut pool = BlockPool::new(5, 16, true);
        assert_eq!(pool.num_free(), 4);
        let got: Vec<_> = std::iter::from_fn(|| pool.allocate()).collect();
        assert_eq!(got, vec![BlockId(1), BlockId(2), BlockId(3), BlockId(4)]);
        assert_eq!(pool.num_free(), 0);
        assert_eq!(pool.usage(), 1.0);
        assert!(pool.allocate().is_none());
        pool.release(BlockId(3));
        assert_eq!(pool.num_free(), 1);
        assert_eq!(pool.allocate(), Some(BlockId(3)));
    }

    #[test]
    fn uncached_blocks_are_reused_before_cached_ones_in_lru_order() {
        let mut pool = BlockPool::new(6, 4, true);
        let blocks: Vec<_> = (0..5).map(|_| pool.allocate().unwrap()).collect();
        let h = |i: u32| hash_block(root_key(None), &[i; 4]);
        pool.register(blocks[0], h(0), &ROOT, &[0; 4]);
        pool.register(blocks[1], h(1), &ROOT, &[1; 4]);
        // Free in order 1, 0, then the uncached 2: the uncached one must come out first.
        pool.release(blocks[1]);
        pool.release(blocks[0]);
        pool.release(blocks[2]);
        assert_eq!(pool.free_order(), vec![blocks[2], blocks[1], blocks[0]]);
        assert_eq!(pool.allocate(), Some(blocks[2]));
        // Next is the least recently freed cached block: its hash is evicted on reuse.
        assert!(pool.lookup(h(1), &ROOT, &[1; 4]).is_some());
        assert_eq!(pool.allocate(), Some(blocks[1]));
        assert!(pool.lookup(h(1), &ROOT, &[1; 4]).is_none());
        assert_eq!(id(pool.lookup(h(0), &ROOT, &[0; 4])), Some(blocks[0]));
    }

    #[test]
    fn touch_takes_a_free_cached_block_back() {
        let mut pool = BlockPool::new(3, 2, true);
        let b = pool.allocate().unwrap();
        pool.register(b, BlockHash(7), &ROOT, &[1, 2]);
        pool.release(b);
        assert!(pool.is_free(b));
        assert_eq!(pool.num_free(), 2);
        pool.touch(b);
        assert!(!pool.is_free(b));
        assert_eq!(pool.ref_count(b), 1);
        assert_eq!(pool.num_free(), 1);
        pool.touch(b);
        assert_eq!(pool.ref_count(b), 2);
    }

    #[test]
    fn lookup_verifies_tokens_and_parent_not_only_the_hash() {
        let mut pool = BlockPool::new(3, 2, true);
        let b = pool.allocate().unwrap();
        pool.register(b, BlockHash(42), &Parent::Block(5), &[1, 2]);
        assert_eq!(
            id(pool.lookup(BlockHash(42), &Parent::Block(5), &[1, 2])),
            Some(b)
        );
        let forged = pool.lookup(BlockHash(42), &Parent::Block(5), &[1, 3]);
        assert_eq!(forged, None, "forged collision");
        let other = pool.lookup(BlockHash(42), &Parent::Block(6), &[1, 2]);
        assert_eq!(other, None, "other parent");
        let salted = Parent::Root(Some("a".into()));
        assert_eq!(pool.lookup(BlockHash(42), &salted, &[1, 2]), None);
    }

    #[test]
    fn a_hit_needs_the_whole_chain_not_only_an_equal_parent_hash() {
        // Two different first blocks whose hashes collide (forged: both under hash 1), then the
        // same second block after each. The second block computed after `a` must never be served
        // after `c`, though its own hash, tokens and parent hash all match.
        let mut pool = BlockPool::new(5, 2, true);
        let (a, b, c) = (
            pool.allocate().unwrap(),
            pool.allocate().unwrap(),
            pool.allocate().unwrap(),
        );
        let sa = pool.register(a, BlockHash(1), &ROOT, &[1, 2]);
        let sb = pool.register(b, BlockHash(2), &Parent::Block(sa), &[3, 4]);
        assert_ne!(sa, sb);
        // `c` collides with `a`'s hash: it gets a serial of its own and no entry.
        let sc = pool.register(c, BlockHash(1), &ROOT, &[9, 9]);
        assert_ne!(sc, sa);
        assert_eq!(pool.lookup(BlockHash(1), &ROOT, &[9, 9]), None);
        assert_eq!(pool.lookup(BlockHash(2), &Parent::Block(sc), &[3, 4]), None);
        assert_eq!(
            pool.lookup(BlockHash(2), &Parent::Block(sa), &[3, 4]),
            Some((b, sb))
        );
        // Once `a` is evicted and its block reused, its serial is gone for good.
        pool.release(a);
        pool.release(b);
        pool.release(c);
        while pool.allocate().is_some() {}
        assert_eq!(pool.lookup(BlockHash(1), &ROOT, &[1, 2]), None);
    }

    #[test]
    fn duplicate_content_is_not_registered_twice_and_caching_can_be_off() {
        let mut pool = BlockPool::new(4, 2, true);
        let a = pool.allocate().unwrap();
        let b = pool.allocate().unwrap();
        let sa = pool.register(a, BlockHash(1), &ROOT, &[1, 2]);
        let sb = pool.register(b, BlockHash(1), &ROOT, &[1, 2]);
        assert_eq!(sa, sb, "the same prefix has one identity");
        assert_eq!(pool.num_cached(), 1);
        assert_eq!(pool.lookup(BlockHash(1), &ROOT, &[1, 2]), Some((a, sa)));

        let mut off = BlockPool::new(4, 2, false);
        let c = off.allocate().unwrap();
        off.register(c, BlockHash(1), &ROOT, &[1, 2]);
        assert_eq!(off.lookup(BlockHash(1), &ROOT, &[1, 2]), None);
    }

    #[test]
    fn kept_states_equal_the_metadata_through_any_operations() {
        let mut pool = BlockPool::new(9, 2, true);
        let mut held: Vec<BlockId> = Vec::new();
        let mut x = 12345u64;
        for step in 0..2000u32 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            match (x >> 33) % 4 {
                0 => held.extend(pool.allocate()),
                1 if !held.is_empty() => {
                    pool.release(held.swap_remove((x >> 40) as usize % held.len()))
                }
                2 if !held.is_empty() => {
                    let b = held[(x >> 40) as usize % held.len()];
                    let tokens = [step % 3, step % 5];
                    pool.register(b, hash_block(root_key(None), &tokens), &ROOT, &tokens);
                }
                3 if !held.is_empty() => {
                    let b = held[(x >> 40) as usize % held.len()];
                    pool.touch(b);
                    held.push(b);
                }
                _ => {}
            }
            let mut got = Vec::new();
            pool.states_into(&mut got);
            let want: Vec<u8> = (1..9).map(|i| pool.state_of(i) as u8).collect();
            assert_eq!(got, want, "after step {step}");
        }
    }
}
