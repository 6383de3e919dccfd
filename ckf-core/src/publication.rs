//! `DcCkfPublisher`: the lease and sequence envelope of one publication stream (docs/design.md,
//! "Publication protocol").
//!
//! A publisher turns producer state into frames for one consumer (one indexer endpoint):
//!
//! ```text
//! install_lease(L)        -> AwaitingSnapshot      (sequence reset to 0, or the injected start)
//! snapshot(state)         -> DcCkfSnapshot tagged N, Streaming   (refused while state has pending dirty buckets)
//! delta(batch)            -> DcCkfDelta N -> N+1
//! drain_marker()          -> DrainMarker N          (exact: the last batch sent)
//! fence(reason)           -> Fenced                 (no frame until a new lease + snapshot)
//! ```
//!
//! * Sequence numbers count batches, not events, and exist only for FIFO continuation and gap
//!   detection. A new lease starts a new sequence space at 0 (tests may start elsewhere with
//!   the `testing` feature's `DcCkfPublisher::install_lease_at`).
//! * A delta that would need sequence `u64::MAX + 1` is refused and fences the stream
//!   ([`FenceReason::SequenceExhausted`]): the producer re-attaches, and the new lease restarts
//!   the sequence.
//! * Uncertain delivery (a send that may or may not have arrived) must be reported with
//!   [`DcCkfPublisher::fence`]: continuing would risk a silent gap or a duplicate, so the lane
//!   needs a new lease and a barrier snapshot.
//!
//! # Several publishers, one state
//! A producer may publish to several indexer endpoints, each with its own lease, snapshot and
//! sequence. All of them share one [`DcCkfState`] owned by the producer actor:
//!
//! 1. After each complete command (or on the publication cadence) the actor calls
//!    [`DcCkfState::take_batch`] **once** and hands the same [`PublicationBatch`] to
//!    [`DcCkfPublisher::delta`] of every publisher. A publisher that is streaming turns it into
//!    its own `N -> N+1` delta; a publisher still waiting for a lease or a snapshot (or fenced)
//!    refuses it with a typed error ([`PublishError::NotStreaming`]) and the actor skips it: that
//!    publisher's next barrier snapshot will include the change anyway.
//! 2. To (re)start a publisher the actor first drains: `take_batch()` and deliver the batch to
//!    every streaming publisher, so `state.pending_dirty() == 0`; then
//!    [`DcCkfPublisher::snapshot`] copies the table. No change can fall between the drained
//!    batch and the snapshot because the actor owns the state.
//!
//! Publishers never call `take_batch` themselves: a batch taken for one publisher would be lost
//! to the others. [`crate::fanout::Fanout`] implements both steps for any number of publishers
//! (plus delta splitting and fencing of a full queue); a producer uses it rather than
//! sequencing publishers by hand.
//!
//! [`DcCkfState`]: crate::dc::DcCkfState
//! [`DcCkfState::take_batch`]: crate::dc::DcCkfState::take_batch
//! [`PublicationBatch`]: crate::dirty::PublicationBatch

use thiserror::Error;

use crate::addressing::TableFormat;
use crate::dc::DcCkfState;
use crate::dirty::PublicationBatch;
use crate::frames::{DcCkfDelta, DcCkfSnapshot, DrainMarker};
use crate::identity::{LaneLease, ProducerIdentity, StreamTag};

/// Why a publisher stopped sending frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FenceReason {
    /// A send may or may not have been delivered (transport error, timeout).
    UncertainDelivery,
    /// The next delta would overflow the `u64` sequence.
    SequenceExhausted,
    /// The consumer granted a newer lease to another stream, or retired the lane.
    Superseded,
    /// The producer is shutting down after its drain marker.
    Shutdown,
}

impl std::fmt::Display for FenceReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::UncertainDelivery => "uncertain delivery",
            Self::SequenceExhausted => "sequence exhausted",
            Self::Superseded => "superseded",
            Self::Shutdown => "shutdown",
        })
    }
}

/// Where a publisher is in its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublisherState {
    /// No lease yet: attach to the consumer first.
    AwaitingLease,
    /// A lease is installed; the next frame must be a barrier snapshot.
    AwaitingSnapshot,
    /// A snapshot was sent under the current lease; deltas and drain markers may follow.
    Streaming,
    /// No frames until a new lease and snapshot.
    Fenced(FenceReason),
}

/// Errors of [`DcCkfPublisher`]. None of them changes the publisher's sequence.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PublishError {
    /// No lease has been installed.
    #[error("no lane lease installed")]
    NoLease,
    /// The offered lease is not newer than the installed one from the same consumer instance.
    #[error("lease {offered} is not newer than the installed {installed}")]
    StaleLease {
        /// The installed lease.
        installed: LaneLease,
        /// The refused lease.
        offered: LaneLease,
    },
    /// The publisher cannot send deltas or drain markers in its current state (awaiting a lease
    /// or a snapshot, or fenced). The actor skips this publisher for the batch.
    #[error("publisher is not streaming (state {0:?})")]
    NotStreaming(PublisherState),
    /// The publisher is fenced: it needs a new lease and snapshot.
    #[error("publisher is fenced ({0}); a new lease and barrier snapshot are required")]
    Fenced(FenceReason),
    /// The barrier snapshot was refused because the state has dirty buckets that were not
    /// drained to every publisher first.
    #[error("{pending} dirty buckets are pending; drain them to every publisher before a snapshot")]
    PendingDirty {
        /// `state.pending_dirty()` at the refusal.
        pending: usize,
    },
    /// The state's format differs from the publisher identity's.
    #[error("state format ({state}) differs from the publisher's ({identity})")]
    FormatMismatch {
        /// The publisher identity's format.
        identity: TableFormat,
        /// The state's format.
        state: TableFormat,
    },
    /// The batch has no images (a batch from `take_batch` never has).
    #[error("empty publication batch")]
    EmptyBatch,
    /// The sequence cannot advance past `u64::MAX`; the publisher is now fenced.
    #[error("sequence {0} cannot advance; the publisher is fenced")]
    SequenceExhausted(u64),
}

/// The serialized stream owner for one pool and one consumer (see the module docs).
#[derive(Debug, Clone)]
pub struct DcCkfPublisher {
    identity: ProducerIdentity,
    lease: Option<LaneLease>,
    sequence: u64,
    state: PublisherState,
}

impl DcCkfPublisher {
    /// A publisher for `identity`, awaiting a lease.
    pub fn new(identity: ProducerIdentity) -> Self {
        Self {
            identity,
            lease: None,
            sequence: 0,
            state: PublisherState::AwaitingLease,
        }
    }

    /// The producer identity presented to the consumer.
    pub fn identity(&self) -> &ProducerIdentity {
        &self.identity
    }

    /// The installed lease, if any (kept while fenced, for epoch ordering).
    pub fn lease(&self) -> Option<LaneLease> {
        self.lease
    }

    /// The sequence `N` of the last batch sent (or of the snapshot) under the current lease.
    pub fn sequence(&self) -> u64 {
        self.sequence
    }

    /// The stream state.
    pub fn state(&self) -> PublisherState {
        self.state
    }

    /// Installs a lease granted by the consumer, with sequence 0; the next frame must be a
    /// barrier snapshot.
    ///
    /// A lease from the same `consumer_instance` must have a strictly greater epoch than the
    /// installed one; a lease from a different consumer instance (a restarted consumer) is
    /// always accepted. Installing a lease clears any fence.
    ///
    /// # Errors
    /// [`PublishError::StaleLease`]; the publisher is unchanged.
    pub fn install_lease(&mut self, lease: LaneLease) -> Result<(), PublishError> {
        self.install(lease, 0)
    }

    /// Test hook (feature `testing`): [`install_lease`](Self::install_lease) with a sequence
    /// space starting at `start_sequence` (the snapshot is tagged with it), so tests can reach
    /// sequence exhaustion near `u64::MAX` or a mid-stream sequence without emitting every batch.
    ///
    /// # Errors
    /// [`PublishError::StaleLease`]; the publisher is unchanged.
    #[cfg(feature = "testing")]
    pub fn install_lease_at(
        &mut self,
        lease: LaneLease,
        start_sequence: u64,
    ) -> Result<(), PublishError> {
        self.install(lease, start_sequence)
    }

    fn install(&mut self, lease: LaneLease, start_sequence: u64) -> Result<(), PublishError> {
        if let Some(installed) = self.lease
            && installed.consumer_instance == lease.consumer_instance
            && lease.epoch <= installed.epoch
        {
            return Err(PublishError::StaleLease {
                installed,
                offered: lease,
            });
        }
        self.lease = Some(lease);
        self.sequence = start_sequence;
        self.state = PublisherState::AwaitingSnapshot;
        Ok(())
    }

    fn tag(&self) -> Result<StreamTag, PublishError> {
        let lease = self.lease.ok_or(PublishError::NoLease)?;
        Ok(StreamTag {
            incarnation: self.identity.incarnation,
            lease,
        })
    }

    /// A barrier snapshot of `state`, tagged with the current sequence `N`; the first delta
    /// after it is `N -> N+1`. Allowed while awaiting a snapshot and while streaming (a
    /// re-snapshot keeps `N`).
    ///
    /// # Errors
    /// [`PublishError::NoLease`], [`PublishError::Fenced`], [`PublishError::FormatMismatch`],
    /// [`PublishError::PendingDirty`] (the barrier: drain pending batches to every publisher
    /// first).
    pub fn snapshot(&mut self, state: &DcCkfState) -> Result<DcCkfSnapshot, PublishError> {
        match self.state {
            PublisherState::AwaitingLease => return Err(PublishError::NoLease),
            PublisherState::Fenced(r) => return Err(PublishError::Fenced(r)),
            PublisherState::AwaitingSnapshot | PublisherState::Streaming => {}
        }
        if state.format() != self.identity.format {
            return Err(PublishError::FormatMismatch {
                identity: self.identity.format,
                state: state.format(),
            });
        }
        let pending = state.pending_dirty();
        if pending > 0 {
            return Err(PublishError::PendingDirty { pending });
        }
        let tag = self.tag()?;
        self.state = PublisherState::Streaming;
        Ok(DcCkfSnapshot {
            tag,
            sequence: self.sequence,
            buckets: state.buckets().to_vec(),
        })
    }

    fn require_streaming(&self) -> Result<(), PublishError> {
        match self.state {
            PublisherState::Streaming => Ok(()),
            PublisherState::Fenced(r) => Err(PublishError::Fenced(r)),
            other => Err(PublishError::NotStreaming(other)),
        }
    }

    /// The delta `N -> N+1` carrying `batch`'s images in their order, with
    /// `oldest_change_age_ms` measured now from `batch.oldest_change`.
    ///
    /// # Errors
    /// [`PublishError::NotStreaming`] or [`PublishError::Fenced`] (the actor skips this
    /// publisher), [`PublishError::EmptyBatch`], [`PublishError::SequenceExhausted`] (and the
    /// publisher is fenced).
    pub fn delta(&mut self, batch: &PublicationBatch) -> Result<DcCkfDelta, PublishError> {
        self.require_streaming()?;
        if batch.images.is_empty() {
            return Err(PublishError::EmptyBatch);
        }
        let Some(next) = self.sequence.checked_add(1) else {
            self.fence(FenceReason::SequenceExhausted);
            return Err(PublishError::SequenceExhausted(self.sequence));
        };
        let tag = self.tag()?;
        let age = batch.oldest_change.elapsed().as_millis();
        let base_sequence = self.sequence;
        self.sequence = next;
        Ok(DcCkfDelta {
            tag,
            base_sequence,
            sequence: next,
            images: batch.images.clone(),
            oldest_change_age_ms: u64::try_from(age).unwrap_or(u64::MAX),
        })
    }

    /// The exact drain marker: the sequence `N` of the last batch sent (or of the snapshot when
    /// no delta followed). The publisher stays streaming.
    ///
    /// # Errors
    /// [`PublishError::NotStreaming`] or [`PublishError::Fenced`].
    pub fn drain_marker(&mut self) -> Result<DrainMarker, PublishError> {
        self.require_streaming()?;
        Ok(DrainMarker {
            tag: self.tag()?,
            sequence: self.sequence,
        })
    }

    /// Stops the stream: no frame until a new lease and a barrier snapshot. Idempotent; a
    /// publisher without a lease stays awaiting one.
    pub fn fence(&mut self, reason: FenceReason) {
        if self.lease.is_some() {
            self.state = PublisherState::Fenced(reason);
        }
    }
}
