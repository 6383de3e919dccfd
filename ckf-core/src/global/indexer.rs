//! [`GlobalCkfIndexer`]: the consumer's state (manifest, lease authority, shared table, ready
//! mask, one serialized ingestor per lane) and its lease grants and frame ingestion. Attached
//! streams are `global/attachment.rs`'s, prefix queries `global/query.rs`'s.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use crate::addressing::Addressing;
use crate::bucket::groups::LaneGroups;
use crate::identity::{LaneIndex, LaneLease, PoolId, ProducerIdentity};
use crate::lane::{
    Frame, IngestOutcome, LagPolicy, LaneContext, LaneEvent, LaneIngestor, LaneStatus,
    RetireReason, StrayFrame,
};
use crate::search::SearchKernel;

use super::manifest::{Manifest, ManifestError};
use super::request::{AttachError, AttachRequest, ClaimedFormat};

/// The transposed global consumer. `Sync`: share it in an `Arc` between ingestion workers and
/// query threads.
#[derive(Debug)]
pub struct GlobalCkfIndexer {
    manifest: Manifest,
    addressing: Addressing,
    consumer_instance: u64,
    policy: LagPolicy,
    table: LaneGroups,
    /// Bit `i` set = lane `i` ready. Release on activation, Acquire once per query.
    ready: AtomicU64,
    lanes: Vec<Mutex<LaneIngestor>>,
    huge_pages: bool,
    /// The search kernel queries run with, always a resolved one the CPU supports (see
    /// [`crate::search::SearchKernel`]); set at construction to the best available and changed
    /// only through `set_search_kernel`, which checks availability first.
    pub(crate) search_kernel: AtomicU8,
}

impl GlobalCkfIndexer {
    /// Builds a consumer with the default [`LagPolicy`].
    ///
    /// `consumer_instance` identifies this consumer process in every lease it grants; use a
    /// fresh value per start (e.g. random or start time) so leases of a previous run are ignored.
    ///
    /// # Errors
    /// [`ManifestError`].
    pub fn new(manifest: Manifest, consumer_instance: u64) -> Result<Self, ManifestError> {
        Self::with_policy(manifest, consumer_instance, LagPolicy::default())
    }

    /// Builds a consumer with an explicit lag policy.
    ///
    /// # Errors
    /// [`ManifestError`].
    pub fn with_policy(
        manifest: Manifest,
        consumer_instance: u64,
        policy: LagPolicy,
    ) -> Result<Self, ManifestError> {
        manifest.validate()?;
        let addressing = Addressing::new(&manifest.format)?;
        let table = LaneGroups::new(manifest.format.bucket_count, manifest.lanes.len())?;
        let lanes = (0..manifest.lanes.len())
            .map(|l| Mutex::new(LaneIngestor::new(l as LaneIndex)))
            .collect();
        // Every group is advised (each its own allocation); the figure is whether all were.
        let huge_pages = table
            .groups()
            .iter()
            .map(|g| crate::memory::advise(g.row(0).as_ptr().cast(), g.bytes()))
            .fold(true, |all, one| all & one);
        Ok(Self {
            manifest,
            addressing,
            consumer_instance,
            policy,
            table,
            ready: AtomicU64::new(0),
            lanes,
            huge_pages,
            search_kernel: AtomicU8::new(SearchKernel::best() as u8),
        })
    }

    /// The validated manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// This consumer's instance id (carried in every lease it grants).
    pub fn consumer_instance(&self) -> u64 {
        self.consumer_instance
    }

    /// The lag policy.
    pub fn policy(&self) -> &LagPolicy {
        &self.policy
    }

    /// Number of lanes (1..=64).
    pub fn lane_count(&self) -> usize {
        self.lanes.len()
    }

    /// The lane of `pool`, if it is in the manifest.
    pub fn lane_of(&self, pool: &PoolId) -> Option<LaneIndex> {
        self.manifest
            .lanes
            .iter()
            .position(|p| p == pool)
            .map(|l| l as LaneIndex)
    }

    /// The pool of `lane`.
    ///
    /// # Panics
    /// When `lane` is not in the manifest.
    #[inline]
    pub fn pool(&self, lane: LaneIndex) -> &PoolId {
        &self.manifest.lanes[lane as usize]
    }

    /// The shared table, one transposed table per lane group (read-only use: tests,
    /// convergence checks, memory figures).
    pub fn table(&self) -> &LaneGroups {
        &self.table
    }

    /// Whether the table was collapsed into transparent huge pages (Linux, tables of at least
    /// 8 MiB; see `memory.rs`). A figure for operators and benchmarks only.
    pub fn huge_pages(&self) -> bool {
        self.huge_pages
    }

    /// Addressing of the manifest's format.
    #[inline]
    pub fn addressing(&self) -> &Addressing {
        &self.addressing
    }

    /// The ready mask (bit `i` = lane `i`), loaded with `Acquire`.
    #[inline]
    pub fn ready_mask(&self) -> u64 {
        self.ready.load(Ordering::Acquire)
    }

    fn shared(&self) -> LaneContext<'_> {
        LaneContext {
            table: &self.table,
            ready: &self.ready,
            consumer_instance: self.consumer_instance,
            policy: &self.policy,
        }
    }

    fn lane(&self, lane: LaneIndex) -> Result<MutexGuard<'_, LaneIngestor>, StrayFrame> {
        let m = self
            .lanes
            .get(lane as usize)
            .ok_or(StrayFrame::UnknownLane {
                lane,
                lanes: self.lanes.len(),
            })?;
        // A panic inside the lock is caught before the guard drops, so poisoning only follows a
        // bug outside the ingestor; the state stays usable either way.
        Ok(m.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Grants the next lease of the producer's lane (the consumer is the lease authority). Any
    /// older stream of the lane is fenced: its ready bit is cleared first and its frames are
    /// ignored from now on. The lane awaits a barrier snapshot under the new lease. Services that
    /// stream frames under the lease use [`GlobalCkfIndexer::attach`] instead.
    ///
    /// Always [`AttachMode::Takeover`](crate::lane::AttachMode::Takeover).
    ///
    /// # Errors
    /// [`AttachError::UnknownPool`] (naming the configured pools) or
    /// [`AttachError::FormatMismatch`] (naming both formats).
    pub fn grant_lease(&self, producer: &ProducerIdentity) -> Result<LaneLease, AttachError> {
        let (lease, _) = self.grant(&AttachRequest::from(producer), false)?;
        Ok(lease)
    }

    /// Checks the request (pool in the manifest, then the format), grants the next lease and,
    /// when `subscribe`, subscribes to the lane's events under the same lane lock, so no
    /// transition of the new lease can be missed.
    pub(super) fn grant(
        &self,
        request: &AttachRequest,
        subscribe: bool,
    ) -> Result<(LaneLease, Option<flume::Receiver<LaneEvent>>), AttachError> {
        let lane = self
            .lane_of(&request.pool)
            .ok_or_else(|| AttachError::UnknownPool {
                pool: request.pool.clone(),
                configured: self.manifest.lanes.clone(),
            })?;
        if request.format != ClaimedFormat::Valid(self.manifest.format) {
            return Err(AttachError::FormatMismatch {
                pool: request.pool.clone(),
                expected: self.manifest.format,
                got: request.format.clone(),
            });
        }
        let mut ingestor = self.lane(lane).expect("lane_of returns manifest lanes");
        let lease = ingestor
            .grant(
                self.shared(),
                request.incarnation,
                request.mode,
                Instant::now(),
            )
            .map_err(|holder| AttachError::Occupied {
                pool: request.pool.clone(),
                lane,
                holder: holder.incarnation,
                epoch: holder.lease.epoch,
                state: holder.state,
            })?;
        let events = subscribe.then(|| ingestor.subscribe());
        Ok((lease, events))
    }

    /// Applies one frame synchronously on the caller's thread, serialized with every other frame
    /// of its lane (the lane's lock). `received_at` is when the frame reached the consumer (the
    /// dirty-to-applied deadline counts the time since). A panic while applying is caught and
    /// retires only that lane ([`RetireReason::ApplyFailed`]).
    pub fn ingest(&self, frame: &Frame, received_at: Instant) -> IngestOutcome {
        let mut ingestor = match self.lane(frame.tag().lease.lane) {
            Ok(g) => g,
            Err(e) => return IngestOutcome::Rejected(e),
        };
        let sh = self.shared();
        match catch_unwind(AssertUnwindSafe(|| ingestor.ingest(sh, frame, received_at))) {
            Ok(outcome) => outcome,
            Err(payload) => {
                let detail = payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|| "non-string panic".to_owned());
                let reason = RetireReason::ApplyFailed { detail };
                ingestor.retire(sh, reason.clone());
                IngestOutcome::Retired(reason)
            }
        }
    }

    /// Applies one frame received now ([`GlobalCkfIndexer::ingest`]).
    pub fn ingest_now(&self, frame: &Frame) -> IngestOutcome {
        self.ingest(frame, Instant::now())
    }

    /// Retires `lease`'s stream if it is still the lane's current, live stream. Returns whether
    /// it did. Used for transport-level failures (queue saturation, a broken connection).
    pub fn retire_lease(&self, lease: LaneLease, reason: RetireReason) -> bool {
        match self.lane(lease.lane) {
            Ok(mut g) => {
                lease.consumer_instance == self.consumer_instance
                    && g.retire_lease(self.shared(), lease, reason)
            }
            Err(_) => false,
        }
    }

    /// Enforces the heartbeat deadline and the drain grace of `lane` at `now`; returns the
    /// reason if it retired it.
    pub fn check_deadlines(&self, lane: LaneIndex, now: Instant) -> Option<RetireReason> {
        self.lane(lane).ok()?.check_deadline(self.shared(), now)
    }

    /// `lane`'s ingestion worker runs at `now` (see [`crate::ingestion`], "Deadlines"): a gap
    /// since it last ran longer than [`STALL_EXCUSED_AFTER`](crate::lane::STALL_EXCUSED_AFTER)
    /// is this consumer's own stall, and the producer's silence during it is not counted
    /// against the heartbeat deadline or the drain grace.
    pub fn note_worker_ran(&self, lane: LaneIndex, now: Instant) {
        if let Ok(mut l) = self.lane(lane) {
            l.note_worker_ran(now);
        }
    }

    /// Operator view of `lane`.
    ///
    /// # Errors
    /// [`StrayFrame::UnknownLane`].
    pub fn lane_status(&self, lane: LaneIndex) -> Result<LaneStatus, StrayFrame> {
        Ok(self.lane(lane)?.status(self.shared()))
    }

    /// Operator view of every lane, in lane order.
    pub fn lane_statuses(&self) -> Vec<LaneStatus> {
        (0..self.lanes.len())
            .map(|l| {
                self.lane(l as LaneIndex)
                    .expect("in range")
                    .status(self.shared())
            })
            .collect()
    }

    /// Subscribes to `lane`'s transitions (activation, drain, retirement, supersession), tagged
    /// with the lease they concern. The receiver is unbounded; drop it to unsubscribe.
    ///
    /// # Errors
    /// [`StrayFrame::UnknownLane`].
    pub fn subscribe(&self, lane: LaneIndex) -> Result<flume::Receiver<LaneEvent>, StrayFrame> {
        Ok(self.lane(lane)?.subscribe())
    }

    /// Fault injection (feature `testing` only; tests and [`crate::adapter`]): the next delta
    /// applied on `lane` panics after storing `after_images` of its images, exercising the
    /// mid-apply failure path. Never compiled into the services.
    ///
    /// # Errors
    /// [`StrayFrame::UnknownLane`].
    #[cfg(feature = "testing")]
    pub fn inject_apply_fault(
        &self,
        lane: LaneIndex,
        after_images: usize,
    ) -> Result<(), StrayFrame> {
        self.lane(lane)?.arm_fault(after_images);
        Ok(())
    }
}
