//! Pre-/post-commit failure dispositions (docs/design.md, "Lane recovery and failure boundaries":
//! "Recovery targets the state whose commit became uncertain").
//!
//! | where the uncertainty is | disposition | what recovers it |
//! | --- | --- | --- |
//! | nothing committed (capacity exhaustion before any write) | [`Disposition::Omission`] | nothing: observable omission, service continues |
//! | one consumer lane's words or stream position (gap, malformed frame, lag, saturation, mid-apply failure, lost final delta) | [`Disposition::RetireLane`] | lane retired; the producer re-attaches |
//! | the publication stream of a trustworthy producer (delivery uncertain, sequence exhausted, lease superseded) | [`Disposition::NewLeaseAndSnapshot`] | new lease + barrier snapshot |
//! | the producer's exact ownership state itself ([`producer_state_disposition`]) | [`Disposition::ProducerRebuild`] | new producer generation (incarnation), rebuilt from its sources |
//!
//! Each disposition affects only its own domain: an omission touches no stream, a lane
//! retirement touches no other lane and no producer state, a new lease touches no exact state.
//! Stale or superseded traffic ([`crate::lane::IgnoreReason`]) and unattributable frames
//! ([`crate::lane::StrayFrame`]) need no recovery at all.

use crate::dc::{BlockError, DcCkfError, DcCkfStats};
use crate::global::manifest::ManifestError;
use crate::global::request::AttachError;
use crate::lane::{IgnoreReason, RetireReason, StrayFrame};
use crate::publication::{FenceReason, PublishError};

/// What recovery a failure needs, ordered from cheapest to most expensive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Disposition {
    /// Nothing to recover: a pre-commit failure (or ignorable traffic) left every state exact.
    Omission,
    /// The consumer lane is uncertain: retire only that lane; it needs a new lease and a barrier
    /// snapshot, never producer recovery.
    RetireLane,
    /// The producer is trustworthy but its stream is uncertain: attach again for a new lease and
    /// send a barrier snapshot.
    NewLeaseAndSnapshot,
    /// The producer's exact state is suspect: rebuild it under a new producer incarnation.
    ProducerRebuild,
}

impl Disposition {
    /// Whether the consumer lane must stop answering (ready bit cleared) until recovered.
    pub fn unreadies_lane(&self) -> bool {
        matches!(
            self,
            Disposition::RetireLane
                | Disposition::NewLeaseAndSnapshot
                | Disposition::ProducerRebuild
        )
    }
}

/// Maps a failure to its [`Disposition`].
pub trait Disposed {
    /// The recovery this failure needs.
    fn disposition(&self) -> Disposition;
}

impl Disposed for RetireReason {
    /// Every retirement makes the consumer lane uncertain: [`Disposition::RetireLane`]. The
    /// producer then needs only a new lease and snapshot; its exact state is untouched.
    fn disposition(&self) -> Disposition {
        match self {
            RetireReason::Gap { .. }
            | RetireReason::NonContiguous { .. }
            | RetireReason::MalformedDelta(_)
            | RetireReason::MalformedSnapshot(_)
            | RetireReason::NotActive { .. }
            | RetireReason::LostFinalDelta { .. }
            | RetireReason::HeartbeatGap { .. }
            | RetireReason::HeartbeatTimeout { .. }
            | RetireReason::LagExceeded { .. }
            | RetireReason::Saturated { .. }
            | RetireReason::ApplyFailed { .. }
            | RetireReason::StreamLost { .. }
            | RetireReason::Removed => Disposition::RetireLane,
            // The stream ended cleanly and the content was exact: only the lane's readiness
            // ends, and a producer that comes back needs a new lease and snapshot anyway.
            RetireReason::DrainGraceExpired { .. } => Disposition::RetireLane,
        }
    }
}

impl Disposed for IgnoreReason {
    /// Stale or superseded traffic changes nothing: [`Disposition::Omission`].
    fn disposition(&self) -> Disposition {
        Disposition::Omission
    }
}

impl Disposed for StrayFrame {
    /// A frame that belongs to no current stream is dropped: [`Disposition::Omission`] for the
    /// consumer. (A producer that sent it should re-attach, which its own stream error tells it.)
    /// A foreign lease on an attached stream makes that stream's delivery uncertain:
    /// [`Disposition::RetireLane`] for the stream's own lane.
    fn disposition(&self) -> Disposition {
        match self {
            StrayFrame::UnknownLane { .. } | StrayFrame::UnknownLease { .. } => {
                Disposition::Omission
            }
            StrayFrame::ForeignLease { .. } => Disposition::RetireLane,
        }
    }
}

impl Disposed for AttachError {
    /// A refused attach commits nothing on either side: [`Disposition::Omission`] (a
    /// configuration error to fix, or for [`AttachError::Occupied`] a live holder to wait out:
    /// the refused producer retries `IF_VACANT` later, not state to recover).
    fn disposition(&self) -> Disposition {
        Disposition::Omission
    }
}

impl Disposed for BlockError {
    /// Capacity exhaustion is a pre-commit omission: no edge, no refcount, no dirty bucket.
    fn disposition(&self) -> Disposition {
        match self {
            BlockError::CapacityExhausted { .. } => Disposition::Omission,
            #[allow(unreachable_patterns)] // `BlockError` is non-exhaustive
            _ => Disposition::Omission,
        }
    }
}

impl Disposed for FenceReason {
    /// A fenced publisher is trustworthy; its stream is uncertain or ended: new lease + snapshot
    /// (a clean shutdown needs nothing).
    fn disposition(&self) -> Disposition {
        match self {
            FenceReason::UncertainDelivery
            | FenceReason::SequenceExhausted
            | FenceReason::Superseded => Disposition::NewLeaseAndSnapshot,
            FenceReason::Shutdown => Disposition::Omission,
        }
    }
}

impl Disposed for PublishError {
    /// Refusals before anything is sent are omissions (the frame was not produced); a fenced or
    /// exhausted stream needs a new lease and snapshot.
    fn disposition(&self) -> Disposition {
        match self {
            PublishError::Fenced(reason) => reason.disposition(),
            PublishError::SequenceExhausted(_) => Disposition::NewLeaseAndSnapshot,
            PublishError::NoLease
            | PublishError::StaleLease { .. }
            | PublishError::NotStreaming(_)
            | PublishError::PendingDirty { .. }
            | PublishError::FormatMismatch { .. }
            | PublishError::EmptyBatch => Disposition::Omission,
        }
    }
}

impl Disposed for ManifestError {
    /// A refused manifest builds nothing: fix the configuration.
    fn disposition(&self) -> Disposition {
        Disposition::Omission
    }
}

impl Disposed for DcCkfError {
    /// A refused producer configuration builds nothing: fix the configuration.
    fn disposition(&self) -> Disposition {
        Disposition::Omission
    }
}

/// Disposition of a producer's exact state from its own consistency counters: a tracked block
/// whose fingerprint was missing at removal means the exact state and the table disagree, so the
/// producer state is suspect and needs a [`Disposition::ProducerRebuild`] (a new incarnation
/// rebuilt from its sources); otherwise nothing.
pub fn producer_state_disposition(stats: &DcCkfStats) -> Disposition {
    if stats.missing_fingerprints_total > 0 {
        Disposition::ProducerRebuild
    } else {
        Disposition::Omission
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lane::{DeltaError, SnapshotError};

    #[test]
    fn each_failure_recovers_its_own_domain_only() {
        let lane_failures = [
            RetireReason::Gap {
                installed: 1,
                base_sequence: 2,
            },
            RetireReason::MalformedDelta(DeltaError::Empty),
            RetireReason::MalformedSnapshot(SnapshotError::OutOfOrder {
                expected: 0,
                got: 1,
            }),
            RetireReason::LostFinalDelta {
                installed: 1,
                marker: 2,
            },
            RetireReason::Saturated { capacity: 1 },
            RetireReason::HeartbeatGap {
                installed: 3,
                heartbeat: 9,
            },
            RetireReason::DrainGraceExpired {
                drained_ms: 30_001,
                grace_ms: 30_000,
            },
            RetireReason::ApplyFailed {
                detail: String::new(),
            },
        ];
        for r in &lane_failures {
            assert_eq!(r.disposition(), Disposition::RetireLane, "{r}");
            assert!(r.disposition().unreadies_lane());
        }
        let occupied = AttachError::Occupied {
            pool: crate::identity::PoolId::new("d", "dc-a").unwrap(),
            lane: 0,
            holder: crate::identity::ProducerIncarnation(9),
            epoch: 2,
            state: crate::lane::LaneState::Active,
        };
        assert_eq!(occupied.disposition(), Disposition::Omission);
        assert!(!occupied.disposition().unreadies_lane());
        let omission = BlockError::CapacityExhausted {
            block_hash: 1,
            kicks: 500,
        };
        assert_eq!(omission.disposition(), Disposition::Omission);
        assert!(!omission.disposition().unreadies_lane());
        assert_eq!(
            PublishError::Fenced(FenceReason::UncertainDelivery).disposition(),
            Disposition::NewLeaseAndSnapshot
        );
        assert_eq!(
            PublishError::SequenceExhausted(u64::MAX).disposition(),
            Disposition::NewLeaseAndSnapshot
        );
        assert_eq!(FenceReason::Shutdown.disposition(), Disposition::Omission);
        assert_eq!(
            PublishError::PendingDirty { pending: 3 }.disposition(),
            Disposition::Omission
        );
        assert_eq!(
            IgnoreReason::StaleLease {
                frame: 1,
                current: 2
            }
            .disposition(),
            Disposition::Omission
        );
    }

    #[test]
    fn suspect_producer_state_needs_a_rebuild() {
        let mut st = crate::dc::DcCkfState::new(crate::dc::DcCkfConfig::new(
            crate::addressing::TableFormat::new(16, 0).unwrap(),
        ))
        .unwrap()
        .stats();
        assert_eq!(producer_state_disposition(&st), Disposition::Omission);
        st.missing_fingerprints_total = 1;
        assert_eq!(
            producer_state_disposition(&st),
            Disposition::ProducerRebuild
        );
    }
}
