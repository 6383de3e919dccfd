//! Supersession and stale lanes: the attach modes (`TAKEOVER`, `IF_VACANT`), what a
//! live attachment is, lane contention, the drain grace and the heartbeat sequence check, unit
//! by unit and against a simple model of one lane (proptest).

use std::time::{Duration, Instant};

use ckf_core::addressing::TableFormat;
use ckf_core::global::{
    AttachError, AttachMode, AttachRequest, ClaimedFormat, GlobalCkfIndexer, Manifest,
};
use ckf_core::identity::{IndexerDomainId, LaneLease, PoolId, ProducerIncarnation, StreamTag};
use ckf_core::lane::{
    ContentionKind, IngestOutcome, LagPolicy, LaneEventKind, LaneState, RetireReason,
};
use ckf_core::testing::TestStream;
use proptest::prelude::*;

const BUCKETS: u64 = 64;

fn format() -> TableFormat {
    TableFormat::new(BUCKETS, 0).unwrap()
}

fn pool(dc: &str) -> PoolId {
    PoolId::new("prod", dc).unwrap()
}

fn indexer(policy: LagPolicy) -> GlobalCkfIndexer {
    let manifest = Manifest {
        domain: IndexerDomainId::new("prod").unwrap(),
        format: format(),
        lanes: vec![pool("dc-a"), pool("dc-b")],
    };
    GlobalCkfIndexer::with_policy(manifest, 0xAB, policy).unwrap()
}

fn request(dc: &str, incarnation: u64, mode: AttachMode) -> AttachRequest {
    AttachRequest {
        pool: pool(dc),
        incarnation: ProducerIncarnation(incarnation),
        format: ClaimedFormat::Valid(format()),
        mode,
    }
}

/// Attaches and returns the stream envelope of the granted lease.
fn attach(
    ix: &GlobalCkfIndexer,
    dc: &str,
    incarnation: u64,
    mode: AttachMode,
) -> Result<TestStream, AttachError> {
    let at = ix.attach(&request(dc, incarnation, mode))?;
    Ok(TestStream {
        tag: StreamTag {
            incarnation: at.incarnation(),
            lease: at.lease(),
        },
    })
}

/// Attaches (takeover) and installs an all-zero snapshot tagged `sequence`.
fn active(ix: &GlobalCkfIndexer, dc: &str, incarnation: u64, sequence: u64) -> TestStream {
    let s = attach(ix, dc, incarnation, AttachMode::Takeover).unwrap();
    assert_eq!(
        ix.ingest_now(&s.snapshot(sequence, vec![0; BUCKETS as usize])),
        IngestOutcome::Activated {
            installed_sequence: sequence
        }
    );
    s
}

fn policy(heartbeat: Option<Duration>, drain_grace: Option<Duration>) -> LagPolicy {
    LagPolicy {
        heartbeat_deadline: heartbeat,
        apply_deadline: None,
        drain_grace,
    }
}

/// An attach decided right after this consumer's own stall, before the lane's worker ran
/// again (on resume, an attach queued meanwhile may be read first), does not count the stall
/// as the holder's silence: an `IF_VACANT` contender is refused, the holder keeps the lane.
#[test]
fn an_attach_decided_right_after_the_consumers_own_stall_keeps_the_live_holder() {
    let ix = indexer(LagPolicy {
        heartbeat_deadline: Some(Duration::from_millis(300)),
        apply_deadline: None,
        drain_grace: None,
    });
    let holder = active(&ix, "dc-a", 1, 3);
    ix.note_consumer_ran(0, Instant::now());
    // Nothing of this consumer runs for longer than the deadline (a stopped process).
    std::thread::sleep(Duration::from_millis(400));
    let err = attach(&ix, "dc-a", 2, AttachMode::IfVacant).unwrap_err();
    assert!(matches!(err, AttachError::Occupied { .. }), "{err}");
    let status = &ix.lane_statuses()[0];
    assert_eq!(status.retirements, 0, "{status:?}");
    assert_eq!(status.lease, Some(holder.tag.lease), "{status:?}");
}

#[test]
fn if_vacant_is_refused_by_a_live_holder_naming_it_and_changes_nothing() {
    let ix = indexer(LagPolicy::DISABLED);
    let holder = active(&ix, "dc-a", 1, 3);
    let other = active(&ix, "dc-b", 7, 0);
    let before = ix.lane_statuses();
    let err = attach(&ix, "dc-a", 2, AttachMode::IfVacant).unwrap_err();
    assert_eq!(
        err,
        AttachError::Occupied {
            pool: pool("dc-a"),
            lane: 0,
            holder: ProducerIncarnation(1),
            epoch: holder.tag.lease.epoch,
            state: LaneState::Active,
        }
    );
    let text = err.to_string();
    assert!(
        text.contains("incarnation 0x0000000000000001") && text.contains("lease epoch 1"),
        "{text}"
    );
    let after = ix.lane_statuses();
    // Lease, holder, state, readiness and content are as they were; only the count moved.
    assert_eq!(after[0].lease, before[0].lease);
    assert_eq!(after[0].incarnation, before[0].incarnation);
    assert_eq!(after[0].state, LaneState::Active);
    assert!(after[0].ready);
    assert_eq!(after[0].installed_sequence, Some(3));
    let c = after[0].contention.expect("contention recorded");
    assert_eq!(
        (c.count, c.last_kind, c.last_contender, c.last_holder),
        (
            1,
            ContentionKind::IfVacantRefused,
            ProducerIncarnation(2),
            ProducerIncarnation(1)
        )
    );
    assert_eq!(after[1], before[1], "the other lane is untouched");
    // The holder's stream goes on.
    assert_eq!(
        ix.ingest_now(&holder.delta(3, 4, &[(1, 9)])),
        IngestOutcome::Applied {
            installed_sequence: 4
        }
    );
    let _ = other;
}

#[test]
fn a_holder_awaiting_its_snapshot_is_live_too() {
    let ix = indexer(LagPolicy::DISABLED);
    let s = attach(&ix, "dc-a", 1, AttachMode::Takeover).unwrap();
    let err = attach(&ix, "dc-a", 2, AttachMode::IfVacant).unwrap_err();
    assert!(
        matches!(
            err,
            AttachError::Occupied {
                state: LaneState::AwaitingSnapshot,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        ix.lane_status(0).unwrap().lease,
        Some(s.tag.lease),
        "nothing superseded"
    );
}

#[test]
fn if_vacant_is_granted_on_a_vacant_lane() {
    let ix = indexer(LagPolicy::DISABLED);
    // Never leased.
    attach(&ix, "dc-a", 1, AttachMode::IfVacant).expect("unassigned is vacant");
    // Retired.
    let ix = indexer(LagPolicy::DISABLED);
    let s = active(&ix, "dc-a", 1, 0);
    assert!(ix.retire_lease(
        s.tag.lease,
        RetireReason::StreamLost {
            detail: "test".into()
        }
    ));
    attach(&ix, "dc-a", 2, AttachMode::IfVacant).expect("retired is vacant");
    // Drained, inside its grace (a rolling restart).
    let ix = indexer(policy(None, Some(Duration::from_secs(600))));
    let s = active(&ix, "dc-a", 1, 5);
    assert_eq!(
        ix.ingest_now(&s.drain(5)),
        IngestOutcome::Drained {
            installed_sequence: 5
        }
    );
    let new = attach(&ix, "dc-a", 2, AttachMode::IfVacant).expect("drained is vacant");
    assert_eq!(new.tag.lease.epoch, s.tag.lease.epoch + 1);
    assert_eq!(ix.lane_status(0).unwrap().contention, None);
    // The holder's own incarnation (its older stream broke unnoticed) is never refused.
    let ix = indexer(LagPolicy::DISABLED);
    active(&ix, "dc-a", 1, 0);
    attach(&ix, "dc-a", 1, AttachMode::IfVacant).expect("own incarnation");
    assert_eq!(ix.lane_status(0).unwrap().contention, None);
}

#[test]
fn a_holder_silent_past_the_heartbeat_deadline_is_not_live() {
    let ix = indexer(policy(Some(Duration::from_millis(30)), None));
    active(&ix, "dc-a", 1, 0);
    assert!(attach(&ix, "dc-a", 2, AttachMode::IfVacant).is_err());
    std::thread::sleep(Duration::from_millis(60));
    // The grant enforces the deadline first: the silent holder is retired, the lane vacant.
    let s = attach(&ix, "dc-a", 2, AttachMode::IfVacant).expect("vacant after the deadline");
    let status = ix.lane_status(0).unwrap();
    assert!(matches!(
        status.last_retirement,
        Some(RetireReason::HeartbeatTimeout { .. })
    ));
    assert_eq!(status.lease, Some(s.tag.lease));
    assert_eq!(
        status.contention.map(|c| c.count),
        Some(1),
        "the earlier refusal"
    );
}

#[test]
fn takeover_of_a_live_holder_is_counted_and_announced() {
    let ix = indexer(LagPolicy::DISABLED);
    let old = active(&ix, "dc-a", 1, 0);
    let events = ix.subscribe(0).unwrap();
    let new = attach(&ix, "dc-a", 2, AttachMode::Takeover).unwrap();
    let kinds: Vec<_> = events.try_iter().collect();
    assert_eq!(kinds.len(), 2, "{kinds:?}");
    assert_eq!(kinds[0].lease, old.tag.lease);
    assert_eq!(
        kinds[0].kind,
        LaneEventKind::Contended {
            kind: ContentionKind::Takeover,
            contender: ProducerIncarnation(2)
        }
    );
    assert_eq!(
        kinds[1].kind,
        LaneEventKind::Superseded {
            by: new.tag.lease,
            incarnation: ProducerIncarnation(2)
        }
    );
    let c = ix.lane_status(0).unwrap().contention.unwrap();
    assert_eq!((c.count, c.last_kind), (1, ContentionKind::Takeover));
    // Not contention: the same incarnation again, or a lane that is not live.
    attach(&ix, "dc-a", 2, AttachMode::Takeover).unwrap();
    let s = attach(&ix, "dc-b", 3, AttachMode::Takeover).unwrap();
    ix.retire_lease(s.tag.lease, RetireReason::StreamLost { detail: "x".into() });
    attach(&ix, "dc-b", 4, AttachMode::Takeover).unwrap();
    let st = ix.lane_statuses();
    assert_eq!(st[0].contention.map(|c| c.count), Some(1));
    assert_eq!(st[1].contention, None);
}

#[test]
fn a_drained_lane_stays_ready_for_its_grace_then_retires() {
    let grace = Duration::from_secs(5);
    let ix = indexer(policy(Some(Duration::from_secs(1)), Some(grace)));
    let s = active(&ix, "dc-a", 1, 4);
    let drained_at = Instant::now();
    assert!(matches!(
        ix.ingest_now(&s.drain(4)),
        IngestOutcome::Drained { .. }
    ));
    let st = ix.lane_status(0).unwrap();
    assert!(st.drained && st.ready);
    let deadline = st.drain_grace_deadline.expect("a grace deadline");
    assert!(deadline >= drained_at + grace && deadline <= Instant::now() + grace);
    // Silence past the heartbeat deadline is fine for a drained lane; the grace is not over.
    assert_eq!(
        ix.check_deadlines(0, deadline - Duration::from_millis(1)),
        None
    );
    assert!(ix.lane_status(0).unwrap().ready);
    let reason = ix.check_deadlines(0, deadline).expect("grace over");
    assert!(
        matches!(
            reason,
            RetireReason::DrainGraceExpired { grace_ms: 5000, .. }
        ),
        "{reason:?}"
    );
    assert_eq!(reason.label(), "drain_grace_expired");
    let st = ix.lane_status(0).unwrap();
    assert_eq!(st.state, LaneState::Retired);
    assert!(!st.ready && ix.ready_mask() == 0);
    assert_eq!(st.drain_grace_deadline, None);
    // Afterwards the lane is vacant.
    attach(&ix, "dc-a", 2, AttachMode::IfVacant).unwrap();
}

#[test]
fn a_new_lease_inside_the_grace_keeps_the_lane() {
    let ix = indexer(policy(None, Some(Duration::from_secs(5))));
    let old = active(&ix, "dc-a", 1, 4);
    ix.ingest_now(&old.drain(4));
    let new = attach(&ix, "dc-a", 2, AttachMode::Takeover).unwrap();
    assert_eq!(
        ix.lane_status(0).unwrap().contention,
        None,
        "drained is vacant"
    );
    assert_eq!(
        ix.check_deadlines(0, Instant::now() + Duration::from_secs(60)),
        None
    );
    assert_eq!(
        ix.ingest_now(&new.snapshot(0, vec![0; BUCKETS as usize])),
        IngestOutcome::Activated {
            installed_sequence: 0
        }
    );
    assert_eq!(
        ix.check_deadlines(0, Instant::now() + Duration::from_secs(60)),
        None
    );
    let st = ix.lane_status(0).unwrap();
    assert_eq!(
        (st.state, st.ready, st.retirements),
        (LaneState::Active, true, 0)
    );
}

#[test]
fn zero_grace_retires_at_the_first_check_and_none_never() {
    let ix = indexer(policy(None, Some(Duration::ZERO)));
    let s = active(&ix, "dc-a", 1, 0);
    ix.ingest_now(&s.drain(0));
    assert!(matches!(
        ix.check_deadlines(0, Instant::now()),
        Some(RetireReason::DrainGraceExpired { grace_ms: 0, .. })
    ));
    let ix = indexer(LagPolicy::DISABLED);
    let s = active(&ix, "dc-a", 1, 0);
    ix.ingest_now(&s.drain(0));
    assert_eq!(
        ix.check_deadlines(0, Instant::now() + Duration::from_secs(86_400)),
        None
    );
    assert!(ix.lane_status(0).unwrap().ready);
}

#[test]
fn a_heartbeat_claiming_another_sequence_retires_the_lane_as_a_gap() {
    let ix = indexer(LagPolicy::DISABLED);
    let s = attach(&ix, "dc-a", 1, AttachMode::Takeover).unwrap();
    // Awaiting the snapshot: nothing installed to compare with.
    assert_eq!(ix.ingest_now(&s.heartbeat(0)), IngestOutcome::Alive);
    assert_eq!(ix.ingest_now(&s.heartbeat(42)), IngestOutcome::Alive);
    ix.ingest_now(&s.snapshot(3, vec![0; BUCKETS as usize]));
    assert_eq!(ix.ingest_now(&s.heartbeat(3)), IngestOutcome::Alive);
    let b = active(&ix, "dc-b", 2, 0);
    let want = RetireReason::HeartbeatGap {
        installed: 3,
        heartbeat: 9,
    };
    assert_eq!(
        ix.ingest_now(&s.heartbeat(9)),
        IngestOutcome::Retired(want.clone())
    );
    assert_eq!(
        want.to_string(),
        "gap: heartbeat claims sequence 9 but installed sequence is 3"
    );
    let st = ix.lane_statuses();
    assert_eq!((st[0].state, st[0].ready), (LaneState::Retired, false));
    assert_eq!(st[0].last_retirement, Some(want));
    assert_eq!((st[1].state, st[1].ready), (LaneState::Active, true));
    assert_eq!(ix.ingest_now(&b.heartbeat(0)), IngestOutcome::Alive);
}

// ---------------------------------------------------------------- model

#[derive(Debug, Clone, Copy)]
enum Op {
    Attach { incarnation: u64, if_vacant: bool },
    Snapshot,
    Drain,
    Lose,
    ExpireGrace,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1u64..=3, any::<bool>()).prop_map(|(incarnation, if_vacant)| Op::Attach { incarnation, if_vacant }),
        2 => Just(Op::Snapshot),
        1 => Just(Op::Drain),
        1 => Just(Op::Lose),
        1 => Just(Op::ExpireGrace),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum M {
    Unassigned,
    Awaiting,
    Active,
    Drained,
    Retired,
}

#[derive(Debug)]
struct Model {
    state: M,
    holder: Option<u64>,
    epoch: u64,
    contention: u64,
}

impl Model {
    fn live(&self) -> bool {
        matches!(self.state, M::Awaiting | M::Active)
    }
}

proptest! {
    /// The lane follows the model: `IF_VACANT` is granted exactly when no other incarnation
    /// holds a live attachment, a refusal changes nothing but the contention count, and every
    /// attach by another incarnation while the lane is live is counted.
    #[test]
    fn one_lane_follows_the_lease_model(ops in proptest::collection::vec(op(), 1..60)) {
        let grace = Duration::from_secs(10);
        let ix = indexer(policy(None, Some(grace)));
        let mut m = Model { state: M::Unassigned, holder: None, epoch: 0, contention: 0 };
        let mut cur: Option<TestStream> = None;
        for op in ops {
            match op {
                Op::Attach { incarnation, if_vacant } => {
                    let mode = if if_vacant { AttachMode::IfVacant } else { AttachMode::Takeover };
                    let contended = m.live() && m.holder != Some(incarnation);
                    let got = attach(&ix, "dc-a", incarnation, mode);
                    if contended {
                        m.contention += 1;
                    }
                    if contended && if_vacant {
                        let holder = m.holder.unwrap();
                        prop_assert!(
                            matches!(got, Err(AttachError::Occupied { holder: h, epoch, .. })
                                if h == ProducerIncarnation(holder) && epoch == m.epoch),
                            "{got:?} vs {m:?}"
                        );
                    } else {
                        let s = got.expect("granted");
                        m.epoch += 1;
                        m.holder = Some(incarnation);
                        m.state = M::Awaiting;
                        prop_assert_eq!(s.tag.lease, LaneLease { consumer_instance: 0xAB, lane: 0, epoch: m.epoch });
                        cur = Some(s);
                    }
                }
                Op::Snapshot => if let Some(s) = cur {
                    ix.ingest_now(&s.snapshot(0, vec![0; BUCKETS as usize]));
                    if matches!(m.state, M::Awaiting | M::Active | M::Drained) {
                        m.state = M::Active;
                    }
                },
                Op::Drain => if let Some(s) = cur {
                    ix.ingest_now(&s.drain(0));
                    m.state = match m.state {
                        M::Active | M::Drained => M::Drained,
                        M::Awaiting => M::Retired,
                        other => other,
                    };
                },
                Op::Lose => if let Some(s) = cur {
                    ix.retire_lease(s.tag.lease, RetireReason::StreamLost { detail: "model".into() });
                    if matches!(m.state, M::Awaiting | M::Active | M::Drained) {
                        m.state = M::Retired;
                    }
                },
                Op::ExpireGrace => {
                    let retired = ix.check_deadlines(0, Instant::now() + grace * 2);
                    prop_assert_eq!(retired.is_some(), m.state == M::Drained);
                    if m.state == M::Drained {
                        m.state = M::Retired;
                    }
                }
            }
            let st = ix.lane_status(0).unwrap();
            let want = match m.state {
                M::Unassigned => LaneState::Unassigned,
                M::Awaiting => LaneState::AwaitingSnapshot,
                M::Active | M::Drained => LaneState::Active,
                M::Retired => LaneState::Retired,
            };
            prop_assert_eq!(st.state, want, "{:?} after {:?}", m, op);
            prop_assert_eq!(st.drained, m.state == M::Drained);
            prop_assert_eq!(st.ready, matches!(m.state, M::Active | M::Drained));
            prop_assert_eq!(st.lease.map_or(0, |l| l.epoch), m.epoch);
            prop_assert_eq!(st.incarnation.map(|i| i.0), m.holder);
            prop_assert_eq!(st.contention.map_or(0, |c| c.count), m.contention);
        }
    }

    /// Two live producers, the older one retrying `IF_VACANT` any number of times, never take
    /// the lane from each other: the epoch moves once (the newer one's takeover).
    #[test]
    fn a_standby_producer_never_flaps(retries in 1usize..40) {
        let ix = indexer(LagPolicy::DISABLED);
        active(&ix, "dc-a", 1, 0);
        let newer = active(&ix, "dc-a", 2, 0);
        for _ in 0..retries {
            prop_assert!(attach(&ix, "dc-a", 1, AttachMode::IfVacant).is_err());
        }
        let st = ix.lane_status(0).unwrap();
        prop_assert_eq!(st.lease, Some(newer.tag.lease));
        prop_assert_eq!(st.lease.unwrap().epoch, 2);
        prop_assert_eq!(st.contention.unwrap().count, retries as u64 + 1);
    }
}
