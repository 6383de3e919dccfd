//! `DcCkfState::prefetch_next` is a hint: it may change how fast events apply, never what they
//! do. Random store / remove sequences over 4 members are applied to two states of the same
//! large table (2^20 buckets: the size from which the hint is taken), one without hints and
//! one with a hint before every event: the next event's blocks (the intended use), a wrong
//! list, a list shorter or longer than the prefetch ring, or none. After every event both
//! outcomes must be equal; at the end the two tables (every bucket word), the statistics, the
//! ownership and the publication batch must be equal too. A hint that carried a block's
//! located position into the wrong block would put a fingerprint into the wrong bucket pair
//! and show up as a differing table.

use ckf_core::TableFormat;
use ckf_core::addressing::fmix64;
use ckf_core::dc::{DcCkfConfig, DcCkfState, MemberId};
use proptest::prelude::*;

const BUCKETS: u64 = 1 << 20;
const HASHES: u64 = 300;

#[derive(Debug, Clone)]
enum Hint {
    /// The next event's blocks (the producer's own use).
    Next,
    /// Blocks no event names next.
    Wrong(Vec<u64>),
    /// No hint before this event.
    None,
}

#[derive(Debug, Clone)]
struct Step {
    store: bool,
    member: u32,
    blocks: Vec<u64>,
    hint: Hint,
}

fn hash(i: u64) -> u64 {
    fmix64(i ^ 0x10_0CA1)
}

fn step() -> impl Strategy<Value = Step> {
    (
        any::<bool>(),
        0..4u32,
        // 0-20 blocks: events shorter and longer than the 8-block prefetch ring.
        prop::collection::vec(0..HASHES, 0..20),
        prop_oneof![
            3 => Just(Hint::Next),
            1 => prop::collection::vec(any::<u64>(), 0..12).prop_map(Hint::Wrong),
            1 => Just(Hint::None),
        ],
    )
        .prop_map(|(store, member, blocks, hint)| Step {
            store,
            member,
            blocks: blocks.into_iter().map(hash).collect(),
            hint,
        })
}

fn apply(state: &mut DcCkfState, s: &Step) -> ckf_core::dc::EventOutcome {
    let member = MemberId::new(u64::from(s.member), 0);
    if s.store {
        state.store(member, &s.blocks)
    } else {
        state.remove(member, &s.blocks)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn hints_change_no_outcome_and_no_table_word(steps in prop::collection::vec(step(), 1..80)) {
        let format = TableFormat::new(BUCKETS, 0x00C0_FFEE).unwrap();
        let mut plain = DcCkfState::new(DcCkfConfig::new(format)).unwrap();
        let mut hinted = DcCkfState::new(DcCkfConfig::new(format)).unwrap();
        for (i, s) in steps.iter().enumerate() {
            match &s.hint {
                Hint::Next => {
                    if let Some(next) = steps.get(i + 1) {
                        hinted.prefetch_next(&next.blocks);
                    }
                }
                Hint::Wrong(blocks) => hinted.prefetch_next(blocks),
                Hint::None => {}
            }
            prop_assert_eq!(apply(&mut plain, s), apply(&mut hinted, s), "event {}", i);
        }
        prop_assert!(plain.buckets() == hinted.buckets(), "the tables differ");
        prop_assert_eq!(plain.stats(), hinted.stats());
        for m in 0..4 {
            let member = MemberId::new(m, 0);
            prop_assert_eq!(plain.member_blocks(member), hinted.member_blocks(member));
        }
        for h in 0..HASHES {
            prop_assert_eq!(plain.refcount(hash(h)), hinted.refcount(hash(h)));
        }
        // (The batches' oldest-change instants are each state's own clock reads.)
        let images = |s: &mut DcCkfState| s.take_batch().map(|b| (b.images, b.cycles_broken));
        prop_assert_eq!(images(&mut plain), images(&mut hinted));
    }
}

/// The hint is taken on a table of 2^20 buckets: a hinted event's blocks end up exactly where
/// an unhinted state puts them, including when the hinted event is shorter than the ring and
/// when the next event repeats the hinted blocks in another order.
#[test]
fn a_hinted_stream_of_events_lands_like_an_unhinted_one() {
    let format = TableFormat::new(BUCKETS, 7).unwrap();
    let mut plain = DcCkfState::new(DcCkfConfig::new(format)).unwrap();
    let mut hinted = DcCkfState::new(DcCkfConfig::new(format)).unwrap();
    let events: Vec<Vec<u64>> = (0..200u64)
        .map(|e| (0..(e % 19)).map(|b| hash(e * 31 + b)).collect())
        .collect();
    for (i, blocks) in events.iter().enumerate() {
        if let Some(next) = events.get(i + 1) {
            // Every third hint names the next event's blocks reversed: located, but not the
            // ring's order, so nothing carried may be reused for the wrong block.
            let mut hint = next.clone();
            if i % 3 == 0 {
                hint.reverse();
            }
            hinted.prefetch_next(&hint);
        }
        let member = MemberId::new(i as u64 % 3, 0);
        assert_eq!(
            plain.store(member, blocks),
            hinted.store(member, blocks),
            "{i}"
        );
    }
    assert!(plain.buckets() == hinted.buckets());
    assert_eq!(plain.stats(), hinted.stats());
    assert_eq!(
        plain.stats().unique_blocks,
        hinted.count_resident() as usize
    );
}
