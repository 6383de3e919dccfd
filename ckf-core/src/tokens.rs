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
//!
//! A query by token ids (`ckf.v1.Query/FindMatchesByTokens`) is a [`TokenQuery`];
//! [`TokenQuery::sequence_hashes`] checks it against the indexer's [`TokenQueryRules`] (block
//! size, block limit, multimodal items) and computes the hashes it probes. The Python reference
//! `proto/token_hash/ckf_token_hash.py` and its vectors `proto/token_hash/vectors.json` (checked
//! by `tests/token_vectors.rs`) define the same function.

use std::borrow::Cow;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

pub mod lanes;

/// The chain seed, and the block seed of a request with neither LoRA name nor cache salt.
pub const CHAIN_SEED: u64 = 1337;

/// The request-wide seed of every block hash of one request: `1337` mixed with the LoRA name
/// and the cache salt (see the module docs). Empty strings count as absent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
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
    // Without multimodal items (the common case) the bytes to hash are the token ids
    // themselves: on a little-endian target their memory already is the definition's `u32`
    // little-endian bytes, hashed in place (no copy, no allocation per block).
    #[cfg(target_endian = "little")]
    if mm_hashes.is_empty() {
        return xxh3_64_with_seed(bytemuck::cast_slice(tokens), seed.0);
    }
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
/// it overlaps, then chained from the first block. The same hashes as [`SequenceHashes`],
/// collected.
///
/// # Errors
/// [`TokenHashError::ZeroBlockSize`] when `block_size` is 0.
pub fn sequence_hashes(
    tokens: &[u32],
    block_size: usize,
    seed: BlockSeed,
    multimodal: &[MultimodalSpan],
) -> Result<Vec<u64>, TokenHashError> {
    Ok(SequenceHashes::new(tokens, block_size, seed, multimodal)?.collect())
}

/// The sequence hashes of a request's full blocks ([`sequence_hashes`]), computed one block at
/// a time as they are pulled: a query by token ids hands this to
/// `GlobalCkfIndexer::find_prefix_matches_by_tokens`, which on a long request of large blocks
/// hashes only as far as some lane still matches. Exact-size: [`len`](ExactSizeIterator::len)
/// is the number of full blocks left; fused: `None` once, then always.
#[derive(Debug, Clone)]
pub struct SequenceHashes<'t> {
    blocks: std::slice::ChunksExact<'t, u32>,
    block_size: u64,
    seed: BlockSeed,
    multimodal: Cow<'t, [MultimodalSpan]>,
    /// Block index of the next block (its first token is `index * block_size`).
    index: u64,
    parent: Option<u64>,
    /// The overlapping items' hashes of the current block (reused buffer).
    mm: Vec<u64>,
}

impl<'t> SequenceHashes<'t> {
    /// The hashes of `tokens`' full blocks of `block_size` under `seed`, with the `multimodal`
    /// items; nothing is hashed until pulled.
    ///
    /// # Errors
    /// [`TokenHashError::ZeroBlockSize`] when `block_size` is 0.
    pub fn new(
        tokens: &'t [u32],
        block_size: usize,
        seed: BlockSeed,
        multimodal: impl Into<Cow<'t, [MultimodalSpan]>>,
    ) -> Result<Self, TokenHashError> {
        if block_size == 0 {
            return Err(TokenHashError::ZeroBlockSize);
        }
        Ok(Self {
            blocks: tokens.chunks_exact(block_size),
            block_size: block_size as u64,
            seed,
            multimodal: multimodal.into(),
            index: 0,
            parent: None,
            mm: Vec::new(),
        })
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size as usize
    }
}

impl Iterator for SequenceHashes<'_> {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        let block = self.blocks.next()?;
        let start = self.index * self.block_size;
        let end = start + self.block_size;
        self.index += 1;
        self.mm.clear();
        self.mm.extend(
            self.multimodal
                .iter()
                .filter(|span| span.overlaps(start, end))
                .map(|span| span.hash),
        );
        let hash = chain_step(self.parent, block_hash(block, &self.mm, self.seed));
        self.parent = Some(hash);
        Some(hash)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.blocks.size_hint()
    }
}

impl ExactSizeIterator for SequenceHashes<'_> {}

// `ChunksExact` is fused, and `next` returns `None` exactly when it does.
impl std::iter::FusedIterator for SequenceHashes<'_> {}

/// Largest block size (tokens per KV block) a service accepts; the smallest is 1. Engines use
/// 16 to 512 tokens per block; the bound keeps a configuration typo from meaning "one block
/// per request".
pub const MAX_BLOCK_SIZE: u32 = 65_536;

/// A multimodal item as a query names it: its identifier (hashed with
/// [`mm_identifier_hash`]) and the token positions `[offset, offset + length)` it occupies in
/// the whole request (`length` 0: the item is ignored, as in [`sequence_hashes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultimodalItem {
    /// vLLM's 64-hex digest, or any other non-empty identifier.
    pub identifier: String,
    /// First token position (0-based, in the whole request).
    pub offset: u64,
    /// Number of token positions.
    pub length: u64,
}

/// A prefix-match query by token ids (the core value of `ckf.v1.FindMatchesByTokensRequest`):
/// the request's tokens, its request-wide LoRA name and cache salt (`None` = absent, as `""`),
/// its multimodal items, and the block size the caller assumes (`None`: the indexer's).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenQuery {
    /// Token ids in request order.
    pub token_ids: Vec<u32>,
    /// LoRA adapter name.
    pub lora_name: Option<String>,
    /// Cache salt (vLLM `cache_salt`, Dynamo cache namespace).
    pub cache_salt: Option<String>,
    /// Multimodal items.
    pub multimodal: Vec<MultimodalItem>,
    /// Tokens per block the caller assumes; must equal the indexer's when given.
    pub block_size: Option<u32>,
}

/// What the answering side fixes for every [`TokenQuery`]: its block size and the most blocks
/// one query may probe (the same bound as a query by hashes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenQueryRules {
    /// Tokens per KV block, `1..=MAX_BLOCK_SIZE`.
    pub block_size: u32,
    /// Most blocks per query; the token limit is `max_blocks * block_size`.
    pub max_blocks: u32,
}

impl TokenQueryRules {
    /// Most token ids one query may carry: `max_blocks * block_size` (a query within it has at
    /// most `max_blocks` full blocks).
    pub fn max_tokens(&self) -> u64 {
        u64::from(self.max_blocks) * u64::from(self.block_size)
    }
}

/// Why a [`TokenQuery`] is refused. Every variant names the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenQueryError {
    /// The query's block size is not the indexer's (its hashes would name other blocks).
    #[error(
        "block_size {requested} differs from the indexer's block_size {configured} \
         (send 0 to use the indexer's)"
    )]
    BlockSizeMismatch {
        /// The query's block size.
        requested: u32,
        /// The indexer's.
        configured: u32,
    },
    /// The query's block size is none of the lanes' (a domain of several block sizes).
    #[error(
        "block_size {requested} is not a block size of this indexer's lanes (they use {served:?}; \
         send 0 to answer every lane in its own)"
    )]
    BlockSizeNotServed {
        /// The query's block size.
        requested: u32,
        /// The lanes' block sizes, smallest first.
        served: Vec<u32>,
    },
    /// More tokens than `max_blocks * block_size`.
    #[error(
        "{tokens} token ids is more than max_query_blocks {max_blocks} x block_size \
         {block_size} = {limit}"
    )]
    TooManyTokens {
        /// Token ids in the query.
        tokens: usize,
        /// The limit.
        limit: u64,
        /// The block limit it derives from.
        max_blocks: u32,
        /// The block size it derives from.
        block_size: u32,
    },
    /// A multimodal item with an empty identifier (it would hash to nothing).
    #[error("multimodal[{index}].identifier is empty")]
    EmptyIdentifier {
        /// The item's position in the query.
        index: usize,
    },
    /// A multimodal item whose end `offset + length` does not fit a `u64`.
    #[error("multimodal[{index}]: offset {offset} + length {length} overflows 64 bits")]
    SpanOverflow {
        /// The item's position in the query.
        index: usize,
        /// Its offset.
        offset: u64,
        /// Its length.
        length: u64,
    },
    /// The rules' block size is 0 (a configuration the services refuse at start).
    #[error(transparent)]
    Hash(#[from] TokenHashError),
}

impl TokenQuery {
    /// The canonical sequence hashes this query probes: every full block of `token_ids` under
    /// `rules.block_size` and the request's seed ([`BlockSeed::new`]) with its multimodal
    /// items, exactly as [`sequence_hashes`].
    ///
    /// No tokens, or fewer than one block, give an empty sequence: a query by hashes with no
    /// hashes, answered with depth 0 for every ready lane (a short request is not an error; it
    /// simply matches nothing yet).
    ///
    /// # Errors
    /// [`TokenQueryError`], checked in this order: a block size other than `rules.block_size`,
    /// more than [`TokenQueryRules::max_tokens`] tokens, then per multimodal item (first one at
    /// fault) an empty identifier or an `offset + length` overflow.
    pub fn sequence_hashes(&self, rules: &TokenQueryRules) -> Result<Vec<u64>, TokenQueryError> {
        Ok(self.lazy_sequence_hashes(rules)?.collect())
    }

    /// [`TokenQuery::sequence_hashes`], checked now and hashed as pulled: every check (and so
    /// every error) happens here, before any block is hashed; the iterator then yields the
    /// same hashes one block at a time (for `GlobalCkfIndexer::find_prefix_matches_by_tokens`).
    ///
    /// # Errors
    /// As [`TokenQuery::sequence_hashes`].
    pub fn lazy_sequence_hashes(
        &self,
        rules: &TokenQueryRules,
    ) -> Result<SequenceHashes<'_>, TokenQueryError> {
        if let Some(requested) = self.block_size
            && requested != rules.block_size
        {
            return Err(TokenQueryError::BlockSizeMismatch {
                requested,
                configured: rules.block_size,
            });
        }
        self.hashes_in(rules)
    }

    /// [`TokenQuery::lazy_sequence_hashes`] without the check of the query's own block size
    /// (a domain of several block sizes checks it against all of them).
    pub(crate) fn hashes_in(
        &self,
        rules: &TokenQueryRules,
    ) -> Result<SequenceHashes<'_>, TokenQueryError> {
        if self.token_ids.len() as u64 > rules.max_tokens() {
            return Err(TokenQueryError::TooManyTokens {
                tokens: self.token_ids.len(),
                limit: rules.max_tokens(),
                max_blocks: rules.max_blocks,
                block_size: rules.block_size,
            });
        }
        let spans = self
            .multimodal
            .iter()
            .enumerate()
            .map(|(index, item)| {
                let hash = mm_identifier_hash(&item.identifier)
                    .ok_or(TokenQueryError::EmptyIdentifier { index })?;
                if item.offset.checked_add(item.length).is_none() {
                    return Err(TokenQueryError::SpanOverflow {
                        index,
                        offset: item.offset,
                        length: item.length,
                    });
                }
                Ok(MultimodalSpan {
                    hash,
                    offset: item.offset,
                    length: item.length,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let seed = BlockSeed::new(self.cache_salt.as_deref(), self.lora_name.as_deref());
        Ok(SequenceHashes::new(
            &self.token_ids,
            rules.block_size as usize,
            seed,
            spans,
        )?)
    }
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
    fn lazy_sequence_hashes_are_the_blocks_hashed_and_chained_one_by_one() {
        let tokens: Vec<u32> = (0..103).map(|t| t * 7 + 1).collect();
        let seed = BlockSeed::new(Some("salt"), None);
        // Items inside one block, across a block boundary, past the end, and of length 0.
        let spans = [(3, 2, 11u64), (15, 6, 12), (90, 40, 13), (40, 0, 14)].map(
            |(offset, length, hash)| MultimodalSpan {
                hash,
                offset,
                length,
            },
        );
        for block_size in [1usize, 8, 10, 103, 104] {
            // The oracle: each full block's tokens and overlapping items, hashed and chained
            // here, not by the iterator.
            let mut parent = None;
            let want: Vec<u64> = tokens
                .chunks_exact(block_size)
                .enumerate()
                .map(|(i, block)| {
                    let (start, end) = ((i * block_size) as u64, ((i + 1) * block_size) as u64);
                    let mm: Vec<u64> = spans
                        .iter()
                        .filter(|s| s.length > 0 && s.offset < end && start < s.offset + s.length)
                        .map(|s| s.hash)
                        .collect();
                    let h = chain_step(parent, block_hash(block, &mm, seed));
                    parent = Some(h);
                    h
                })
                .collect();
            let mut lazy = SequenceHashes::new(&tokens, block_size, seed, spans.to_vec()).unwrap();
            assert_eq!(lazy.len(), tokens.len() / block_size);
            // Pulled part way, a clone goes on with the same chain.
            let half: Vec<u64> = lazy.by_ref().take(want.len() / 2).collect();
            assert_eq!(lazy.len(), want.len() - half.len());
            let rest: Vec<u64> = lazy.clone().collect();
            assert_eq!([half, rest].concat(), want, "block size {block_size}");
            assert_eq!(lazy.by_ref().count(), want.len() - want.len() / 2);
            assert_eq!(lazy.next(), None);
            assert_eq!(
                sequence_hashes(&tokens, block_size, seed, &spans).unwrap(),
                want
            );
        }
        assert_eq!(
            SequenceHashes::new(&tokens, 0, seed, Vec::new()).unwrap_err(),
            TokenHashError::ZeroBlockSize
        );
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
        assert!(
            sequence_hashes(&[1, 2, 3], 4, BlockSeed::DEFAULT, &[])
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            sequence_hashes(&[1], 0, BlockSeed::DEFAULT, &[]),
            Err(TokenHashError::ZeroBlockSize)
        );
    }

    fn rules() -> TokenQueryRules {
        TokenQueryRules {
            block_size: 4,
            max_blocks: 3,
        }
    }

    #[test]
    fn a_token_query_hashes_like_sequence_hashes_with_its_seed_and_items() {
        let query = TokenQuery {
            token_ids: (0..12).collect(),
            lora_name: Some("adapter".into()),
            cache_salt: Some("tenant".into()),
            multimodal: vec![MultimodalItem {
                identifier: "img-1".into(),
                offset: 5,
                length: 2,
            }],
            block_size: Some(4),
        };
        let seed = BlockSeed::new(Some("tenant"), Some("adapter"));
        let span = MultimodalSpan {
            hash: xxh3_64(b"img-1"),
            offset: 5,
            length: 2,
        };
        let expected = sequence_hashes(&query.token_ids, 4, seed, &[span]).unwrap();
        assert_eq!(expected.len(), 3);
        assert_eq!(query.sequence_hashes(&rules()), Ok(expected.clone()));
        // The indexer's block size is used when the query names none.
        let query = TokenQuery {
            block_size: None,
            ..query
        };
        assert_eq!(query.sequence_hashes(&rules()), Ok(expected));
        // Short queries are an empty sequence, not an error.
        let short = TokenQuery {
            token_ids: vec![1, 2, 3],
            ..TokenQuery::default()
        };
        assert_eq!(short.sequence_hashes(&rules()), Ok(vec![]));
        assert_eq!(TokenQuery::default().sequence_hashes(&rules()), Ok(vec![]));
    }

    #[test]
    fn a_token_query_is_refused_naming_the_field_at_fault() {
        let ok = TokenQuery {
            token_ids: (0..12).collect(),
            ..TokenQuery::default()
        };
        assert_eq!(ok.sequence_hashes(&rules()).unwrap().len(), 3);
        let wrong_size = TokenQuery {
            block_size: Some(16),
            ..ok.clone()
        };
        // The lazy form checks everything before hashing, with the same errors.
        assert_eq!(
            wrong_size.lazy_sequence_hashes(&rules()).unwrap_err(),
            wrong_size.sequence_hashes(&rules()).unwrap_err()
        );
        let err = wrong_size.sequence_hashes(&rules()).unwrap_err();
        assert_eq!(
            err,
            TokenQueryError::BlockSizeMismatch {
                requested: 16,
                configured: 4
            }
        );
        assert!(err.to_string().contains("block_size 16"), "{err}");
        assert!(err.to_string().contains("block_size 4"), "{err}");

        let long = TokenQuery {
            token_ids: (0..13).collect(),
            ..TokenQuery::default()
        };
        let err = long.sequence_hashes(&rules()).unwrap_err();
        assert!(matches!(
            err,
            TokenQueryError::TooManyTokens {
                tokens: 13,
                limit: 12,
                ..
            }
        ));
        assert!(err.to_string().contains("13 token ids"), "{err}");

        let item = |identifier: &str, offset, length| MultimodalItem {
            identifier: identifier.into(),
            offset,
            length,
        };
        let empty = TokenQuery {
            multimodal: vec![item("a", 0, 1), item("", 0, 1)],
            ..ok.clone()
        };
        assert_eq!(
            empty.sequence_hashes(&rules()),
            Err(TokenQueryError::EmptyIdentifier { index: 1 })
        );
        let overflow = TokenQuery {
            multimodal: vec![item("a", u64::MAX, 1)],
            ..ok.clone()
        };
        assert_eq!(
            overflow.sequence_hashes(&rules()),
            Err(TokenQueryError::SpanOverflow {
                index: 0,
                offset: u64::MAX,
                length: 1
            })
        );
        // The largest span that fits is accepted.
        let edge = TokenQuery {
            multimodal: vec![item("a", u64::MAX - 1, 1)],
            ..ok
        };
        assert!(edge.sequence_hashes(&rules()).is_ok());
        let zero = TokenQueryRules {
            block_size: 0,
            max_blocks: 3,
        };
        assert_eq!(
            TokenQuery::default().sequence_hashes(&zero),
            Err(TokenQueryError::Hash(TokenHashError::ZeroBlockSize))
        );
    }

    #[test]
    fn a_repeated_multimodal_hash_counts_once() {
        let seed = BlockSeed::DEFAULT;
        assert_eq!(
            block_hash(&[1, 2], &[7, 3, 7], seed),
            block_hash(&[1, 2], &[3, 7], seed)
        );
    }

    proptest::proptest! {
        /// The property prefix queries rest on: the hashes of a prefix of a request are a
        /// prefix of the request's hashes, whatever follows, and one changed token changes its
        /// block's hash and every later one (the chain), never an earlier one.
        #[test]
        fn hashes_of_a_prefix_are_a_prefix_and_a_change_propagates_forward(
            tokens in proptest::collection::vec(proptest::prelude::any::<u32>(), 0..200),
            block_size in 1usize..20,
            cut in 0usize..200,
            salt in proptest::option::of("[a-z]{0,4}"),
            lora in proptest::option::of("[a-z]{0,4}"),
            spans in proptest::collection::vec((0u64..220, 0u64..30, 0u64..4), 0..4),
            flip in 0usize..200,
        ) {
            let seed = BlockSeed::new(salt.as_deref(), lora.as_deref());
            let spans: Vec<MultimodalSpan> = spans
                .into_iter()
                .map(|(offset, length, id)| MultimodalSpan { hash: id * 7 + 1, offset, length })
                .collect();
            let all = sequence_hashes(&tokens, block_size, seed, &spans).unwrap();
            proptest::prop_assert_eq!(all.len(), tokens.len() / block_size);
            let cut = cut.min(tokens.len());
            let prefix = sequence_hashes(&tokens[..cut], block_size, seed, &spans).unwrap();
            proptest::prop_assert_eq!(&all[..prefix.len()], &prefix[..]);
            if !tokens.is_empty() {
                let flip = flip % tokens.len();
                let mut changed = tokens.clone();
                changed[flip] ^= 1;
                let other = sequence_hashes(&changed, block_size, seed, &spans).unwrap();
                let block = flip / block_size;
                for i in 0..all.len() {
                    if i < block {
                        proptest::prop_assert_eq!(all[i], other[i], "block {} before the change", i);
                    } else {
                        proptest::prop_assert_ne!(all[i], other[i], "block {} from the change", i);
                    }
                }
            }
        }

        /// The in-place path (no multimodal items, little-endian target) hashes exactly the
        /// definition's bytes: each token id as `u32` little-endian, built here byte by byte,
        /// for any block length and any seed (the published constants above pin a few).
        #[test]
        fn a_block_hashes_its_tokens_little_endian_bytes(
            tokens in proptest::collection::vec(proptest::prelude::any::<u32>(), 0..600),
            seed in proptest::prelude::any::<u64>(),
        ) {
            let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
            proptest::prop_assert_eq!(
                block_hash(&tokens, &[], BlockSeed(seed)),
                xxh3_64_with_seed(&bytes, seed)
            );
        }
    }
}
