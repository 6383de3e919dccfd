//! One lane's serialized ingestor: lease validation, the lane state machine and the delta
//! acceptance rules (design source, "Global transposed consumer" and "Lane recovery and failure
//! boundaries").
//!
//! ```text
//!   Unassigned --grant--> AwaitingSnapshot --last chunk--> Active --gap/malformed/lag/...--> Retired
//!                              ^    ^                        |  |                              |
//!                              |    +------- new lease ------+  +-- re-barrier chunk 0 --+     |
//!                              +-------------------------------- new lease --------------+-----+
//! ```
//! Everything here is ingestion-worker-local (the owning [`crate::global::GlobalCkfIndexer`]
//! keeps each `LaneIngestor` behind its own mutex, which queries never touch). Only the bucket
//! words and the ready bit are shared with queries.
//!
//! Every frame is validated completely before its first word is stored, so a malformed frame
//! changes no word of the table.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::bucket::TransposedTable;
use crate::frames::{ChunkError, DcCkfDelta, DcCkfSnapshot, DrainMarker, SnapshotChunk};
use crate::identity::{LaneIndex, LaneLease, ProducerIncarnation, StreamTag};

/// Deadlines enforced by the consumer (DESIGN.md section 4: "a lag-policy violation ... retires
/// only that lane").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LagPolicy {
    /// A lane holding a lease (awaiting its snapshot, or active and not drained) that receives no
    /// frame of its current lease for this long is retired with
    /// [`RetireReason::HeartbeatTimeout`]. `None` disables the check. Enforced by the
    /// [`crate::ingestion::IngestionPool`] workers, or by calling
    /// [`crate::global::GlobalCkfIndexer::check_deadlines`].
    pub heartbeat_deadline: Option<Duration>,
    /// Dirty-to-applied deadline: a delta whose `oldest_change_age_ms` plus the time it waited at
    /// the consumer exceeds this is not applied and the lane is retired with
    /// [`RetireReason::LagExceeded`]. `None` disables the check.
    pub apply_deadline: Option<Duration>,
}

impl Default for LagPolicy {
    /// Heartbeat deadline 10 s, dirty-to-applied deadline 10 s.
    fn default() -> Self {
        Self {
            heartbeat_deadline: Some(Duration::from_secs(10)),
            apply_deadline: Some(Duration::from_secs(10)),
        }
    }
}

impl LagPolicy {
    /// No deadlines at all (tests and offline tools).
    pub const DISABLED: Self = Self {
        heartbeat_deadline: None,
        apply_deadline: None,
    };
}

/// Liveness frame: "the stream of this lease is alive" (no content).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heartbeat {
    /// Sender and lease.
    pub tag: StreamTag,
}

/// Everything a lane ingestor consumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// One chunk of a barrier snapshot (chunks must arrive in order from bucket 0).
    Chunk(SnapshotChunk),
    /// A whole barrier snapshot in one frame (in-process use); same rules as a single chunk
    /// covering every bucket.
    Snapshot(DcCkfSnapshot),
    /// A sequenced delta of absolute bucket images.
    Delta(DcCkfDelta),
    /// Exact drain marker.
    Drain(DrainMarker),
    /// Liveness.
    Heartbeat(Heartbeat),
}

impl Frame {
    /// The frame's envelope (sender incarnation and lease).
    pub fn tag(&self) -> &StreamTag {
        match self {
            Frame::Chunk(c) => &c.tag,
            Frame::Snapshot(s) => &s.tag,
            Frame::Delta(d) => &d.tag,
            Frame::Drain(m) => &m.tag,
            Frame::Heartbeat(h) => &h.tag,
        }
    }

    /// Short name of the frame kind ("chunk", "snapshot", "delta", "drain", "heartbeat").
    pub fn kind(&self) -> &'static str {
        match self {
            Frame::Chunk(_) => "chunk",
            Frame::Snapshot(_) => "snapshot",
            Frame::Delta(_) => "delta",
            Frame::Drain(_) => "drain",
            Frame::Heartbeat(_) => "heartbeat",
        }
    }
}

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
    /// drain marker, or carried a frame the service could not decode or admit (design source:
    /// "delivery uncertainty ... retires only the affected lane"). Retired through
    /// [`crate::global::GlobalCkfIndexer::retire_lease`] by the service owning the stream.
    #[error("stream lost: {detail}")]
    StreamLost {
        /// What the transport saw.
        detail: String,
    },
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
            RetireReason::HeartbeatTimeout { .. } => "heartbeat_timeout",
            RetireReason::LagExceeded { .. } => "lag_exceeded",
            RetireReason::Saturated { .. } => "saturated",
            RetireReason::ApplyFailed { .. } => "apply_failed",
            RetireReason::StreamLost { .. } => "stream_lost",
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

/// A frame that cannot belong to any lane stream of this consumer.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum IngestError {
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
    Rejected(IngestError),
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
    },
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
    /// An exact drain marker was accepted under the current lease.
    pub drained: bool,
}

impl LaneStatus {
    /// Time since the last frame of the current lease, if any.
    pub fn last_update_age(&self) -> Option<Duration> {
        self.last_update.map(|t| t.elapsed())
    }
}

/// The shared pieces a lane ingestor writes: the table (its own lane column) and the ready mask.
#[derive(Clone, Copy)]
pub(crate) struct Shared<'a> {
    pub table: &'a TransposedTable,
    pub ready: &'a AtomicU32,
    pub consumer_instance: u64,
    pub policy: &'a LagPolicy,
}

/// A snapshot being received: its terminal sequence and the next bucket expected.
#[derive(Debug, Clone, Copy)]
struct Receiving {
    sequence: u64,
    next_bucket: u64,
}

/// The serialized, worker-local state of one lane.
#[derive(Debug)]
pub(crate) struct LaneIngestor {
    lane: LaneIndex,
    state: LaneState,
    lease: Option<LaneLease>,
    incarnation: Option<ProducerIncarnation>,
    installed: Option<u64>,
    receiving: Option<Receiving>,
    drained: bool,
    last_update: Option<Instant>,
    retirements: u64,
    last_retirement: Option<RetireReason>,
    subscribers: Vec<flume::Sender<LaneEvent>>,
    /// Scratch for the uniqueness check (reused, so steady-state deltas allocate nothing).
    scratch: Vec<u32>,
    /// Fault injection: panic after storing this many images of the next delta.
    fault_after: Option<usize>,
}

impl LaneIngestor {
    pub(crate) fn new(lane: LaneIndex) -> Self {
        Self {
            lane,
            state: LaneState::Unassigned,
            lease: None,
            incarnation: None,
            installed: None,
            receiving: None,
            drained: false,
            last_update: None,
            retirements: 0,
            last_retirement: None,
            subscribers: Vec::new(),
            scratch: Vec::new(),
            fault_after: None,
        }
    }

    fn bit(&self) -> u32 {
        1 << self.lane
    }

    fn set_ready(&self, sh: Shared<'_>) {
        // Release: every word of the snapshot stored before this is visible to a query that
        // captures the mask with Acquire and sees the bit.
        sh.ready.fetch_or(self.bit(), Ordering::Release);
    }

    fn clear_ready(&self, sh: Shared<'_>) {
        sh.ready.fetch_and(!self.bit(), Ordering::AcqRel);
    }

    fn emit(&mut self, kind: LaneEventKind) {
        if let Some(lease) = self.lease {
            let ev = LaneEvent { lease, kind };
            self.subscribers.retain(|s| s.send(ev.clone()).is_ok());
        }
    }

    pub(crate) fn subscribe(&mut self) -> flume::Receiver<LaneEvent> {
        let (tx, rx) = flume::unbounded();
        self.subscribers.push(tx);
        rx
    }

    pub(crate) fn arm_fault(&mut self, after_images: usize) {
        self.fault_after = Some(after_images);
    }

    pub(crate) fn status(&self, sh: Shared<'_>) -> LaneStatus {
        LaneStatus {
            lane: self.lane,
            state: self.state,
            ready: sh.ready.load(Ordering::Acquire) & self.bit() != 0,
            lease: self.lease,
            incarnation: self.incarnation,
            installed_sequence: self.installed,
            last_update: self.last_update,
            retirements: self.retirements,
            last_retirement: self.last_retirement.clone(),
            drained: self.drained,
        }
    }

    /// Grants the next lease to `incarnation`, fencing any older stream (ready bit first).
    pub(crate) fn grant(
        &mut self,
        sh: Shared<'_>,
        incarnation: ProducerIncarnation,
        now: Instant,
    ) -> LaneLease {
        self.clear_ready(sh);
        let epoch = self.lease.map_or(1, |l| l.epoch + 1);
        let lease = LaneLease {
            consumer_instance: sh.consumer_instance,
            lane: self.lane,
            epoch,
        };
        if self.lease.is_some() && self.state != LaneState::Retired {
            self.emit(LaneEventKind::Superseded { by: lease });
        }
        self.lease = Some(lease);
        self.incarnation = Some(incarnation);
        self.state = LaneState::AwaitingSnapshot;
        self.installed = None;
        self.receiving = None;
        self.drained = false;
        self.last_update = Some(now);
        lease
    }

    /// Retires the current stream with `reason` (ready bit cleared first). No-op (returns false)
    /// when there is no live stream.
    pub(crate) fn retire(&mut self, sh: Shared<'_>, reason: RetireReason) -> bool {
        if !matches!(self.state, LaneState::AwaitingSnapshot | LaneState::Active) {
            return false;
        }
        self.clear_ready(sh);
        self.state = LaneState::Retired;
        self.receiving = None;
        self.retirements += 1;
        self.last_retirement = Some(reason.clone());
        self.emit(LaneEventKind::Retired(reason));
        true
    }

    /// Retires only if `lease` is the current, live lease.
    pub(crate) fn retire_lease(
        &mut self,
        sh: Shared<'_>,
        lease: LaneLease,
        reason: RetireReason,
    ) -> bool {
        self.lease == Some(lease) && self.retire(sh, reason)
    }

    fn fail(&mut self, sh: Shared<'_>, reason: RetireReason) -> IngestOutcome {
        self.retire(sh, reason.clone());
        IngestOutcome::Retired(reason)
    }

    /// Heartbeat deadline check; returns the reason when it retired the lane.
    pub(crate) fn check_deadline(&mut self, sh: Shared<'_>, now: Instant) -> Option<RetireReason> {
        let deadline = sh.policy.heartbeat_deadline?;
        let live = match self.state {
            LaneState::AwaitingSnapshot => true,
            // A drained stream ended cleanly: its content is exact as of the drain, so silence
            // afterwards is expected, not a failure.
            LaneState::Active => !self.drained,
            _ => false,
        };
        let silent = now.saturating_duration_since(self.last_update?);
        if live && silent > deadline {
            let reason = RetireReason::HeartbeatTimeout {
                silent_ms: silent.as_millis() as u64,
                deadline_ms: deadline.as_millis() as u64,
            };
            self.retire(sh, reason.clone());
            return Some(reason);
        }
        None
    }

    /// Lease and incarnation checks shared by every frame kind. `Err` is the final outcome.
    fn admit(&self, sh: Shared<'_>, tag: &StreamTag) -> Result<(), IngestOutcome> {
        let lease = tag.lease;
        if lease.consumer_instance != sh.consumer_instance {
            return Err(IngestOutcome::Ignored(IgnoreReason::OtherConsumer {
                frame: lease.consumer_instance,
                current: sh.consumer_instance,
            }));
        }
        let current = self.lease.map_or(0, |l| l.epoch);
        if lease.epoch > current {
            return Err(IngestOutcome::Rejected(IngestError::UnknownLease {
                lane: self.lane,
                epoch: lease.epoch,
                latest: current,
            }));
        }
        if lease.epoch < current {
            return Err(IngestOutcome::Ignored(IgnoreReason::StaleLease {
                frame: lease.epoch,
                current,
            }));
        }
        let holder = self.incarnation.expect("a granted lease has a holder");
        if tag.incarnation != holder {
            return Err(IngestOutcome::Ignored(IgnoreReason::OtherIncarnation {
                frame: tag.incarnation,
                current: holder,
            }));
        }
        if self.state == LaneState::Retired {
            let reason = self
                .last_retirement
                .clone()
                .expect("retired lanes have a reason");
            return Err(IngestOutcome::Ignored(IgnoreReason::LaneRetired(reason)));
        }
        Ok(())
    }

    /// Applies one frame. `received_at` is when the consumer received it (lag policy).
    pub(crate) fn ingest(
        &mut self,
        sh: Shared<'_>,
        frame: &Frame,
        received_at: Instant,
    ) -> IngestOutcome {
        if let Err(outcome) = self.admit(sh, frame.tag()) {
            return outcome;
        }
        let now = Instant::now();
        self.last_update = Some(now);
        match frame {
            Frame::Chunk(c) => self.chunk(sh, c),
            Frame::Snapshot(s) => self.whole_snapshot(sh, s),
            Frame::Delta(d) => self.delta(sh, d, now.saturating_duration_since(received_at)),
            Frame::Drain(m) => self.drain(sh, m),
            Frame::Heartbeat(_) => IngestOutcome::Alive,
        }
    }

    /// Starts or continues a snapshot at `first_bucket` with terminal `sequence`; returns the
    /// error that retires the lane, if any. On success the caller stores the words.
    fn begin_words(&self, sequence: u64, first_bucket: u64) -> Result<(), SnapshotError> {
        match self.receiving {
            Some(r) => {
                if first_bucket != r.next_bucket {
                    return Err(SnapshotError::OutOfOrder {
                        expected: r.next_bucket,
                        got: first_bucket,
                    });
                }
                if sequence != r.sequence {
                    return Err(SnapshotError::SequenceChanged {
                        expected: r.sequence,
                        got: sequence,
                    });
                }
            }
            None => {
                if first_bucket != 0 {
                    return Err(SnapshotError::OutOfOrder {
                        expected: 0,
                        got: first_bucket,
                    });
                }
                if let Some(installed) = self.installed
                    && sequence < installed
                {
                    return Err(SnapshotError::Regressed {
                        installed,
                        sequence,
                    });
                }
            }
        }
        Ok(())
    }

    /// Marks the start of a (re-)barrier rewrite: the ready bit is cleared before the first word
    /// is overwritten, so no query that captures readiness from now on reads a half-written
    /// snapshot (a query that captured earlier may, as the weak-read contract allows).
    fn start_rewrite(&mut self, sh: Shared<'_>, sequence: u64) {
        if self.receiving.is_none() {
            self.clear_ready(sh);
            self.state = LaneState::AwaitingSnapshot;
            self.drained = false;
            self.receiving = Some(Receiving {
                sequence,
                next_bucket: 0,
            });
        }
    }

    fn finish_words(&mut self, sh: Shared<'_>, next_bucket: u64) -> IngestOutcome {
        let r = self.receiving.as_mut().expect("receiving");
        r.next_bucket = next_bucket;
        if next_bucket < sh.table.bucket_count() as u64 {
            return IngestOutcome::ChunkAccepted { next_bucket };
        }
        let sequence = r.sequence;
        self.receiving = None;
        self.installed = Some(sequence);
        self.state = LaneState::Active;
        self.set_ready(sh);
        self.emit(LaneEventKind::Activated {
            installed_sequence: sequence,
        });
        IngestOutcome::Activated {
            installed_sequence: sequence,
        }
    }

    fn chunk(&mut self, sh: Shared<'_>, c: &SnapshotChunk) -> IngestOutcome {
        let bucket_count = sh.table.bucket_count() as u64;
        if let Err(e) = self.begin_words(c.sequence, c.first_bucket) {
            return self.fail(sh, RetireReason::MalformedSnapshot(e));
        }
        let words = match crate::frames::decode_chunk_words(c.first_bucket, &c.words, bucket_count)
        {
            Ok(w) => w,
            Err(e) => return self.fail(sh, RetireReason::MalformedSnapshot(e.into())),
        };
        self.start_rewrite(sh, c.sequence);
        let lane = self.lane as usize;
        let mut bucket = c.first_bucket as usize;
        for w in words {
            sh.table.store(bucket, lane, w);
            bucket += 1;
        }
        self.finish_words(sh, bucket as u64)
    }

    fn whole_snapshot(&mut self, sh: Shared<'_>, s: &DcCkfSnapshot) -> IngestOutcome {
        let bucket_count = sh.table.bucket_count() as u64;
        if s.buckets.len() as u64 != bucket_count {
            return self.fail(
                sh,
                RetireReason::MalformedSnapshot(SnapshotError::WrongLength {
                    expected: bucket_count,
                    got: s.buckets.len() as u64,
                }),
            );
        }
        if let Err(e) = self.begin_words(s.sequence, 0) {
            return self.fail(sh, RetireReason::MalformedSnapshot(e));
        }
        self.start_rewrite(sh, s.sequence);
        let lane = self.lane as usize;
        for (bucket, &w) in s.buckets.iter().enumerate() {
            sh.table.store(bucket, lane, w);
        }
        self.finish_words(sh, bucket_count)
    }

    /// Checks every acceptance rule of a current-stream delta; nothing is stored on `Err`.
    fn validate_delta(
        &mut self,
        sh: Shared<'_>,
        d: &DcCkfDelta,
        queued: Duration,
    ) -> Result<(), RetireReason> {
        if self.state != LaneState::Active {
            return Err(RetireReason::NotActive { frame: "delta" });
        }
        let installed = self
            .installed
            .expect("active lanes have an installed sequence");
        if d.base_sequence != installed {
            return Err(RetireReason::Gap {
                installed,
                base_sequence: d.base_sequence,
            });
        }
        if d.base_sequence.checked_add(1) != Some(d.sequence) {
            return Err(RetireReason::NonContiguous {
                base_sequence: d.base_sequence,
                sequence: d.sequence,
            });
        }
        if let Some(deadline) = sh.policy.apply_deadline {
            let age_ms = d
                .oldest_change_age_ms
                .saturating_add(queued.as_millis() as u64);
            if u128::from(age_ms) > deadline.as_millis() {
                return Err(RetireReason::LagExceeded {
                    age_ms,
                    deadline_ms: deadline.as_millis() as u64,
                });
            }
        }
        if d.images.is_empty() {
            return Err(RetireReason::MalformedDelta(DeltaError::Empty));
        }
        let bucket_count = sh.table.bucket_count() as u64;
        if let Some(img) = d
            .images
            .iter()
            .find(|i| u64::from(i.bucket) >= bucket_count)
        {
            return Err(RetireReason::MalformedDelta(DeltaError::BucketOutOfRange {
                bucket: img.bucket,
                bucket_count,
            }));
        }
        self.scratch.clear();
        self.scratch.extend(d.images.iter().map(|i| i.bucket));
        self.scratch.sort_unstable();
        if let Some(w) = self.scratch.windows(2).find(|w| w[0] == w[1]) {
            return Err(RetireReason::MalformedDelta(DeltaError::DuplicateBucket {
                bucket: w[0],
            }));
        }
        Ok(())
    }

    fn delta(&mut self, sh: Shared<'_>, d: &DcCkfDelta, queued: Duration) -> IngestOutcome {
        if let Err(reason) = self.validate_delta(sh, d, queued) {
            return self.fail(sh, reason);
        }
        let lane = self.lane as usize;
        let fault = self.fault_after.take();
        // Images are installed one atomic store each, in the producer's order (a relocated
        // fingerprint reaches its new bucket before it leaves its old one).
        for (i, img) in d.images.iter().enumerate() {
            if fault == Some(i) {
                panic!("injected apply fault after {i} images on lane {lane}");
            }
            sh.table.store(img.bucket as usize, lane, img.image);
        }
        self.installed = Some(d.sequence);
        self.drained = false;
        IngestOutcome::Applied {
            installed_sequence: d.sequence,
        }
    }

    fn drain(&mut self, sh: Shared<'_>, m: &DrainMarker) -> IngestOutcome {
        if self.state != LaneState::Active {
            return self.fail(sh, RetireReason::NotActive { frame: "drain" });
        }
        let installed = self
            .installed
            .expect("active lanes have an installed sequence");
        if m.sequence != installed {
            return self.fail(
                sh,
                RetireReason::LostFinalDelta {
                    installed,
                    marker: m.sequence,
                },
            );
        }
        self.drained = true;
        self.emit(LaneEventKind::Drained {
            installed_sequence: installed,
        });
        IngestOutcome::Drained {
            installed_sequence: installed,
        }
    }
}
