//! One lane's serialized ingestor: lease validation, the lane state machine and the delta
//! acceptance rules (docs/design.md, "Global transposed consumer" and "Lane recovery and failure
//! boundaries").
//!
//! ```text
//!   Unassigned --grant--> AwaitingSnapshot --last chunk--> Active --gap/malformed/lag/...--> Retired
//!                              ^    ^                        |  |                              |
//!                              |    +------- new lease ------+  +-- re-barrier chunk 0 --+     |
//!                              +-------------------------------- new lease --------------+-----+
//!   Active --exact drain--> Active (drained) --drain grace over--> Retired (DrainGraceExpired)
//! ```
//! A lane has a *live attachment* while it is awaiting its snapshot or active, not drained
//! (and not silent past the heartbeat deadline: the deadline is enforced before deciding).
//! A drained lane inside its grace is vacant: a new producer may attach `IF_VACANT` (a rolling
//! restart). A grant in [`AttachMode::IfVacant`] to another incarnation than a live holder is
//! refused and changes nothing; a [`AttachMode::Takeover`] of a live holder proceeds. Both are
//! counted as [`Contention`].
//! Everything here is ingestion-worker-local (the owning [`crate::global::GlobalCkfIndexer`]
//! keeps each `LaneIngestor` behind its own mutex, which queries never touch). Only the bucket
//! words and the ready bit are shared with queries.
//!
//! Every frame is validated completely before its first word is stored, so a malformed frame
//! changes no word of the table.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::bucket::groups::LaneGroups;
use crate::frames::Heartbeat;
use crate::frames::{DcCkfDelta, DcCkfSnapshot, DrainMarker, SnapshotChunk};
use crate::identity::{LaneIndex, LaneLease, ProducerIncarnation, StreamTag};

mod attach_mode;
mod frame;
mod lag;
mod outcome;

pub use attach_mode::AttachMode;
pub use frame::Frame;
pub use lag::LagPolicy;
pub use outcome::{
    Contention, ContentionKind, DeltaError, IgnoreReason, IngestOutcome, LaneEvent, LaneEventKind,
    LaneState, LaneStatus, RetireReason, SnapshotError, StrayFrame,
};

/// A live attachment that refused an [`AttachMode::IfVacant`] grant: who holds the lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LiveHolder {
    pub incarnation: ProducerIncarnation,
    pub lease: LaneLease,
    pub state: LaneState,
}

/// The shared pieces a lane ingestor writes: the table (its own lane column) and the ready mask.
#[derive(Clone, Copy)]
pub(crate) struct LaneContext<'a> {
    pub table: &'a LaneGroups,
    pub ready: &'a AtomicU64,
    pub consumer_instance: u64,
    pub policy: &'a LagPolicy,
}

/// A snapshot being received: its terminal sequence and the next bucket expected.
#[derive(Debug, Clone, Copy)]
struct Receiving {
    sequence: u64,
    next_bucket: u64,
}

/// How long this consumer may go without noting that it ran for a lane before the gap counts as
/// its own stall, not its producer's silence (the deadline keeper of `IngestionWorkers` notes it
/// for every leased lane at least every tick, at most 100 ms; a lane without a lease gets no
/// notes, which excuses nothing: its next grant starts the new lease's clocks at the grant).
pub const STALL_EXCUSED_AFTER: Duration = Duration::from_millis(250);

/// The serialized, worker-local state of one lane.
#[derive(Debug)]
pub(crate) struct LaneIngestor {
    lane: LaneIndex,
    state: LaneState,
    lease: Option<LaneLease>,
    incarnation: Option<ProducerIncarnation>,
    installed: Option<u64>,
    receiving: Option<Receiving>,
    /// When the exact drain marker of the current lease was accepted.
    drained_at: Option<Instant>,
    last_update: Option<Instant>,
    /// When this consumer last ran for the lane ([`note_consumer_ran`](Self::note_consumer_ran)):
    /// a longer gap than [`STALL_EXCUSED_AFTER`] is the consumer's own stall.
    consumer_ran: Option<Instant>,
    contention: Option<Contention>,
    retirements: u64,
    last_retirement: Option<RetireReason>,
    subscribers: Vec<flume::Sender<LaneEvent>>,
    /// Scratch for the uniqueness check (reused, so steady-state deltas allocate nothing).
    scratch: Vec<u32>,
    /// Fault injection (feature `testing`): panic after storing this many images of the next
    /// delta.
    #[cfg(feature = "testing")]
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
            drained_at: None,
            last_update: None,
            consumer_ran: None,
            contention: None,
            retirements: 0,
            last_retirement: None,
            subscribers: Vec::new(),
            scratch: Vec::new(),
            #[cfg(feature = "testing")]
            fault_after: None,
        }
    }

    fn bit(&self) -> u64 {
        1 << self.lane
    }

    fn set_ready(&self, sh: LaneContext<'_>) {
        // Release: every word of the snapshot stored before this is visible to a query that
        // captures the mask with Acquire and sees the bit.
        sh.ready.fetch_or(self.bit(), Ordering::Release);
    }

    fn clear_ready(&self, sh: LaneContext<'_>) {
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

    #[cfg(feature = "testing")]
    pub(crate) fn arm_fault(&mut self, after_images: usize) {
        self.fault_after = Some(after_images);
    }

    pub(crate) fn status(&self, sh: LaneContext<'_>) -> LaneStatus {
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
            // Drained and still serving; a retired lane is not "drained" any more.
            drained: self.drained_at.is_some() && self.state == LaneState::Active,
            drain_grace_deadline: self.drain_grace_deadline(sh),
            contention: self.contention,
        }
    }

    /// When the drained, still active lane retires for its drain grace.
    fn drain_grace_deadline(&self, sh: LaneContext<'_>) -> Option<Instant> {
        match (self.state, self.drained_at, sh.policy.drain_grace) {
            (LaneState::Active, Some(at), Some(grace)) => Some(at + grace),
            _ => None,
        }
    }

    /// Whether a deadline check may retire this lane: a lease awaiting its snapshot or active
    /// (the heartbeat deadline; once drained, the drain grace). An unassigned or retired lane
    /// has none until its next grant.
    pub(crate) fn has_deadline(&self) -> bool {
        matches!(self.state, LaneState::AwaitingSnapshot | LaneState::Active)
    }

    /// Whether the lane has a live attachment: a lease whose stream awaits its snapshot or is
    /// active and not drained. (Deadlines are enforced by the caller first.)
    fn is_live(&self) -> bool {
        matches!(self.state, LaneState::AwaitingSnapshot | LaneState::Active)
            && self.drained_at.is_none()
    }

    fn contend(&mut self, kind: ContentionKind, contender: ProducerIncarnation, now: Instant) {
        let holder = self.incarnation.expect("a live lane has a holder");
        let count = self.contention.map_or(0, |c| c.count) + 1;
        self.contention = Some(Contention {
            count,
            last_kind: kind,
            last_contender: contender,
            last_holder: holder,
            last_at: now,
        });
        self.emit(LaneEventKind::Contended { kind, contender });
    }

    /// Grants the next lease to `incarnation`, fencing any older stream (ready bit first).
    ///
    /// The deadlines are enforced at `now` first, so "live" is exact. When another incarnation
    /// holds a live attachment, [`AttachMode::IfVacant`] is refused with that holder (nothing
    /// changes but the contention count) and [`AttachMode::Takeover`] proceeds (counted too).
    /// The holder's own incarnation is never refused: its older stream is dead to it.
    pub(crate) fn grant(
        &mut self,
        sh: LaneContext<'_>,
        incarnation: ProducerIncarnation,
        mode: AttachMode,
        now: Instant,
    ) -> Result<LaneLease, LiveHolder> {
        self.check_deadline(sh, now);
        if self.is_live() && self.incarnation != Some(incarnation) {
            let holder = LiveHolder {
                incarnation: self.incarnation.expect("a live lane has a holder"),
                lease: self.lease.expect("a live lane has a lease"),
                state: self.state,
            };
            match mode {
                AttachMode::IfVacant => {
                    self.contend(ContentionKind::IfVacantRefused, incarnation, now);
                    return Err(holder);
                }
                AttachMode::Takeover => self.contend(ContentionKind::Takeover, incarnation, now),
            }
        }
        self.clear_ready(sh);
        let epoch = self.lease.map_or(1, |l| l.epoch + 1);
        let lease = LaneLease {
            consumer_instance: sh.consumer_instance,
            lane: self.lane,
            epoch,
        };
        if self.lease.is_some() && self.state != LaneState::Retired {
            self.emit(LaneEventKind::Superseded {
                by: lease,
                incarnation,
            });
        }
        self.lease = Some(lease);
        self.incarnation = Some(incarnation);
        self.state = LaneState::AwaitingSnapshot;
        self.installed = None;
        self.receiving = None;
        self.drained_at = None;
        self.last_update = Some(now);
        Ok(lease)
    }

    /// Retires the current stream with `reason` (ready bit cleared first). No-op (returns false)
    /// when there is no live stream.
    pub(crate) fn retire(&mut self, sh: LaneContext<'_>, reason: RetireReason) -> bool {
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
        sh: LaneContext<'_>,
        lease: LaneLease,
        reason: RetireReason,
    ) -> bool {
        self.lease == Some(lease) && self.retire(sh, reason)
    }

    fn fail(&mut self, sh: LaneContext<'_>, reason: RetireReason) -> IngestOutcome {
        self.retire(sh, reason.clone());
        IngestOutcome::Retired(reason)
    }

    /// This consumer runs for the lane at `now` (the deadline keeper notes it at least every
    /// tick while the lane holds a lease). A gap since the last note longer than
    /// [`STALL_EXCUSED_AFTER`] means this consumer did not run (its process was stopped, its
    /// host froze) or the lane's worker held it (a long apply): that time is excused
    /// ([`excuse_own_stall`](Self::excuse_own_stall)).
    pub(crate) fn note_consumer_ran(&mut self, now: Instant) {
        self.excuse_own_stall(now);
        self.consumer_ran = Some(now);
    }

    /// Time since this consumer last ran for the lane, past [`STALL_EXCUSED_AFTER`], is its
    /// own stall, not the producer's silence: the heartbeat deadline and the drain grace
    /// restart from where they were that much later (never past `now`). Called before every
    /// deadline check too, so a check that runs before the keeper after a stall (an attach
    /// decided first) excuses it all the same.
    fn excuse_own_stall(&mut self, now: Instant) {
        let Some(ran) = self.consumer_ran else {
            return;
        };
        let stalled = now.saturating_duration_since(ran);
        if stalled <= STALL_EXCUSED_AFTER {
            return;
        }
        for at in [&mut self.last_update, &mut self.drained_at]
            .into_iter()
            .flatten()
        {
            *at = (*at + stalled).min(now);
        }
        self.consumer_ran = Some(now);
    }

    /// Heartbeat deadline and drain grace check; returns the reason when it retired the lane.
    pub(crate) fn check_deadline(
        &mut self,
        sh: LaneContext<'_>,
        now: Instant,
    ) -> Option<RetireReason> {
        self.excuse_own_stall(now);
        if let Some(at) = self.drained_at {
            // A drained stream ended cleanly: its content is exact as of the drain, so silence
            // afterwards is expected, not a failure; only the drain grace ends it.
            let (Some(grace), LaneState::Active) = (sh.policy.drain_grace, self.state) else {
                return None;
            };
            let drained = now.saturating_duration_since(at);
            if drained < grace {
                return None;
            }
            let reason = RetireReason::DrainGraceExpired {
                drained_ms: drained.as_millis() as u64,
                grace_ms: grace.as_millis() as u64,
            };
            self.retire(sh, reason.clone());
            return Some(reason);
        }
        let deadline = sh.policy.heartbeat_deadline?;
        let live = self.is_live();
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
    fn admit(&self, sh: LaneContext<'_>, tag: &StreamTag) -> Result<(), IngestOutcome> {
        let lease = tag.lease;
        if lease.consumer_instance != sh.consumer_instance {
            return Err(IngestOutcome::Ignored(IgnoreReason::OtherConsumer {
                frame: lease.consumer_instance,
                current: sh.consumer_instance,
            }));
        }
        let current = self.lease.map_or(0, |l| l.epoch);
        if lease.epoch > current {
            return Err(IngestOutcome::Rejected(StrayFrame::UnknownLease {
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
        sh: LaneContext<'_>,
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
            Frame::Heartbeat(h) => self.heartbeat(sh, h),
        }
    }

    /// A heartbeat of an active lane must claim the installed sequence; a lane awaiting its
    /// snapshot has nothing to compare (the producer claims the snapshot it is sending, or 0).
    fn heartbeat(&mut self, sh: LaneContext<'_>, h: &Heartbeat) -> IngestOutcome {
        if self.state == LaneState::Active {
            let installed = self
                .installed
                .expect("active lanes have an installed sequence");
            if h.sequence != installed {
                return self.fail(
                    sh,
                    RetireReason::HeartbeatGap {
                        installed,
                        heartbeat: h.sequence,
                    },
                );
            }
        }
        IngestOutcome::Alive
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
    fn start_rewrite(&mut self, sh: LaneContext<'_>, sequence: u64) {
        if self.receiving.is_none() {
            self.clear_ready(sh);
            self.state = LaneState::AwaitingSnapshot;
            self.drained_at = None;
            self.receiving = Some(Receiving {
                sequence,
                next_bucket: 0,
            });
        }
    }

    fn finish_words(&mut self, sh: LaneContext<'_>, next_bucket: u64) -> IngestOutcome {
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

    fn chunk(&mut self, sh: LaneContext<'_>, c: &SnapshotChunk) -> IngestOutcome {
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
        let (table, column) = sh.table.group_of(lane);
        let mut bucket = c.first_bucket as usize;
        for w in words {
            table.store(bucket, column, w);
            bucket += 1;
        }
        self.finish_words(sh, bucket as u64)
    }

    fn whole_snapshot(&mut self, sh: LaneContext<'_>, s: &DcCkfSnapshot) -> IngestOutcome {
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
        let (table, column) = sh.table.group_of(lane);
        for (bucket, &w) in s.buckets.iter().enumerate() {
            table.store(bucket, column, w);
        }
        self.finish_words(sh, bucket_count)
    }

    /// Checks every acceptance rule of a current-stream delta; nothing is stored on `Err`.
    fn validate_delta(
        &mut self,
        sh: LaneContext<'_>,
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

    fn delta(&mut self, sh: LaneContext<'_>, d: &DcCkfDelta, queued: Duration) -> IngestOutcome {
        if let Err(reason) = self.validate_delta(sh, d, queued) {
            return self.fail(sh, reason);
        }
        let lane = self.lane as usize;
        let (table, column) = sh.table.group_of(lane);
        #[cfg(feature = "testing")]
        let (fault, mut stored) = (self.fault_after.take(), 0usize);
        // Images are installed one atomic store each, in the producer's order (a relocated
        // fingerprint reaches its new bucket before it leaves its old one).
        for img in &d.images {
            #[cfg(feature = "testing")]
            {
                if fault == Some(stored) {
                    panic!("injected apply fault after {stored} images on lane {lane}");
                }
                stored += 1;
            }
            table.store(img.bucket as usize, column, img.image);
        }
        self.installed = Some(d.sequence);
        self.drained_at = None;
        IngestOutcome::Applied {
            installed_sequence: d.sequence,
        }
    }

    fn drain(&mut self, sh: LaneContext<'_>, m: &DrainMarker) -> IngestOutcome {
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
        self.drained_at = Some(Instant::now());
        self.emit(LaneEventKind::Drained {
            installed_sequence: installed,
        });
        IngestOutcome::Drained {
            installed_sequence: installed,
        }
    }
}
