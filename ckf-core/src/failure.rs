//! Pre-/post-commit failure dispositions (design source, "Lane recovery and failure boundaries":
//! "Recovery targets the state whose commit became uncertain").
//!
//! | where the uncertainty is | disposition | what recovers it |
//! | --- | --- | --- |
//! | nothing committed (capacity exhaustion before any write) | [`Disposition::Omission`] | nothing: observable omission, service continues |
//! | one consumer lane's words or stream position (gap, malformed frame, lag, saturation, mid-apply failure, lost final delta) | [`Disposition::RetireLane`] | lane retired; the producer re-attaches |
//! | the publication stream of a trustworthy producer (delivery uncertain, sequence exhausted, lease superseded) | [`Disposition::NewLeaseAndSnapshot`] | new lease + barrier snapshot |
//! | the producer's exact ownership state itself | [`Disposition::ProducerRebuild`] | new producer generation (incarnation), rebuilt from its sources |
//!
//! Each disposition affects only its own domain: an omission touches no stream, a lane
//! retirement touches no other lane and no producer state, a new lease touches no exact state.
//! Stale or superseded traffic ([`crate::lane::IgnoreReason`]) and unattributable frames
//! ([`crate::lane::IngestError`]) need no recovery at all.

use crate::global::AttachError;
use crate::lane::{IgnoreReason, IngestError, RetireReason};

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
            Disposition::RetireLane | Disposition::NewLeaseAndSnapshot | Disposition::ProducerRebuild
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
            | RetireReason::HeartbeatTimeout { .. }
            | RetireReason::LagExceeded { .. }
            | RetireReason::Saturated { .. }
            | RetireReason::ApplyFailed { .. }
            | RetireReason::StreamLost { .. } => Disposition::RetireLane,
        }
    }
}

impl Disposed for IgnoreReason {
    /// Stale or superseded traffic changes nothing: [`Disposition::Omission`].
    fn disposition(&self) -> Disposition {
        Disposition::Omission
    }
}

impl Disposed for IngestError {
    /// A frame that belongs to no current stream is dropped: [`Disposition::Omission`] for the
    /// consumer. (A producer that sent it should re-attach, which its own stream error tells it.)
    fn disposition(&self) -> Disposition {
        Disposition::Omission
    }
}

impl Disposed for AttachError {
    /// A refused attach commits nothing on either side: [`Disposition::Omission`] (it is a
    /// configuration error to fix, not state to recover).
    fn disposition(&self) -> Disposition {
        Disposition::Omission
    }
}
