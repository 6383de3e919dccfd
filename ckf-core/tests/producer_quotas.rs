//! Ingest quotas of `DcCkfState::apply_from` against a simple exact model (`ckf_core::dc::quota`).
//!
//! Random stored / removed / cleared events from three sources over four members and 48 block
//! hashes, plus engine-path stores (`apply`, charged to nobody), on a table far larger than the
//! blocks (no capacity omission, so the model needs none), with small random limits so every
//! refusal happens. After every operation: the refusal (or the outcome's applied count) equals
//! the model's, every member owns what the model says, every source holds exactly the blocks of
//! the members charged to it, and the charge table has one entry per source holding blocks.
//! Then: clearing everything leaves no charge entry and the maps give their memory back.

use std::collections::{BTreeMap, BTreeSet};

use ckf_core::TableFormat;
use ckf_core::dc::{DcCkfConfig, DcCkfState, KvEvent, KvEventKind, MemberId, QuotaError, Quotas};
use proptest::prelude::*;

const SOURCES: [&str; 3] = ["src-a", "src-b", "src-c"];
const MEMBERS: u64 = 4;
const HASHES: u64 = 48;

fn state(quotas: Quotas) -> DcCkfState {
    let mut s = DcCkfState::new(DcCkfConfig::new(TableFormat::new(1 << 15, 7).unwrap())).unwrap();
    s.set_quotas(quotas);
    s
}

fn hash(i: u64) -> u64 {
    // Spread the small indices over the 64-bit space (any distinct values would do).
    (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

#[derive(Debug, Clone)]
enum Op {
    Store(usize, u64, Vec<u64>),
    Remove(usize, u64, Vec<u64>),
    Clear(usize, u64),
    EngineStore(u64, Vec<u64>),
}

fn op() -> impl Strategy<Value = Op> {
    let hashes = || proptest::collection::vec(0..HASHES, 0..12);
    prop_oneof![
        5 => (0..SOURCES.len(), 0..MEMBERS, hashes()).prop_map(|(s, m, h)| Op::Store(s, m, h)),
        2 => (0..SOURCES.len(), 0..MEMBERS, hashes()).prop_map(|(s, m, h)| Op::Remove(s, m, h)),
        1 => (0..SOURCES.len(), 0..MEMBERS).prop_map(|(s, m)| Op::Clear(s, m)),
        1 => (0..MEMBERS, hashes()).prop_map(|(m, h)| Op::EngineStore(m, h)),
    ]
}

/// The exact model: owned sets and member -> charged source.
#[derive(Default)]
struct Model {
    owned: BTreeMap<u64, BTreeSet<u64>>,
    charge: BTreeMap<u64, &'static str>,
}

impl Model {
    fn held(&self, source: &str) -> u64 {
        self.charge
            .iter()
            .filter(|(_, s)| **s == source)
            .map(|(m, _)| self.owned.get(m).map_or(0, |o| o.len() as u64))
            .sum()
    }

    fn forget_if_empty(&mut self, m: u64) {
        if self.owned.get(&m).is_none_or(BTreeSet::is_empty) {
            self.owned.remove(&m);
            self.charge.remove(&m);
        }
    }

    /// The model's answer to a stored event from `source`: refusal, or the edges added.
    fn store(
        &mut self,
        q: &Quotas,
        source: &'static str,
        m: u64,
        hashes: &[u64],
    ) -> Result<u32, QuotaError> {
        if q.max_blocks_per_event > 0 && hashes.len() > q.max_blocks_per_event as usize {
            return Err(QuotaError::EventTooLarge {
                index: None,
                blocks: hashes.len(),
                max: q.max_blocks_per_event,
            });
        }
        let owned = self.owned.get(&m).cloned().unwrap_or_default();
        let fresh: BTreeSet<u64> = hashes
            .iter()
            .copied()
            .filter(|h| !owned.contains(h))
            .collect();
        let adding = fresh.len() as u64;
        if adding > 0 {
            let held_m = owned.len() as u64;
            if q.max_blocks_per_member > 0 && held_m + adding > u64::from(q.max_blocks_per_member) {
                return Err(QuotaError::MemberFull {
                    member: MemberId::new(m, 0),
                    held: held_m,
                    adding,
                    max: q.max_blocks_per_member,
                });
            }
            if q.max_blocks_per_source > 0 {
                let (charged, extra) = match self.charge.get(&m) {
                    Some(c) => (*c, 0),
                    None => (source, held_m),
                };
                let held = self.held(charged);
                if held + adding + extra > q.max_blocks_per_source {
                    return Err(QuotaError::SourceFull {
                        source_id: charged.into(),
                        held,
                        adding: adding + extra,
                        max: q.max_blocks_per_source,
                    });
                }
            }
        }
        let set = self.owned.entry(m).or_default();
        set.extend(fresh.iter().copied());
        if !set.is_empty() {
            self.charge.entry(m).or_insert(source);
        }
        self.forget_if_empty(m);
        Ok(adding as u32)
    }
}

fn stored(m: u64, h: &[u64]) -> KvEvent {
    KvEvent {
        member: MemberId::new(m, 0),
        kind: KvEventKind::Stored {
            block_hashes: h.iter().map(|&i| hash(i)).collect(),
            parent_hash: None,
        },
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn quotas_match_the_exact_model(
        per_event in 0u32..14,
        per_member in 0u32..30,
        per_source in 0u64..60,
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        let q = Quotas {
            max_blocks_per_event: per_event,
            max_blocks_per_batch: 0,
            max_blocks_per_member: per_member,
            max_blocks_per_source: per_source,
            max_ranks_per_worker: 0,
        };
        let mut s = state(q);
        let mut model = Model::default();
        for op in &ops {
            match op {
                Op::Store(src, m, h) => {
                    let expect = model.store(&q, SOURCES[*src], *m, h);
                    let got = s.apply_from(SOURCES[*src], &stored(*m, h));
                    if let Ok(o) = &got {
                        prop_assert_eq!(o.omitted, 0);
                    }
                    let got = got.map(|o| o.applied);
                    prop_assert_eq!(got, expect, "{:?}", op);
                }
                Op::Remove(src, m, h) => {
                    let event = KvEvent {
                        member: MemberId::new(*m, 0),
                        kind: KvEventKind::Removed { block_hashes: h.iter().map(|&i| hash(i)).collect() },
                    };
                    let got = s.apply_from(SOURCES[*src], &event);
                    if per_event > 0 && h.len() > per_event as usize {
                        prop_assert!(matches!(got, Err(QuotaError::EventTooLarge { .. })), "{:?}", got);
                    } else {
                        let owned = model.owned.entry(*m).or_default();
                        let before = owned.len();
                        for i in h { owned.remove(i); }
                        let removed = (before - owned.len()) as u32;
                        model.forget_if_empty(*m);
                        prop_assert_eq!(got.map(|o| o.applied), Ok(removed));
                    }
                }
                Op::Clear(src, m) => {
                    let event = KvEvent { member: MemberId::new(*m, 0), kind: KvEventKind::Cleared };
                    let expect = model.owned.remove(m).map_or(0, |o| o.len() as u32);
                    model.charge.remove(m);
                    prop_assert_eq!(s.apply_from(SOURCES[*src], &event).map(|o| o.applied), Ok(expect));
                }
                Op::EngineStore(m, h) => {
                    // The trusted path: no quota, no charge.
                    let set = model.owned.entry(*m).or_default();
                    let before = set.len();
                    set.extend(h.iter().copied());
                    let added = (set.len() - before) as u32;
                    model.forget_if_empty(*m);
                    prop_assert_eq!(s.apply(&stored(*m, h)).applied, added);
                }
            }
            for m in 0..MEMBERS {
                let expect = model.owned.get(&m).map_or(0, |o| o.len() as u32);
                prop_assert_eq!(s.member_owned(MemberId::new(m, 0)), expect, "member {}", m);
            }
            for src in SOURCES {
                prop_assert_eq!(s.source_held(src), model.held(src), "source {}", src);
            }
            let charged: BTreeSet<&str> = model
                .charge
                .iter()
                .filter(|(m, _)| model.owned.contains_key(m))
                .map(|(_, s)| *s)
                .collect();
            prop_assert_eq!(s.charged_sources(), charged.len());
            let mut holdings: Vec<(String, u64)> =
                s.source_holdings().map(|(id, h)| (id.to_owned(), h)).collect();
            holdings.sort();
            let expect: Vec<(String, u64)> =
                charged.iter().map(|c| ((*c).to_owned(), model.held(c))).collect();
            prop_assert_eq!(holdings, expect);
        }
        for m in 0..MEMBERS {
            s.clear_member(MemberId::new(m, 0));
        }
        prop_assert_eq!(s.charged_sources(), 0);
        prop_assert_eq!(s.stats().unique_blocks, 0);
    }
}

#[test]
fn one_source_is_refused_while_another_proceeds() {
    let mut s = state(Quotas {
        max_blocks_per_source: 10,
        ..Quotas::UNLIMITED
    });
    let ten: Vec<u64> = (0..10).collect();
    assert_eq!(s.apply_from("a", &stored(1, &ten)).unwrap().applied, 10);
    // Re-storing what the member owns is free.
    assert_eq!(s.apply_from("a", &stored(1, &ten)).unwrap().redundant, 10);
    let e = s.apply_from("a", &stored(2, &[20])).unwrap_err();
    assert_eq!(
        e,
        QuotaError::SourceFull {
            source_id: "a".into(),
            held: 10,
            adding: 1,
            max: 10
        }
    );
    // Nothing of the refused event was applied.
    assert_eq!(s.member_owned(MemberId::new(2, 0)), 0);
    assert_eq!(s.stats().unique_blocks, 10);
    // Another source proceeds, even into the same blocks.
    assert_eq!(s.apply_from("b", &stored(3, &ten)).unwrap().applied, 10);
    // Member 1 is charged to "a": "b" storing into it spends "a"'s quota.
    assert!(matches!(
        s.apply_from("b", &stored(1, &[30])),
        Err(QuotaError::SourceFull { ref source_id, .. }) if source_id == "a"
    ));
    // Freeing blocks makes room again.
    s.apply_from(
        "a",
        &KvEvent {
            member: MemberId::new(1, 0),
            kind: KvEventKind::Removed {
                block_hashes: vec![hash(0)],
            },
        },
    )
    .unwrap();
    assert_eq!(s.source_held("a"), 9);
    assert_eq!(s.apply_from("a", &stored(2, &[20])).unwrap().applied, 1);
    assert_eq!(s.source_held("a"), 10);
}

/// `max_ranks_per_worker` counts the ranks of a worker owning blocks: a new rank past it is
/// refused whole, a rank already owning blocks and other workers are not, and a rank that
/// owns nothing again (its blocks removed, or the worker removed, even before the sweep got
/// to its blocks) makes room.
#[test]
fn ranks_per_worker_are_bounded() {
    let mut s = state(Quotas {
        max_ranks_per_worker: 3,
        ..Quotas::UNLIMITED
    });
    let rank = |w: u64, r: u32, blocks: &[u64]| KvEvent {
        member: MemberId::new(w, r),
        kind: KvEventKind::Stored {
            block_hashes: blocks.to_vec(),
            parent_hash: None,
        },
    };
    for r in 0..3 {
        assert_eq!(
            s.apply_from("a", &rank(1, r, &[u64::from(r)]))
                .unwrap()
                .applied,
            1
        );
    }
    let refused = QuotaError::WorkerRanks {
        worker_id: 1,
        dp_rank: 3,
        ranks: 3,
        max: 3,
    };
    assert_eq!(s.apply_from("a", &rank(1, 3, &[9])).unwrap_err(), refused);
    assert!(
        refused.to_string().contains("max_ranks_per_worker is 3"),
        "{refused}"
    );
    assert_eq!(refused.limit(), "max_ranks_per_worker");
    assert_eq!(s.member_owned(MemberId::new(1, 3)), 0);
    // An owning rank stores more; another worker has its own count.
    assert_eq!(s.apply_from("a", &rank(1, 0, &[10])).unwrap().applied, 1);
    assert_eq!(s.apply_from("a", &rank(2, 7, &[11])).unwrap().applied, 1);
    // Rank 1 owns nothing again: room for rank 3.
    s.remove(MemberId::new(1, 1), &[1]);
    assert_eq!(s.apply_from("a", &rank(1, 3, &[9])).unwrap().applied, 1);
    // The worker removed: its ranks no longer count.
    s.remove_worker(1);
    for r in 10..13 {
        assert_eq!(
            s.apply_from("a", &rank(1, r, &[u64::from(r)]))
                .unwrap()
                .applied,
            1
        );
    }
    assert!(s.apply_from("a", &rank(1, 13, &[13])).is_err());
    // The trusted engine path is not bounded.
    assert_eq!(s.apply(&rank(1, 14, &[14])).applied, 1);
}

#[test]
fn member_limit_counts_distinct_new_blocks() {
    let mut s = state(Quotas {
        max_blocks_per_member: 3,
        ..Quotas::UNLIMITED
    });
    // Duplicates inside one event are one new block.
    assert_eq!(
        s.apply_from("a", &stored(1, &[1, 1, 2, 2]))
            .unwrap()
            .applied,
        2
    );
    assert_eq!(
        s.apply_from("a", &stored(1, &[1, 2, 3])).unwrap().applied,
        1
    );
    assert_eq!(
        s.apply_from("a", &stored(1, &[1, 4])).unwrap_err(),
        QuotaError::MemberFull {
            member: MemberId::new(1, 0),
            held: 3,
            adding: 1,
            max: 3
        }
    );
    // Another member of the same source is not affected.
    assert_eq!(
        s.apply_from("a", &stored(2, &[4, 5, 6])).unwrap().applied,
        3
    );
}

#[test]
fn engine_members_are_taken_over_whole() {
    let mut s = state(Quotas {
        max_blocks_per_source: 5,
        ..Quotas::UNLIMITED
    });
    s.apply(&stored(1, &[1, 2, 3, 4]));
    assert_eq!(s.charged_sources(), 0);
    // Storing into it would charge its 4 blocks plus 2 new ones to "a": 6 > 5.
    assert_eq!(
        s.apply_from("a", &stored(1, &[5, 6])).unwrap_err(),
        QuotaError::SourceFull {
            source_id: "a".into(),
            held: 0,
            adding: 6,
            max: 5
        }
    );
    assert_eq!(s.apply_from("a", &stored(1, &[5])).unwrap().applied, 1);
    assert_eq!(s.source_held("a"), 5);
}

#[test]
fn memory_is_returned_after_churn() {
    let mut s = state(Quotas::UNLIMITED);
    // 64 members x 256 blocks, two owners for half of the blocks; every member then cleared.
    let churn = |s: &mut DcCkfState| {
        for m in 0..64u64 {
            let hashes: Vec<u64> = (0..256).map(|i| hash(m * 128 + i) ^ 0x55).collect();
            s.apply_from(&format!("src-{m}"), &stored(m, &hashes))
                .unwrap();
        }
        s.take_batch();
        let full = s.stats().bytes_used;
        for m in 0..64u64 {
            s.clear_member(MemberId::new(m, 0));
        }
        s.take_batch();
        full
    };
    // The first round also sizes the publication scratch space (kept on purpose).
    churn(&mut s);
    let baseline = s.stats().bytes_used;
    let full = churn(&mut s);
    // ~8,300 tracked blocks at 18-27 bytes each in the block map, plus members and charges.
    assert!(full > baseline + 150_000, "{baseline} -> {full}");
    let after = s.stats();
    assert_eq!((after.unique_blocks, after.members), (0, 0));
    assert_eq!(s.charged_sources(), 0);
    // The exact maps, member records and charge table are all given back.
    assert_eq!(
        after.bytes_used, baseline,
        "baseline {baseline}, full {full}, after clearing {}",
        after.bytes_used
    );
}

#[test]
fn shrinking_has_hysteresis() {
    let mut s = state(Quotas::UNLIMITED);
    let big: Vec<u64> = (0..20_000).map(hash).collect();
    s.store(MemberId::new(1, 0), &big);
    let full = s.stats().bytes_used;
    // Removing a little keeps the capacity (no rehash on every removal).
    s.remove(MemberId::new(1, 0), &big[..2_000]);
    assert_eq!(s.stats().bytes_used, full);
    // Removing most of it gives memory back.
    s.remove(MemberId::new(1, 0), &big[2_000..19_000]);
    let sparse = s.stats().bytes_used;
    // The block map (32,368 slots of 16 bytes, 518 KB, for 20,000 blocks) went down to 2,000
    // slots (32 KB); the table, undo log and dirty tracker (fixed) stay.
    assert!(full - sparse > 450_000, "{full} -> {sparse}");
    // A store that refills a little does not grow it back at once.
    s.store(MemberId::new(1, 0), &big[2_000..2_500]);
    assert_eq!(s.stats().bytes_used, sparse);
}
