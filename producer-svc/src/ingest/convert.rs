//! Ingest wire messages <-> the actor's core terms ([`crate::events`]).
//!
//! Decoding checks only wire well-formedness (required fields, the source id's canonical form,
//! batch size) and the stateless size quotas; the rules themselves are `ckf-core`'s
//! (`identity::SourceId`, `dc::Quotas::check_batch`), as is every rule about ownership and the
//! filter.

use ckf_core::dc::{DcCkfStats, EventOutcome, KvEvent, KvEventKind, MemberId, Quotas};
use ckf_core::identity::{ProducerIdentity, SourceId};
use ckf_proto::v1;
use ckf_proto::v1::kv_event::Kind;

use crate::error::RequestError;
use crate::events::{BatchReport, EventError, EventReport, IngestBatch, IngestEvent};
use ckf_core::sources::SequenceCheck;

/// Decodes one wire batch. Malformed events become `Err` entries; a bad source id, too many
/// events or a size quota refuses the whole batch before anything of it is applied.
///
/// # Errors
/// [`RequestError::BadSourceId`], [`RequestError::TooManyEvents`], [`RequestError::Quota`]
/// (`max_blocks_per_event`, `max_blocks_per_batch`).
pub fn batch_from_wire(
    batch: v1::KvEventBatch,
    max_events: usize,
    quotas: &Quotas,
) -> Result<IngestBatch, RequestError> {
    let source_id = SourceId::new(batch.source_id)?;
    if batch.events.len() > max_events {
        return Err(RequestError::TooManyEvents {
            count: batch.events.len(),
            max: max_events,
        });
    }
    quotas
        .check_batch(batch.events.iter().map(wire_blocks))
        .map_err(RequestError::Quota)?;
    Ok(IngestBatch {
        source_id,
        sequence: batch.sequence,
        events: batch
            .events
            .into_iter()
            .enumerate()
            .map(|(index, e)| event_from_wire(index, e))
            .collect(),
    })
}

/// Block hashes one wire event carries (0 for a clear, a worker removal or no kind).
fn wire_blocks(event: &v1::KvEvent) -> usize {
    match &event.kind {
        Some(Kind::Stored(s)) => s.block_hashes.len(),
        Some(Kind::Removed(r)) => r.block_hashes.len(),
        _ => 0,
    }
}

fn event_from_wire(index: usize, event: v1::KvEvent) -> Result<IngestEvent, EventError> {
    let member = event.member.ok_or(EventError::MissingMember { index })?;
    let member = MemberId::new(member.worker_id, member.dp_rank);
    let kind = match event.kind.ok_or(EventError::MissingKind { index })? {
        Kind::Stored(s) => KvEventKind::Stored {
            block_hashes: s.block_hashes,
            parent_hash: s.parent_hash,
        },
        Kind::Removed(r) => KvEventKind::Removed {
            block_hashes: r.block_hashes,
        },
        Kind::Cleared(_) => KvEventKind::Cleared,
        Kind::WorkerRemoved(_) => {
            return Ok(IngestEvent::WorkerRemoved {
                worker_id: member.worker_id,
            });
        }
    };
    Ok(IngestEvent::Kv(KvEvent { member, kind }))
}

/// One event's wire result.
fn event_result(report: &EventReport) -> v1::EventResult {
    match report {
        EventReport::Rejected(e) => v1::EventResult {
            status: v1::EventStatus::Rejected.into(),
            error: e.to_string(),
            ..Default::default()
        },
        EventReport::Refused(e) => v1::EventResult {
            status: v1::EventStatus::Refused.into(),
            error: e.to_string(),
            code: tonic::Code::ResourceExhausted as i32,
            ..Default::default()
        },
        EventReport::Applied(o) => applied_result(o),
    }
}

fn applied_result(o: &EventOutcome) -> v1::EventResult {
    let status = if o.omitted > 0 {
        v1::EventStatus::PartiallyOmitted
    } else {
        v1::EventStatus::Applied
    };
    v1::EventResult {
        status: status.into(),
        // Wire: "blocks whose ownership changed or whose removal was an applied no-op"; a
        // redundant store is an applied no-op too.
        applied_blocks: o
            .applied
            .saturating_add(o.unknown)
            .saturating_add(o.redundant),
        omitted_blocks: o.omitted,
        unknown_blocks: o.unknown,
        redundant_blocks: o.redundant,
        error: o.first_error.map(|e| e.to_string()).unwrap_or_default(),
        code: 0,
    }
}

/// The wire result of one batch.
pub fn report_to_wire(report: &BatchReport) -> v1::KvEventBatchResult {
    let (gap, duplicate) = match report.check {
        SequenceCheck::Gap { expected, received } => {
            (Some(v1::SourceGap { expected, received }), false)
        }
        SequenceCheck::Duplicate { .. } => (None, true),
        SequenceCheck::First | SequenceCheck::InOrder => (None, false),
    };
    v1::KvEventBatchResult {
        source_id: report.source_id.clone(),
        sequence: report.sequence,
        gap,
        duplicate,
        events: report.events.iter().map(event_result).collect(),
        refused: None,
    }
}

/// The wire result of a batch of a `Publish` stream that was refused whole: its echo and the
/// refusal (the status `PublishBatch` would have failed with), no event results.
pub fn refusal_to_wire(
    source_id: String,
    sequence: u64,
    error: &RequestError,
) -> v1::KvEventBatchResult {
    let status = tonic::Status::from(error.clone());
    v1::KvEventBatchResult {
        source_id,
        sequence,
        refused: Some(v1::BatchRefusal {
            code: status.code() as i32,
            message: status.message().to_owned(),
        }),
        ..Default::default()
    }
}

/// The wire form of the producer's statistics.
/// `tracked_sources`: sources whose batch sequence is tracked now.
pub fn stats_to_wire(
    identity: &ProducerIdentity,
    stats: &DcCkfStats,
    tracked_sources: u64,
) -> v1::ProducerStats {
    v1::ProducerStats {
        pool: Some((&identity.pool).into()),
        incarnation: identity.incarnation.0,
        format: Some(identity.format.into()),
        members: stats.members as u64,
        unique_blocks: stats.unique_blocks as u64,
        resident_fingerprints: stats.resident_fingerprints,
        load_factor: stats.load_factor,
        omissions_total: stats.omissions_total,
        bytes_used: stats.bytes_used,
        tracked_sources,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ckf_core::dc::QuotaError;
    use ckf_core::identity::SourceIdError;

    fn stored(worker: u64, hashes: &[u64]) -> v1::KvEvent {
        v1::KvEvent {
            member: Some(v1::MemberId {
                worker_id: worker,
                dp_rank: 1,
            }),
            kind: Some(Kind::Stored(v1::Stored {
                block_hashes: hashes.to_vec(),
                parent_hash: Some(7),
            })),
        }
    }

    #[test]
    fn malformed_events_keep_their_position() {
        let batch = v1::KvEventBatch {
            source_id: "w1".into(),
            sequence: 3,
            events: vec![
                stored(1, &[10, 11]),
                v1::KvEvent {
                    member: None,
                    kind: Some(Kind::Cleared(v1::Cleared {})),
                },
                v1::KvEvent {
                    member: Some(v1::MemberId::default()),
                    kind: None,
                },
                v1::KvEvent {
                    member: Some(v1::MemberId {
                        worker_id: 4,
                        dp_rank: 9,
                    }),
                    kind: Some(Kind::WorkerRemoved(v1::WorkerRemoved {})),
                },
            ],
        };
        let decoded = batch_from_wire(batch, 10, &Quotas::default()).unwrap();
        assert_eq!(decoded.events.len(), 4);
        assert_eq!(
            decoded.events[0],
            Ok(IngestEvent::Kv(KvEvent {
                member: MemberId::new(1, 1),
                kind: KvEventKind::Stored {
                    block_hashes: vec![10, 11],
                    parent_hash: Some(7)
                }
            }))
        );
        assert_eq!(
            decoded.events[1],
            Err(EventError::MissingMember { index: 1 })
        );
        assert_eq!(decoded.events[2], Err(EventError::MissingKind { index: 2 }));
        assert_eq!(
            decoded.events[3],
            Ok(IngestEvent::WorkerRemoved { worker_id: 4 })
        );
    }

    #[test]
    fn bad_batches_are_refused_whole() {
        let mut batch = v1::KvEventBatch {
            source_id: String::new(),
            sequence: 0,
            events: vec![stored(1, &[1])],
        };
        let q = Quotas::default();
        assert_eq!(
            batch_from_wire(batch.clone(), 10, &q),
            Err(RequestError::BadSourceId(SourceIdError::Empty))
        );
        batch.source_id = "x".repeat(129);
        assert!(matches!(
            batch_from_wire(batch.clone(), 10, &q),
            Err(RequestError::BadSourceId(SourceIdError::TooLong {
                len: 129,
                ..
            }))
        ));
        for bad in ["nul\0", "new\nline"] {
            batch.source_id = bad.into();
            let e = batch_from_wire(batch.clone(), 10, &q).unwrap_err();
            assert!(matches!(
                e,
                RequestError::BadSourceId(SourceIdError::BadCharacter { .. })
            ));
            let status = tonic::Status::from(e);
            assert_eq!(status.code(), tonic::Code::InvalidArgument);
            assert!(
                status.message().starts_with("KvEventBatch.source_id \""),
                "{}",
                status.message()
            );
        }
        batch.source_id = "ok".into();
        batch.events = vec![stored(1, &[1]); 3];
        assert_eq!(
            batch_from_wire(batch.clone(), 2, &q),
            Err(RequestError::TooManyEvents { count: 3, max: 2 })
        );
        let small = Quotas {
            max_blocks_per_event: 2,
            max_blocks_per_batch: 3,
            ..Quotas::UNLIMITED
        };
        batch.events = vec![stored(1, &[1, 2]), stored(1, &[1, 2, 3])];
        assert_eq!(
            batch_from_wire(batch.clone(), 10, &small),
            Err(RequestError::Quota(QuotaError::EventTooLarge {
                index: Some(1),
                blocks: 3,
                max: 2
            }))
        );
        batch.events = vec![stored(1, &[1, 2]), stored(1, &[1, 2])];
        let e = batch_from_wire(batch, 10, &small).unwrap_err();
        assert_eq!(
            e,
            RequestError::Quota(QuotaError::BatchTooLarge { blocks: 4, max: 3 })
        );
        let wire = refusal_to_wire("ok".into(), 7, &e);
        let refused = wire.refused.unwrap();
        assert_eq!(refused.code, tonic::Code::ResourceExhausted as i32);
        assert!(
            refused.message.contains("max_blocks_per_batch is 3"),
            "{}",
            refused.message
        );
        assert!(wire.events.is_empty());
    }

    #[test]
    fn outcomes_map_to_statuses() {
        let report = BatchReport {
            source_id: "s".into(),
            sequence: 5,
            check: SequenceCheck::Gap {
                expected: 3,
                received: 5,
            },
            events: vec![
                EventReport::Applied(EventOutcome {
                    applied: 2,
                    omitted: 1,
                    unknown: 0,
                    redundant: 1,
                    first_error: Some(ckf_core::dc::BlockError::CapacityExhausted {
                        block_hash: 9,
                        kicks: 500,
                    }),
                }),
                EventReport::Applied(EventOutcome {
                    applied: 0,
                    unknown: 2,
                    ..Default::default()
                }),
                EventReport::Rejected(EventError::MissingKind { index: 2 }),
                EventReport::Refused(QuotaError::MemberFull {
                    member: MemberId::new(1, 0),
                    held: 4,
                    adding: 1,
                    max: 4,
                }),
            ],
        };
        let wire = report_to_wire(&report);
        assert_eq!(
            wire.gap,
            Some(v1::SourceGap {
                expected: 3,
                received: 5
            })
        );
        assert!(!wire.duplicate);
        assert_eq!(wire.events[0].status(), v1::EventStatus::PartiallyOmitted);
        assert_eq!(wire.events[0].applied_blocks, 3);
        assert_eq!(wire.events[0].omitted_blocks, 1);
        assert!(
            wire.events[0].error.contains("omitted"),
            "{}",
            wire.events[0].error
        );
        assert_eq!(wire.events[1].status(), v1::EventStatus::Applied);
        assert_eq!(wire.events[1].applied_blocks, 2);
        assert_eq!(wire.events[1].unknown_blocks, 2);
        assert_eq!(wire.events[2].status(), v1::EventStatus::Rejected);
        assert!(wire.events[2].error.contains("KvEvent.kind is required"));
        assert_eq!(wire.events[3].status(), v1::EventStatus::Refused);
        assert_eq!(wire.events[3].code, tonic::Code::ResourceExhausted as i32);
        assert!(wire.events[3].error.contains("max_blocks_per_member is 4"));
        assert_eq!(wire.events[0].code, 0);
    }
}
