//! The one place where the indexer's failures become gRPC statuses and `Retired` replies.
//!
//! | failure | gRPC code | `Retired.reason` |
//! | --- | --- | --- |
//! | too many relay streams | `RESOURCE_EXHAUSTED` | - |
//! | first frame not `Attach`, undecodable `Attach` | `INVALID_ARGUMENT` | - |
//! | unknown pool | `NOT_FOUND` (names the pool and the configured ones) | - |
//! | table format mismatch | `FAILED_PRECONDITION` (names both formats) | - |
//! | undecodable / foreign-lease / oversized frame after attach | `INVALID_ARGUMENT`, `RESOURCE_EXHAUSTED` (too large) | `STREAM_LOST` |
//! | stream ended without a drain marker | `FAILED_PRECONDITION` | `STREAM_LOST` |
//! | gap (base != installed) | `FAILED_PRECONDITION` | `GAP` |
//! | non-contiguous delta, malformed delta or snapshot | `INVALID_ARGUMENT` | `GAP` / `MALFORMED_FRAME` |
//! | delta or drain before the snapshot completed | `FAILED_PRECONDITION` | `MALFORMED_FRAME` |
//! | drain marker != installed sequence | `FAILED_PRECONDITION` | `LOST_FINAL_DELTA` |
//! | heartbeat deadline, dirty-to-applied deadline | `DEADLINE_EXCEEDED` | `HEARTBEAT_TIMEOUT` / `LAG_EXCEEDED` |
//! | lane queue saturated | `RESOURCE_EXHAUSTED` | `SATURATED` |
//! | apply failure inside the indexer | `INTERNAL` | `APPLY_FAILURE` |
//! | superseded by a newer attachment for the pool | `ABORTED` (names the new epoch) | `SUPERSEDED` |
//! | indexer shutting down | `UNAVAILABLE` | `SHUTDOWN` |
//! | query longer than the limit | `INVALID_ARGUMENT` | - |

use ckf_core::addressing::TableFormat;
use ckf_core::global::AttachError;
use ckf_core::identity::{LaneLease, PoolId};
use ckf_core::lane::{IngestError, RetireReason};
use ckf_proto::{WireError, v1};
use tonic::{Code, Status};

/// Why a relay stream was refused or ended (every variant is terminal for the stream).
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// `limits.max_relay_streams` streams are open.
    #[error("too many relay streams open (limits.max_relay_streams = {limit})")]
    TooManyStreams {
        /// The limit.
        limit: u32,
    },
    /// The stream ended or carried another frame before `Attach`.
    #[error("the first relay frame must be Attach, got {got}")]
    NoAttach {
        /// What arrived instead.
        got: &'static str,
    },
    /// `Attach` could not be decoded (missing pool, bad name).
    #[error("bad Attach: {0}")]
    BadAttach(WireError),
    /// The pool is not a lane of this indexer.
    #[error("pool {pool} is not a lane of this indexer (configured pools: {configured})")]
    UnknownPool {
        /// The producer's pool.
        pool: PoolId,
        /// The manifest's pools, comma-separated.
        configured: String,
    },
    /// The producer's table format differs from the manifest's (or is not one this build
    /// speaks).
    #[error(
        "table format mismatch for pool {pool}: indexer has [{expected}], producer has [{got}]{}",
        .problem.as_ref().map(|p| format!(" ({p})")).unwrap_or_default()
    )]
    FormatMismatch {
        /// The pool.
        pool: PoolId,
        /// The manifest's format.
        expected: TableFormat,
        /// The producer's format as sent.
        got: String,
        /// Why the producer's format is not even valid, when it is not.
        problem: Option<String>,
    },
    /// A frame after `Attach` broke the stream protocol; the lane was retired (stream lost).
    #[error("{0}")]
    Frame(#[from] FrameError),
    /// The producer closed its side without a drain marker; the lane was retired.
    #[error("relay stream ended without a drain marker; lane retired (delivery uncertain)")]
    EndedWithoutDrain,
    /// The lane was retired by ckf-core (acceptance rule, deadline, saturation, apply failure).
    #[error("lane {lane} retired: {reason}")]
    Retired {
        /// The lane.
        lane: u8,
        /// Why.
        reason: RetireReason,
    },
    /// A frame could not be attributed to the stream's lane (never expected: the handler
    /// only submits frames carrying the stream's own lease).
    #[error("{0}")]
    Unattributable(IngestError),
    /// A newer attachment for the same pool holds the lane now.
    #[error("superseded by a newer attachment for pool {pool}: lease epoch {} replaced epoch {}", .by.epoch, .held.epoch)]
    Superseded {
        /// The pool.
        pool: PoolId,
        /// The lease this stream held.
        held: LaneLease,
        /// The new lease.
        by: LaneLease,
    },
    /// The indexer is shutting down.
    #[error("indexer is shutting down")]
    Shutdown,
}

/// A broken frame on an attached stream.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The frame's fields could not be decoded.
    #[error("malformed {frame} frame: {error}")]
    Decode {
        /// Frame kind.
        frame: &'static str,
        /// What was wrong.
        error: WireError,
    },
    /// A `RelayFrame` without any frame set.
    #[error("empty RelayFrame (no frame set)")]
    Empty,
    /// A second `Attach` on an attached stream.
    #[error("second Attach on an attached stream")]
    SecondAttach,
    /// The frame carries a lease other than the one granted to this stream.
    #[error("{frame} frame carries {got} but this stream holds {held}")]
    ForeignLease {
        /// Frame kind.
        frame: &'static str,
        /// The frame's lease.
        got: LaneLease,
        /// The stream's lease.
        held: LaneLease,
    },
    /// A delta with more images than `limits.max_images_per_delta`.
    #[error("delta carries {images} images (limits.max_images_per_delta = {limit})")]
    TooManyImages {
        /// Images in the delta.
        images: usize,
        /// The limit.
        limit: u32,
    },
    /// The inbound stream failed in transport or decoding (e.g. a message over
    /// `limits.max_message_bytes`).
    #[error("relay stream failed: {}", .0.message())]
    Transport(Status),
}

/// The `RetireReason` wire value of a core retirement reason (`ckf_proto::convert`).
pub fn wire_reason(reason: &RetireReason) -> v1::RetireReason {
    reason.into()
}

fn reason_code(reason: &RetireReason) -> Code {
    match reason {
        RetireReason::Gap { .. }
        | RetireReason::NotActive { .. }
        | RetireReason::LostFinalDelta { .. } => Code::FailedPrecondition,
        RetireReason::NonContiguous { .. }
        | RetireReason::MalformedDelta(_)
        | RetireReason::MalformedSnapshot(_) => Code::InvalidArgument,
        RetireReason::HeartbeatTimeout { .. } | RetireReason::LagExceeded { .. } => {
            Code::DeadlineExceeded
        }
        RetireReason::Saturated { .. } => Code::ResourceExhausted,
        RetireReason::ApplyFailed { .. } => Code::Internal,
        RetireReason::StreamLost { .. } => Code::FailedPrecondition,
    }
}

impl RelayError {
    /// The terminal gRPC status of the stream.
    pub fn status(&self) -> Status {
        let code = match self {
            RelayError::TooManyStreams { .. } => Code::ResourceExhausted,
            RelayError::NoAttach { .. } | RelayError::BadAttach(_) => Code::InvalidArgument,
            RelayError::UnknownPool { .. } => Code::NotFound,
            RelayError::FormatMismatch { .. } => Code::FailedPrecondition,
            RelayError::Frame(FrameError::Transport(s)) if s.code() == Code::OutOfRange => {
                // tonic reports a message over the decoding limit as OUT_OF_RANGE; gRPC servers
                // conventionally answer RESOURCE_EXHAUSTED for "message larger than max".
                Code::ResourceExhausted
            }
            RelayError::Frame(FrameError::Transport(s)) => s.code(),
            RelayError::Frame(_) => Code::InvalidArgument,
            RelayError::EndedWithoutDrain => Code::FailedPrecondition,
            RelayError::Retired { reason, .. } => reason_code(reason),
            RelayError::Unattributable(_) => Code::InvalidArgument,
            RelayError::Superseded { .. } => Code::Aborted,
            RelayError::Shutdown => Code::Unavailable,
        };
        Status::new(code, self.to_string())
    }

    /// The `Retired` reply sent before the status, for failures that end a leased stream.
    pub fn retired_reply(&self) -> Option<v1::RelayReply> {
        let reason = match self {
            RelayError::Frame(_) | RelayError::EndedWithoutDrain => v1::RetireReason::StreamLost,
            RelayError::Retired { reason, .. } => wire_reason(reason),
            RelayError::Superseded { .. } => v1::RetireReason::Superseded,
            RelayError::Shutdown => v1::RetireReason::Shutdown,
            _ => return None,
        };
        Some(
            v1::relay_reply::Reply::Retired(v1::Retired {
                reason: reason as i32,
                detail: self.to_string(),
            })
            .into(),
        )
    }

    /// The `code` label for refused attachments.
    pub fn code_label(&self) -> &'static str {
        match self.status().code() {
            Code::NotFound => "not_found",
            Code::FailedPrecondition => "failed_precondition",
            Code::InvalidArgument => "invalid_argument",
            Code::ResourceExhausted => "resource_exhausted",
            Code::Unavailable => "unavailable",
            _ => "other",
        }
    }

    /// Builds the attach-refusal error for a core [`AttachError`].
    pub fn from_attach(error: AttachError, configured: &[PoolId]) -> Self {
        match error {
            AttachError::UnknownPool(pool) => RelayError::UnknownPool {
                pool,
                configured: configured
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
            },
            AttachError::FormatMismatch {
                pool,
                expected,
                got,
            } => RelayError::FormatMismatch {
                pool,
                expected,
                got: got.to_string(),
                problem: None,
            },
        }
    }
}

/// Why a query was refused.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// More block hashes than `limits.max_query_blocks`.
    #[error("FindMatches carries {blocks} block hashes (limits.max_query_blocks = {limit})")]
    TooManyBlocks {
        /// Hashes in the request.
        blocks: usize,
        /// The limit.
        limit: u32,
    },
}

impl From<QueryError> for Status {
    fn from(error: QueryError) -> Self {
        match error {
            QueryError::TooManyBlocks { .. } => Status::invalid_argument(error.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ckf_core::lane::DeltaError;

    #[test]
    fn retirements_map_to_codes_and_wire_reasons() {
        let gap = RelayError::Retired {
            lane: 1,
            reason: RetireReason::Gap {
                installed: 4,
                base_sequence: 6,
            },
        };
        assert_eq!(gap.status().code(), Code::FailedPrecondition);
        assert!(gap.status().message().contains("installed sequence is 4"));
        let Some(v1::RelayReply {
            reply: Some(v1::relay_reply::Reply::Retired(r)),
        }) = gap.retired_reply()
        else {
            panic!("gap must send a Retired reply");
        };
        assert_eq!(r.reason(), v1::RetireReason::Gap);

        let dup = RelayError::Retired {
            lane: 0,
            reason: RetireReason::MalformedDelta(DeltaError::DuplicateBucket { bucket: 3 }),
        };
        assert_eq!(dup.status().code(), Code::InvalidArgument);

        let too_big = RelayError::Frame(FrameError::Transport(Status::out_of_range("too large")));
        assert_eq!(too_big.status().code(), Code::ResourceExhausted);

        let refused = RelayError::TooManyStreams { limit: 2 };
        assert!(refused.retired_reply().is_none());
    }
}
