//! `Lineage` against a simple exact model: per member, a map engine hash -> canonical hash
//! computed by brute force from the full token chain (`tokens::sequence_hashes` of the whole
//! request prefix), for random store / remove / clear sequences including duplicate stores,
//! chained stores, orphans, several engine hashes per canonical block and unknown removals.
//! The translated events are applied to a per-member set (the state) which must always equal
//! the model's set of canonical hashes.

use std::collections::{BTreeMap, BTreeSet};

use ckf_core::dc::{KvEventKind, MemberId};
use ckf_core::tokens::{self, BlockSeed};
use ckf_engine::event::{EngineEvent, RemovedBlocks, StoredBlocks};
use ckf_engine::filters::EngineFilters;
use ckf_engine::lineage::{Lineage, SkipReason};
use proptest::prelude::*;

const BS: usize = 2;
const SALTS: [Option<&str>; 2] = [None, Some("salt")];

#[derive(Debug, Clone)]
enum Op {
    /// Store blocks `start..` of a request with these tokens (whole blocks), salt and engine
    /// variant (engine-only key: the same tokens under two variants are two engine hashes of
    /// one canonical block).
    Store {
        member: usize,
        tokens: Vec<u32>,
        start: prop::sample::Index,
        salt: usize,
        variant: u8,
    },
    /// Remove some engine hashes seen so far, and maybe one never seen.
    Remove {
        member: usize,
        picks: Vec<prop::sample::Index>,
        unknown: bool,
    },
    Clear {
        member: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..2usize, 1..=4usize, any::<prop::sample::Index>(), 0..2usize, 0..2u8)
            .prop_flat_map(|(member, blocks, start, salt, variant)| {
                prop::collection::vec(0..2u32, blocks * BS).prop_map(move |tokens| Op::Store {
                    member,
                    tokens,
                    start,
                    salt,
                    variant,
                })
            }),
        3 => (0..2usize, prop::collection::vec(any::<prop::sample::Index>(), 1..4), any::<bool>())
            .prop_map(|(member, picks, unknown)| Op::Remove { member, picks, unknown }),
        1 => (0..2usize).prop_map(|member| Op::Clear { member }),
    ]
}

/// The engine's own hash of block `k` (last block of `prefix`): any injective-enough function
/// of (variant, salt, whole prefix) will do.
fn engine_hash(variant: u8, salt: usize, prefix: &[u32]) -> u64 {
    let mut bytes = vec![variant, salt as u8];
    for t in prefix {
        bytes.extend(t.to_le_bytes());
    }
    fnv1a(&bytes)
}

/// A tiny FNV-1a (64-bit) so the test needs no extra dependency; collisions on these short
/// inputs are not expected (and would show as a failing `Conflict`).
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn members() -> [MemberId; 2] {
    [MemberId::new(3, 0), MemberId::new(3, 1)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn lineage_matches_the_exact_model(ops in prop::collection::vec(op(), 1..60)) {
        let filters = EngineFilters { block_size: BS as u32, ..EngineFilters::default() };
        let mut lineage = Lineage::new();
        let mut model: [BTreeMap<u64, u64>; 2] = Default::default();
        let mut state: [BTreeSet<u64>; 2] = Default::default();
        let mut seen: Vec<u64> = vec![];
        for op in ops {
            match op {
                Op::Store { member, tokens, start, salt, variant } => {
                    let m = members()[member];
                    let blocks = tokens.len() / BS;
                    let start = start.index(blocks);
                    let seed = BlockSeed::new(SALTS[salt], None);
                    let canon = tokens::sequence_hashes(&tokens, BS, seed, &[]).unwrap();
                    let engine: Vec<u64> = (0..blocks)
                        .map(|k| engine_hash(variant, salt, &tokens[..(k + 1) * BS]))
                        .collect();
                    seen.extend(&engine);
                    let parent = start.checked_sub(1).map(|p| engine[p]);
                    let event = EngineEvent::Stored(StoredBlocks {
                        block_hashes: engine[start..].to_vec(),
                        parent,
                        token_ids: tokens[start * BS..].to_vec(),
                        block_size: BS as u32,
                        // sent on every store (SGLang does): ignored when there is a parent
                        cache_salt: SALTS[salt].map(Into::into),
                        ..StoredBlocks::default()
                    });
                    let t = lineage.translate(m, &event, &filters);
                    let orphan = parent.is_some_and(|p| !model[member].contains_key(&p));
                    if orphan {
                        prop_assert_eq!(t.kv_event, None);
                        prop_assert_eq!(t.skipped, vec![(SkipReason::Orphan, (blocks - start) as u32)]);
                    } else {
                        prop_assert!(t.skipped.is_empty(), "{:?}", t.skipped);
                        for k in start..blocks {
                            model[member].entry(engine[k]).or_insert(canon[k]);
                        }
                        let ev = t.kv_event.expect("a store");
                        prop_assert_eq!(ev.member, m);
                        let KvEventKind::Stored { block_hashes, parent_hash } = ev.kind else {
                            panic!("not a store")
                        };
                        prop_assert_eq!(&block_hashes, &canon[start..].to_vec());
                        prop_assert_eq!(parent_hash, start.checked_sub(1).map(|p| canon[p]));
                        state[member].extend(block_hashes);
                    }
                }
                Op::Remove { member, picks, unknown } => {
                    let m = members()[member];
                    let mut hashes: Vec<u64> = if seen.is_empty() {
                        vec![]
                    } else {
                        picks.iter().map(|i| seen[i.index(seen.len())]).collect()
                    };
                    if unknown {
                        hashes.push(0xdead_beef);
                    }
                    let event = EngineEvent::Removed(RemovedBlocks {
                        block_hashes: hashes.clone(),
                        ..RemovedBlocks::default()
                    });
                    let t = lineage.translate(m, &event, &filters);
                    let mut unknown_n = 0;
                    for h in &hashes {
                        if model[member].remove(h).is_none() {
                            unknown_n += 1;
                        }
                    }
                    let want_skipped = if unknown_n > 0 {
                        vec![(SkipReason::UnknownRemoval, unknown_n)]
                    } else {
                        vec![]
                    };
                    prop_assert_eq!(t.skipped, want_skipped);
                    if let Some(ev) = t.kv_event {
                        let KvEventKind::Removed { block_hashes } = ev.kind else {
                            panic!("not a removal")
                        };
                        prop_assert!(!block_hashes.is_empty());
                        for c in block_hashes {
                            // exact: only held blocks are removed, each once
                            prop_assert!(state[member].remove(&c), "removed {c:#x} not held");
                        }
                    }
                }
                Op::Clear { member } => {
                    let m = members()[member];
                    let t = lineage.translate(m, &EngineEvent::AllCleared, &filters);
                    prop_assert_eq!(t.kv_event.map(|e| e.kind), Some(KvEventKind::Cleared));
                    model[member].clear();
                    state[member].clear();
                }
            }
            for (i, m) in members().into_iter().enumerate() {
                let held: BTreeSet<u64> = model[i].values().copied().collect();
                prop_assert_eq!(&state[i], &held, "member {}", i);
                prop_assert_eq!(lineage.len(m), model[i].len());
                for (e, c) in &model[i] {
                    prop_assert_eq!(lineage.lookup(m, *e).map(|x| x.0), Some(*c));
                }
            }
            let with_blocks: Vec<MemberId> = members()
                .into_iter()
                .enumerate()
                .filter(|(i, _)| !model[*i].is_empty())
                .map(|(_, m)| m)
                .collect();
            prop_assert_eq!(lineage.members(), with_blocks);
        }
    }
}
