use super::*;

fn toks(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| i + 100).collect()
}

fn manager(full: usize, window_blocks: usize, window: usize) -> KvCacheManager {
    KvCacheManager::with_window(
        full,
        4,
        true,
        Some(WindowConfig {
            window,
            num_blocks: window_blocks,
        }),
    )
}

fn live(t: &BlockTable) -> usize {
    t.window_blocks().iter().filter(|b| b.0 != 0).count()
}

#[test]
fn a_long_sequence_holds_only_its_window_in_the_window_group() {
    // Window 6 over blocks of 4: the next token reads at most 6 positions, over 3 blocks.
    let mut kv = manager(64, 8, 6);
    let none = CachedPrefix::default();
    let mut t = BlockTable::new(None);
    kv.allocate_slots(&mut t, &none, 10).unwrap();
    assert_eq!((t.len(), live(&t)), (3, 3));
    // After the prompt (10 tokens), the token at 10 reads 5..=10: block 0 is dead.
    assert_eq!(kv.release_out_of_window(&mut t, 10), 1);
    assert_eq!(t.window_blocks()[0], BlockId(0));
    let mut most_live = 0;
    for computed in 11..200 {
        kv.allocate_slots(&mut t, &none, computed).unwrap();
        most_live = most_live.max(live(&t));
        kv.release_out_of_window(&mut t, computed);
        // Every block the next token can read is still there.
        for p in (computed + 1 - 6)..=computed.min(t.len() * 4 - 1) {
            assert_ne!(t.window_blocks()[p / 4], BlockId(0), "position {p}");
        }
    }
    assert_eq!(t.len(), 50, "the full layers keep the whole context");
    assert!(most_live <= 3, "{most_live} window blocks held at once");
    assert_eq!(kv.pool().num_free(), 63 - 50);
    assert_eq!(kv.window_pool().unwrap().num_free(), 7 - live(&t));
    kv.free(&mut t);
    assert_eq!(kv.window_pool().unwrap().num_free(), 7);
    assert_eq!(kv.pool().num_free(), 63);
}

#[test]
fn allocation_is_all_or_nothing_across_both_groups() {
    // The window group has 2 usable blocks: 9 tokens need 3 of them at once.
    let mut kv = manager(16, 3, 4);
    let none = CachedPrefix::default();
    let mut t = BlockTable::new(None);
    let err = kv.allocate_slots(&mut t, &none, 9).unwrap_err();
    assert!(err.window, "{err}");
    assert!(!kv.can_allocate(&t, &none, 9));
    assert!(t.is_empty() && t.window_blocks().is_empty());
    assert_eq!(kv.pool().num_free(), 15, "the full group gave nothing");
    kv.allocate_slots(&mut t, &none, 8).unwrap();
    // Once the first block is out of the window, the group has room to grow.
    kv.release_out_of_window(&mut t, 8);
    kv.allocate_slots(&mut t, &none, 12).unwrap();
    assert_eq!((t.len(), live(&t)), (3, 2));
}

#[test]
fn a_prefix_is_served_as_far_as_its_window_blocks_are_cached() {
    let mut kv = manager(64, 16, 6);
    let none = CachedPrefix::default();
    let prompt = toks(17);
    let mut a = BlockTable::new(None);
    kv.allocate_slots(&mut a, &none, 17).unwrap();
    kv.commit_full_blocks(&mut a, &prompt, 17);
    kv.release_out_of_window(&mut a, 17);
    kv.free(&mut a);

    // 16 of 17 tokens can come from cache: the token at 16 reads 11..=16, so blocks 2 and 3.
    let mut b = BlockTable::new(None);
    let hit = kv.cached_prefix(&mut b, &prompt);
    assert_eq!(hit.num_tokens, 16);
    assert_eq!((hit.window_start, hit.window_blocks.len()), (2, 2));
    kv.allocate_slots(&mut b, &hit, 17).unwrap();
    assert_eq!(b.len(), 5);
    let w = b.window_blocks();
    assert_eq!((w[0], w[1]), (BlockId(0), BlockId(0)));
    assert!(w[2..].iter().all(|x| x.0 != 0));
    kv.free(&mut b);

    // Evict the window group's cached blocks: fill the pool with another sequence's blocks.
    let mut c = BlockTable::new(Some("other"));
    kv.allocate_slots(&mut c, &none, 15 * 4).unwrap();
    kv.free(&mut c);
    let mut d = BlockTable::new(None);
    let hit = kv.cached_prefix(&mut d, &prompt);
    assert_eq!(
        hit.num_tokens, 0,
        "the full blocks alone cannot serve the window layers"
    );
    assert_eq!(kv.pool().num_free(), 63);
}

#[test]
fn a_window_of_one_needs_no_cached_window_block() {
    let mut kv = manager(16, 4, 1);
    let none = CachedPrefix::default();
    let prompt = toks(9);
    let mut a = BlockTable::new(None);
    kv.allocate_slots(&mut a, &none, 9).unwrap();
    kv.commit_full_blocks(&mut a, &prompt, 9);
    assert_eq!(kv.release_out_of_window(&mut a, 9), 2);
    assert_eq!(live(&a), 1);
    kv.free(&mut a);
    let mut b = BlockTable::new(None);
    let hit = kv.cached_prefix(&mut b, &prompt);
    assert_eq!((hit.num_tokens, hit.window_blocks.len()), (8, 0));
}
