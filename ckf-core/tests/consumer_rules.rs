//! One test per consumer acceptance rule and per lane transition (docs/design.md, "Lane
//! recovery and failure boundaries"). Frames are built by hand so every rule is hit exactly.

use std::time::{Duration, Instant};

use ckf_core::addressing::TableFormat;
use ckf_core::bucket::with_slot;
use ckf_core::dc::{DcCkfConfig, DcCkfState, MemberId};
use ckf_core::frames::ChunkError;
use ckf_core::global::{AttachError, ClaimedFormat, GlobalCkfIndexer, Manifest, ManifestError};
use ckf_core::identity::{
    IndexerDomainId, LaneLease, PoolId, ProducerIdentity, ProducerIncarnation,
};
use ckf_core::ingestion::{IngestionWorkers, IngestionWorkersConfig, SubmitError};
use ckf_core::lane::{
    DeltaError, Frame, IgnoreReason, IngestOutcome, LagPolicy, LaneEventKind, LaneState,
    RetireReason, SnapshotError, StrayFrame,
};
use ckf_core::publication::DcCkfPublisher;
use ckf_core::testing::{self, TestStream as Stream};

const BUCKETS: u64 = 64;
const INSTANCE: u64 = 0xC0FFEE;

fn format() -> TableFormat {
    TableFormat::new(BUCKETS, 7).unwrap()
}

fn pool(dc: &str) -> PoolId {
    PoolId::new("prod", dc).unwrap()
}

fn manifest(lanes: usize) -> Manifest {
    Manifest {
        domain: IndexerDomainId::new("prod").unwrap(),
        format: format(),
        lanes: (0..lanes).map(|i| pool(&format!("dc-{i}"))).collect(),
    }
}

fn indexer(lanes: usize) -> GlobalCkfIndexer {
    GlobalCkfIndexer::with_policy(manifest(lanes), INSTANCE, LagPolicy::DISABLED).unwrap()
}

fn identity(dc: &str, incarnation: u64) -> ProducerIdentity {
    ProducerIdentity {
        pool: pool(dc),
        incarnation: ProducerIncarnation(incarnation),
        format: format(),
    }
}

/// A stream of pool `dc` (lane N for "dc-N") granted to `incarnation`.
fn attach(ix: &GlobalCkfIndexer, dc: &str, incarnation: u64) -> Stream {
    Stream::attach(ix, &identity(dc, incarnation))
}

/// A table whose bucket `b` holds fingerprint `fp_base + b` in slot `b % 4`.
fn table_words(fp_base: u16) -> Vec<u64> {
    (0..BUCKETS as usize)
        .map(|b| with_slot(0, b % 4, fp_base + b as u16))
        .collect()
}

fn activate(
    ix: &GlobalCkfIndexer,
    dc: &str,
    incarnation: u64,
    seq: u64,
    words: Vec<u64>,
) -> Stream {
    let lane = ix.lane_of(&pool(dc)).expect("a manifest pool");
    testing::activate(ix, lane, incarnation, seq, words)
}

fn lane_ready(ix: &GlobalCkfIndexer, lane: u8) -> bool {
    ix.ready_mask() & (1 << lane) != 0
}

// ---------------------------------------------------------------- manifest

#[test]
fn manifest_rejects_zero_lanes() {
    assert_eq!(
        GlobalCkfIndexer::new(manifest(0), 1).unwrap_err(),
        ManifestError::NoLanes
    );
}

#[test]
fn manifest_rejects_sixty_five_lanes_and_accepts_sixty_four() {
    assert_eq!(
        GlobalCkfIndexer::new(manifest(65), 1).unwrap_err(),
        ManifestError::TooManyLanes(65)
    );
    let ix = GlobalCkfIndexer::new(manifest(64), 1).unwrap();
    assert_eq!(ix.lane_count(), 64);
    assert_eq!(ix.table().lanes(), 64);
    assert_eq!(ix.table().groups().len(), 4, "groups of 16 lanes");
    for lanes in [1u64, 16, 17, 64] {
        let ix = GlobalCkfIndexer::new(manifest(lanes as usize), 1).unwrap();
        assert_eq!(
            ix.table().bytes() as u64,
            BUCKETS * 8 * lanes,
            "table sized to the lane count ({lanes} lanes)"
        );
    }
}

#[test]
fn lanes_past_sixteen_attach_and_get_ready_in_their_own_group() {
    let ix = indexer(20);
    let _s17 = activate(&ix, "dc-17", 1, 5, table_words(100));
    let _s3 = activate(&ix, "dc-3", 1, 5, table_words(200));
    assert_eq!(ix.ready_mask(), 1 << 17 | 1 << 3);
    assert_eq!(ix.table().lane_words(17), table_words(100));
    assert_eq!(ix.table().lane_words(3), table_words(200));
    for untouched in [0, 1, 16, 18, 19] {
        assert!(
            ix.table().lane_words(untouched).iter().all(|&w| w == 0),
            "lane {untouched} untouched"
        );
    }
    assert!(ix.lane_status(17).unwrap().ready);
}

#[test]
fn manifest_rejects_duplicate_pool_naming_both_lanes() {
    let mut m = manifest(3);
    m.lanes[2] = m.lanes[0].clone();
    assert_eq!(
        GlobalCkfIndexer::new(m, 1).unwrap_err(),
        ManifestError::DuplicatePool {
            lane: 2,
            first: 0,
            pool: pool("dc-0")
        }
    );
}

#[test]
fn manifest_rejects_duplicate_dc_naming_it() {
    // Within one domain a DC names exactly one pool, so a repeated DC is a repeated pool.
    let mut m = manifest(2);
    m.lanes[1] = pool("dc-0");
    let err = m.validate().unwrap_err();
    assert!(
        matches!(
            err,
            ManifestError::DuplicatePool {
                lane: 1,
                first: 0,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("DC dc-0"), "{err}");
}

#[test]
fn manifest_rejects_foreign_domain() {
    let mut m = manifest(3);
    m.lanes[1] = PoolId::new("staging", "dc-x").unwrap();
    assert_eq!(
        GlobalCkfIndexer::new(m, 1).unwrap_err(),
        ManifestError::ForeignDomain {
            lane: 1,
            pool: PoolId::new("staging", "dc-x").unwrap(),
            domain: IndexerDomainId::new("prod").unwrap()
        }
    );
}

#[test]
fn manifest_rejects_bad_format() {
    let mut m = manifest(2);
    m.format.bucket_count = 49;
    assert!(matches!(
        GlobalCkfIndexer::new(m.clone(), 1).unwrap_err(),
        ManifestError::Format(_)
    ));
    m.format = format();
    m.format.slots_per_bucket = 8;
    assert!(matches!(
        GlobalCkfIndexer::new(m, 1).unwrap_err(),
        ManifestError::Format(_)
    ));
}

#[test]
fn lane_of_and_pool_are_inverse() {
    let ix = indexer(4);
    for lane in 0..4u8 {
        assert_eq!(ix.lane_of(ix.pool(lane)), Some(lane));
    }
    assert_eq!(ix.lane_of(&pool("dc-9")), None);
    assert_eq!(ix.manifest().lanes.len(), 4);
}

// ---------------------------------------------------------------- attach

#[test]
fn unknown_pool_is_refused() {
    let ix = indexer(2);
    let err = ix.grant_lease(&identity("dc-7", 1)).unwrap_err();
    assert_eq!(
        err,
        AttachError::UnknownPool {
            pool: pool("dc-7"),
            configured: vec![pool("dc-0"), pool("dc-1")],
        }
    );
    assert!(
        err.to_string().contains(
            "prod/dc-7 is not a lane of this indexer (configured pools: prod/dc-0, prod/dc-1)"
        ),
        "{err}"
    );
    let mut foreign = identity("dc-0", 1);
    foreign.pool = PoolId::new("staging", "dc-0").unwrap();
    assert!(matches!(
        ix.grant_lease(&foreign).unwrap_err(),
        AttachError::UnknownPool { .. }
    ));
    assert_eq!(testing::lane_states(&ix), [LaneState::Unassigned; 2]);
}

#[test]
fn format_mismatch_names_both_formats() {
    let ix = indexer(2);
    let mut id = identity("dc-1", 1);
    id.format = TableFormat::new(128, 7).unwrap();
    let err = ix.grant_lease(&id).unwrap_err();
    assert_eq!(
        err,
        AttachError::FormatMismatch {
            pool: pool("dc-1"),
            expected: format(),
            got: ClaimedFormat::Valid(id.format)
        }
    );
    let msg = err.to_string();
    assert!(
        msg.contains("buckets=64") && msg.contains("buckets=128"),
        "{msg}"
    );
    assert_eq!(ix.lane_status(1).unwrap().state, LaneState::Unassigned);
}

// ---------------------------------------------------------------- transitions

#[test]
fn unassigned_to_awaiting_to_active() {
    let ix = indexer(2);
    let st = ix.lane_status(1).unwrap();
    assert_eq!(
        (st.state, st.ready, st.lease),
        (LaneState::Unassigned, false, None)
    );
    let s = attach(&ix, "dc-1", 1);
    let st = ix.lane_status(1).unwrap();
    assert_eq!(st.state, LaneState::AwaitingSnapshot);
    assert_eq!(st.lease, Some(s.tag.lease));
    assert_eq!(s.tag.lease.epoch, 1);
    assert_eq!(s.tag.lease.consumer_instance, INSTANCE);
    assert!(!lane_ready(&ix, 1));
    assert_eq!(
        ix.ingest_now(&s.snapshot(5, table_words(100))),
        IngestOutcome::Activated {
            installed_sequence: 5
        }
    );
    let st = ix.lane_status(1).unwrap();
    assert_eq!(
        (st.state, st.ready, st.installed_sequence),
        (LaneState::Active, true, Some(5))
    );
    assert_eq!(ix.ready_mask(), 0b10);
    assert_eq!(ix.table().lane_words(1), table_words(100));
}

#[test]
fn lease_epochs_strictly_increase_per_lane() {
    let ix = indexer(2);
    let mut last = 0;
    for i in 0..5 {
        let l = ix.grant_lease(&identity("dc-0", i)).unwrap();
        assert!(l.epoch > last);
        last = l.epoch;
    }
    assert_eq!(
        ix.grant_lease(&identity("dc-1", 9)).unwrap().epoch,
        1,
        "per lane"
    );
}

#[test]
fn new_lease_while_active_supersedes_and_unreadies_first() {
    let ix = indexer(2);
    let old = activate(&ix, "dc-0", 1, 0, table_words(10));
    let events = ix.subscribe(0).unwrap();
    let new = attach(&ix, "dc-0", 2);
    assert!(!lane_ready(&ix, 0), "the new lease clears the ready bit");
    assert_eq!(
        ix.lane_status(0).unwrap().state,
        LaneState::AwaitingSnapshot
    );
    // Taking over a live holder is contention, announced first.
    assert_eq!(
        events.try_recv().unwrap().kind,
        LaneEventKind::Contended {
            kind: ckf_core::lane::ContentionKind::Takeover,
            contender: new.tag.incarnation,
        }
    );
    assert_eq!(
        events.try_recv().unwrap(),
        ckf_core::lane::LaneEvent {
            lease: old.tag.lease,
            kind: LaneEventKind::Superseded {
                by: new.tag.lease,
                incarnation: new.tag.incarnation,
            }
        }
    );
    // The old stream is now stale and ignored.
    assert!(matches!(
        ix.ingest_now(&old.delta(0, 1, &[(0, 1)])),
        IngestOutcome::Ignored(IgnoreReason::StaleLease {
            frame: 1,
            current: 2
        })
    ));
}

#[test]
fn stale_lease_is_ignored_without_harming_its_replacement() {
    let ix = indexer(2);
    let old = activate(&ix, "dc-0", 1, 0, table_words(10));
    let new = activate(&ix, "dc-0", 1, 3, table_words(500));
    let before = ix.table().lane_words(0);
    // Every kind of old-lease frame, including ones that would retire a current stream.
    for f in [
        old.delta(0, 1, &[(0, 77)]),
        old.delta(9, 4, &[(0, 77)]),
        old.delta(3, 4, &[]),
        old.drain(99),
        old.snapshot(8, table_words(1)),
        old.heartbeat(0),
    ] {
        assert!(
            matches!(
                ix.ingest_now(&f),
                IngestOutcome::Ignored(IgnoreReason::StaleLease { .. })
            ),
            "{f:?}"
        );
    }
    assert_eq!(ix.table().lane_words(0), before);
    let st = ix.lane_status(0).unwrap();
    assert_eq!(
        (st.state, st.installed_sequence, st.retirements),
        (LaneState::Active, Some(3), 0)
    );
    assert_eq!(
        ix.ingest_now(&new.delta(3, 4, &[(1, 42)])),
        IngestOutcome::Applied {
            installed_sequence: 4
        }
    );
    assert_eq!(ix.table().load(1, 0), 42);
}

#[test]
fn other_incarnation_and_other_consumer_are_ignored() {
    let ix = indexer(2);
    let cur = activate(&ix, "dc-0", 1, 0, table_words(10));
    let before = ix.table().lane_words(0);
    let mut impostor = cur;
    impostor.tag.incarnation = ProducerIncarnation(2);
    assert!(matches!(
        ix.ingest_now(&impostor.delta(0, 1, &[(0, 5)])),
        IngestOutcome::Ignored(IgnoreReason::OtherIncarnation { .. })
    ));
    let mut old_consumer = cur;
    old_consumer.tag.lease.consumer_instance = INSTANCE + 1;
    assert!(matches!(
        ix.ingest_now(&old_consumer.drain(7)),
        IngestOutcome::Ignored(IgnoreReason::OtherConsumer { .. })
    ));
    assert_eq!(ix.table().lane_words(0), before);
    assert_eq!(
        ix.ingest_now(&cur.delta(0, 1, &[(0, 5)])),
        IngestOutcome::Applied {
            installed_sequence: 1
        }
    );
}

#[test]
fn never_granted_lease_and_unknown_lane_are_rejected() {
    let ix = indexer(2);
    let cur = activate(&ix, "dc-0", 1, 0, table_words(10));
    let mut future = cur;
    future.tag.lease.epoch = 9;
    assert_eq!(
        ix.ingest_now(&future.heartbeat(0)),
        IngestOutcome::Rejected(StrayFrame::UnknownLease {
            lane: 0,
            epoch: 9,
            latest: 1
        })
    );
    let mut nowhere = cur;
    nowhere.tag.lease = LaneLease {
        lane: 5,
        ..cur.tag.lease
    };
    assert_eq!(
        ix.ingest_now(&nowhere.heartbeat(0)),
        IngestOutcome::Rejected(StrayFrame::UnknownLane { lane: 5, lanes: 2 })
    );
    assert_eq!(ix.lane_status(0).unwrap().state, LaneState::Active);
}

// ---------------------------------------------------------------- delta acceptance

/// Retires lane 0 with `frame` and checks: the reason, no word changed, lane 1 untouched
/// (words, state, readiness), later frames of the retired lease ignored, queries see lane 1 only.
fn assert_retires_only_lane0(
    name: &str,
    ix: &GlobalCkfIndexer,
    s: &Stream,
    frame: Frame,
    want: RetireReason,
) {
    let words0 = ix.table().lane_words(0);
    let words1 = ix.table().lane_words(1);
    assert!(lane_ready(ix, 1), "{name}");
    assert_eq!(
        ix.ingest_now(&frame),
        IngestOutcome::Retired(want.clone()),
        "{name}"
    );
    assert_eq!(
        ix.table().lane_words(0),
        words0,
        "{name}: a rejected frame changes no word"
    );
    assert_eq!(
        ix.table().lane_words(1),
        words1,
        "{name}: other lane's words"
    );
    assert_eq!(
        ix.ready_mask(),
        0b10,
        "{name}: retired lane leaves the ready mask, the other stays"
    );
    let st = ix.lane_status(0).unwrap();
    assert_eq!(st.state, LaneState::Retired, "{name}");
    assert_eq!(st.retirements, 1, "{name}");
    assert_eq!(st.last_retirement, Some(want.clone()), "{name}");
    let other = ix.lane_status(1).unwrap();
    assert_eq!(
        (other.state, other.retirements),
        (LaneState::Active, 0),
        "{name}"
    );
    // Further frames of the retired lease are ignored, not applied.
    let words0 = ix.table().lane_words(0);
    assert!(
        matches!(
            ix.ingest_now(&s.delta(7, 8, &[(0, 1)])),
            IngestOutcome::Ignored(IgnoreReason::LaneRetired(r)) if r == want
        ),
        "{name}"
    );
    assert_eq!(ix.table().lane_words(0), words0, "{name}");
    // A query reports only the other lane.
    let m = ix.find_prefix_matches(&[1, 2, 3]);
    assert_eq!(m.ready_mask(), 0b10, "{name}");
    assert_eq!(m.depth(0), None, "{name}");
}

/// One refusal: frames that must be accepted first, then the frame that must retire the lane.
struct Refusal {
    name: &'static str,
    accepted_first: fn(&Stream) -> Vec<Frame>,
    bad: fn(&Stream) -> Frame,
    want: RetireReason,
}

fn nothing(_: &Stream) -> Vec<Frame> {
    Vec::new()
}

/// Every acceptance rule of an active lane (installed sequence 7), one row each.
fn active_lane_refusals() -> Vec<Refusal> {
    vec![
        Refusal {
            name: "gap",
            accepted_first: nothing,
            bad: |a| a.delta(8, 9, &[(0, 1)]),
            want: RetireReason::Gap {
                installed: 7,
                base_sequence: 8,
            },
        },
        Refusal {
            name: "replayed delta is a gap",
            accepted_first: |a| vec![a.delta(7, 8, &[(0, 1)])],
            bad: |a| a.delta(7, 8, &[(0, 2)]),
            want: RetireReason::Gap {
                installed: 8,
                base_sequence: 7,
            },
        },
        Refusal {
            name: "non-contiguous sequence",
            accepted_first: nothing,
            bad: |a| a.delta(7, 9, &[(0, 1)]),
            want: RetireReason::NonContiguous {
                base_sequence: 7,
                sequence: 9,
            },
        },
        Refusal {
            name: "empty delta",
            accepted_first: nothing,
            bad: |a| a.delta(7, 8, &[]),
            want: RetireReason::MalformedDelta(DeltaError::Empty),
        },
        Refusal {
            // A valid image first: validation must precede any store.
            name: "out-of-range image",
            accepted_first: nothing,
            bad: |a| a.delta(7, 8, &[(1, 0xDEAD), (BUCKETS as u32, 5)]),
            want: RetireReason::MalformedDelta(DeltaError::BucketOutOfRange {
                bucket: BUCKETS as u32,
                bucket_count: BUCKETS,
            }),
        },
        Refusal {
            name: "duplicate image",
            accepted_first: nothing,
            bad: |a| a.delta(7, 8, &[(2, 0xDEAD), (9, 1), (2, 0xBEEF)]),
            want: RetireReason::MalformedDelta(DeltaError::DuplicateBucket { bucket: 2 }),
        },
        Refusal {
            name: "re-barrier below the installed sequence",
            accepted_first: nothing,
            bad: |a| a.snapshot(6, table_words(1)),
            want: RetireReason::MalformedSnapshot(SnapshotError::Regressed {
                installed: 7,
                sequence: 6,
            }),
        },
        Refusal {
            // The producer sent 8 -> 9 but it was lost; no later delta exposes the gap.
            name: "drain marker catches a dropped final delta",
            accepted_first: |a| vec![a.delta(7, 8, &[(0, 1)])],
            bad: |a| a.drain(9),
            want: RetireReason::LostFinalDelta {
                installed: 8,
                marker: 9,
            },
        },
    ]
}

#[test]
fn each_refusal_of_an_active_lane_retires_only_that_lane() {
    for row in active_lane_refusals() {
        let (ix, a, _) = two_active();
        for f in (row.accepted_first)(&a) {
            assert!(
                matches!(ix.ingest_now(&f), IngestOutcome::Applied { .. }),
                "{}: setup frame {f:?}",
                row.name
            );
        }
        assert_retires_only_lane0(row.name, &ix, &a, (row.bad)(&a), row.want);
    }
}

/// Every broken barrier snapshot of a lane awaiting its snapshot (and frames that need one),
/// one row each. `accepted_first` frames must be accepted chunks.
fn awaiting_lane_refusals() -> Vec<Refusal> {
    vec![
        Refusal {
            name: "delta before the snapshot",
            accepted_first: nothing,
            bad: |a| a.delta(0, 1, &[(0, 1)]),
            want: RetireReason::NotActive { frame: "delta" },
        },
        Refusal {
            name: "drain before the snapshot",
            accepted_first: nothing,
            bad: |a| a.drain(0),
            want: RetireReason::NotActive { frame: "drain" },
        },
        Refusal {
            name: "truncated snapshot, then a delta",
            accepted_first: |a| vec![a.chunk(3, 0, &table_words(10)[..32])],
            bad: |a| a.delta(3, 4, &[(0, 1)]),
            want: RetireReason::NotActive { frame: "delta" },
        },
        Refusal {
            name: "empty chunk",
            accepted_first: nothing,
            bad: |a| a.chunk_bytes(3, 0, vec![]),
            want: RetireReason::MalformedSnapshot(SnapshotError::Chunk(ChunkError::Empty {
                first_bucket: 0,
            })),
        },
        Refusal {
            name: "misaligned chunk",
            accepted_first: |a| vec![a.chunk_bytes(3, 0, vec![1; 8 * 4])],
            bad: |a| a.chunk_bytes(3, 4, vec![1; 13]),
            want: RetireReason::MalformedSnapshot(SnapshotError::Chunk(ChunkError::Misaligned {
                first_bucket: 4,
                len: 13,
            })),
        },
        Refusal {
            name: "chunk past the table",
            accepted_first: |a| vec![a.chunk_bytes(3, 0, vec![1; 8 * 60])],
            bad: |a| a.chunk_bytes(3, 60, vec![1; 8 * 5]),
            want: RetireReason::MalformedSnapshot(SnapshotError::Chunk(ChunkError::Oversized {
                first_bucket: 60,
                end: 65,
                bucket_count: 64,
            })),
        },
        Refusal {
            name: "chunk out of order",
            accepted_first: |a| vec![a.chunk_bytes(3, 0, vec![1; 8 * 4])],
            bad: |a| a.chunk_bytes(3, 8, vec![1; 8 * 4]),
            want: RetireReason::MalformedSnapshot(SnapshotError::OutOfOrder {
                expected: 4,
                got: 8,
            }),
        },
        Refusal {
            name: "first chunk not at bucket 0",
            accepted_first: nothing,
            bad: |a| a.chunk_bytes(3, 4, vec![1; 8 * 4]),
            want: RetireReason::MalformedSnapshot(SnapshotError::OutOfOrder {
                expected: 0,
                got: 4,
            }),
        },
        Refusal {
            name: "chunk sequence changes mid-snapshot",
            accepted_first: |a| vec![a.chunk(3, 0, &[1, 2])],
            bad: |a| a.chunk(4, 2, &[1, 2]),
            want: RetireReason::MalformedSnapshot(SnapshotError::SequenceChanged {
                expected: 3,
                got: 4,
            }),
        },
        Refusal {
            name: "whole snapshot of the wrong length",
            accepted_first: nothing,
            bad: |a| a.snapshot(3, table_words(10)[..40].to_vec()),
            want: RetireReason::MalformedSnapshot(SnapshotError::WrongLength {
                expected: 64,
                got: 40,
            }),
        },
    ]
}

#[test]
fn each_broken_barrier_snapshot_retires_only_that_lane() {
    for row in awaiting_lane_refusals() {
        let ix = indexer(2);
        let _b = activate(&ix, "dc-1", 2, 0, table_words(900));
        let a = attach(&ix, "dc-0", 1);
        for f in (row.accepted_first)(&a) {
            assert!(
                matches!(ix.ingest_now(&f), IngestOutcome::ChunkAccepted { .. }),
                "{}: setup frame {f:?}",
                row.name
            );
            assert!(!lane_ready(&ix, 0), "{}: not ready mid-snapshot", row.name);
        }
        assert_retires_only_lane0(row.name, &ix, &a, (row.bad)(&a), row.want);
    }
}

fn two_active() -> (GlobalCkfIndexer, Stream, Stream) {
    let ix = indexer(2);
    let a = activate(&ix, "dc-0", 1, 7, table_words(10));
    let b = activate(&ix, "dc-1", 2, 0, table_words(900));
    (ix, a, b)
}

#[test]
fn contiguous_delta_applies_in_order() {
    let (ix, a, _) = two_active();
    assert_eq!(
        ix.ingest_now(&a.delta(7, 8, &[(3, 0xAAAA), (4, 0xBBBB)])),
        IngestOutcome::Applied {
            installed_sequence: 8
        }
    );
    assert_eq!(ix.table().load(3, 0), 0xAAAA);
    assert_eq!(ix.table().load(4, 0), 0xBBBB);
    assert_eq!(
        ix.table().load(3, 1),
        table_words(900)[3],
        "other lane untouched"
    );
    assert_eq!(
        ix.ingest_now(&a.delta(8, 9, &[(3, 0)])),
        IngestOutcome::Applied {
            installed_sequence: 9
        }
    );
    assert_eq!(ix.table().load(3, 0), 0);
    assert_eq!(ix.lane_status(0).unwrap().installed_sequence, Some(9));
}

#[test]
fn retired_lane_recovers_with_new_lease_and_snapshot() {
    let (ix, a, _) = two_active();
    ix.ingest_now(&a.delta(1, 2, &[(0, 1)]));
    assert_eq!(ix.lane_status(0).unwrap().state, LaneState::Retired);
    let a2 = activate(&ix, "dc-0", 1, 12, table_words(300));
    assert!(a2.tag.lease.epoch > a.tag.lease.epoch);
    assert_eq!(ix.ready_mask(), 0b11);
    assert_eq!(ix.table().lane_words(0), table_words(300));
    let st = ix.lane_status(0).unwrap();
    assert_eq!(
        (st.state, st.retirements, st.installed_sequence),
        (LaneState::Active, 1, Some(12))
    );
}

// ---------------------------------------------------------------- snapshots (case 10)

#[test]
fn case10_chunked_snapshot_round_trips_10000_blocks() {
    let fmt = TableFormat::for_expected_blocks(10_000, 3).unwrap();
    let m = Manifest {
        domain: IndexerDomainId::new("prod").unwrap(),
        format: fmt,
        lanes: vec![pool("dc-0"), pool("dc-1")],
    };
    let ix = GlobalCkfIndexer::with_policy(m, INSTANCE, LagPolicy::DISABLED).unwrap();
    // The table comes from a real producer state, through the real publisher.
    let mut state = DcCkfState::new(DcCkfConfig::new(fmt)).unwrap();
    let stored: Vec<u64> = (0..10_000u64)
        .map(|i| ckf_core::addressing::fmix64(i ^ 0xABCD))
        .collect();
    let out = state.store(MemberId::new(1, 0), &stored);
    assert_eq!((out.applied, out.omitted), (10_000, 0));
    let words = state.buckets().to_vec();
    let mut id = identity("dc-1", 4);
    id.format = fmt;
    let lease = ix.grant_lease(&id).unwrap();
    let mut publisher = DcCkfPublisher::new(id.clone());
    publisher.install_lease_at(lease, 17).unwrap();
    while state.take_batch().is_some() {}
    let snap = publisher.snapshot(&state).unwrap();
    assert_eq!(snap.sequence, 17);
    let chunks: Vec<_> = snap.chunks(1000).collect();
    assert!(chunks.len() > 10);
    let last = chunks.len() - 1;
    for (i, c) in chunks.iter().enumerate() {
        let out = ix.ingest_now(&Frame::Chunk(c.clone()));
        if i < last {
            assert!(
                matches!(out, IngestOutcome::ChunkAccepted { .. }),
                "{out:?}"
            );
            assert!(!lane_ready(&ix, 1), "not ready before the last chunk");
        } else {
            assert_eq!(
                out,
                IngestOutcome::Activated {
                    installed_sequence: 17
                }
            );
        }
    }
    assert_eq!(ix.table().lane_words(1), words, "identical bytes");
    for (i, &h) in stored.iter().enumerate() {
        let m = ix.find_prefix_matches(&[h]);
        assert_eq!(m.depth(1), Some(1), "block {i} not found");
    }
    let m = ix.find_prefix_matches(&stored[..64]);
    assert_eq!(m.depth(1), Some(64));
    assert_eq!(m.depth(0), None, "unassigned lane not reported");
}

#[test]
fn snapshot_while_ready_is_a_re_barrier() {
    let (ix, a, _) = two_active();
    ix.ingest_now(&a.delta(7, 8, &[(0, 1)]));
    let fresh = table_words(2000);
    // First chunk: the lane leaves the ready mask while it is rewritten.
    assert!(matches!(
        ix.ingest_now(&a.chunk(8, 0, &fresh[..32])),
        IngestOutcome::ChunkAccepted { next_bucket: 32 }
    ));
    assert_eq!(ix.ready_mask(), 0b10);
    assert_eq!(
        ix.lane_status(0).unwrap().state,
        LaneState::AwaitingSnapshot
    );
    assert_eq!(
        ix.ingest_now(&a.chunk(8, 32, &fresh[32..])),
        IngestOutcome::Activated {
            installed_sequence: 8
        }
    );
    assert_eq!(ix.ready_mask(), 0b11);
    assert_eq!(ix.table().lane_words(0), fresh);
    assert_eq!(
        ix.ingest_now(&a.delta(8, 9, &[(5, 5)])),
        IngestOutcome::Applied {
            installed_sequence: 9
        }
    );
    assert_eq!(ix.lane_status(0).unwrap().retirements, 0);
}

// ---------------------------------------------------------------- drain markers

#[test]
fn exact_drain_keeps_lane_ready_and_marks_it_drained() {
    let (ix, a, _) = two_active();
    ix.ingest_now(&a.delta(7, 8, &[(0, 1)]));
    let events = ix.subscribe(0).unwrap();
    assert_eq!(
        ix.ingest_now(&a.drain(8)),
        IngestOutcome::Drained {
            installed_sequence: 8
        }
    );
    let st = ix.lane_status(0).unwrap();
    assert!(st.drained && st.ready && st.state == LaneState::Active);
    assert_eq!(
        events.try_recv().unwrap().kind,
        LaneEventKind::Drained {
            installed_sequence: 8
        }
    );
}

#[test]
fn heartbeat_of_current_stream_is_alive() {
    let (ix, a, _) = two_active();
    let before = ix.lane_status(0).unwrap().last_update.unwrap();
    assert_eq!(ix.ingest_now(&a.heartbeat(7)), IngestOutcome::Alive);
    assert!(ix.lane_status(0).unwrap().last_update.unwrap() >= before);
}

// ---------------------------------------------------------------- mid-apply failure

#[test]
fn mid_apply_panic_retires_only_that_lane() {
    let (ix, a, b) = two_active();
    ix.inject_apply_fault(0, 1).unwrap();
    let out = ix.ingest_now(&a.delta(7, 8, &[(0, 1), (1, 2), (2, 3)]));
    assert!(
        matches!(
            out,
            IngestOutcome::Retired(RetireReason::ApplyFailed { .. })
        ),
        "{out:?}"
    );
    assert_eq!(ix.ready_mask(), 0b10);
    assert_eq!(ix.lane_status(0).unwrap().state, LaneState::Retired);
    assert_eq!(
        ix.ingest_now(&b.delta(0, 1, &[(0, 1)])),
        IngestOutcome::Applied {
            installed_sequence: 1
        }
    );
    // The lane is usable again after a new lease (the lock was not poisoned).
    activate(&ix, "dc-0", 1, 0, table_words(3));
    assert_eq!(ix.ready_mask(), 0b11);
}

// ---------------------------------------------------------------- lag and saturation

#[test]
fn lag_deadline_retires_only_that_lane() {
    let policy = LagPolicy {
        heartbeat_deadline: None,
        apply_deadline: Some(Duration::from_millis(500)),
        drain_grace: None,
    };
    let ix = GlobalCkfIndexer::with_policy(manifest(2), INSTANCE, policy).unwrap();
    let a = activate(&ix, "dc-0", 1, 0, table_words(1));
    let _b = activate(&ix, "dc-1", 2, 0, table_words(2));
    let mut late = a.delta(0, 1, &[(0, 9)]);
    if let Frame::Delta(d) = &mut late {
        d.oldest_change_age_ms = 400;
    }
    // 400 ms old at send + 200 ms queued here = 600 ms > 500 ms.
    let received = Instant::now() - Duration::from_millis(200);
    let out = ix.ingest(&late, received);
    assert!(
        matches!(out, IngestOutcome::Retired(RetireReason::LagExceeded { age_ms, deadline_ms: 500 }) if age_ms >= 600),
        "{out:?}"
    );
    assert_eq!(
        ix.table().load(0, 0),
        table_words(1)[0],
        "late delta not applied"
    );
    assert_eq!(ix.ready_mask(), 0b10);
}

#[test]
fn the_consumers_own_stall_does_not_count_against_the_heartbeat_deadline() {
    let policy = LagPolicy {
        heartbeat_deadline: Some(Duration::from_secs(5)),
        apply_deadline: None,
        drain_grace: None,
    };
    let ix = GlobalCkfIndexer::with_policy(manifest(2), INSTANCE, policy).unwrap();
    let _a = activate(&ix, "dc-0", 1, 0, table_words(1));
    let _b = activate(&ix, "dc-1", 2, 0, table_words(2));
    // The consumer ran for both lanes at t0; then nothing ran for 6 s (the process was stopped).
    let t0 = Instant::now();
    ix.note_consumer_ran(0, t0);
    ix.note_consumer_ran(1, t0);
    let later = t0 + Duration::from_secs(6);
    // The first check after the stall (an attach decided before the keeper ran, here) does
    // not blame the producers, whichever comes first.
    assert_eq!(ix.check_deadlines(0, later), None, "lane 0 checked first");
    ix.note_consumer_ran(1, later);
    assert_eq!(
        ix.check_deadlines(1, later),
        None,
        "the keeper first for lane 1"
    );
    // The keeper runs every 100 ms from then on, the producer stays silent: retired one
    // deadline after the stall.
    let mut at = later;
    while at < later + Duration::from_millis(5_100) {
        at += Duration::from_millis(100);
        ix.note_consumer_ran(0, at);
    }
    assert!(matches!(
        ix.check_deadlines(0, at),
        Some(RetireReason::HeartbeatTimeout { .. })
    ));
    // A lane the consumer never noted (no ingestion workers) gets no excuse.
    let ix = GlobalCkfIndexer::with_policy(manifest(1), INSTANCE, policy).unwrap();
    let _a = activate(&ix, "dc-0", 1, 0, table_words(1));
    assert!(matches!(
        ix.check_deadlines(0, Instant::now() + Duration::from_secs(6)),
        Some(RetireReason::HeartbeatTimeout { .. })
    ));
}

#[test]
fn heartbeat_deadline_retires_silent_lane_only() {
    let policy = LagPolicy {
        heartbeat_deadline: Some(Duration::from_secs(5)),
        apply_deadline: None,
        drain_grace: None,
    };
    let ix = GlobalCkfIndexer::with_policy(manifest(3), INSTANCE, policy).unwrap();
    let _a = activate(&ix, "dc-0", 1, 0, table_words(1));
    let b = activate(&ix, "dc-1", 2, 0, table_words(2));
    ix.ingest_now(&b.drain(0));
    let _c = attach(&ix, "dc-2", 3);
    let later = Instant::now() + Duration::from_secs(6);
    assert!(matches!(
        ix.check_deadlines(0, later),
        Some(RetireReason::HeartbeatTimeout { .. })
    ));
    assert_eq!(
        ix.check_deadlines(1, later),
        None,
        "a drained lane is exempt"
    );
    assert!(
        matches!(
            ix.check_deadlines(2, later),
            Some(RetireReason::HeartbeatTimeout { .. })
        ),
        "awaiting a snapshot counts too"
    );
    assert_eq!(ix.ready_mask(), 0b010);
    assert_eq!(ix.check_deadlines(0, Instant::now()), None);
}

/// Two lanes with a 50 ms heartbeat deadline, fed by ingestion workers whose deadline keeper
/// ticks every 10 ms.
fn two_lanes_with_workers() -> (std::sync::Arc<GlobalCkfIndexer>, IngestionWorkers) {
    let policy = LagPolicy {
        heartbeat_deadline: Some(Duration::from_millis(50)),
        apply_deadline: None,
        drain_grace: None,
    };
    let ix =
        std::sync::Arc::new(GlobalCkfIndexer::with_policy(manifest(2), INSTANCE, policy).unwrap());
    let workers = IngestionWorkers::new(
        ix.clone(),
        IngestionWorkersConfig {
            queue_capacity: 8,
            tick: Duration::from_millis(10),
        },
    );
    (ix, workers)
}

#[test]
fn a_lease_granted_while_the_deadline_keeper_sleeps_is_timed_by_it() {
    let (ix, workers) = two_lanes_with_workers();
    let events = workers.subscribe(1).unwrap();
    // No lease yet: the keeper has nothing to time and sleeps (past several ticks here).
    std::thread::sleep(Duration::from_millis(100));
    // A producer attaches and never sends a frame: the grant alone must wake the keeper, which
    // retires the silent lease one heartbeat deadline later. No lane leased, the keeper sleeps
    // again, and the next grant wakes it again.
    for incarnation in [1, 2] {
        let stream = attach(&ix, "dc-1", incarnation);
        let ev = events.recv_timeout(Duration::from_secs(30)).unwrap();
        assert_eq!(ev.lease, stream.tag.lease);
        assert!(
            matches!(
                ev.kind,
                LaneEventKind::Retired(RetireReason::HeartbeatTimeout { .. })
            ),
            "{ev:?}"
        );
    }
    assert_eq!(ix.lane_status(0).unwrap().state, LaneState::Unassigned);
}

#[test]
fn pool_heartbeat_deadline_emits_retirement_event() {
    let (ix, pool_) = two_lanes_with_workers();
    let a = attach(&ix, "dc-0", 1);
    let events = pool_.subscribe(0).unwrap();
    let out = pool_
        .submit_with_reply(a.snapshot(0, table_words(1)))
        .unwrap()
        .recv()
        .unwrap();
    assert_eq!(
        out,
        IngestOutcome::Activated {
            installed_sequence: 0
        }
    );
    assert_eq!(
        events.recv().unwrap().kind,
        LaneEventKind::Activated {
            installed_sequence: 0
        }
    );
    // Silence: the worker retires the lane by itself and tells the subscriber.
    let ev = events.recv_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(ev.lease, a.tag.lease);
    assert!(
        matches!(
            ev.kind,
            LaneEventKind::Retired(RetireReason::HeartbeatTimeout { .. })
        ),
        "{ev:?}"
    );
    assert_eq!(ix.ready_mask(), 0);
    pool_.shutdown();
}

#[test]
fn saturation_retires_only_that_lane() {
    let ix = std::sync::Arc::new(indexer(2));
    let a = activate(&ix, "dc-0", 1, 0, table_words(1));
    let b = activate(&ix, "dc-1", 2, 0, table_words(2));
    let pool_ = IngestionWorkers::new(
        ix.clone(),
        IngestionWorkersConfig {
            queue_capacity: 2,
            tick: Duration::from_millis(10),
        },
    );
    // Hold lane 0's ingestor busy with a blocked reply? Simpler: stall the worker by holding the
    // queue full faster than it drains is timing-dependent, so fill it while the worker is
    // blocked on the lane lock taken here via lane_status in a loop is also timing-dependent.
    // Instead submit until saturation happens (bounded by a generous limit).
    let mut seq = 0;
    let mut saturated = None;
    let (tx, rx) = flume::unbounded();
    for _ in 0..1_000_000 {
        match pool_.submit(a.delta(seq, seq + 1, &[(0, seq + 1)]), Some(tx.clone())) {
            Ok(()) => seq += 1,
            Err(e) => {
                saturated = Some(e);
                break;
            }
        }
    }
    let err = saturated.expect("a 2-frame queue saturates");
    assert_eq!(
        err,
        SubmitError::Saturated {
            lane: 0,
            capacity: 2,
            retired: true
        }
    );
    drop(tx);
    let outcomes: Vec<_> = rx.iter().collect();
    assert_eq!(
        outcomes.len() as u64,
        seq,
        "every queued frame got an outcome"
    );
    assert_eq!(ix.lane_status(0).unwrap().state, LaneState::Retired);
    assert_eq!(
        ix.lane_status(0).unwrap().last_retirement,
        Some(RetireReason::Saturated { capacity: 2 })
    );
    assert_eq!(ix.ready_mask(), 0b10);
    let out = pool_
        .submit_with_reply(b.delta(0, 1, &[(0, 7)]))
        .unwrap()
        .recv()
        .unwrap();
    assert_eq!(
        out,
        IngestOutcome::Applied {
            installed_sequence: 1
        }
    );
    pool_.shutdown();
}
