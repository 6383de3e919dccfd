//! Bounded, lane-sticky ingestion transport (docs/design.md, "Global transposed consumer": "The
//! Flume ingestion pool assigns a lane to a stable worker, so snapshots, deltas, and drain
//! markers for that lane cannot interleave").
//!
//! One worker thread per lane drains that lane's bounded `flume` queue and applies each frame
//! through [`GlobalCkfIndexer::ingest`]; different lanes and query threads run concurrently.
//!
//! * **Saturation.** [`IngestionWorkers::submit`] never blocks: when the lane's queue is full the
//!   frame is refused ([`SubmitError::Saturated`]) and, if the frame carries the lane's current
//!   lease, that lane alone is retired ([`RetireReason::Saturated`]): its stream has lost a frame.
//! * **Deadlines.** While its lane holds a lease (awaiting its snapshot or active), a worker
//!   wakes at least every `tick` to enforce the lane's heartbeat deadline
//!   ([`LagPolicy::heartbeat_deadline`]) and drain grace; a lane without one (unassigned,
//!   retired) has nothing to time, and its worker sleeps until a frame arrives or a lease is
//!   granted, which wakes it (an idle indexer of 2,000 lanes woke 20,000 times a second and
//!   spent about a third of a core on it). The dirty-to-applied deadline is checked per
//!   delta using the time the frame spent in the queue. Each time a worker runs it tells its
//!   lane ([`GlobalCkfIndexer::note_worker_ran`]); a lane whose worker has not run for more
//!   than [`STALL_EXCUSED_AFTER`] (this process was stopped, its host froze, or the worker was
//!   busy) does not blame its producer for that time, in the worker's check or in any other
//!   (an attach decided first after the stall), so the producer's heartbeats, queued in the
//!   connection meanwhile, arrive before its deadline does. A producer that stays silent
//!   afterwards is still retired one deadline later.
//! * **Replies.** Every submitted frame gets exactly one [`IngestOutcome`] on the reply sender the
//!   caller supplied (use `recv_async` from async code). Asynchronous retirements (deadlines) are
//!   published as [`LaneEvent`]s to [`IngestionWorkers::subscribe`]rs.
//!
//! No async runtime: std threads and flume only. Dropping the workers (or
//! [`IngestionWorkers::shutdown`]) closes the queues, lets each worker finish the frames already
//! queued, and joins it.
//!
//! [`LagPolicy::heartbeat_deadline`]: crate::lane::LagPolicy::heartbeat_deadline
//! [`STALL_EXCUSED_AFTER`]: crate::lane::STALL_EXCUSED_AFTER

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::global::indexer::GlobalCkfIndexer;
use crate::identity::LaneIndex;
use crate::lane::{Frame, IngestOutcome, LaneEvent, RetireReason, StrayFrame};

/// Longest [`IngestionWorkersConfig::tick`].
pub const MAX_TICK: Duration = Duration::from_millis(100);

/// Configuration of the ingestion workers (one thread and one bounded queue per lane).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IngestionWorkersConfig {
    /// Frames each lane's queue holds before submission saturates (>= 1). Default 1024.
    pub queue_capacity: usize,
    /// Longest a worker of a leased lane sleeps between heartbeat-deadline checks. Default
    /// 100 ms; at most [`MAX_TICK`] (a longer one is cut to it): a worker that sleeps longer
    /// than [`STALL_EXCUSED_AFTER`](crate::lane::STALL_EXCUSED_AFTER) would look stalled to
    /// its lane on every idle wake. (A lane without a lease has nothing to time: its worker
    /// sleeps until a frame or a grant.)
    pub tick: Duration,
}

impl Default for IngestionWorkersConfig {
    fn default() -> Self {
        Self {
            queue_capacity: 1024,
            tick: Duration::from_millis(100),
        }
    }
}

/// Why a frame was not queued. The frame is dropped; nothing else is affected.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SubmitError {
    /// The frame's lane is not in the manifest.
    #[error(transparent)]
    UnknownLane(#[from] StrayFrame),
    /// The lane's queue was full. `retired` says whether this retired the lane's current stream
    /// (the frame carried the current lease).
    #[error("lane {lane} ingestion queue is full ({capacity} frames); retired: {retired}")]
    Saturated {
        /// The lane.
        lane: LaneIndex,
        /// Queue capacity.
        capacity: usize,
        /// Whether the lane's current stream was retired.
        retired: bool,
    },
    /// The pool is shutting down.
    #[error("ingestion workers are shut down")]
    ShutDown,
}

/// A queued frame with its reply channel.
struct Envelope {
    frame: Frame,
    received_at: Instant,
    reply: Option<flume::Sender<IngestOutcome>>,
}

/// One worker thread per lane over bounded queues; see the module docs.
pub struct IngestionWorkers {
    indexer: Arc<GlobalCkfIndexer>,
    config: IngestionWorkersConfig,
    senders: Vec<flume::Sender<Envelope>>,
    workers: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for IngestionWorkers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IngestionWorkers")
            .field("lanes", &self.senders.len())
            .field("config", &self.config)
            .finish()
    }
}

impl IngestionWorkers {
    /// Starts one worker per lane of `indexer`.
    ///
    /// # Panics
    /// When `config.queue_capacity` is 0 or a thread cannot be spawned
    /// ([`IngestionWorkers::start`] returns that error instead).
    pub fn new(indexer: Arc<GlobalCkfIndexer>, config: IngestionWorkersConfig) -> Self {
        Self::start(indexer, config).expect("spawn lane worker")
    }

    /// Starts one worker per lane of `indexer`; when a thread cannot be spawned (a thread or
    /// memory limit), the ones started are stopped and joined and the error returned.
    ///
    /// # Errors
    /// The spawn error, naming the lane.
    ///
    /// # Panics
    /// When `config.queue_capacity` is 0.
    pub fn start(
        indexer: Arc<GlobalCkfIndexer>,
        config: IngestionWorkersConfig,
    ) -> std::io::Result<Self> {
        assert!(config.queue_capacity > 0, "queue_capacity must be >= 1");
        let mut this = Self {
            indexer: Arc::clone(&indexer),
            config,
            senders: Vec::new(),
            workers: Vec::new(),
        };
        // One pending wake is enough: a worker re-reads its lane when it wakes. The wakes are
        // the indexer's before any worker runs: a grant made once a worker may have read its
        // lane wakes that worker (a grant made before is what the worker's first read sees).
        let (wakes, wake_rxs): (Vec<_>, Vec<_>) = (0..indexer.lane_count())
            .map(|_| flume::bounded::<()>(1))
            .unzip();
        indexer.set_worker_wakes(wakes);
        for (lane, wake_rx) in wake_rxs.into_iter().enumerate() {
            let (tx, rx) = flume::bounded::<Envelope>(config.queue_capacity);
            let idx = Arc::clone(&indexer);
            let tick = config.tick.min(MAX_TICK);
            // On an error `this` is dropped: the workers started so far stop and are joined.
            let handle = std::thread::Builder::new()
                .name(format!("ckf-lane-{lane}"))
                .spawn(move || worker(idx, lane as LaneIndex, rx, wake_rx, tick))
                .map_err(|e| {
                    std::io::Error::new(e.kind(), format!("lane {lane}'s worker thread: {e}"))
                })?;
            this.senders.push(tx);
            this.workers.push(handle);
        }
        Ok(this)
    }

    /// The indexer the pool feeds (grant leases and run queries through it).
    pub fn indexer(&self) -> &Arc<GlobalCkfIndexer> {
        &self.indexer
    }

    /// Queues `frame` for its lane (from its lease) without blocking. The outcome is sent on
    /// `reply` when applied (a closed reply channel is fine).
    ///
    /// # Errors
    /// [`SubmitError`]; on [`SubmitError::Saturated`] the lane's current stream may have been
    /// retired (see the module docs).
    pub fn submit(
        &self,
        frame: Frame,
        reply: Option<flume::Sender<IngestOutcome>>,
    ) -> Result<(), SubmitError> {
        let lease = frame.tag().lease;
        let tx = self
            .senders
            .get(usize::from(lease.lane))
            .ok_or(StrayFrame::UnknownLane {
                lane: lease.lane,
                lanes: self.senders.len(),
            })?;
        let env = Envelope {
            frame,
            received_at: Instant::now(),
            reply,
        };
        match tx.try_send(env) {
            Ok(()) => Ok(()),
            Err(flume::TrySendError::Full(_)) => {
                let capacity = self.config.queue_capacity;
                let retired = self
                    .indexer
                    .retire_lease(lease, RetireReason::Saturated { capacity });
                Err(SubmitError::Saturated {
                    lane: lease.lane,
                    capacity,
                    retired,
                })
            }
            Err(flume::TrySendError::Disconnected(_)) => Err(SubmitError::ShutDown),
        }
    }

    /// Queues `frame` and returns a receiver for its outcome (convenience over
    /// [`IngestionWorkers::submit`]).
    ///
    /// # Errors
    /// As [`IngestionWorkers::submit`].
    pub fn submit_with_reply(
        &self,
        frame: Frame,
    ) -> Result<flume::Receiver<IngestOutcome>, SubmitError> {
        let (tx, rx) = flume::bounded(1);
        self.submit(frame, Some(tx))?;
        Ok(rx)
    }

    /// Frames waiting in `lane`'s queue.
    pub fn queued(&self, lane: LaneIndex) -> usize {
        self.senders.get(usize::from(lane)).map_or(0, |s| s.len())
    }

    /// Lane transition events ([`GlobalCkfIndexer::subscribe`]).
    ///
    /// # Errors
    /// [`StrayFrame::UnknownLane`].
    pub fn subscribe(&self, lane: LaneIndex) -> Result<flume::Receiver<LaneEvent>, StrayFrame> {
        self.indexer.subscribe(lane)
    }

    /// Closes every queue, lets the workers apply what is already queued, and joins them.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.senders.clear();
        for w in self.workers.drain(..) {
            // A worker never panics (apply panics are caught inside ingest); ignore if it did.
            let _ = w.join();
        }
    }
}

impl Drop for IngestionWorkers {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What woke a worker.
enum Wake {
    Frame(Envelope),
    /// The deadline tick, or a lease granted on the lane (or a wake left from an earlier one).
    Check,
}

fn worker(
    indexer: Arc<GlobalCkfIndexer>,
    lane: LaneIndex,
    rx: flume::Receiver<Envelope>,
    wake: flume::Receiver<()>,
    tick: Duration,
) {
    let mut next_check = Instant::now() + tick;
    // False once the indexer dropped this worker's wake sender (later workers replaced it).
    let mut wakeable = true;
    loop {
        let timed = indexer.lane_has_deadline(lane);
        let woke = if timed || !wakeable {
            let bound = if timed {
                next_check
            } else {
                Instant::now() + tick
            };
            rx.recv_deadline(bound)
                .map(Wake::Frame)
                .or_else(|e| match e {
                    flume::RecvTimeoutError::Timeout => Ok(Wake::Check),
                    flume::RecvTimeoutError::Disconnected => Err(()),
                })
        } else {
            // Nothing to time: no wake-up every tick (an indexer of thousands of idle lanes
            // would spend a core on them), only for a frame or a grant.
            flume::Selector::new()
                .recv(&rx, |r| r.map(Wake::Frame).map_err(drop))
                .recv(&wake, |r| {
                    wakeable = r.is_ok();
                    Ok(Wake::Check)
                })
                .wait()
        };
        match woke {
            Ok(Wake::Frame(env)) => {
                let outcome = indexer.ingest(&env.frame, env.received_at);
                if let Some(reply) = env.reply {
                    let _ = reply.send(outcome);
                }
            }
            Ok(Wake::Check) => {}
            Err(()) => return,
        }
        let now = Instant::now();
        indexer.note_worker_ran(lane, now);
        if now >= next_check {
            indexer.check_deadlines(lane, now);
            next_check = now + tick;
        }
    }
}
