//! What the ingest handlers hand the state actor, and what it hands back, in core terms.
//!
//! The handlers decode and validate wire batches (`ingest::convert`) into an [`IngestBatch`];
//! the actor checks the source sequence, applies the events in order to `DcCkfState` and
//! answers with a [`BatchReport`]. A malformed event travels as `Err` so that its result keeps
//! its position among its siblings and nothing of it is applied.

use ckf_core::dc::{EventOutcome, KvEvent, QuotaError};
use ckf_core::identity::SourceId;

use ckf_core::sources::SequenceCheck;

/// One decoded event (journaled as is: `actor::records`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum IngestEvent {
    /// A store, remove or clear of one member (`DcCkfState::apply`).
    Kv(KvEvent),
    /// Every dp rank of a worker is cleared (`DcCkfState::remove_worker`).
    WorkerRemoved {
        /// The worker that left.
        worker_id: u64,
    },
}

impl IngestEvent {
    /// The `kind` label used in metrics.
    pub fn kind_label(&self) -> &'static str {
        match self {
            Self::Kv(kv) => kv.kind.label(),
            Self::WorkerRemoved { .. } => "worker_removed",
        }
    }
}

/// Why an event was rejected before anything of it was applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    /// `KvEvent.member` is absent.
    #[error("event {index}: KvEvent.member is required")]
    MissingMember {
        /// Position of the event in its batch.
        index: usize,
    },
    /// `KvEvent.kind` (stored / removed / cleared / worker_removed) is absent.
    #[error("event {index}: KvEvent.kind is required (stored, removed, cleared or worker_removed)")]
    MissingKind {
        /// Position of the event in its batch.
        index: usize,
    },
}

/// A decoded batch from one source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IngestBatch {
    /// The source's stable name (validated: 1..=128 bytes, no control character).
    pub source_id: SourceId,
    /// The source's batch sequence.
    pub sequence: u64,
    /// Events in order; malformed ones as `Err`.
    pub events: Vec<Result<IngestEvent, EventError>>,
}

/// The fate of one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventReport {
    /// Applied block by block (some blocks may have been omitted for capacity).
    Applied(EventOutcome),
    /// Malformed; nothing applied.
    Rejected(EventError),
    /// A holding quota refused it (`ckf_core::dc::quota`); nothing applied.
    Refused(QuotaError),
}

/// The actor's answer to one [`IngestBatch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchReport {
    /// Echo of the batch's source.
    pub source_id: String,
    /// Echo of the batch's sequence.
    pub sequence: u64,
    /// How the sequence related to the source's history.
    pub check: SequenceCheck,
    /// One report per event, in order; empty for a refused duplicate.
    pub events: Vec<EventReport>,
}
