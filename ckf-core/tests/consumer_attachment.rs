//! `GlobalCkfIndexer::attach` and `Attachment`: what a service streaming frames under a lease is
//! told (docs/design.md, "Lane recovery and failure boundaries"). Every verdict is checked against
//! the lane state it must leave behind, and every refusal against the other lane.

use std::sync::Arc;
use std::time::Duration;

use ckf_core::addressing::TableFormat;
use ckf_core::failure::{Disposed, Disposition};
use ckf_core::global::{
    AttachError, AttachMode, AttachRequest, ClaimedFormat, GlobalCkfIndexer, Manifest, StreamEnd,
    StreamVerdict,
};
use ckf_core::identity::{IndexerDomainId, LaneLease, PoolId, ProducerIncarnation};
use ckf_core::ingestion::{IngestionWorkers, IngestionWorkersConfig, SubmitError};
use ckf_core::lane::{IgnoreReason, IngestOutcome, LagPolicy, LaneState, RetireReason, StrayFrame};
use ckf_core::testing::{self, TestStream};

const BUCKETS: u64 = 64;

fn format() -> TableFormat {
    TableFormat::new(BUCKETS, 3).unwrap()
}

fn pool(dc: &str) -> PoolId {
    PoolId::new("prod", dc).unwrap()
}

fn indexer() -> GlobalCkfIndexer {
    let manifest = Manifest {
        domain: IndexerDomainId::new("prod").unwrap(),
        format: format(),
        lanes: vec![pool("dc-a"), pool("dc-b")],
    };
    GlobalCkfIndexer::with_policy(manifest, 0xAB, LagPolicy::DISABLED).unwrap()
}

fn request(dc: &str, incarnation: u64) -> AttachRequest {
    AttachRequest {
        pool: pool(dc),
        incarnation: ProducerIncarnation(incarnation),
        format: ClaimedFormat::Valid(format()),
        mode: AttachMode::Takeover,
    }
}

/// The verdicts of `at`'s pending lane events other than `Continue` (the events that end or
/// change its stream), in order.
fn ending_events(at: &ckf_core::global::Attachment) -> Vec<StreamVerdict> {
    at.events()
        .try_iter()
        .map(|e| at.event(e))
        .filter(|v| *v != StreamVerdict::Continue)
        .collect()
}

/// An attachment of dc-a (lane 0) with an installed snapshot at sequence 0; lane 1 active too.
fn attached_and_ready(ix: &GlobalCkfIndexer) -> (ckf_core::global::Attachment, TestStream) {
    testing::activate(ix, 1, 9, 0, vec![0; BUCKETS as usize]);
    let at = ix.attach(&request("dc-a", 5)).unwrap();
    let stream = TestStream {
        tag: ckf_core::StreamTag {
            incarnation: at.incarnation(),
            lease: at.lease(),
        },
    };
    let outcome = ix.ingest_now(&stream.snapshot(0, vec![0; BUCKETS as usize]));
    assert_eq!(
        at.outcome(outcome),
        StreamVerdict::Activated {
            installed_sequence: 0
        }
    );
    (at, stream)
}

#[test]
fn refusals_name_the_configured_pools_and_both_formats_and_lease_nothing() {
    let ix = indexer();
    let err = ix.attach(&request("dc-z", 1)).unwrap_err();
    assert_eq!(
        err,
        AttachError::UnknownPool {
            pool: pool("dc-z"),
            configured: vec![pool("dc-a"), pool("dc-b")],
        }
    );
    assert_eq!(
        err.to_string(),
        "pool prod/dc-z is not a lane of this indexer (configured pools: prod/dc-a, prod/dc-b)"
    );
    assert_eq!(err.disposition(), Disposition::Omission);

    let other = TableFormat::new(128, 3).unwrap();
    let mut wrong = request("dc-a", 1);
    wrong.format = ClaimedFormat::Valid(other);
    let msg = ix.attach(&wrong).unwrap_err().to_string();
    assert!(
        msg.contains(&format!(
            "indexer has [{}], producer has [{other}]",
            format()
        )),
        "{msg}"
    );

    // A format this build cannot use is a mismatch too, naming why.
    let mut unusable = request("dc-a", 1);
    unusable.format = ClaimedFormat::Unusable {
        shown: "TableFormat { bucket_count: 1001 }".into(),
        problem: "bucket count 1001 is odd (it must be even)".into(),
    };
    let err = ix.attach(&unusable).unwrap_err();
    assert!(matches!(err, AttachError::FormatMismatch { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("producer has [TableFormat { bucket_count: 1001 }] (bucket count 1001"),
        "{msg}"
    );
    // An unknown pool wins over a bad format (the pool is checked first).
    unusable.pool = pool("dc-z");
    assert!(matches!(
        ix.attach(&unusable).unwrap_err(),
        AttachError::UnknownPool { .. }
    ));
    assert_eq!(testing::lane_states(&ix), [LaneState::Unassigned; 2]);
}

#[test]
fn an_attachment_holds_its_lease_and_answers_its_frames() {
    let ix = indexer();
    let (at, s) = attached_and_ready(&ix);
    assert_eq!(at.lane(), 0);
    assert_eq!(at.pool(), &pool("dc-a"));
    assert_eq!(at.incarnation(), ProducerIncarnation(5));
    assert_eq!(ix.lane_status(0).unwrap().lease, Some(at.lease()));

    let delta = s.delta(0, 1, &[(3, 7)]);
    at.check(&delta).unwrap();
    assert_eq!(
        at.outcome(ix.ingest_now(&delta)),
        StreamVerdict::Applied {
            installed_sequence: 1
        }
    );
    assert_eq!(
        at.outcome(ix.ingest_now(&s.heartbeat(1))),
        StreamVerdict::Continue
    );
    assert_eq!(
        at.outcome(ix.ingest_now(&s.drain(1))),
        StreamVerdict::Drained {
            installed_sequence: 1
        }
    );
    // Its own activation and drain events were already answered by the outcomes.
    assert_eq!(ending_events(&at), []);
}

#[test]
fn a_frame_under_another_lease_is_refused_before_submission() {
    let ix = indexer();
    let (at, s) = attached_and_ready(&ix);
    let mut forged = s;
    forged.tag.lease.epoch += 5;
    let err = at.check(&forged.heartbeat(0)).unwrap_err();
    assert_eq!(
        err,
        StrayFrame::ForeignLease {
            frame: "heartbeat",
            got: forged.tag.lease,
            held: at.lease(),
        }
    );
    assert!(err.to_string().contains("but this stream holds"), "{err}");
    assert_eq!(err.disposition(), Disposition::RetireLane);
    let mut other_lane = s;
    other_lane.tag.lease.lane = 1;
    assert!(at.check(&other_lane.delta(0, 1, &[(0, 1)])).is_err());
}

#[test]
fn stream_loss_retires_the_current_lease_only() {
    let ix = indexer();
    let (at, _) = attached_and_ready(&ix);
    assert!(at.stream_lost(&ix, "transport broke"));
    let st = ix.lane_status(0).unwrap();
    assert_eq!(st.state, LaneState::Retired);
    assert_eq!(
        st.last_retirement,
        Some(RetireReason::StreamLost {
            detail: "transport broke".into()
        })
    );
    assert_eq!(ix.ready_mask(), 0b10, "the other lane keeps answering");
    assert!(!at.stream_lost(&ix, "again"), "already retired");

    // A superseded attachment's loss leaves the newer one alone.
    let newer = ix.attach(&request("dc-a", 6)).unwrap();
    let newest = ix.attach(&request("dc-a", 7)).unwrap();
    assert!(!newer.stream_lost(&ix, "late"));
    let st = ix.lane_status(0).unwrap();
    assert_eq!(
        (st.state, st.lease),
        (LaneState::AwaitingSnapshot, Some(newest.lease()))
    );
}

#[test]
fn a_newer_attachment_supersedes_by_event_and_by_stale_outcome() {
    let ix = indexer();
    let (old, s) = attached_and_ready(&ix);
    let new = ix.attach(&request("dc-a", 6)).unwrap();
    let want = StreamEnd::Superseded {
        pool: pool("dc-a"),
        held: old.lease(),
        by: new.lease(),
        by_incarnation: Some(ProducerIncarnation(6)),
    };
    assert_eq!(ending_events(&old), vec![StreamVerdict::End(want.clone())]);
    assert_eq!(
        want.to_string(),
        format!(
            "superseded by a newer attachment for pool prod/dc-a: lease epoch {} replaced epoch {} \
             (held by incarnation 0x0000000000000006)",
            new.lease().epoch,
            old.lease().epoch
        )
    );
    assert_eq!(want.disposition(), Disposition::NewLeaseAndSnapshot);
    // A frame of the old stream that raced the grant is ignored as stale: the same verdict,
    // without the holder (a stale lease does not name it).
    let StreamEnd::Superseded { pool, held, by, .. } = want else {
        unreachable!("built above")
    };
    assert_eq!(
        old.outcome(ix.ingest_now(&s.delta(0, 1, &[(0, 1)]))),
        StreamVerdict::End(StreamEnd::Superseded {
            pool,
            held,
            by,
            by_incarnation: None
        })
    );
    // The new attachment ignores the old lease's events.
    assert_eq!(ending_events(&new), []);
}

#[test]
fn retirements_end_the_stream_with_their_reason() {
    let ix = indexer();
    let (at, s) = attached_and_ready(&ix);
    let gap = RetireReason::Gap {
        installed: 0,
        base_sequence: 4,
    };
    let end = StreamEnd::Retired {
        lane: 0,
        reason: gap.clone(),
    };
    assert_eq!(
        at.outcome(ix.ingest_now(&s.delta(4, 5, &[(0, 1)]))),
        StreamVerdict::End(end.clone())
    );
    assert_eq!(end.disposition(), Disposition::RetireLane);
    // The retirement event says the same; later frames find the lane retired.
    assert_eq!(ending_events(&at), vec![StreamVerdict::End(end.clone())]);
    assert_eq!(
        at.outcome(ix.ingest_now(&s.heartbeat(0))),
        StreamVerdict::End(end)
    );
}

#[test]
fn ignored_and_rejected_outcomes_are_reported_as_they_are() {
    let ix = indexer();
    let (at, _) = attached_and_ready(&ix);
    let other = IgnoreReason::OtherIncarnation {
        frame: ProducerIncarnation(1),
        current: ProducerIncarnation(5),
    };
    assert_eq!(
        at.outcome(IngestOutcome::Ignored(other.clone())),
        StreamVerdict::End(StreamEnd::Ignored(other))
    );
    let unknown = StrayFrame::UnknownLease {
        lane: 0,
        epoch: 9,
        latest: 1,
    };
    let end = StreamEnd::Refused(unknown.clone());
    assert_eq!(
        at.outcome(IngestOutcome::Rejected(unknown)),
        StreamVerdict::End(end.clone())
    );
    assert_eq!(end.disposition(), Disposition::Omission);
    assert_eq!(ix.lane_status(0).unwrap().state, LaneState::Active);
}

#[test]
fn queue_refusals_become_stream_ends() {
    let ix = Arc::new(indexer());
    let (at, s) = attached_and_ready(&ix);
    assert_eq!(
        at.submit_failed(SubmitError::Saturated {
            lane: 0,
            capacity: 4,
            retired: true
        }),
        StreamEnd::Retired {
            lane: 0,
            reason: RetireReason::Saturated { capacity: 4 }
        }
    );
    assert_eq!(at.submit_failed(SubmitError::ShutDown), StreamEnd::ShutDown);
    // Through a real pool: a frame for a lane outside the manifest is refused as unknown.
    let pool = IngestionWorkers::new(
        Arc::clone(&ix),
        IngestionWorkersConfig {
            queue_capacity: 4,
            tick: Duration::from_millis(10),
        },
    );
    let mut nowhere = s;
    nowhere.tag.lease = LaneLease {
        lane: 7,
        ..s.tag.lease
    };
    let err = pool.submit(nowhere.heartbeat(0), None).unwrap_err();
    assert_eq!(
        at.submit_failed(err),
        StreamEnd::Refused(StrayFrame::UnknownLane { lane: 7, lanes: 2 })
    );
    pool.shutdown();
}
