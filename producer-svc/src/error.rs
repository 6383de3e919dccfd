//! Errors of the producer's gRPC surface. They become gRPC statuses in exactly one place,
//! [`crate::status`].

use thiserror::Error;

/// Longest accepted `KvEventBatch.source_id`, in bytes.
pub const MAX_SOURCE_ID_BYTES: usize = 128;

/// Why an ingest request was refused as a whole (nothing of it was applied).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RequestError {
    /// `KvEventBatch.source_id` is empty.
    #[error("KvEventBatch.source_id is required (1..={MAX_SOURCE_ID_BYTES} bytes)")]
    EmptySourceId,
    /// `KvEventBatch.source_id` is too long.
    #[error("KvEventBatch.source_id is {len} bytes; at most {MAX_SOURCE_ID_BYTES} are allowed")]
    SourceIdTooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// The batch has more events than `limits.max_events_per_batch`.
    #[error("KvEventBatch has {count} events; at most {max} are allowed per batch")]
    TooManyEvents {
        /// Events in the batch.
        count: usize,
        /// The configured limit.
        max: usize,
    },
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

/// A state actor that stopped no longer ingests: the producer is shutting down.
impl From<crate::actor::ActorGone> for RequestError {
    fn from(_: crate::actor::ActorGone) -> Self {
        Self::ShuttingDown
    }
}
