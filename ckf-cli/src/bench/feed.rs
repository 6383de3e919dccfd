//! The token feed: trace requests as the tokens and engine events a real vLLM engine would
//! produce, for `--feed zmq`.
//!
//! Rules (all deterministic, documented so a run can be reproduced):
//! - **Tokens.** One trace block id `b` stands for one KV block of `block_size` tokens; token `i`
//!   of it is `splitmix64(b * 2^16 + i) mod 2^31` (vLLM-sized ids, no reserved value). A request
//!   is the concatenation of its blocks' tokens, so two requests share `k` leading blocks'
//!   tokens exactly when they share `k` leading block ids.
//! - **Canonical hashes.** The request's canonical hashes are
//!   [`ckf_core::tokens::sequence_hashes`] of its tokens (no salt, LoRA or multimodal items):
//!   what the producers' lineage derives from the events' tokens and what
//!   `FindMatchesByTokens` probes. The fleet simulator and its exact oracle run on these.
//! - **Engine hashes.** The publisher's block hash is deliberately not the canonical one, as a
//!   real engine's is not: the last 8 bytes (big-endian) of xxh3-128 over the parent's engine
//!   hash and the block's tokens (little-endian), the root's parent being a fixed `NONE_HASH`.
//!   This mirrors vLLM's `--prefix-caching-hash-algo xxhash` chaining and its conversion of a
//!   digest to a 64-bit external hash (`maybe_convert_block_hash`), so the demo only answers
//!   right if the producers translate engine hashes into the canonical space.

use std::collections::HashMap;

use anyhow::{Context, Result};
use ckf_core::tokens::{BlockSeed, sequence_hashes};
use ckf_engine::encode::{Batch, BlockRemoved, BlockStored, Event};
use xxhash_rust::xxh3::xxh3_128;

use crate::bench::fleet::Served;

/// The engine hash a root block chains from (any fixed value; vLLM derives its own at start).
pub const NONE_HASH: u64 = 0x6e6f_6e65_5f68_6173;
/// The storage tier the feed publishes (the producers' default filter admits it).
pub const MEDIUM: &str = "GPU";

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The `block_size` tokens trace block id `id` stands for (see the module rules).
pub fn block_tokens(id: u64, block_size: u32) -> Vec<u32> {
    (0..u64::from(block_size))
        .map(|i| (splitmix64(id.wrapping_shl(16).wrapping_add(i)) % (1 << 31)) as u32)
        .collect()
}

/// The engine-side hash of a block (see the module rules): not the canonical hash.
pub fn engine_hash(parent: Option<u64>, tokens: &[u32]) -> u64 {
    let mut bytes = Vec::with_capacity(8 + 4 * tokens.len());
    bytes.extend_from_slice(&parent.unwrap_or(NONE_HASH).to_le_bytes());
    for t in tokens {
        bytes.extend_from_slice(&t.to_le_bytes());
    }
    // The digest's last 8 bytes, big-endian, are its low 64 bits.
    xxh3_128(&bytes) as u64
}

/// One request in token form.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenRequest {
    /// Its tokens, `block_size` per trace block.
    pub tokens: Vec<u32>,
    /// Canonical (sequence) hashes, one per block.
    pub canonical: Vec<u64>,
}

#[derive(Debug, Clone, Copy)]
struct KnownBlock {
    id: u64,
    engine: u64,
}

/// Maps trace requests to tokens and canonical hashes, and a serve's block changes to vLLM
/// events with engine hashes.
#[derive(Debug)]
pub struct TokenFeed {
    block_size: u32,
    /// canonical hash -> the block's trace id and engine hash (the same content always gets
    /// the same canonical and engine hash, so one global map serves every rank).
    blocks: HashMap<u64, KnownBlock>,
}

impl TokenFeed {
    /// A feed of `block_size`-token blocks (must be at least 1).
    ///
    /// # Errors
    /// A zero block size.
    pub fn new(block_size: u32) -> Result<Self> {
        anyhow::ensure!(block_size >= 1, "the block size must be at least 1 token");
        Ok(Self {
            block_size,
            blocks: HashMap::new(),
        })
    }

    /// Tokens per block.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// The request of trace block ids `hash_ids` in token form; remembers its blocks for
    /// [`TokenFeed::events`].
    ///
    /// # Errors
    /// None in practice (the block size is checked at construction).
    pub fn request(&mut self, hash_ids: &[u64]) -> Result<TokenRequest> {
        let tokens: Vec<u32> = hash_ids
            .iter()
            .flat_map(|&id| block_tokens(id, self.block_size))
            .collect();
        let canonical = sequence_hashes(&tokens, self.block_size as usize, BlockSeed::DEFAULT, &[])
            .context("canonical hashes of a feed request")?;
        let mut parent = None;
        for (&id, &hash) in hash_ids.iter().zip(&canonical) {
            let known = *self.blocks.entry(hash).or_insert_with(|| KnownBlock {
                id,
                engine: engine_hash(parent, &block_tokens(id, self.block_size)),
            });
            parent = Some(known.engine);
        }
        Ok(TokenRequest { tokens, canonical })
    }

    /// The engine hash of a canonical hash seen in an earlier [`TokenFeed::request`].
    pub fn engine_of(&self, canonical: u64) -> Option<u64> {
        self.blocks.get(&canonical).map(|b| b.engine)
    }

    /// A serve's changes as vLLM events, in the order they happened on the rank: one
    /// `BlockRemoved` for the evictions, then one `BlockStored` per run (parent, engine hashes
    /// and tokens). `None` when the serve changed nothing. Blocks never seen in a request are
    /// a caller bug and are left out.
    pub fn events(&self, served: &Served) -> Vec<Event> {
        let mut events = Vec::with_capacity(1 + served.stored.len());
        if !served.evicted.is_empty() {
            events.push(Event::Removed(BlockRemoved {
                block_hashes: served
                    .evicted
                    .iter()
                    .filter_map(|&h| self.engine_of(h))
                    .collect(),
                medium: Some(MEDIUM.into()),
                ..BlockRemoved::default()
            }));
        }
        for run in &served.stored {
            let blocks: Vec<KnownBlock> = run
                .hashes
                .iter()
                .filter_map(|h| self.blocks.get(h).copied())
                .collect();
            events.push(Event::Stored(BlockStored {
                block_hashes: blocks.iter().map(|b| b.engine).collect(),
                parent_block_hash: run.parent.and_then(|p| self.engine_of(p)),
                token_ids: blocks
                    .iter()
                    .flat_map(|b| block_tokens(b.id, self.block_size))
                    .collect(),
                block_size: self.block_size,
                medium: Some(MEDIUM.into()),
                ..BlockStored::default()
            }));
        }
        events
    }

    /// [`TokenFeed::events`] as one batch of rank `rank` at time `ts` (seconds).
    pub fn batch(&self, served: &Served, rank: usize, ts: f64) -> Batch {
        Batch {
            ts,
            events: self.events(served),
            data_parallel_rank: Some(rank as i64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::fleet::{RankId, StoredRun};
    use ckf_core::dc::KvEventKind;
    use ckf_engine::encode::{Layout, encode_batch};
    use ckf_engine::event::EngineEvent;
    use ckf_engine::filters::EngineFilters;
    use ckf_engine::lineage::Lineage;

    #[test]
    fn shared_ids_share_tokens_and_canonical_prefixes_only() {
        let mut feed = TokenFeed::new(4).unwrap();
        let a = feed.request(&[1, 2, 3]).unwrap();
        let b = feed.request(&[1, 2, 9]).unwrap();
        let c = feed.request(&[2, 1]).unwrap();
        assert_eq!(a.tokens.len(), 12);
        assert_eq!(a.tokens[..8], b.tokens[..8]);
        assert_eq!(a.canonical[..2], b.canonical[..2]);
        assert_ne!(a.canonical[2], b.canonical[2]);
        // Same block id, different prefix: a different block.
        assert_ne!(c.canonical[1], a.canonical[0]);
        for h in a.canonical.iter().chain(&b.canonical) {
            let engine = feed.engine_of(*h).unwrap();
            assert_ne!(engine, *h, "engine hashes are not canonical");
        }
    }

    /// The engine events, decoded by the producer's own rules (wire + lineage), land on the
    /// canonical hashes the oracle uses.
    #[test]
    fn decoded_and_translated_events_are_the_canonical_blocks() {
        let mut feed = TokenFeed::new(16).unwrap();
        let first = feed.request(&[10, 11, 12]).unwrap();
        let second = feed.request(&[10, 11, 13, 14]).unwrap();
        let rank_id = RankId {
            dc: 0,
            worker: 1,
            rank: 1,
        };
        let served = |evicted: Vec<u64>, stored: Vec<StoredRun>| Served {
            rank_id,
            dc_seq: 1,
            requested: 0,
            reused: 0,
            evicted,
            stored,
        };
        let steps = [
            served(
                vec![],
                vec![StoredRun {
                    parent: None,
                    hashes: first.canonical.clone(),
                }],
            ),
            served(
                vec![first.canonical[2]],
                vec![StoredRun {
                    parent: Some(second.canonical[1]),
                    hashes: second.canonical[2..].to_vec(),
                }],
            ),
        ];
        let mut lineage = Lineage::new();
        let filters = EngineFilters {
            block_size: 16,
            ..EngineFilters::default()
        };
        let member = ckf_core::dc::MemberId {
            worker_id: 1,
            dp_rank: 1,
        };
        let mut held = std::collections::BTreeSet::new();
        for step in &steps {
            let bytes = encode_batch(&feed.batch(step, 1, 0.0), Layout::Tagged);
            let batch = ckf_engine::wire::decode_batch(&bytes, &Default::default()).unwrap();
            assert_eq!(batch.dp_rank, Some(1));
            for event in &batch.events {
                assert!(!matches!(event, EngineEvent::Unknown { .. }));
                let t = lineage.translate(member, event, &filters);
                assert!(t.skipped.is_empty(), "{:?}", t.skipped);
                let kv = t.kv_event.expect("an event");
                assert_eq!(kv.member, member);
                match kv.kind {
                    KvEventKind::Stored { block_hashes, .. } => held.extend(block_hashes),
                    KvEventKind::Removed { block_hashes } => {
                        for h in block_hashes {
                            held.remove(&h);
                        }
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
        let expected: std::collections::BTreeSet<u64> = [
            first.canonical[0],
            first.canonical[1],
            second.canonical[2],
            second.canonical[3],
        ]
        .into();
        assert_eq!(held, expected);
    }
}
