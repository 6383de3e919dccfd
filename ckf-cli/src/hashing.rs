//! From trace `hash_ids` to chained 64-bit sequence block hashes.
//!
//! # The rule (stable; part of what `ckf replay` sends)
//! ```text
//! parent(0)      = ROOT_PARENT = 0
//! block_hash(i)  = xxh3_64( le_bytes(parent(i)) ++ le_bytes(hash_ids[i]) )   (16 input bytes)
//! parent(i + 1)  = block_hash(i)
//! ```
//! `xxh3_64` is XXH3 64-bit with the default secret and seed 0. Block `i`'s hash depends on every
//! id at positions `0..=i`, so two requests share the hash of block `i` exactly when they share
//! the whole prefix up to `i` (up to 64-bit collisions): equal prefixes give equal hashes and the
//! same id after different prefixes gives different hashes, which is what a sequence block hash
//! means to the indexer. [`ckf query --ids`](crate::operator::query) applies the same rule.
//!
//! # Why not `ckf_core::tokens`
//! The core's rule ([`ckf_core::tokens`], NVIDIA Dynamo's token-hash scheme) hashes a block's
//! **token ids** (block seed 1337 plus any LoRA / cache-salt hash, chain seed 1337, the first
//! block's sequence hash is its block hash). A Mooncake trace has no tokens, only one id per block (`hash_ids`), so a replay
//! chains those ids with this simpler rule instead: it is the documented, stable rule of
//! `ckf replay` and `ckf query --ids` (docs/replay-report.md, "Block hashing rule"), not a second
//! variant of the core's. Only `--feed zmq` turns trace ids into tokens and uses the core's
//! rule ([`crate::bench::feed`]).

use xxhash_rust::xxh3::xxh3_64;

/// The parent of a request's first block.
pub const ROOT_PARENT: u64 = 0;

/// `H(parent, hash_id)`: the hash of the block with id `hash_id` following a block whose hash is
/// `parent`.
pub fn chain(parent: u64, hash_id: u64) -> u64 {
    let mut input = [0u8; 16];
    input[..8].copy_from_slice(&parent.to_le_bytes());
    input[8..].copy_from_slice(&hash_id.to_le_bytes());
    xxh3_64(&input)
}

/// The sequence block hashes of a request's `hash_ids`, in prefix order (same length).
pub fn block_hashes(hash_ids: &[u64]) -> Vec<u64> {
    let mut parent = ROOT_PARENT;
    hash_ids
        .iter()
        .map(|&id| {
            parent = chain(parent, id);
            parent
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_prefixes_give_equal_hashes_and_diverge_after() {
        let a = block_hashes(&[0, 1, 2, 3]);
        let b = block_hashes(&[0, 1, 9, 3]);
        assert_eq!(a[..2], b[..2]);
        assert_ne!(a[2], b[2]);
        // Same id at the same position after a different prefix: different hash.
        assert_ne!(a[3], b[3]);
    }

    #[test]
    fn hash_depends_on_position_and_order() {
        let a = block_hashes(&[5, 5]);
        assert_ne!(a[0], a[1]);
        assert_ne!(block_hashes(&[1, 2])[1], block_hashes(&[2, 1])[1]);
    }

    #[test]
    fn chain_matches_the_documented_rule() {
        let mut input = Vec::new();
        input.extend_from_slice(&ROOT_PARENT.to_le_bytes());
        input.extend_from_slice(&42u64.to_le_bytes());
        let first = xxh3_64(&input);
        assert_eq!(block_hashes(&[42])[0], first);
        let mut input = Vec::new();
        input.extend_from_slice(&first.to_le_bytes());
        input.extend_from_slice(&7u64.to_le_bytes());
        assert_eq!(block_hashes(&[42, 7])[1], xxh3_64(&input));
    }

    #[test]
    fn empty_request_has_no_blocks() {
        assert!(block_hashes(&[]).is_empty());
    }
}
