//! The lane vocabulary shared with services: states, per-frame outcomes, retirement and ignore
//! reasons, transition events and the operator status.

use std::time::{Duration, Instant};

use thiserror::Error;

use crate::frames::ChunkError;
use crate::identity::{LaneIndex, LaneLease, ProducerIncarnation};

/// State of one lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LaneState {
    /// No lease was ever granted.
    Unassigned,
    /// A lease is granted; the barrier snapshot is missing or incomplete. Not ready.
    AwaitingSnapshot,
    /// Snapshot complete, deltas applying; the ready bit is set.
    Active,
    /// Retired by a failure; not ready until a new lease and a new barrier snapshot.
    Retired,
}

impl LaneState {
    /// Lower-case name for logs and metrics labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            LaneState::Unassigned => "unassigned",
            LaneState::AwaitingSnapshot => "awaiting_snapshot",
            LaneState::Active => "active",
            LaneState::Retired => "retired",
        }
    }
}

/// Why a current-stream delta is malformed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DeltaError {
    /// The delta carries no image.
    #[error("delta carries no bucket image")]
    Empty,
    /// An image names a bucket outside the table.
    #[error("bucket {bucket} is outside the table of {bucket_count} buckets")]
    BucketOutOfRange {
        /// The offending bucket.
        bucket: u32,
        /// Buckets in the table.
        bucket_count: u64,
    },
    /// Two images name the same bucket.
    #[error("bucket {bucket} appears more than once")]
    DuplicateBucket {
        /// The repeated bucket.
        bucket: u32,
    },
}

/// Why a current-stream snapshot (or chunk) is malformed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SnapshotError {
    /// The chunk itself is empty, misaligned or reaches past the table.
    #[error(transparent)]
    Chunk(#[from] ChunkError),
    /// A chunk did not start where the previous one ended (or the first did not start at 0).
    #[error("snapshot chunk starts at bucket {got}, expected {expected}")]
    OutOfOrder {
        /// The next bucket the ingestor expected.
        expected: u64,
        /// The chunk's first bucket.
        got: u64,
    },
    /// A later chunk carries a different terminal sequence than the first.
    #[error("snapshot chunk has sequence {got}, but the snapshot started with {expected}")]
    SequenceChanged {
        /// Sequence of the snapshot in progress.
        expected: u64,
        /// Sequence of this chunk.
        got: u64,
    },
    /// A re-barrier snapshot is tagged below the already installed sequence.
    #[error("snapshot sequence {sequence} is below the installed sequence {installed}")]
    Regressed {
        /// Installed sequence.
        installed: u64,
        /// Snapshot sequence.
        sequence: u64,
    },
    /// A whole snapshot whose bucket count differs from the table's.
    #[error("snapshot has {got} buckets, the table has {expected}")]
    WrongLength {
        /// Buckets in the table.
        expected: u64,
        /// Buckets in the snapshot.
        got: u64,
    },
}

/// Why a lane was retired. Every variant affects only that lane; recovery is a new lease plus a
/// barrier snapshot (see [`crate::failure`]).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RetireReason {
    /// A delta's base sequence differs from the installed sequence (a lost or reordered delta).
    #[error("gap: delta base {base_sequence} but installed sequence is {installed}")]
    Gap {
        /// Installed sequence.
        installed: u64,
        /// The delta's base sequence.
        base_sequence: u64,
    },
    /// A delta whose sequence is not `base_sequence + 1`.
    #[error("non-contiguous delta {base_sequence} -> {sequence}")]
    NonContiguous {
        /// The delta's base sequence.
        base_sequence: u64,
        /// The delta's sequence.
        sequence: u64,
    },
    /// A current-stream delta with bad images (nothing was applied).
    #[error("malformed delta: {0}")]
    MalformedDelta(DeltaError),
    /// A current-stream snapshot or chunk that is malformed or out of order.
    #[error("malformed snapshot: {0}")]
    MalformedSnapshot(SnapshotError),
    /// A delta or drain marker arrived before the barrier snapshot completed.
    #[error("{frame} before the barrier snapshot completed")]
    NotActive {
        /// Frame kind ("delta" or "drain").
        frame: &'static str,
    },
    /// A drain marker whose sequence differs from the installed one: the final delta(s) were lost.
    #[error("drain marker says {marker} but installed sequence is {installed}: lost final delta")]
    LostFinalDelta {
        /// Installed sequence.
        installed: u64,
        /// The marker's sequence.
        marker: u64,
    },
    /// A heartbeat of an active lane claims another last sequence than the installed one: the
    /// producer sent deltas the lane never applied (or claims ones it never sent). Reported as a
    /// gap (wire reason `GAP`).
    #[error("gap: heartbeat claims sequence {heartbeat} but installed sequence is {installed}")]
    HeartbeatGap {
        /// Installed sequence.
        installed: u64,
        /// The heartbeat's last sent sequence.
        heartbeat: u64,
    },
    /// A drained lane's grace period ([`super::LagPolicy::drain_grace`]) ended without a new
    /// lease: its content was exact as of the drain but nobody keeps it current any more.
    #[error("drained {drained_ms} ms ago without a new lease (drain grace {grace_ms} ms)")]
    DrainGraceExpired {
        /// Milliseconds since the drain marker was accepted.
        drained_ms: u64,
        /// The configured grace.
        grace_ms: u64,
    },
    /// No frame of the current lease arrived within the heartbeat deadline.
    #[error("no frame for {silent_ms} ms (heartbeat deadline {deadline_ms} ms)")]
    HeartbeatTimeout {
        /// Milliseconds since the last frame of the current lease.
        silent_ms: u64,
        /// The deadline.
        deadline_ms: u64,
    },
    /// A delta exceeded the dirty-to-applied deadline (it was not applied).
    #[error("delta lag {age_ms} ms exceeds the dirty-to-applied deadline {deadline_ms} ms")]
    LagExceeded {
        /// `oldest_change_age_ms` plus the time queued at the consumer.
        age_ms: u64,
        /// The deadline.
        deadline_ms: u64,
    },
    /// The lane's bounded ingestion queue was full when a frame of its current lease arrived.
    #[error("ingestion queue full ({capacity} frames)")]
    Saturated {
        /// Queue capacity.
        capacity: usize,
    },
    /// Applying a frame failed midway (a caught panic); the lane's words are uncertain.
    #[error("apply failed midway: {detail}")]
    ApplyFailed {
        /// The panic message.
        detail: String,
    },
    /// Delivery became uncertain at the transport: the current stream broke, ended without a
    /// drain marker, or carried a frame the service could not decode or admit (docs/design.md,
    /// "Lane recovery and failure boundaries": delivery uncertainty retires only the affected
    /// lane). Retired through
    /// [`crate::global::GlobalCkfIndexer::retire_lease`] by the service owning the stream.
    #[error("stream lost: {detail}")]
    StreamLost {
        /// What the transport saw.
        detail: String,
    },
    /// The lane was removed from the consumer's lanes while it ran
    /// ([`crate::global::GlobalCkfIndexer::remove_lane`]): attachments for its pool are refused
    /// until it is added back.
    #[error("the lane was removed from the indexer's lanes")]
    Removed,
}

impl RetireReason {
    /// Stable snake-case label for metrics (`retirements_total{reason=...}`).
    pub fn label(&self) -> &'static str {
        match self {
            RetireReason::Gap { .. } => "gap",
            RetireReason::NonContiguous { .. } => "non_contiguous",
            RetireReason::MalformedDelta(_) => "malformed_delta",
            RetireReason::MalformedSnapshot(_) => "malformed_snapshot",
            RetireReason::NotActive { .. } => "not_active",
            RetireReason::LostFinalDelta { .. } => "lost_final_delta",
            RetireReason::HeartbeatGap { .. } => "heartbeat_gap",
            RetireReason::DrainGraceExpired { .. } => "drain_grace_expired",
            RetireReason::HeartbeatTimeout { .. } => "heartbeat_timeout",
            RetireReason::LagExceeded { .. } => "lag_exceeded",
            RetireReason::Saturated { .. } => "saturated",
            RetireReason::ApplyFailed { .. } => "apply_failed",
            RetireReason::StreamLost { .. } => "stream_lost",
            RetireReason::Removed => "removed",
        }
    }
}

/// Why a frame was ignored: it belongs to no current stream, and the current stream is untouched.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum IgnoreReason {
    /// The frame's lease was granted by another consumer instance (e.g. before a restart).
    #[error("lease from consumer instance {frame:#x}, this is {current:#x}")]
    OtherConsumer {
        /// The frame's consumer instance.
        frame: u64,
        /// This consumer's instance.
        current: u64,
    },
    /// The frame's lease epoch is older than the lane's current lease.
    #[error("stale lease epoch {frame} (current {current})")]
    StaleLease {
        /// The frame's epoch.
        frame: u64,
        /// The current epoch.
        current: u64,
    },
    /// The frame carries the current lease but another producer incarnation.
    #[error("incarnation {frame} does not hold the current lease (held by {current})")]
    OtherIncarnation {
        /// The frame's incarnation.
        frame: ProducerIncarnation,
        /// The lease holder's incarnation.
        current: ProducerIncarnation,
    },
    /// The current lease's stream was retired; only a new lease revives the lane.
    #[error("lane retired ({0}); waiting for a new lease")]
    LaneRetired(RetireReason),
}

/// A frame that belongs to no current stream of this consumer: an unknown lane, a lease this
/// consumer never granted, or (on an attached stream) another stream's lease.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum StrayFrame {
    /// The lease names a lane outside the manifest.
    #[error("lane {lane} is not in the manifest ({lanes} lanes)")]
    UnknownLane {
        /// The lane.
        lane: LaneIndex,
        /// Lanes in the manifest.
        lanes: usize,
    },
    /// The lease epoch was never granted by this consumer instance.
    #[error("lease epoch {epoch} on lane {lane} was never granted (latest {latest})")]
    UnknownLease {
        /// The lane.
        lane: LaneIndex,
        /// The frame's epoch.
        epoch: u64,
        /// The latest granted epoch (0 = none).
        latest: u64,
    },
    /// A frame on an attached stream carries another lease than the one granted to that stream
    /// ([`crate::global::Attachment::check`]). The frame is dropped; the stream can no longer
    /// be trusted, so its own lane is retired as stream lost.
    #[error("{frame} frame carries {got} but this stream holds {held}")]
    ForeignLease {
        /// Frame kind ([`super::Frame::kind`]).
        frame: &'static str,
        /// The frame's lease.
        got: LaneLease,
        /// The stream's lease.
        held: LaneLease,
    },
}

/// What happened to one frame. Every command gets exactly one outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IngestOutcome {
    /// A delta was applied; the lane has installed `installed_sequence`.
    Applied {
        /// Installed sequence after the delta.
        installed_sequence: u64,
    },
    /// A snapshot chunk was written; the snapshot is not complete yet.
    ChunkAccepted {
        /// First bucket of the next expected chunk.
        next_bucket: u64,
    },
    /// The barrier snapshot completed: the lane is ready at `installed_sequence`.
    Activated {
        /// The snapshot's terminal sequence.
        installed_sequence: u64,
    },
    /// An exact drain marker: the lane stays ready and is marked drained.
    Drained {
        /// Installed (= final) sequence.
        installed_sequence: u64,
    },
    /// A heartbeat of the current stream was noted.
    Alive,
    /// Stale or superseded traffic; nothing changed.
    Ignored(IgnoreReason),
    /// Not attributable to any lane stream; nothing changed.
    Rejected(StrayFrame),
    /// This frame retired the lane (or found it failing).
    Retired(RetireReason),
}

/// Lane transition notifications, for services streaming under a lease (e.g. to end a producer's
/// stream with a terminal status when its lane is retired by a deadline).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LaneEventKind {
    /// The barrier snapshot completed; the lane is ready.
    Activated {
        /// Installed sequence.
        installed_sequence: u64,
    },
    /// An exact drain marker was accepted.
    Drained {
        /// Installed sequence.
        installed_sequence: u64,
    },
    /// The lease's stream was retired.
    Retired(RetireReason),
    /// A newer lease fenced this one.
    Superseded {
        /// The new lease.
        by: LaneLease,
        /// The incarnation holding the new lease.
        incarnation: ProducerIncarnation,
    },
    /// Another producer incarnation asked for the lane while this lease's attachment was live
    /// (see [`Contention`]); the event's lease is the live holder's.
    Contended {
        /// What the contender did.
        kind: ContentionKind,
        /// The contender's incarnation.
        contender: ProducerIncarnation,
    },
}

/// How another producer incarnation contended for a lane held by a live attachment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ContentionKind {
    /// An `IF_VACANT` attach was refused (nothing changed).
    IfVacantRefused,
    /// A `TAKEOVER` attach superseded the live holder.
    Takeover,
}

impl ContentionKind {
    /// Every kind, in label order.
    pub const ALL: [ContentionKind; 2] =
        [ContentionKind::IfVacantRefused, ContentionKind::Takeover];

    /// Stable snake-case label for metrics (`lane_contention_total{kind=...}`) and logs.
    pub fn as_str(&self) -> &'static str {
        match self {
            ContentionKind::IfVacantRefused => "if_vacant_refused",
            ContentionKind::Takeover => "takeover",
        }
    }
}

/// Lane contention since the consumer started: attaches by another incarnation while the lane
/// had a live attachment (an `IF_VACANT` refusal, or a `TAKEOVER` of a live holder). Two live
/// producers for one pool show up here (and in `ckf_indexer_lane_contention_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Contention {
    /// Contentions counted on this lane.
    pub count: u64,
    /// The latest one's kind.
    pub last_kind: ContentionKind,
    /// The latest contender's incarnation.
    pub last_contender: ProducerIncarnation,
    /// The live holder's incarnation at the latest contention.
    pub last_holder: ProducerIncarnation,
    /// When the latest one happened.
    pub last_at: Instant,
}

/// One lane transition, tagged with the lease it concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneEvent {
    /// The lease whose stream changed.
    pub lease: LaneLease,
    /// What happened.
    pub kind: LaneEventKind,
}

/// Operator view of one lane (`ListLanes`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneStatus {
    /// Lane index.
    pub lane: LaneIndex,
    /// State machine position.
    pub state: LaneState,
    /// Whether the ready bit is set (queries see the lane).
    pub ready: bool,
    /// Current lease (None while unassigned).
    pub lease: Option<LaneLease>,
    /// Incarnation holding the current lease.
    pub incarnation: Option<ProducerIncarnation>,
    /// Installed sequence (None before the first activation of the current lease).
    pub installed_sequence: Option<u64>,
    /// When the last frame of the current lease arrived (or the lease was granted).
    pub last_update: Option<Instant>,
    /// Retirements since the consumer started.
    pub retirements: u64,
    /// Reason of the latest retirement.
    pub last_retirement: Option<RetireReason>,
    /// An exact drain marker was accepted under the current lease and the lane is still
    /// active (ready, inside its drain grace).
    pub drained: bool,
    /// When a drained lane retires as [`RetireReason::DrainGraceExpired`] unless a new lease
    /// arrives first (None: not drained, or no grace configured).
    pub drain_grace_deadline: Option<Instant>,
    /// Contention on this lane (None: never contended).
    pub contention: Option<Contention>,
}

impl LaneStatus {
    /// Time since the last frame of the current lease, if any.
    pub fn last_update_age(&self) -> Option<Duration> {
        self.last_update.map(|t| t.elapsed())
    }
}
