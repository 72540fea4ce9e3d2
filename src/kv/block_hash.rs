//! Chained content hashes of full KV blocks, the keys of the prefix cache.
//!
//! A block's hash covers its parent's hash (or, for the first block, a key derived from the request's
//! optional cache salt) and its token ids. Hashes are only a fast index, never trusted: a hit is
//! verified exactly, against the block's stored tokens and its [`Parent`], the exact identity of
//! the prefix before it (the salt itself for a first block, else the serial number of the
//! registered block before it; serials are never reused). By induction over the chain a hit's
//! whole prefix equals the request's, so no hash collision, chance or forged, can serve KV that was
//! computed under another prefix.

use std::hash::{BuildHasherDefault, DefaultHasher, Hash, Hasher};
use std::sync::Arc;

/// Hash of one full block and everything before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u64);

/// What a block's hash chains from: the previous block's hash, or the salt key for the first block.
pub type ParentKey = u64;

/// The exact identity of the prefix a cached block extends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Parent {
    /// A first block: the request's cache salt (compared as a string).
    Root(Option<Arc<str>>),
    /// The registered block before it, by serial number (unique for the pool's lifetime).
    Block(u64),
}

/// Parent key of a sequence's first block. Different salts never share cached blocks.
pub fn root_key(salt: Option<&str>) -> ParentKey {
    match salt {
        None => 0,
        Some(salt) => {
            let mut h = DefaultHasher::new();
            "pagewise-cache-salt".hash(&mut h);
            salt.hash(&mut h);
            // Keep 0 for "no salt": a salted root can never equal the unsalted one.
            h.finish().max(1)
        }
    }
}

/// Hash of a full block given its parent key and its token ids.
pub fn hash_block(parent: ParentKey, tokens: &[u32]) -> BlockHash {
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    BlockHash(h.finish())
}

/// `HashMap` hasher for keys that already are well-mixed 64-bit hashes: it passes them through.
#[derive(Default)]
pub struct PassThroughHasher(u64);

impl Hasher for PassThroughHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only reached for keys other than a single u64; fold them in so it still hashes correctly.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// Build-hasher for maps keyed by [`BlockHash`].
pub type BuildPassThrough = BuildHasherDefault<PassThroughHasher>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_depends_on_parent_tokens_and_salt() {
        let a = hash_block(root_key(None), &[1, 2, 3, 4]);
        assert_eq!(a, hash_block(root_key(None), &[1, 2, 3, 4]));
        assert_ne!(a, hash_block(root_key(None), &[1, 2, 3, 5]));
        assert_ne!(a, hash_block(root_key(Some("tenant-a")), &[1, 2, 3, 4]));
        assert_ne!(
            hash_block(root_key(Some("tenant-a")), &[1, 2, 3, 4]),
            hash_block(root_key(Some("tenant-b")), &[1, 2, 3, 4])
        );
        let b1 = hash_block(a.0, &[5, 6, 7, 8]);
        let b2 = hash_block(hash_block(root_key(None), &[9, 9, 9, 9]).0, &[5, 6, 7, 8]);
        assert_ne!(
            b1, b2,
            "same tokens under a different parent must hash differently"
        );
    }
}
