//! [`GlobalCkfIndexer`]: the consumer's state (manifest, lease authority, shared table, ready
//! mask, one serialized ingestor per lane) and its lease grants and frame ingestion. Attached
//! streams are `global/attachment.rs`'s, prefix queries `global/query.rs`'s.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
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
use super::request::{AttachError, AttachRequest, ClaimedFormat, LaneChangeError};

/// The transposed global consumer. `Sync`: share it in an `Arc` between ingestion workers and
/// query threads.
#[derive(Debug)]
pub struct GlobalCkfIndexer {
    /// As built: the domain, the format and the lanes served from the start.
    manifest: Manifest,
    /// The pool of each lane slot: set at construction for the manifest's lanes, by
    /// [`GlobalCkfIndexer::add_lane`] for a spare slot; a slot never changes pool, so a lane
    /// index names one pool for the consumer's life.
    pools: Box<[OnceLock<PoolId>]>,
    /// Whether each slot's lane is removed ([`GlobalCkfIndexer::remove_lane`]). Written under
    /// the lane's lock, and `grant` reads it under that lock: no lease after a removal.
    removed: Box<[AtomicBool]>,
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
    /// The wake channels of the deadline keepers timing this consumer
    /// ([`crate::ingestion::DeadlineKeeper`] adds its own when a pool registers): a grant
    /// wakes a keeper that sleeps because no lane had a deadline to enforce. Empty without
    /// workers; a stopped keeper's channel is dropped at the next grant.
    deadline_wakes: Mutex<Vec<flume::Sender<()>>>,
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
        Self::with_spare_lanes(manifest, consumer_instance, policy, 0)
    }

    /// Builds a consumer with `spare` lane slots beyond the manifest's lanes (lanes
    /// `manifest.lanes.len()..`), each a column of the table from the start, for lanes added
    /// while it runs ([`GlobalCkfIndexer::add_lane`]).
    ///
    /// # Errors
    /// [`ManifestError`]; more than 64 slots in all is a table error.
    pub fn with_spare_lanes(
        manifest: Manifest,
        consumer_instance: u64,
        policy: LagPolicy,
        spare: usize,
    ) -> Result<Self, ManifestError> {
        manifest.validate()?;
        let addressing = Addressing::new(&manifest.format)?;
        let slots = manifest.lanes.len() + spare;
        let table = LaneGroups::new(manifest.format.bucket_count, slots)?;
        let pools = (0..slots)
            .map(|l| {
                let slot = OnceLock::new();
                if let Some(pool) = manifest.lanes.get(l) {
                    let _ = slot.set(pool.clone());
                }
                slot
            })
            .collect();
        let removed = (0..slots).map(|_| AtomicBool::new(false)).collect();
        let lanes = (0..slots)
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
            pools,
            removed,
            addressing,
            consumer_instance,
            policy,
            table,
            ready: AtomicU64::new(0),
            lanes,
            huge_pages,
            search_kernel: AtomicU8::new(SearchKernel::best() as u8),
            deadline_wakes: Mutex::new(Vec::new()),
        })
    }

    /// The validated manifest as built (the lanes served from the start; lanes added or removed
    /// since: [`GlobalCkfIndexer::slot`], [`GlobalCkfIndexer::is_removed`]).
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

    /// Number of lane slots (1..=64): the manifest's lanes and the spare ones.
    pub fn lane_count(&self) -> usize {
        self.lanes.len()
    }

    /// The lane serving `pool`, if one does (not removed).
    pub fn lane_of(&self, pool: &PoolId) -> Option<LaneIndex> {
        self.slot_of(pool).filter(|&l| !self.is_removed(l))
    }

    /// The slot whose pool is `pool`, removed or not.
    fn slot_of(&self, pool: &PoolId) -> Option<LaneIndex> {
        self.pools
            .iter()
            .position(|p| p.get() == Some(pool))
            .map(|l| l as LaneIndex)
    }

    /// The pool of `lane` (a lane that ever served one: every lane a query answers does).
    ///
    /// # Panics
    /// When `lane` is a spare slot never added, or not a slot.
    #[inline]
    pub fn pool(&self, lane: LaneIndex) -> &PoolId {
        self.slot(lane).expect("a lane that serves a pool")
    }

    /// The pool of `lane`, `None` for a spare slot never added (a removed lane keeps its pool).
    pub fn slot(&self, lane: LaneIndex) -> Option<&PoolId> {
        self.pools.get(usize::from(lane)).and_then(OnceLock::get)
    }

    /// Whether `lane` was removed and not added back.
    pub fn is_removed(&self, lane: LaneIndex) -> bool {
        self.removed
            .get(usize::from(lane))
            .is_some_and(|r| r.load(Ordering::Acquire))
    }

    /// The pools served now (lanes added, not removed), in lane order.
    pub fn pools_served(&self) -> Vec<PoolId> {
        (0..self.lanes.len() as LaneIndex)
            .filter(|&l| !self.is_removed(l))
            .filter_map(|l| self.slot(l).cloned())
            .collect()
    }

    /// Serves `pool` from now: on its own lane again if it had one (removed), else on the first
    /// spare slot. The lane waits for its producer's attachment and barrier snapshot like any
    /// unassigned lane; no other lane is touched.
    ///
    /// # Errors
    /// [`LaneChangeError`]: another domain's pool, a pool served already, no spare slot.
    pub fn add_lane(&self, pool: PoolId) -> Result<LaneIndex, LaneChangeError> {
        if pool.domain != self.manifest.domain {
            return Err(LaneChangeError::ForeignDomain {
                pool,
                domain: self.manifest.domain.clone(),
            });
        }
        if let Some(lane) = self.slot_of(&pool) {
            let _ingestor = self.lane(lane).expect("a slot");
            if !self.removed[usize::from(lane)].swap(false, Ordering::AcqRel) {
                return Err(LaneChangeError::Served { pool, lane });
            }
            return Ok(lane);
        }
        for (lane, slot) in self.pools.iter().enumerate() {
            if slot.get().is_none() && slot.set(pool.clone()).is_ok() {
                return Ok(lane as LaneIndex);
            }
        }
        Err(LaneChangeError::NoSpareLane {
            pool,
            slots: self.lanes.len(),
        })
    }

    /// Stops serving `lane`'s pool: its current lease, if any, is retired as
    /// [`RetireReason::Removed`] (its ready bit cleared first, its stream told), and attachments
    /// for its pool are refused until [`GlobalCkfIndexer::add_lane`] adds it back (on this
    /// lane). No other lane is touched. Returns whether a lease was retired.
    ///
    /// # Errors
    /// [`LaneChangeError::NotServed`]: a spare slot never added, or a lane removed already.
    pub fn remove_lane(&self, lane: LaneIndex) -> Result<bool, LaneChangeError> {
        let mut ingestor = self
            .lane(lane)
            .map_err(|_| LaneChangeError::NotServed { lane })?;
        if self.slot(lane).is_none() || self.removed[usize::from(lane)].swap(true, Ordering::AcqRel)
        {
            return Err(LaneChangeError::NotServed { lane });
        }
        Ok(ingestor.retire(self.shared(), RetireReason::Removed))
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
        let unknown = || AttachError::UnknownPool {
            pool: request.pool.clone(),
            configured: self.pools_served(),
        };
        let lane = self.lane_of(&request.pool).ok_or_else(unknown)?;
        if request.format != ClaimedFormat::Valid(self.manifest.format) {
            return Err(AttachError::FormatMismatch {
                pool: request.pool.clone(),
                expected: self.manifest.format,
                got: request.format.clone(),
            });
        }
        let mut ingestor = self.lane(lane).expect("lane_of returns manifest lanes");
        // Removed since `lane_of` looked: refused under the lane's lock, as `remove_lane` sets it.
        if self.is_removed(lane) {
            return Err(unknown());
        }
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
        drop(ingestor);
        // The lane has a deadline now: a deadline keeper, asleep while no lane had one, wakes.
        // An error is harmless: Full means a wake is already pending; a keeper's sender is
        // removed when its registration ends, before the keeper can stop.
        for wake in self
            .deadline_wakes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
        {
            let _ = wake.try_send(());
        }
        Ok((lease, events))
    }

    /// Adds the wake sender of a deadline keeper that times this consumer (once per keeper: a
    /// sender of a channel already listed is not added again).
    pub(crate) fn add_deadline_wake(&self, wake: flume::Sender<()>) {
        let mut wakes = self
            .deadline_wakes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !wakes.iter().any(|w| w.same_channel(&wake)) {
            wakes.push(wake);
        }
    }

    /// Removes the wake sender of a deadline keeper that no longer times this consumer.
    pub(crate) fn remove_deadline_wake(&self, wake: &flume::Sender<()>) {
        self.deadline_wakes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|w| !w.same_channel(wake));
    }

    /// One pass of the deadline keeper ([`crate::ingestion`], "Deadlines") at `now`: every lane
    /// with a deadline (a lease awaiting its snapshot or active, drained or not) notes that
    /// this consumer ran ([`GlobalCkfIndexer::note_consumer_ran`]) and has its deadlines
    /// enforced ([`GlobalCkfIndexer::check_deadlines`]). A lane whose lock is held (its worker
    /// applying a frame) is skipped: it is being heard from, and a long apply is excused as the
    /// consumer's own stall. Returns whether a lane still has a deadline (or was skipped), so
    /// whether the keeper must come back.
    pub(crate) fn keep_deadlines(&self, now: Instant) -> bool {
        let sh = self.shared();
        let mut timed = false;
        for lane in &self.lanes {
            let mut ingestor = match lane.try_lock() {
                Ok(g) => g,
                Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {
                    timed = true;
                    continue;
                }
            };
            if ingestor.has_deadline() {
                ingestor.note_consumer_ran(now);
                ingestor.check_deadline(sh, now);
                timed |= ingestor.has_deadline();
            }
        }
        timed
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

    /// This consumer runs for `lane` at `now` (the deadline keeper notes it for every lane
    /// with a deadline at least every tick; see [`crate::ingestion`], "Deadlines"): a gap since
    /// the last note longer than [`STALL_EXCUSED_AFTER`](crate::lane::STALL_EXCUSED_AFTER) is
    /// this consumer's own stall, and the producer's silence during it is not counted against
    /// the heartbeat deadline or the drain grace.
    pub fn note_consumer_ran(&self, lane: LaneIndex, now: Instant) {
        if let Ok(mut l) = self.lane(lane) {
            l.note_consumer_ran(now);
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::addressing::TableFormat;
    use crate::identity::{IndexerDomainId, ProducerIncarnation};
    use crate::lane::{LagPolicy, LaneState, RetireReason};

    /// The deadline keeper skips a lane whose lock is held (its worker applying a frame) and
    /// comes back; the time it held the lane is then excused as the consumer's own stall, and a
    /// producer silent afterwards is retired one deadline later.
    #[test]
    fn the_keeper_skips_a_held_lane_and_excuses_the_time_it_was_held() {
        let format = TableFormat::new(64, 7).unwrap();
        let pool = PoolId::new("prod", "dc-0").unwrap();
        let manifest = Manifest {
            domain: IndexerDomainId::new("prod").unwrap(),
            format,
            lanes: vec![pool.clone()],
        };
        let deadline = Duration::from_millis(300);
        let policy = LagPolicy {
            heartbeat_deadline: Some(deadline),
            apply_deadline: None,
            drain_grace: None,
        };
        let ix = GlobalCkfIndexer::with_policy(manifest, 1, policy).unwrap();
        assert!(
            !ix.keep_deadlines(Instant::now()),
            "no lease: nothing to time"
        );
        let producer = ProducerIdentity {
            pool,
            incarnation: ProducerIncarnation(1),
            format,
        };
        ix.grant_lease(&producer).unwrap();
        let t0 = Instant::now();
        assert!(ix.keep_deadlines(t0), "a lease to time");

        let held = ix.lanes[0].lock().unwrap();
        let later = t0 + Duration::from_secs(1);
        assert!(ix.keep_deadlines(later), "a held lane is come back to");
        drop(held);
        let after_hold = later + Duration::from_millis(50);
        assert!(ix.keep_deadlines(after_hold), "the hold is excused");
        assert_eq!(
            ix.lane_status(0).unwrap().state,
            LaneState::AwaitingSnapshot
        );

        // The keeper runs every 100 ms from then on: retired once silent past the deadline.
        let mut at = after_hold;
        while ix.keep_deadlines(at) {
            at += Duration::from_millis(100);
            assert!(at < after_hold + deadline * 2, "not retired by {at:?}");
        }
        assert!(at >= after_hold + deadline, "retired early, at {at:?}");
        let status = ix.lane_status(0).unwrap();
        assert!(
            matches!(
                status.last_retirement,
                Some(RetireReason::HeartbeatTimeout { .. })
            ),
            "{status:?}"
        );
    }
}
