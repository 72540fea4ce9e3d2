//! Tests of the page table manager.

use super::*;

fn toks(n: usize, offset: u32) -> Vec<u32> {
    (0..n as u32).map(|i| i + offset).collect()
}

#[test]
fn allocate_is_all_or_nothing() {
    let mut kv = KvCacheManager::new(4, 4, true); // 3 usable blocks
    let mut t = BlockTable::new(None);
    let none = CachedPrefix::default();
    assert!(kv.can_allocate(&t, &none, 12));
    assert!(!kv.can_allocate(&t, &none, 13));
    let err = kv.allocate_slots(&mut t, &none, 13).unwrap_err();
    assert_eq!(
        err,
        NoFreeBlocks {
            window: false,
            needed: 4,
            free: 3
        }
    );
    assert!(t.is_empty());
    assert_eq!(kv.pool().num_free(), 3);
    kv.allocate_slots(&mut t, &none, 5).unwrap();
    assert_eq!(t.len(), 2);
    assert_eq!(kv.slot(&t, 0), t.blocks()[0].0 * 4);
    assert_eq!(kv.slot(&t, 5), t.blocks()[1].0 * 4 + 1);
    kv.free(&mut t);
    assert_eq!(kv.pool().num_free(), 3);
}

#[test]
fn prefix_hit_after_commit_and_never_the_last_token() {
    let mut kv = KvCacheManager::new(16, 4, true);
    let none = CachedPrefix::default();
    let prompt = toks(12, 100);
    let mut a = BlockTable::new(None);
    assert_eq!(kv.cached_prefix(&mut a, &prompt).num_tokens, 0);
    kv.allocate_slots(&mut a, &none, 12).unwrap();
    // Nothing is served before the KV is written.
    let mut probe = BlockTable::new(None);
    assert_eq!(kv.cached_prefix(&mut probe, &prompt).num_tokens, 0);
    kv.commit_full_blocks(&mut a, &prompt, 12);

    // Same 12 tokens: only 8 can come from cache (the last token must be computed).
    let mut b = BlockTable::new(None);
    let hit = kv.cached_prefix(&mut b, &prompt);
    assert_eq!(hit.num_tokens, 8);
    assert_eq!(hit.blocks, a.blocks()[..2].to_vec());
    // A longer prompt sharing the first 12 tokens gets all three blocks.
    let mut longer = prompt.clone();
    longer.extend([1, 2, 3]);
    let mut c = BlockTable::new(None);
    assert_eq!(kv.cached_prefix(&mut c, &longer).num_tokens, 12);
    // A different salt shares nothing.
    let mut d = BlockTable::new(Some("other"));
    assert_eq!(kv.cached_prefix(&mut d, &longer).num_tokens, 0);

    kv.allocate_slots(&mut b, &hit, 13).unwrap();
    assert_eq!(kv.pool().ref_count(a.blocks()[0]), 2);
    assert_eq!(b.blocks()[..2], a.blocks()[..2]);
    assert_ne!(b.blocks()[2], a.blocks()[2]);
    kv.record_prefix_lookup(13, 8);
    assert_eq!(kv.prefix_cache_stats().num_hit_tokens, 8);
    assert_eq!(kv.prefix_cache_stats().num_queried_tokens, 13);
}

#[test]
fn freed_blocks_stay_cached_until_reused_and_revival_counts_as_free() {
    let mut kv = KvCacheManager::new(4, 2, true); // 3 usable
    let none = CachedPrefix::default();
    let p = toks(5, 0);
    let mut a = BlockTable::new(None);
    kv.allocate_slots(&mut a, &none, 5).unwrap();
    kv.commit_full_blocks(&mut a, &p, 5);
    kv.free(&mut a);
    assert_eq!(kv.pool().num_free(), 3);

    let mut b = BlockTable::new(None);
    let hit = kv.cached_prefix(&mut b, &p);
    assert_eq!(hit.num_tokens, 4);
    // 2 revived + 1 new = all 3 free blocks; one more token would need a 4th.
    assert!(kv.can_allocate(&b, &hit, 6));
    assert!(!kv.can_allocate(&b, &hit, 7));
    kv.allocate_slots(&mut b, &hit, 6).unwrap();
    assert_eq!(kv.pool().num_free(), 0);
    assert_eq!(kv.pool().total_refs(), 3);
}

#[test]
fn tail_blocks_are_evicted_first() {
    let mut kv = KvCacheManager::new(8, 2, true);
    let none = CachedPrefix::default();
    let p = toks(6, 0);
    let mut a = BlockTable::new(None);
    kv.allocate_slots(&mut a, &none, 6).unwrap();
    kv.commit_full_blocks(&mut a, &p, 6);
    let held = a.blocks().to_vec();
    kv.free(&mut a);
    let order = kv.pool().free_order();
    // Never-used blocks first, then the sequence's blocks tail first.
    let cached_order: Vec<_> = order.into_iter().filter(|b| held.contains(b)).collect();
    assert_eq!(cached_order, vec![held[2], held[1], held[0]]);
}

#[test]
fn disabled_prefix_caching_never_hits() {
    let mut kv = KvCacheManager::new(8, 2, false);
    let none = CachedPrefix::default();
    let p = toks(6, 0);
    let mut a = BlockTable::new(None);
    kv.allocate_slots(&mut a, &none, 6).unwrap();
    kv.commit_full_blocks(&mut a, &p, 6);
    let mut b = BlockTable::new(None);
    assert_eq!(kv.cached_prefix(&mut b, &p), CachedPrefix::default());
}

#[test]
fn a_prefix_is_served_only_under_the_exact_salt() {
    let mut kv = KvCacheManager::new(16, 2, true);
    let none = CachedPrefix::default();
    let p = toks(6, 0);
    let mut a = BlockTable::new(Some("tenant-a"));
    kv.allocate_slots(&mut a, &none, 6).unwrap();
    kv.commit_full_blocks(&mut a, &p, 6);
    let mut same = BlockTable::new(Some("tenant-a"));
    assert_eq!(kv.cached_prefix(&mut same, &p).num_tokens, 4);
    for other in [None, Some("tenant-b"), Some("tenant-a ")] {
        let mut t = BlockTable::new(other);
        assert_eq!(kv.cached_prefix(&mut t, &p).num_tokens, 0, "{other:?}");
    }
}
