//! The deadline keeper ([`DeadlineKeeper`]): one thread that enforces the heartbeat deadline
//! and drain grace of every leased lane of the consumers registered with it (the parent
//! module's "Deadlines"). A process serving many domains starts one and hands it to every
//! domain's [`IngestionWorkers`](super::IngestionWorkers::start_on), so its leased lanes cost
//! one wake-up per tick in all rather than one per domain.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::global::indexer::GlobalCkfIndexer;

/// Longest tick of a keeper ([`DeadlineKeeper::start`], `IngestionWorkersConfig::tick`).
pub const MAX_TICK: Duration = Duration::from_millis(100);

/// The consumers a keeper times, and the sender that wakes it (kept here so the keeper's wake
/// channel never reads as closed while it runs).
struct Registry {
    consumers: Mutex<Vec<Arc<GlobalCkfIndexer>>>,
    wake: flume::Sender<()>,
}

impl Registry {
    fn consumers(&self) -> MutexGuard<'_, Vec<Arc<GlobalCkfIndexer>>> {
        self.consumers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// Owns the keeper's thread: dropping the last handle stops and joins it.
struct Running {
    registry: Arc<Registry>,
    /// Dropped to stop the thread.
    stop: Option<flume::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop = None;
        if let Some(thread) = self.thread.take() {
            // A keeper that panicked has nothing left to stop: ignore it.
            let _ = thread.join();
        }
    }
}

/// One thread timing the leased lanes of any number of consumers; see the module docs. A
/// cheap handle: clones share the thread, which stops when the last handle (the caller's or a
/// registered pool's) is dropped.
#[derive(Clone)]
pub struct DeadlineKeeper {
    running: Arc<Running>,
    tick: Duration,
}

impl std::fmt::Debug for DeadlineKeeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadlineKeeper")
            .field("tick", &self.tick)
            .field("consumers", &self.consumers())
            .finish()
    }
}

impl DeadlineKeeper {
    /// Starts the keeper's thread (`ckf-deadlines`). While a lane of a registered consumer
    /// holds a lease it makes one pass over every registered consumer each `tick` (at most
    /// [`MAX_TICK`]: a longer one is cut to it, since a keeper that sleeps longer than
    /// [`STALL_EXCUSED_AFTER`](crate::lane::STALL_EXCUSED_AFTER) would look like the
    /// consumer's own stall on every pass); while none does, it sleeps until a grant or a
    /// registration wakes it.
    ///
    /// # Errors
    /// The thread could not be spawned (a thread or memory limit).
    pub fn start(tick: Duration) -> std::io::Result<Self> {
        let tick = tick.min(MAX_TICK);
        // One pending wake is enough: a pass re-reads every lane.
        let (wake, wake_rx) = flume::bounded::<()>(1);
        let (stop, stop_rx) = flume::bounded::<()>(0);
        let registry = Arc::new(Registry {
            consumers: Mutex::new(Vec::new()),
            wake,
        });
        let timed = Arc::clone(&registry);
        let thread = std::thread::Builder::new()
            .name("ckf-deadlines".to_owned())
            .spawn(move || keep(&timed, &wake_rx, &stop_rx, tick))
            .map_err(|e| {
                std::io::Error::new(e.kind(), format!("the deadline keeper's thread: {e}"))
            })?;
        Ok(Self {
            running: Arc::new(Running {
                registry,
                stop: Some(stop),
                thread: Some(thread),
            }),
            tick,
        })
    }

    /// The period of a pass while a lane holds a lease.
    pub fn tick(&self) -> Duration {
        self.tick
    }

    /// Consumers registered now (one per running pool that uses this keeper).
    pub fn consumers(&self) -> usize {
        self.running.registry.consumers().len()
    }

    /// Times `indexer`'s lanes until the returned registration is dropped. The indexer's
    /// grants wake this keeper from then on, and the keeper makes a pass at once, so a lease
    /// granted before (or while) it registers is timed too.
    pub(crate) fn register(&self, indexer: &Arc<GlobalCkfIndexer>) -> Registration {
        let registry = &self.running.registry;
        registry.consumers().push(Arc::clone(indexer));
        // Added after the consumer is listed: a grant that wakes the keeper from here on finds
        // it in the pass; one granted before is in the pass this wake starts.
        indexer.add_deadline_wake(registry.wake.clone());
        let _ = registry.wake.try_send(());
        Registration {
            keeper: self.clone(),
            indexer: Arc::clone(indexer),
        }
    }
}

/// A consumer timed by a [`DeadlineKeeper`]; dropping it stops the timing (after the pass in
/// progress, if any) and releases the keeper handle it holds.
pub(crate) struct Registration {
    keeper: DeadlineKeeper,
    indexer: Arc<GlobalCkfIndexer>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let registry = &self.keeper.running.registry;
        let mut consumers = registry.consumers();
        if let Some(at) = consumers.iter().position(|c| Arc::ptr_eq(c, &self.indexer)) {
            consumers.swap_remove(at);
        }
        // Unless another of the consumer's pools still uses this keeper.
        if !consumers.iter().any(|c| Arc::ptr_eq(c, &self.indexer)) {
            self.indexer.remove_deadline_wake(&registry.wake);
        }
    }
}

/// The keeper's loop: a pass over every registered consumer at start and on each wake, then
/// one every `tick` while a lane has a deadline; while none has, it sleeps until woken. It ends
/// when `stop` closes.
fn keep(
    registry: &Registry,
    wake: &flume::Receiver<()>,
    stop: &flume::Receiver<()>,
    tick: Duration,
) {
    loop {
        let timed = registry
            .consumers()
            .iter()
            .fold(false, |timed, c| c.keep_deadlines(Instant::now()) | timed);
        // `false`: stop. The wake channel cannot close: the registry holds a sender.
        let select = flume::Selector::new()
            .recv(stop, |_| false)
            .recv(wake, |_| true);
        let go_on = if timed {
            select.wait_timeout(tick).unwrap_or(true)
        } else {
            select.wait()
        };
        if !go_on {
            return;
        }
    }
}
