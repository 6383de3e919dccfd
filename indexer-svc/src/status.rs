//! The one place where the indexer's failures become gRPC statuses and `Retired` replies.
//!
//! | failure | gRPC code | `Retired.reason` |
//! | --- | --- | --- |
//! | too many relay streams | `RESOURCE_EXHAUSTED` | - |
//! | `Attach` without valid credentials / for a pool its principal may not publish (`[auth]`) | `UNAUTHENTICATED` / `PERMISSION_DENIED` (names the principal and the pool) | - |
//! | first frame not `Attach`, undecodable `Attach` | `INVALID_ARGUMENT` | - |
//! | unknown pool | `NOT_FOUND` (names the pool and the configured ones) | - |
//! | table format mismatch | `FAILED_PRECONDITION` (names both formats) | - |
//! | `IF_VACANT` attach, lane held by a live attachment | `FAILED_PRECONDITION` (names the holder's incarnation and lease epoch; metadata `ckf-attach-refused: occupied`) | - |
//! | undecodable / empty / foreign-lease / oversized frame, second `Attach` | `INVALID_ARGUMENT`, `RESOURCE_EXHAUSTED` (too large) | `STREAM_LOST` |
//! | stream ended without a drain marker | `FAILED_PRECONDITION` | `STREAM_LOST` |
//! | gap (base != installed), heartbeat sequence != installed | `FAILED_PRECONDITION` | `GAP` |
//! | non-contiguous delta, malformed delta or snapshot | `INVALID_ARGUMENT` | `GAP` / `MALFORMED_FRAME` |
//! | delta or drain before the snapshot completed | `FAILED_PRECONDITION` | `MALFORMED_FRAME` |
//! | drain marker != installed sequence | `FAILED_PRECONDITION` | `LOST_FINAL_DELTA` |
//! | heartbeat deadline, dirty-to-applied deadline | `DEADLINE_EXCEEDED` | `HEARTBEAT_TIMEOUT` / `LAG_EXCEEDED` |
//! | lane queue saturated | `RESOURCE_EXHAUSTED` | `SATURATED` |
//! | apply failure inside the indexer | `INTERNAL` | `APPLY_FAILURE` |
//! | superseded by a newer attachment for the pool | `ABORTED` (names the new epoch) | `SUPERSEDED` |
//! | indexer shutting down | `UNAVAILABLE` | `SHUTDOWN` |
//! | frame ckf-core cannot attribute to the stream's lane (unknown lane or lease, ignored) | `INVALID_ARGUMENT` | - |
//! | query without the configured bearer token (`auth.query_token_file`) | `UNAUTHENTICATED` | - |
//! | query longer than the limit | `INVALID_ARGUMENT` | - |
//! | batch / stream message with more queries than `limits.max_query_batch`, or one of its queries longer than `limits.max_query_blocks` | `INVALID_ARGUMENT` (names the limit, the stream message's id and the query's index; ends a `FindMatchesStream`) | - |
//! | `RouteBatch` with more requests than `limits.max_query_batch`, an answer that could exceed `limits.max_message_bytes`, or a request a unary `Route` refuses | `INVALID_ARGUMENT` (names the limit or the first refused request's index; nothing booked) | - |
//! | `FindMatchesStream` open when the indexer shuts down | `UNAVAILABLE` | - |
//! | `FindMatchesStream` opened while `limits.max_query_streams` are open | `RESOURCE_EXHAUSTED` (names the limit) | - |
//! | token query: other block size, too many tokens, bad multimodal item | `INVALID_ARGUMENT` | - |
//! | reply stream closed under the indexer (connection closed or stream reset; the HTTP/2 `GOAWAY` / `RST_STREAM` named when the transport reports one) | the transport's code, else `CANCELLED` | `STREAM_LOST` |
//! | `ListLanes` load-factor count failed | `INTERNAL` | - |

use ckf_core::access::AccessError;
use ckf_core::catalog::DomainError;
use ckf_core::failure::{Disposed, Disposition};
use ckf_core::global::{AttachError, StreamEnd};
use ckf_core::lane::{RetireReason, StrayFrame};
use ckf_core::tokens::TokenQueryError;
use ckf_proto::{WireError, v1};
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Status};

pub use ckf_proto::metadata::{ATTACH_REFUSED_KEY, ATTACH_REFUSED_OCCUPIED};

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
    /// `[auth]` refused the attachment before ckf-core saw it (nothing superseded); the
    /// message names the principal and the pool.
    #[error("relay attachment refused: {0}")]
    Access(AccessError),
    /// The attachment's pool is in a domain this indexer does not serve; the message names
    /// the domains served.
    #[error("pool {pool}: {error}")]
    Domain {
        /// The pool claimed.
        pool: ckf_core::identity::PoolId,
        /// Why (the domains served).
        error: DomainError,
    },
    /// ckf-core refused the attachment (unknown pool, format mismatch); its message names the
    /// configured pools or both formats.
    #[error("{0}")]
    Attach(#[from] AttachError),
    /// A frame after `Attach` broke the stream at the transport; the lane was retired as stream
    /// lost (when its lease was still current).
    #[error("{0}")]
    Frame(#[from] FrameError),
    /// The producer closed its side without a drain marker; the lane was retired.
    #[error("relay stream ended without a drain marker; lane retired (delivery uncertain)")]
    EndedWithoutDrain,
    /// ckf-core ended the stream (retirement, supersession, refused frame, shutdown).
    #[error("{0}")]
    Ended(StreamEnd),
    /// The indexer is shutting down.
    #[error("indexer is shutting down")]
    Shutdown,
    /// A reload took the attached producer's grant for its pool away: the stream ends and the
    /// lane is retired (what it published may not be trusted).
    #[error("the attachment's grant was revoked by a catalog reload: {0}")]
    Revoked(AccessError),
    /// A catalog reload removed the stream's domain.
    #[error(
        "domain {domain} was removed from this indexer's catalog; attachments for it are \
         refused until it is served again"
    )]
    Removed {
        /// The domain.
        domain: ckf_core::identity::IndexerDomainId,
    },
}

/// A frame after `Attach` that breaks the stream at the transport.
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
    /// ckf-core refused the frame before submission (a lease other than the stream's own).
    #[error("{0}")]
    Refused(StrayFrame),
    /// A delta with more images than `limits.max_images_per_delta`.
    #[error("delta carries {images} images (limits.max_images_per_delta = {limit})")]
    TooManyImages {
        /// Images in the delta.
        images: usize,
        /// The limit.
        limit: u32,
    },
    /// The reply stream closed under the indexer (tonic dropped it: the connection closed or
    /// the producer reset the stream) and the inbound side reported no transport error.
    #[error(
        "relay stream failed: the reply stream closed (connection closed or stream reset; no \
         transport error was reported)"
    )]
    RepliesClosed,
    /// The inbound stream failed in transport or decoding (e.g. a message over
    /// `limits.max_message_bytes`, or the connection closed by a `GOAWAY`, named with its
    /// reason, debug data and sender).
    #[error("relay stream failed: {}", transport_message(.0))]
    Transport(Status),
}

/// A transport status in words: its message, then what the transport under it reported (an
/// HTTP/2 `GOAWAY` with its reason, debug data and sender), when it reported anything.
fn transport_message(status: &Status) -> String {
    match ckf_svc_kit::transport::http2::transport_cause(status) {
        Some(cause) => format!("{} ({cause})", status.message()),
        None => status.message().to_owned(),
    }
}

/// The `RetireReason` wire value of a core retirement reason (`ckf_proto::convert`).
pub fn wire_reason(reason: &RetireReason) -> v1::RetireReason {
    reason.into()
}

fn reason_code(reason: &RetireReason) -> Code {
    match reason {
        RetireReason::Gap { .. }
        | RetireReason::HeartbeatGap { .. }
        | RetireReason::DrainGraceExpired { .. }
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
        RetireReason::Removed => Code::NotFound,
    }
}

fn end_code(end: &StreamEnd) -> Code {
    match end {
        StreamEnd::Superseded { .. } => Code::Aborted,
        StreamEnd::Retired { reason, .. } => reason_code(reason),
        StreamEnd::Refused(_) | StreamEnd::Ignored(_) => Code::InvalidArgument,
        StreamEnd::ShutDown => Code::Unavailable,
    }
}

impl RelayError {
    /// The terminal gRPC status of the stream.
    pub fn status(&self) -> Status {
        let code = match self {
            RelayError::TooManyStreams { .. } => Code::ResourceExhausted,
            RelayError::NoAttach { .. } | RelayError::BadAttach(_) => Code::InvalidArgument,
            RelayError::Access(AccessError::Unauthenticated(_)) => Code::Unauthenticated,
            RelayError::Access(AccessError::PermissionDenied(_))
            | RelayError::Revoked(AccessError::PermissionDenied(_)) => Code::PermissionDenied,
            RelayError::Revoked(AccessError::Unauthenticated(_)) => Code::Unauthenticated,
            RelayError::Attach(AttachError::UnknownPool { .. }) | RelayError::Domain { .. } => {
                Code::NotFound
            }
            RelayError::Attach(AttachError::FormatMismatch { .. }) => Code::FailedPrecondition,
            RelayError::Attach(AttachError::Occupied { .. }) => {
                let mut metadata = MetadataMap::new();
                metadata.insert(
                    ATTACH_REFUSED_KEY,
                    MetadataValue::from_static(ATTACH_REFUSED_OCCUPIED),
                );
                return Status::with_metadata(Code::FailedPrecondition, self.to_string(), metadata);
            }
            RelayError::Frame(FrameError::Transport(s)) if s.code() == Code::OutOfRange => {
                // tonic reports a message over the decoding limit as OUT_OF_RANGE; gRPC servers
                // conventionally answer RESOURCE_EXHAUSTED for "message larger than max".
                Code::ResourceExhausted
            }
            RelayError::Frame(FrameError::Transport(s)) => s.code(),
            RelayError::Frame(FrameError::RepliesClosed) => Code::Cancelled,
            RelayError::Frame(_) => Code::InvalidArgument,
            RelayError::EndedWithoutDrain => Code::FailedPrecondition,
            RelayError::Ended(end) => end_code(end),
            RelayError::Shutdown => Code::Unavailable,
            RelayError::Removed { .. } => Code::NotFound,
        };
        Status::new(code, self.to_string())
    }

    /// Whether the stream ended because the indexer is going away.
    pub fn is_shutdown(&self) -> bool {
        matches!(
            self,
            RelayError::Shutdown | RelayError::Ended(StreamEnd::ShutDown)
        )
    }

    /// The `Retired` reply sent before the status, for failures that end a leased stream.
    pub fn retired_reply(&self) -> Option<v1::RelayReply> {
        let reason = match self {
            RelayError::Frame(_) | RelayError::EndedWithoutDrain | RelayError::Revoked(_) => {
                v1::RetireReason::StreamLost
            }
            RelayError::Ended(StreamEnd::Retired { reason, .. }) => wire_reason(reason),
            RelayError::Ended(StreamEnd::Superseded { .. }) => v1::RetireReason::Superseded,
            RelayError::Ended(StreamEnd::ShutDown) | RelayError::Shutdown => {
                v1::RetireReason::Shutdown
            }
            RelayError::Removed { .. } => v1::RetireReason::Removed,
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
            Code::Unauthenticated => "unauthenticated",
            Code::PermissionDenied => "permission_denied",
            _ => "other",
        }
    }
}

impl Disposed for RelayError {
    /// A stream that broke at the transport (a bad frame, a stream error, an end without drain
    /// marker) has uncertain delivery: [`Disposition::RetireLane`]. Ends decided by ckf-core
    /// and refused attachments keep their own disposition.
    fn disposition(&self) -> Disposition {
        match self {
            RelayError::Frame(FrameError::Refused(error)) => error.disposition(),
            RelayError::Frame(_) | RelayError::EndedWithoutDrain | RelayError::Revoked(_) => {
                Disposition::RetireLane
            }
            RelayError::Ended(end) => end.disposition(),
            RelayError::Attach(error) => error.disposition(),
            RelayError::TooManyStreams { .. }
            | RelayError::NoAttach { .. }
            | RelayError::BadAttach(_)
            | RelayError::Access(_)
            | RelayError::Domain { .. }
            | RelayError::Removed { .. }
            | RelayError::Shutdown => Disposition::Omission,
        }
    }
}

/// Why a query was refused.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// More block hashes than `limits.max_query_blocks`.
    #[error("{rpc} carries {blocks} block hashes (limits.max_query_blocks = {limit})")]
    TooManyBlocks {
        /// The RPC refused (`FindMatches`, `Route`).
        rpc: &'static str,
        /// Hashes in the request.
        blocks: usize,
        /// The limit.
        limit: u32,
    },
    /// A `FindMatchesBatch` request or `FindMatchesStream` message with more queries than
    /// `limits.max_query_batch`.
    #[error("{at} carries {queries} queries (limits.max_query_batch = {limit})")]
    TooManyQueries {
        /// Which request.
        at: BatchAt,
        /// Queries in it.
        queries: usize,
        /// The limit.
        limit: u32,
    },
    /// A query of a batch or stream message longer than `limits.max_query_blocks`.
    #[error(
        "{at}: query #{index} carries {blocks} block hashes (limits.max_query_blocks = {limit})"
    )]
    BatchQueryTooLong {
        /// Which request.
        at: BatchAt,
        /// 0-based index of the first query over the limit.
        index: usize,
        /// Hashes in it.
        blocks: usize,
        /// The limit.
        limit: u32,
    },
    /// The answer of a batch or stream message would not fit `limits.max_message_bytes` (many
    /// queries times many ready lanes under a small message limit, though the request fits).
    #[error(
        "{at}: the answer of its {queries} queries would be {bytes} bytes \
         (limits.max_message_bytes = {limit}); send fewer queries per message"
    )]
    AnswerTooLarge {
        /// Which request.
        at: BatchAt,
        /// Queries in it.
        queries: usize,
        /// Encoded size of the answer.
        bytes: usize,
        /// The limit.
        limit: u64,
    },
    /// `limits.max_query_streams` `FindMatchesStream` calls are open already.
    #[error(
        "FindMatchesStream: {limit} query streams are open (limits.max_query_streams = {limit}); \
         close an idle stream or retry later"
    )]
    TooManyStreams {
        /// The limit.
        limit: u32,
    },
    /// The indexer is shutting down (ends an open `FindMatchesStream`).
    #[error("FindMatchesStream: the indexer is shutting down")]
    Shutdown,
    /// A catalog reload removed the domain of an open `FindMatchesStream`.
    #[error("FindMatchesStream: domain {domain} was removed from this indexer's catalog")]
    Removed {
        /// The domain.
        domain: ckf_core::identity::IndexerDomainId,
    },
    /// The call names a domain (`ckf-domain` metadata) that is invalid or not served here.
    #[error("{0}")]
    Domain(#[from] DomainError),
    /// A token query broke a token-query rule (its message names the field).
    #[error("{rpc}: {error}")]
    Tokens {
        /// The RPC refused (`FindMatchesByTokens`, `Route`).
        rpc: &'static str,
        /// The rule broken.
        error: TokenQueryError,
    },
    /// A request of a `RouteBatch` that a unary `Route` would refuse (the first one).
    #[error("{at}: query #{index}: {error}")]
    BatchQuery {
        /// Which request.
        at: BatchAt,
        /// 0-based index of the first refused request.
        index: usize,
        /// Why it was refused.
        error: Box<QueryError>,
    },
    /// A `RouteBatch` whose answer could exceed `limits.max_message_bytes` (checked before
    /// anything is routed, against the largest answer of that many requests on these lanes).
    #[error(
        "RouteBatch: the answer of its {requests} requests could take up to {bytes} bytes \
         (limits.max_message_bytes = {limit}); send fewer requests per message"
    )]
    RouteAnswerTooLarge {
        /// Requests in it.
        requests: usize,
        /// The bound of its answer's encoded size.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// A `Route` request without its query.
    #[error("Route: RouteRequest.query is required (block hashes or token ids)")]
    RouteWithoutQuery,
    /// A `Route` request's round trip that is not a number of milliseconds in 0..=3,600,000.
    #[error("Route: rtt_ms of {dc} is {value:e}, not a number of milliseconds in 0..=3600000")]
    RouteRtt {
        /// The DC it names.
        dc: String,
        /// The value sent.
        value: f64,
    },
    /// The blocking task counting occupied slots for `ListLanes` failed.
    #[error("load-factor count failed: {0}")]
    LoadCount(#[from] tokio::task::JoinError),
    /// The caller did not present the query token (`auth.query_token_file`), checked before
    /// any Query method runs (`IndexerAccess::query_interceptor`).
    #[error("ckf.v1.Query: {0}")]
    Unauthenticated(AccessError),
}

/// Why a catalog reload (`crate::catalog`) changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The indexer was started with a configuration value, not a source to re-read.
    #[error(
        "this indexer was started in-process with a configuration value, not from a \
         configuration file or flags: there is nothing to reload"
    )]
    NoSource,
    /// The configuration could not be read or breaks a rule.
    #[error("the configuration is refused, nothing changed: {0}")]
    Load(#[from] ckf_svc_kit::config::ConfigError),
    /// A key breaks a rule.
    #[error("the configuration is refused, nothing changed: {0}")]
    Invalid(#[from] ckf_svc_kit::config::Invalid),
    /// A key that takes a restart changed.
    #[error(
        "{key} changed, and it takes a restart; nothing changed (a reload changes the catalog \
         of domains and [auth] only)"
    )]
    NeedsRestart {
        /// The top-level key.
        key: &'static str,
    },
    /// The new catalog breaks a catalog rule.
    #[error("the catalog change is refused, nothing changed: {0}")]
    Plan(#[from] ckf_core::catalog::CatalogChangeError),
    /// A lane could not be added or removed (the plan said it could: a bug; the catalog is
    /// not swapped, the lanes changed before stay changed).
    #[error("a lane change failed: {0}")]
    Lane(#[from] ckf_core::global::LaneChangeError),
    /// An added domain could not be built (its table could not be allocated, its lane threads
    /// could not start, ...).
    #[error("domain {domain} could not be added, nothing changed: {error}")]
    Build {
        /// The domain.
        domain: ckf_core::identity::IndexerDomainId,
        /// Why (`crate::state::DomainBuildError`).
        error: String,
    },
    /// The reload task failed.
    #[error("the reload task failed: {0}")]
    Task(String),
}

/// Why an `Admin` call failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// No `auth.admin_token_file`: the service refuses every call.
    #[error("ckf.v1.Admin is off: set auth.admin_token_file on the indexer")]
    Off,
    /// The caller did not present the admin token.
    #[error("ckf.v1.Admin: {0}")]
    Unauthenticated(AccessError),
    /// The catalog reload was refused or failed; nothing changed.
    #[error("ReloadCatalog: {0}")]
    Reload(#[from] ReloadError),
}

impl From<AdminError> for Status {
    fn from(error: AdminError) -> Self {
        let code = match &error {
            AdminError::Off => Code::PermissionDenied,
            AdminError::Unauthenticated(_) => Code::Unauthenticated,
            AdminError::Reload(ReloadError::NoSource) => Code::Unimplemented,
            AdminError::Reload(ReloadError::Task(_)) => Code::Internal,
            AdminError::Reload(_) => Code::FailedPrecondition,
        };
        Status::new(code, error.to_string())
    }
}

/// Which batched request a [`QueryError`] is about (its `Display` starts the message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchAt {
    /// A `FindMatchesBatch` request.
    Batch,
    /// The `FindMatchesStream` request message with this caller-chosen id.
    Stream {
        /// The message's `id`.
        id: u64,
    },
    /// A `RouteBatch` request.
    RouteBatch,
}

impl std::fmt::Display for BatchAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BatchAt::Batch => f.write_str("FindMatchesBatch"),
            BatchAt::Stream { id } => write!(f, "FindMatchesStream message id {id}"),
            BatchAt::RouteBatch => f.write_str("RouteBatch"),
        }
    }
}

impl From<QueryError> for Status {
    fn from(error: QueryError) -> Self {
        match error {
            QueryError::TooManyBlocks { .. }
            | QueryError::TooManyQueries { .. }
            | QueryError::BatchQueryTooLong { .. }
            | QueryError::AnswerTooLarge { .. }
            | QueryError::BatchQuery { .. }
            | QueryError::RouteAnswerTooLarge { .. }
            | QueryError::RouteWithoutQuery
            | QueryError::RouteRtt { .. }
            | QueryError::Tokens { .. } => Status::invalid_argument(error.to_string()),
            QueryError::Shutdown => Status::unavailable(error.to_string()),
            QueryError::Removed { .. } => Status::not_found(error.to_string()),
            QueryError::TooManyStreams { .. } => Status::resource_exhausted(error.to_string()),
            QueryError::LoadCount(_) => Status::internal(error.to_string()),
            QueryError::Domain(DomainError::Invalid(_) | DomainError::Several(_)) => {
                Status::invalid_argument(error.to_string())
            }
            QueryError::Domain(DomainError::NotServed { .. }) => {
                Status::not_found(error.to_string())
            }
            QueryError::Unauthenticated(_) => Status::unauthenticated(error.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ckf_core::lane::DeltaError;

    #[test]
    fn retirements_map_to_codes_and_wire_reasons() {
        let gap = RelayError::Ended(StreamEnd::Retired {
            lane: 1,
            reason: RetireReason::Gap {
                installed: 4,
                base_sequence: 6,
            },
        });
        assert_eq!(gap.status().code(), Code::FailedPrecondition);
        assert!(gap.status().message().contains("installed sequence is 4"));
        let Some(v1::RelayReply {
            reply: Some(v1::relay_reply::Reply::Retired(r)),
        }) = gap.retired_reply()
        else {
            panic!("gap must send a Retired reply");
        };
        assert_eq!(r.reason(), v1::RetireReason::Gap);

        let dup = RelayError::Ended(StreamEnd::Retired {
            lane: 0,
            reason: RetireReason::MalformedDelta(DeltaError::DuplicateBucket { bucket: 3 }),
        });
        assert_eq!(dup.status().code(), Code::InvalidArgument);

        let too_big = RelayError::Frame(FrameError::Transport(Status::out_of_range("too large")));
        assert_eq!(too_big.status().code(), Code::ResourceExhausted);

        let refused = RelayError::TooManyStreams { limit: 2 };
        assert!(refused.retired_reply().is_none());
    }
}
