//! Lanes added and removed while the consumer runs (`GlobalCkfIndexer::add_lane`,
//! `remove_lane`): a removed lane leaves the ready set with its reason and refuses its pool;
//! an added pool takes a spare slot (or its own lane again) and waits for its snapshot; a lane
//! index never changes pool; no other lane is touched.

use ckf_core::addressing::TableFormat;
use ckf_core::bucket::with_slot;
use ckf_core::global::{AttachError, GlobalCkfIndexer, LaneChangeError, Manifest};
use ckf_core::identity::{IndexerDomainId, PoolId, ProducerIdentity, ProducerIncarnation};
use ckf_core::lane::{IngestOutcome, LagPolicy, LaneEventKind, LaneState, RetireReason};
use ckf_core::testing::TestStream;

const BUCKETS: u64 = 64;

fn format() -> TableFormat {
    TableFormat::new(BUCKETS, 7).unwrap()
}

fn pool(dc: &str) -> PoolId {
    PoolId::new("prod", dc).unwrap()
}

/// Lanes dc-0, dc-1 and `spare` spare slots.
fn indexer(spare: usize) -> GlobalCkfIndexer {
    let manifest = Manifest {
        domain: IndexerDomainId::new("prod").unwrap(),
        format: format(),
        lanes: vec![pool("dc-0"), pool("dc-1")],
    };
    GlobalCkfIndexer::with_spare_lanes(manifest, 9, LagPolicy::DISABLED, spare).unwrap()
}

fn identity(dc: &str, incarnation: u64) -> ProducerIdentity {
    ProducerIdentity {
        pool: pool(dc),
        incarnation: ProducerIncarnation(incarnation),
        format: format(),
    }
}

/// Every bucket word of `lane`.
fn lane_words(ix: &GlobalCkfIndexer, lane: usize) -> Vec<u64> {
    (0..BUCKETS as usize)
        .map(|b| ix.table().load(b, lane))
        .collect()
}

fn words(fp: u16) -> Vec<u64> {
    (0..BUCKETS as usize)
        .map(|b| with_slot(0, b % 4, fp))
        .collect()
}

/// Attaches `dc` and installs a snapshot of fingerprint `fp` everywhere.
fn activate(ix: &GlobalCkfIndexer, dc: &str, incarnation: u64, fp: u16) -> TestStream {
    let stream = TestStream::attach(ix, &identity(dc, incarnation));
    assert_eq!(
        ix.ingest_now(&stream.snapshot(1, words(fp))),
        IngestOutcome::Activated {
            installed_sequence: 1
        }
    );
    stream
}

#[test]
fn a_removed_lane_retires_with_its_reason_and_refuses_its_pool_alone() {
    let ix = indexer(0);
    let a = activate(&ix, "dc-0", 1, 11);
    let b = activate(&ix, "dc-1", 2, 22);
    let events = ix.subscribe(0).unwrap();
    let b_words = lane_words(&ix, 1);
    assert_eq!(ix.ready_mask(), 0b11);

    assert_eq!(ix.remove_lane(0), Ok(true));
    assert_eq!(ix.ready_mask(), 0b10, "the removed lane left the ready set");
    let event = events.try_recv().unwrap();
    assert_eq!(event.lease, a.tag.lease);
    assert_eq!(event.kind, LaneEventKind::Retired(RetireReason::Removed));
    assert_eq!(ix.lane_status(0).unwrap().state, LaneState::Retired);
    // Its frames are no longer applied, its pool no longer attaches, it cannot be removed twice.
    assert!(!matches!(
        ix.ingest_now(&a.delta(1, 2, &[(0, 5)])),
        IngestOutcome::Applied { .. }
    ));
    assert!(matches!(
        ix.grant_lease(&identity("dc-0", 3)),
        Err(AttachError::UnknownPool { configured, .. }) if configured == [pool("dc-1")]
    ));
    assert_eq!(
        ix.remove_lane(0),
        Err(LaneChangeError::NotServed { lane: 0 })
    );
    assert_eq!(ix.lane_of(&pool("dc-0")), None);
    assert_eq!(ix.slot(0), Some(&pool("dc-0")), "the lane keeps its pool");

    // The other lane: same lease, still ready, same words, still applying deltas.
    assert_eq!(lane_words(&ix, 1), b_words);
    assert_eq!(ix.lane_status(1).unwrap().lease, Some(b.tag.lease));
    assert!(matches!(
        ix.ingest_now(&b.delta(1, 2, &[(0, 5)])),
        IngestOutcome::Applied { .. }
    ));
}

#[test]
fn an_added_pool_takes_a_spare_slot_or_its_own_lane_and_waits_for_its_snapshot() {
    let ix = indexer(2);
    assert_eq!(ix.lane_count(), 4);
    assert_eq!(ix.slot(2), None);
    let _b = activate(&ix, "dc-1", 2, 22);
    // A new pool: the first spare slot, not ready before its own snapshot.
    assert_eq!(ix.add_lane(pool("dc-9")), Ok(2));
    assert_eq!(ix.lane_of(&pool("dc-9")), Some(2));
    assert_eq!(ix.pool(2), &pool("dc-9"));
    let c = TestStream::attach(&ix, &identity("dc-9", 3));
    assert_eq!(c.tag.lease.lane, 2);
    assert_eq!(ix.ready_mask(), 0b010);
    ix.ingest_now(&c.snapshot(1, words(33)));
    assert_eq!(ix.ready_mask(), 0b110);

    // Removed then added back: the same lane, never a spare one.
    let a = activate(&ix, "dc-0", 1, 11);
    ix.remove_lane(0).unwrap();
    assert_eq!(ix.add_lane(pool("dc-0")), Ok(0));
    assert_eq!(ix.lane_status(0).unwrap().state, LaneState::Retired);
    assert_eq!(
        ix.ready_mask() & 1,
        0,
        "back, but not ready before a new snapshot"
    );
    let again = activate(&ix, "dc-0", 4, 44);
    assert_eq!(again.tag.lease.lane, 0);
    assert!(again.tag.lease.epoch > a.tag.lease.epoch);

    // The rules: served already, another domain, no spare slot left.
    assert_eq!(
        ix.add_lane(pool("dc-1")),
        Err(LaneChangeError::Served {
            pool: pool("dc-1"),
            lane: 1
        })
    );
    assert!(matches!(
        ix.add_lane(PoolId::new("staging", "dc-5").unwrap()),
        Err(LaneChangeError::ForeignDomain { .. })
    ));
    assert_eq!(ix.add_lane(pool("dc-8")), Ok(3));
    let full = ix.add_lane(pool("dc-7")).unwrap_err();
    assert_eq!(
        full,
        LaneChangeError::NoSpareLane {
            pool: pool("dc-7"),
            slots: 4
        }
    );
    assert!(full.to_string().contains("a lane keeps its pool"), "{full}");
    // A removed lane's slot is not given to another pool either.
    ix.remove_lane(2).unwrap();
    assert!(matches!(
        ix.add_lane(pool("dc-7")),
        Err(LaneChangeError::NoSpareLane { .. })
    ));
    assert_eq!(
        ix.remove_lane(3),
        Ok(false),
        "added, never attached: nothing retired"
    );
}

#[test]
fn a_spare_slot_is_never_answered_and_64_slots_is_the_limit() {
    let ix = indexer(1);
    let found = ix.find_prefix_matches(&[1, 2, 3]);
    assert_eq!(found.ready_mask(), 0);
    assert_eq!(ix.lane_status(2).unwrap().state, LaneState::Unassigned);
    let manifest = Manifest {
        domain: IndexerDomainId::new("prod").unwrap(),
        format: format(),
        lanes: vec![pool("dc-0")],
    };
    assert!(
        GlobalCkfIndexer::with_spare_lanes(manifest.clone(), 1, LagPolicy::DISABLED, 63).is_ok()
    );
    assert!(GlobalCkfIndexer::with_spare_lanes(manifest, 1, LagPolicy::DISABLED, 64).is_err());
}

/// One operation of the property test: add the pool `dc-{n}`, or remove lane `n`.
#[derive(Debug, Clone)]
enum Op {
    Add(u8),
    Remove(u8),
    /// Plan the lane list `dcs` with `lane_plan`, then apply the plan.
    Replan(Vec<u8>),
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        (0u8..8).prop_map(Op::Add),
        (0u8..6).prop_map(Op::Remove),
        proptest::collection::vec(0u8..8, 0..6).prop_map(Op::Replan),
    ]
}

/// The exact model: each slot's pool (a DC number) and whether it is removed.
#[derive(Debug, Clone, Default)]
struct Model {
    slots: Vec<Option<(u8, bool)>>,
}

impl Model {
    fn served(&self, dc: u8) -> Option<usize> {
        self.slots.iter().position(|s| *s == Some((dc, false)))
    }
}

proptest::proptest! {
    /// Any sequence of additions, removals and planned lane lists: the consumer's slots, its
    /// refusals and its attachable pools equal a model in which a slot never changes pool, a
    /// removed pool comes back on its own slot and a new one takes the first slot never used;
    /// a plan `lane_plan` accepts always applies, and leaves exactly the listed pools served.
    #[test]
    fn lane_changes_follow_the_slot_model(ops in proptest::collection::vec(op(), 1..40)) {
        use ckf_core::catalog::{LaneSlot, lane_plan};
        let ix = indexer(3); // dc-0, dc-1 and three spare slots
        let mut model = Model {
            slots: vec![Some((0, false)), Some((1, false)), None, None, None],
        };
        let dc = |n: u8| pool(&format!("dc-{n}"));
        for op in ops {
            match op {
                Op::Add(n) => {
                    let expected = match model.slots.iter().position(|s| matches!(s, Some((d, _)) if *d == n)) {
                        Some(l) if model.slots[l] == Some((n, true)) => {
                            model.slots[l] = Some((n, false));
                            Ok(l as u8)
                        }
                        Some(l) => Err(LaneChangeError::Served { pool: dc(n), lane: l as u8 }),
                        None => match model.slots.iter().position(Option::is_none) {
                            Some(l) => {
                                model.slots[l] = Some((n, false));
                                Ok(l as u8)
                            }
                            None => Err(LaneChangeError::NoSpareLane { pool: dc(n), slots: 5 }),
                        },
                    };
                    proptest::prop_assert_eq!(ix.add_lane(dc(n)), expected);
                }
                Op::Remove(lane) => {
                    // Lane 5 is no slot: refused like a removed one.
                    let expected = match model.slots.get(usize::from(lane)).copied().flatten() {
                        Some((n, false)) => {
                            model.slots[usize::from(lane)] = Some((n, true));
                            true
                        }
                        _ => false,
                    };
                    proptest::prop_assert_eq!(ix.remove_lane(lane).is_ok(), expected);
                }
                Op::Replan(dcs) => {
                    let mut next: Vec<PoolId> = Vec::new();
                    for n in dcs {
                        if !next.contains(&dc(n)) {
                            next.push(dc(n));
                        }
                    }
                    let slots: Vec<LaneSlot> = (0..5u8)
                        .map(|l| LaneSlot { pool: ix.slot(l).cloned(), removed: ix.is_removed(l) })
                        .collect();
                    let new = next.iter().filter(|p| slots.iter().all(|s| s.pool.as_ref() != Some(*p))).count();
                    let free = slots.iter().filter(|s| s.pool.is_none()).count();
                    match lane_plan(&slots, &next) {
                        Err(refused) => proptest::prop_assert!(new > free, "{refused}"),
                        Ok(plan) => {
                            proptest::prop_assert!(new <= free);
                            for lane in plan.remove {
                                proptest::prop_assert!(ix.remove_lane(lane).is_ok());
                                if let Some((n, _)) = model.slots[usize::from(lane)] {
                                    model.slots[usize::from(lane)] = Some((n, true));
                                }
                            }
                            for p in plan.add {
                                let lane = ix.add_lane(p.clone());
                                proptest::prop_assert!(lane.is_ok(), "{lane:?}");
                                let n: u8 = p.dc.as_str()[3..].parse().unwrap();
                                model.slots[usize::from(lane.unwrap())] = Some((n, false));
                            }
                            let mut served = ix.pools_served();
                            served.sort();
                            next.sort();
                            proptest::prop_assert_eq!(served, next);
                        }
                    }
                }
            }
            // The consumer and the model agree slot by slot, and on who may attach.
            for l in 0..5u8 {
                let slot = model.slots[usize::from(l)];
                proptest::prop_assert_eq!(ix.slot(l).cloned(), slot.map(|(n, _)| dc(n)));
                proptest::prop_assert_eq!(ix.is_removed(l), slot.is_some_and(|(_, r)| r));
            }
            for n in 0..8u8 {
                proptest::prop_assert_eq!(
                    ix.lane_of(&dc(n)).map(usize::from),
                    model.served(n)
                );
            }
        }
    }
}
