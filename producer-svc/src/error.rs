//! Errors of the producer's gRPC surface, and [`ActorGone`] (the state actor's one failure,
//! which a request sees as the producer shutting down). They become gRPC statuses in exactly
//! one place, [`crate::status`].

use ckf_core::dc::QuotaError;
use ckf_core::identity::SourceIdError;
use thiserror::Error;

/// Longest accepted `KvEventBatch.source_id`, in bytes (`ckf_core`'s rule).
pub const MAX_SOURCE_ID_BYTES: usize = ckf_core::identity::MAX_SOURCE_ID_LEN;

/// Why an ingest request was refused as a whole (nothing of it was applied).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RequestError {
    /// `KvEventBatch.source_id` is not a canonical source id (empty, too long, a control
    /// character: `ckf_core::identity::check_source_id`).
    #[error("KvEventBatch.source_id {0}")]
    BadSourceId(#[from] SourceIdError),
    /// A size quota (`quotas.max_blocks_per_event`, `quotas.max_blocks_per_batch`) refused the
    /// batch before anything of it was applied.
    #[error("KvEventBatch refused: {0}")]
    Quota(QuotaError),
    /// The batch has more events than `limits.max_events_per_batch`.
    #[error("KvEventBatch has {count} events; at most {max} are allowed per batch")]
    TooManyEvents {
        /// Events in the batch.
        count: usize,
        /// The configured limit.
        max: usize,
    },
    /// `GetSourceSequenceRequest.source_id` is not a canonical source id (the rules of
    /// `KvEventBatch.source_id`).
    #[error("GetSourceSequenceRequest.source_id {0}")]
    BadRequestedSourceId(SourceIdError),
    /// `ReportLoadRequest.source_id` is not a canonical source id (the rules of
    /// `KvEventBatch.source_id`).
    #[error("ReportLoadRequest.source_id {0}")]
    BadLoadSourceId(SourceIdError),
    /// A pushed load refused by the pool's rules (`ckf_core::pool_load`): a value out of
    /// range, a scraped engine, or no room for another worker (`engine.max_pushed_workers`).
    #[error("ReportLoadRequest.{0}")]
    Load(ckf_core::pool_load::PushRefused),
    /// `GetMemberBlocksRequest.member` is absent.
    #[error("GetMemberBlocksRequest.member is required")]
    MissingMember,
    /// `[ingest_auth]` refused the request or the batch (nothing of it was applied); the
    /// message names the principal and the source id or worker.
    #[error("{0}")]
    Access(ckf_core::access::AccessError),
    /// The producer is shutting down and no longer ingests.
    #[error("the producer is shutting down and no longer accepts events")]
    ShuttingDown,
}

/// The state actor has stopped (shutdown finished, or it panicked): no answer will come.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("the state actor has stopped")]
pub struct ActorGone;

/// A state actor that stopped no longer ingests: the producer is shutting down.
impl From<ActorGone> for RequestError {
    fn from(_: ActorGone) -> Self {
        Self::ShuttingDown
    }
}
