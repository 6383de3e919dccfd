//! The canonical token hash space: from a request's token ids to the 64-bit sequence block
//! hashes that enter the filter and that queries probe.
//!
//! Engines name blocks with their own hashes (vLLM: SHA-256 or a `PYTHONHASHSEED`-dependent
//! builtin hash; SGLang and TensorRT-LLM: their own 64-bit hashes), so two engines, or one
//! engine restarted with another seed, disagree on the name of the same prefix. The producer
//! therefore re-derives every stored block's key from its token ids with the function below,
//! and the indexer derives a query's keys from the request's token ids with the same function.
//!
//! The function is NVIDIA Dynamo's published token-hash scheme (crates `dynamo-kv-router` /
//! `dynamo-tokens` / `dynamo-kv-hashing` 1.6.1), so a router built for Dynamo's hash space can
//! query ckf-relay with the hashes it already computes (`bench-compare` checks this against the
//! crate itself). Byte-level definition, also in `proto/TOKEN_HASH.md` with test vectors:
//!
//! - **block seed** ([`BlockSeed`]): `1337`, plus (wrapping) `xxh3_64(lora_name, seed 0)` when a
//!   non-empty LoRA name is given, plus (wrapping) `xxh3_64(cache_salt, seed 1)` when a non-empty
//!   cache salt is given. Request-wide: every block of one request uses the same seed.
//! - **block hash** ([`block_hash`]): `xxh3_64_with_seed(bytes, block seed)` where `bytes` are
//!   the block's token ids as `u32` little-endian, followed, when the block overlaps multimodal
//!   items, by their distinct identifier hashes ([`mm_identifier_hash`]) sorted ascending, each
//!   as `u64` little-endian.
//! - **sequence hash** ([`next_sequence_hash`]): the first block's sequence hash is its block
//!   hash; block `i > 0` has `xxh3_64_with_seed(le(seq[i-1]) ++ le(block[i]), 1337)` (the chain
//!   seed is always 1337, whatever the block seed).
//!
//! The sequence hash is what ckf-relay calls a block hash everywhere else (addressing, ingest,
//! queries).

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// The chain seed, and the block seed of a request with neither LoRA name nor cache salt.
pub const CHAIN_SEED: u64 = 1337;

/// The request-wide seed of every block hash of one request: `1337` mixed with the LoRA name
/// and the cache salt (see the module docs). Empty strings count as absent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockSeed(pub u64);

impl BlockSeed {
    /// The seed of a request with neither LoRA name nor cache salt (`1337`).
    pub const DEFAULT: Self = Self(CHAIN_SEED);

    /// The seed for a request's `(cache_salt, lora_name)`; `None` and `""` are the same.
    pub fn new(cache_salt: Option<&str>, lora_name: Option<&str>) -> Self {
        let mut seed = CHAIN_SEED;
        if let Some(name) = lora_name.filter(|name| !name.is_empty()) {
            seed = seed.wrapping_add(xxh3_64_with_seed(name.as_bytes(), 0));
        }
        if let Some(salt) = cache_salt.filter(|salt| !salt.is_empty()) {
            seed = seed.wrapping_add(xxh3_64_with_seed(salt.as_bytes(), 1));
        }
        Self(seed)
    }
}

impl Default for BlockSeed {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// The 64-bit hash of a multimodal item's identifier, mixed into the blocks it overlaps.
///
/// A 64-character hexadecimal digest (vLLM's multimodal hash) maps to its first 16 hex digits
/// read as a `u64`; any other non-empty identifier to `xxh3_64` of its UTF-8 bytes (seed 0).
/// `None` for an empty identifier (such an item is ignored).
pub fn mm_identifier_hash(identifier: &str) -> Option<u64> {
    if identifier.is_empty() {
        return None;
    }
    if identifier.len() == 64 && identifier.bytes().all(|b| b.is_ascii_hexdigit()) {
        return u64::from_str_radix(&identifier[..16], 16).ok();
    }
    Some(xxh3_64(identifier.as_bytes()))
}

/// The block hash of one full block: its tokens (`u32` each), then the distinct multimodal
/// identifier hashes of the items it overlaps (any order, duplicates allowed: they are sorted
/// and deduplicated here), under `seed`.
///
/// Deduplication follows Dynamo's request side (`RequestExtraInfo::to_block_level` lists an
/// item once per block however many of its ranges fall in it), so an image repeated inside one
/// block names the block the same way whether it comes from a query or from an engine event.
pub fn block_hash(tokens: &[u32], mm_hashes: &[u64], seed: BlockSeed) -> u64 {
    let mut bytes = Vec::with_capacity(tokens.len() * 4 + mm_hashes.len() * 8);
    for token in tokens {
        bytes.extend_from_slice(&token.to_le_bytes());
    }
    if !mm_hashes.is_empty() {
        let mut sorted = mm_hashes.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        for hash in sorted {
            bytes.extend_from_slice(&hash.to_le_bytes());
        }
    }
    xxh3_64_with_seed(&bytes, seed.0)
}

/// The sequence hash of a block whose parent block has sequence hash `parent` and whose own
/// block hash is `block`: `xxh3_64_with_seed(le(parent) ++ le(block), 1337)`.
pub fn next_sequence_hash(parent: u64, block: u64) -> u64 {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&parent.to_le_bytes());
    bytes[8..].copy_from_slice(&block.to_le_bytes());
    xxh3_64_with_seed(&bytes, CHAIN_SEED)
}

/// The sequence hash of a block with block hash `block` after `parent` (`None`: the block is
/// its request's first, and its sequence hash is its block hash).
pub fn chain_step(parent: Option<u64>, block: u64) -> u64 {
    match parent {
        Some(parent) => next_sequence_hash(parent, block),
        None => block,
    }
}

/// A multimodal item of a request: which tokens it occupies, and its identifier hash
/// ([`mm_identifier_hash`]). Tokens `[offset, offset + length)` of the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MultimodalSpan {
    /// The item's identifier hash.
    pub hash: u64,
    /// First token position the item occupies (0-based, in the whole request).
    pub offset: u64,
    /// Number of token positions it occupies (0: the item is ignored).
    pub length: u64,
}

impl MultimodalSpan {
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.length > 0 && self.offset < end && start < self.offset.saturating_add(self.length)
    }
}

/// Why a request's tokens could not be turned into sequence hashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenHashError {
    /// The block size is 0.
    #[error("the block size must be at least 1 token")]
    ZeroBlockSize,
}

/// The sequence hashes of every **full** block of a request's tokens, in order: tokens are cut
/// into blocks of `block_size` (a trailing partial block has no hash and is ignored), each
/// block hashed with the request's `seed` and the identifier hashes of the `multimodal` items
/// it overlaps, then chained from the first block.
///
/// # Errors
/// [`TokenHashError::ZeroBlockSize`] when `block_size` is 0.
pub fn sequence_hashes(
    tokens: &[u32],
    block_size: usize,
    seed: BlockSeed,
    multimodal: &[MultimodalSpan],
) -> Result<Vec<u64>, TokenHashError> {
    if block_size == 0 {
        return Err(TokenHashError::ZeroBlockSize);
    }
    let mut hashes = Vec::with_capacity(tokens.len() / block_size);
    let mut parent = None;
    let mut mm = Vec::new();
    for (index, block) in tokens.chunks_exact(block_size).enumerate() {
        let start = (index * block_size) as u64;
        let end = start + block_size as u64;
        mm.clear();
        mm.extend(
            multimodal
                .iter()
                .filter(|span| span.overlaps(start, end))
                .map(|span| span.hash),
        );
        let hash = chain_step(parent, block_hash(block, &mm, seed));
        hashes.push(hash);
        parent = Some(hash);
    }
    Ok(hashes)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Constants published in dynamo-tokens 1.6.1's own tests (src/lib.rs, block size 4).
    const HASH_1_4: u64 = 14643705804678351452;
    const HASH_5_8: u64 = 16777012769546811212;
    const SEQ_HASH_5_8: u64 = 4945711292740353085;
    const HASH_9_12: u64 = 483935686894639516;
    const SEQ_HASH_9_12: u64 = 12583592247330656132;

    #[test]
    fn matches_dynamo_published_constants() {
        let seed = BlockSeed::DEFAULT;
        assert_eq!(block_hash(&[1, 2, 3, 4], &[], seed), HASH_1_4);
        assert_eq!(block_hash(&[5, 6, 7, 8], &[], seed), HASH_5_8);
        assert_eq!(block_hash(&[9, 10, 11, 12], &[], seed), HASH_9_12);
        let tokens: Vec<u32> = (1..=14).collect();
        let chain = sequence_hashes(&tokens, 4, seed, &[]).unwrap();
        assert_eq!(chain, vec![HASH_1_4, SEQ_HASH_5_8, SEQ_HASH_9_12]);
    }

    #[test]
    fn empty_names_are_absent_and_names_change_the_seed() {
        assert_eq!(BlockSeed::new(Some(""), Some("")), BlockSeed::DEFAULT);
        let lora = BlockSeed::new(None, Some("adapter"));
        let salt = BlockSeed::new(Some("adapter"), None);
        assert_ne!(lora, BlockSeed::DEFAULT);
        assert_ne!(salt, BlockSeed::DEFAULT);
        assert_ne!(lora, salt, "lora and salt of the same text must differ");
        assert_ne!(
            block_hash(&[1, 2, 3, 4], &[], lora),
            block_hash(&[1, 2, 3, 4], &[], BlockSeed::DEFAULT)
        );
    }

    #[test]
    fn multimodal_hashes_are_order_free_and_only_touch_overlapped_blocks() {
        let seed = BlockSeed::DEFAULT;
        assert_eq!(
            block_hash(&[1, 2], &[7, 3], seed),
            block_hash(&[1, 2], &[3, 7], seed)
        );
        let tokens: Vec<u32> = (0..12).collect();
        let plain = sequence_hashes(&tokens, 4, seed, &[]).unwrap();
        let image = MultimodalSpan {
            hash: 42,
            offset: 5,
            length: 2,
        };
        let with_image = sequence_hashes(&tokens, 4, seed, &[image]).unwrap();
        assert_eq!(with_image[0], plain[0], "block 0 does not overlap the item");
        assert_ne!(with_image[1], plain[1]);
        assert_ne!(with_image[2], plain[2], "the chain carries the change");
    }

    #[test]
    fn hex_digests_use_their_leading_64_bits() {
        let digest = format!("0123456789abcdef{}", "0".repeat(48));
        assert_eq!(mm_identifier_hash(&digest), Some(0x0123_4567_89ab_cdef));
        assert_eq!(mm_identifier_hash(""), None);
        assert_eq!(mm_identifier_hash("img-1"), Some(xxh3_64(b"img-1")));
    }

    #[test]
    fn partial_blocks_are_ignored_and_zero_block_size_refused() {
        assert!(sequence_hashes(&[1, 2, 3], 4, BlockSeed::DEFAULT, &[]).unwrap().is_empty());
        assert_eq!(
            sequence_hashes(&[1], 0, BlockSeed::DEFAULT, &[]),
            Err(TokenHashError::ZeroBlockSize)
        );
    }
}
