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
//! * **Deadlines.** A [`DeadlineKeeper`] thread enforces every lane's heartbeat deadline
//!   ([`LagPolicy::heartbeat_deadline`]) and drain grace: while any lane of the consumers it
//!   times holds a lease (awaiting its snapshot or active), it wakes every tick and checks each
//!   such lane. While none does it sleeps until a lease is granted, which wakes it. A pool
//!   started with [`IngestionWorkers::start`] has a keeper of its own; pools started with
//!   [`IngestionWorkers::start_on`] share the one they are given (an indexer serving many
//!   domains: one wake-up per tick in all). (A worker per lane ticking on its own cost an
//!   indexer of 2,000 lanes 20,000 wake-ups a second, about a third of a core.) The
//!   dirty-to-applied deadline is checked per delta, using the time the frame spent in the
//!   queue. On every pass the keeper tells each leased lane that this consumer ran
//!   ([`GlobalCkfIndexer::note_consumer_ran`]). A lane that has not been told for more than
//!   [`STALL_EXCUSED_AFTER`] (this process was stopped, its host froze, or the lane's worker
//!   held the lane through a long apply) does not blame its producer for that time, in the
//!   keeper's check or in any other (an attach decided first after the stall). So the
//!   producer's heartbeats, queued in the connection meanwhile, arrive before its deadline
//!   does. A producer that stays silent afterwards is still retired one deadline later.
//! * **Replies.** Every submitted frame gets exactly one [`IngestOutcome`] on the reply sender the
//!   caller supplied (use `recv_async` from async code). Asynchronous retirements (deadlines) are
//!   published as [`LaneEvent`]s to [`IngestionWorkers::subscribe`]rs.
//!
//! No async runtime: std threads and flume only. Dropping the workers (or
//! [`IngestionWorkers::shutdown`]) closes the queues, lets each worker finish the frames already
//! queued, and joins it; the pool's consumer leaves its keeper (a keeper of its own stops).
//!
//! [`LagPolicy::heartbeat_deadline`]: crate::lane::LagPolicy::heartbeat_deadline
//! [`STALL_EXCUSED_AFTER`]: crate::lane::STALL_EXCUSED_AFTER

mod keeper;

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::global::indexer::GlobalCkfIndexer;
use crate::identity::LaneIndex;
use crate::lane::{Frame, IngestOutcome, LaneEvent, RetireReason, StrayFrame};

use keeper::Registration;
pub use keeper::{DeadlineKeeper, MAX_TICK};

/// Configuration of the ingestion workers (one thread and one bounded queue per lane, and the
/// deadline keeper).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IngestionWorkersConfig {
    /// Frames each lane's queue holds before submission saturates (>= 1). Default 1024.
    pub queue_capacity: usize,
    /// Period of the deadline keeper [`IngestionWorkers::start`] starts for the pool, while a
    /// lane holds a lease ([`DeadlineKeeper::start`]). Default 100 ms; at most [`MAX_TICK`].
    /// A pool started on a shared keeper ([`IngestionWorkers::start_on`]) runs at that
    /// keeper's tick instead.
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

/// One worker thread per lane over bounded queues, timed by a deadline keeper; see the module
/// docs.
pub struct IngestionWorkers {
    indexer: Arc<GlobalCkfIndexer>,
    config: IngestionWorkersConfig,
    senders: Vec<flume::Sender<Envelope>>,
    /// The consumer's place in its keeper's pass; dropped when the pool stops.
    timed: Option<Registration>,
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

    /// Starts one worker per lane of `indexer` and a deadline keeper of its own (at
    /// `config.tick`); when a thread cannot be spawned (a thread or memory limit), the ones
    /// started are stopped and joined and the error returned.
    ///
    /// # Errors
    /// The spawn error, naming the thread.
    ///
    /// # Panics
    /// When `config.queue_capacity` is 0.
    pub fn start(
        indexer: Arc<GlobalCkfIndexer>,
        config: IngestionWorkersConfig,
    ) -> std::io::Result<Self> {
        Self::start_on(indexer, config, &DeadlineKeeper::start(config.tick)?)
    }

    /// Starts one worker per lane of `indexer`, its lanes timed by `keeper` (shared with other
    /// pools; `config.tick` is not used) until the pool stops. When a thread cannot be spawned
    /// (a thread or memory limit), the ones started are stopped and joined and the error
    /// returned.
    ///
    /// # Errors
    /// The spawn error, naming the lane.
    ///
    /// # Panics
    /// When `config.queue_capacity` is 0.
    pub fn start_on(
        indexer: Arc<GlobalCkfIndexer>,
        config: IngestionWorkersConfig,
        keeper: &DeadlineKeeper,
    ) -> std::io::Result<Self> {
        assert!(config.queue_capacity > 0, "queue_capacity must be >= 1");
        // Registered before the workers start: a lease granted meanwhile is timed.
        let mut this = Self {
            timed: Some(keeper.register(&indexer)),
            indexer: Arc::clone(&indexer),
            config,
            senders: Vec::new(),
            workers: Vec::new(),
        };
        // On an error `this` is dropped: the threads started so far stop and are joined.
        for lane in 0..indexer.lane_count() {
            let (tx, rx) = flume::bounded::<Envelope>(config.queue_capacity);
            let idx = Arc::clone(&indexer);
            let handle = std::thread::Builder::new()
                .name(format!("ckf-lane-{lane}"))
                .spawn(move || drain_queue(&idx, &rx))
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
        self.timed = None;
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

/// A lane's worker: applies its lane's frames in order until the queue closes.
fn drain_queue(indexer: &GlobalCkfIndexer, rx: &flume::Receiver<Envelope>) {
    while let Ok(env) = rx.recv() {
        let outcome = indexer.ingest(&env.frame, env.received_at);
        if let Some(reply) = env.reply {
            let _ = reply.send(outcome);
        }
    }
}
