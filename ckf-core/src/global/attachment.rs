//! One producer stream attached to a lane: the lease it was granted, the producer incarnation
//! that holds it and the lane's event subscription, plus every decision a service streaming
//! frames under that lease needs (docs/design.md, "Lane recovery and failure boundaries").
//!
//! ```text
//! GlobalCkfIndexer::attach(request) -> Attachment (lease + incarnation + events) | AttachError
//! frame -> Attachment::check (own lease?) -> IngestionWorkers::submit -> IngestOutcome
//!       -> Attachment::outcome -> StreamVerdict
//! lane event -> Attachment::event -> StreamVerdict
//! queue refusal -> Attachment::submit_failed -> StreamEnd
//! transport breaks / ends without drain -> Attachment::stream_lost (retires if still current)
//! ```
//! A service only decodes frames, submits them and translates the verdicts: it never compares
//! leases, never interprets an [`IgnoreReason`] and never decides whether a lane is retired.

use std::fmt;

use crate::failure::{Disposed, Disposition};
use crate::identity::{LaneIndex, LaneLease, PoolId, ProducerIncarnation};
use crate::ingestion::SubmitError;
use crate::lane::{
    Frame, IgnoreReason, IngestOutcome, LaneEvent, LaneEventKind, RetireReason, StrayFrame,
};

use super::indexer::GlobalCkfIndexer;
use super::request::{AttachError, AttachRequest};

/// What one frame, lane event or queue refusal means for the attached stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamVerdict {
    /// Nothing to tell the producer (a snapshot chunk accepted, a heartbeat noted, an event
    /// about another lease or a transition the stream already answered).
    Continue,
    /// A delta was applied: acknowledge `installed_sequence`.
    Applied {
        /// Installed sequence after the delta.
        installed_sequence: u64,
    },
    /// The barrier snapshot completed and the lane is ready: acknowledge `installed_sequence`.
    Activated {
        /// The snapshot's terminal sequence.
        installed_sequence: u64,
    },
    /// An exact drain marker: acknowledge it as drained; the stream ends cleanly (the lane stays
    /// ready).
    Drained {
        /// Installed (= final) sequence.
        installed_sequence: u64,
    },
    /// The stream is over.
    End(StreamEnd),
}

/// Why an attached stream is over (other than a clean drain).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamEnd {
    /// A newer attachment for the same pool holds the lane now (not a retirement).
    #[error(
        "superseded by a newer attachment for pool {pool}: lease epoch {} replaced epoch {}{}",
        .by.epoch,
        .held.epoch,
        .by_incarnation.map(|i| format!(" (held by incarnation {i})")).unwrap_or_default()
    )]
    Superseded {
        /// The pool.
        pool: PoolId,
        /// The lease this stream held.
        held: LaneLease,
        /// The newer lease.
        by: LaneLease,
        /// The incarnation holding the newer lease, when known (the lane event names it; a
        /// stale-lease outcome does not).
        by_incarnation: Option<ProducerIncarnation>,
    },
    /// The lane was retired under this stream's lease (an acceptance rule, a deadline,
    /// saturation, an apply failure, or a loss seen by another caller).
    #[error("lane {lane} retired: {reason}")]
    Retired {
        /// The lane.
        lane: LaneIndex,
        /// Why.
        reason: RetireReason,
    },
    /// The consumer could not attribute a frame of this stream to its lane; nothing changed.
    #[error("{0}")]
    Refused(StrayFrame),
    /// The consumer ignored a frame of this stream as not the lane's current traffic, for a
    /// reason a well-formed attachment cannot produce (another consumer instance or another
    /// incarnation); nothing changed.
    #[error("frame ignored: {0}")]
    Ignored(IgnoreReason),
    /// The consumer is shutting down (its ingestion workers or the lane's subscribers closed).
    #[error("indexer is shutting down")]
    ShutDown,
}

impl Disposed for StreamEnd {
    /// A retirement needs what its reason needs ([`Disposition::RetireLane`]); a superseded
    /// stream's producer needs a new lease and snapshot if it wants the lane back; refused or
    /// ignored frames and a shutdown changed nothing here ([`Disposition::Omission`]).
    fn disposition(&self) -> Disposition {
        match self {
            StreamEnd::Superseded { .. } => Disposition::NewLeaseAndSnapshot,
            StreamEnd::Retired { reason, .. } => reason.disposition(),
            StreamEnd::Refused(error) => error.disposition(),
            StreamEnd::Ignored(reason) => reason.disposition(),
            StreamEnd::ShutDown => Disposition::Omission,
        }
    }
}

/// One producer stream holding a lane lease; see the module docs. Built by
/// [`GlobalCkfIndexer::attach`].
#[derive(Debug)]
pub struct Attachment {
    pool: PoolId,
    incarnation: ProducerIncarnation,
    lease: LaneLease,
    events: flume::Receiver<LaneEvent>,
}

impl GlobalCkfIndexer {
    /// Attaches a producer stream: checks the pool (it must be a manifest lane) and the claimed
    /// format (valid and equal to the manifest's), applies the request's [`AttachMode`](crate::lane::AttachMode), grants
    /// the lane's next lease (fencing any older stream, exactly as
    /// [`GlobalCkfIndexer::grant_lease`]) and subscribes to the lane's events under the same
    /// lane lock, so no transition of the new lease is missed.
    ///
    /// # Errors
    /// [`AttachError::UnknownPool`] (with the configured pools),
    /// [`AttachError::FormatMismatch`] (both formats, and why the producer's is unusable when it
    /// is) or, for [`AttachMode::IfVacant`](crate::lane::AttachMode::IfVacant), [`AttachError::Occupied`] (the live holder's
    /// incarnation and lease epoch). Nothing is leased then.
    pub fn attach(&self, request: &AttachRequest) -> Result<Attachment, AttachError> {
        let (lease, events) = self.grant(request, true)?;
        Ok(Attachment {
            pool: request.pool.clone(),
            incarnation: request.incarnation,
            lease,
            events: events.expect("grant subscribes when asked"),
        })
    }
}

impl Attachment {
    /// The granted lease.
    pub fn lease(&self) -> LaneLease {
        self.lease
    }

    /// The lane of the lease.
    pub fn lane(&self) -> LaneIndex {
        self.lease.lane
    }

    /// The attached pool.
    pub fn pool(&self) -> &PoolId {
        &self.pool
    }

    /// The producer incarnation holding the lease: stamp it on every frame decoded from this
    /// stream.
    pub fn incarnation(&self) -> ProducerIncarnation {
        self.incarnation
    }

    /// The lane's transitions (unbounded; `recv_async` from async code). Pass each one to
    /// [`Attachment::event`]. A closed receiver means the consumer is going away.
    pub fn events(&self) -> &flume::Receiver<LaneEvent> {
        &self.events
    }

    /// Checks, before submission, that `frame` carries this stream's own lease.
    ///
    /// # Errors
    /// [`StrayFrame::ForeignLease`]: the frame must not be submitted, and the stream is lost
    /// (call [`Attachment::stream_lost`]).
    pub fn check(&self, frame: &Frame) -> Result<(), StrayFrame> {
        self.check_lease(frame.kind(), frame.tag().lease)
    }

    /// [`Attachment::check`] for a frame the lane's ingestor does not take (a load report,
    /// kind `frame`, carrying `lease`).
    ///
    /// # Errors
    /// As [`Attachment::check`].
    pub fn check_lease(&self, frame: &'static str, lease: LaneLease) -> Result<(), StrayFrame> {
        if lease != self.lease {
            return Err(StrayFrame::ForeignLease {
                frame,
                got: lease,
                held: self.lease,
            });
        }
        Ok(())
    }

    /// The verdict of one submitted frame's outcome.
    ///
    /// Ignored traffic on an attached stream means the stream no longer holds the lane: a stale
    /// lease is a supersession by the lane's current epoch, a retired lane ends the stream with
    /// the retirement's reason.
    pub fn outcome(&self, outcome: IngestOutcome) -> StreamVerdict {
        match outcome {
            IngestOutcome::Applied { installed_sequence } => {
                StreamVerdict::Applied { installed_sequence }
            }
            IngestOutcome::Activated { installed_sequence } => {
                StreamVerdict::Activated { installed_sequence }
            }
            IngestOutcome::Drained { installed_sequence } => {
                StreamVerdict::Drained { installed_sequence }
            }
            IngestOutcome::ChunkAccepted { .. } | IngestOutcome::Alive => StreamVerdict::Continue,
            IngestOutcome::Ignored(IgnoreReason::StaleLease { current, .. }) => {
                StreamVerdict::End(self.superseded(
                    LaneLease {
                        epoch: current,
                        ..self.lease
                    },
                    None,
                ))
            }
            IngestOutcome::Ignored(IgnoreReason::LaneRetired(reason)) => {
                StreamVerdict::End(self.retired(reason))
            }
            IngestOutcome::Ignored(reason) => StreamVerdict::End(StreamEnd::Ignored(reason)),
            IngestOutcome::Rejected(error) => StreamVerdict::End(StreamEnd::Refused(error)),
            IngestOutcome::Retired(reason) => StreamVerdict::End(self.retired(reason)),
        }
    }

    /// The verdict of one lane event: only this lease's retirement or supersession ends the
    /// stream; everything else (other leases, activation, drain) is [`StreamVerdict::Continue`]
    /// because the frame outcomes already answered it.
    pub fn event(&self, event: LaneEvent) -> StreamVerdict {
        if event.lease != self.lease {
            return StreamVerdict::Continue;
        }
        match event.kind {
            LaneEventKind::Retired(reason) => StreamVerdict::End(self.retired(reason)),
            LaneEventKind::Superseded { by, incarnation } => {
                StreamVerdict::End(self.superseded(by, Some(incarnation)))
            }
            LaneEventKind::Activated { .. }
            | LaneEventKind::Drained { .. }
            | LaneEventKind::Contended { .. } => StreamVerdict::Continue,
        }
    }

    /// The end of the stream when [`crate::ingestion::IngestionWorkers::submit`] refused one of
    /// its frames: a full lane queue retired the lane ([`RetireReason::Saturated`]), an unknown
    /// lane is refused, a closed pool is a shutdown.
    pub fn submit_failed(&self, error: SubmitError) -> StreamEnd {
        match error {
            SubmitError::Saturated { capacity, .. } => {
                self.retired(RetireReason::Saturated { capacity })
            }
            SubmitError::UnknownLane(error) => StreamEnd::Refused(error),
            SubmitError::ShutDown => StreamEnd::ShutDown,
        }
    }

    /// Delivery on this stream became uncertain at the transport (it broke, ended without a
    /// drain marker, or carried a frame that could not be decoded or admitted): retires the
    /// lane as [`RetireReason::StreamLost`] with `detail` if this lease is still the lane's
    /// current, live stream ([`Disposition::RetireLane`]; a superseded or already retired lease
    /// is left alone). Returns whether it retired the lane.
    pub fn stream_lost(&self, indexer: &GlobalCkfIndexer, detail: impl fmt::Display) -> bool {
        let reason = RetireReason::StreamLost {
            detail: detail.to_string(),
        };
        debug_assert_eq!(reason.disposition(), Disposition::RetireLane);
        indexer.retire_lease(self.lease, reason)
    }

    fn superseded(&self, by: LaneLease, by_incarnation: Option<ProducerIncarnation>) -> StreamEnd {
        StreamEnd::Superseded {
            pool: self.pool.clone(),
            held: self.lease,
            by,
            by_incarnation,
        }
    }

    fn retired(&self, reason: RetireReason) -> StreamEnd {
        StreamEnd::Retired {
            lane: self.lease.lane,
            reason,
        }
    }
}
