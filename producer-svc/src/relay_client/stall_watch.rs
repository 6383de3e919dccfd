//! Tells this process's own stalls from waiting on an indexer: a thread that wakes every
//! [`TICK`] and records in a `ckf_core::relay_session::StallLog` every gap in which it could not
//! run (the process was stopped, the VM frozen, the host swapping). A relay session asks it, when
//! it fails, whether this producer was silent past the indexer's heartbeat deadline: time spent
//! blocked on the indexer's flow control is not this producer's silence.
//!
//! One thread per process, started by the first relay session that asks: an OS thread, so a busy
//! async runtime does not look like a stall (a runtime starved past the deadline is retired by
//! the indexer, which says so).

use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use ckf_core::relay_session::StallLog;

/// How often the watch thread wakes.
pub const TICK: Duration = Duration::from_millis(20);

/// The process-wide stall log.
#[derive(Debug, Default)]
pub struct StallWatch {
    log: Mutex<StallLog<Instant>>,
}

impl StallWatch {
    /// The process's watch, its thread started on the first call.
    pub fn get() -> &'static StallWatch {
        static WATCH: OnceLock<&'static StallWatch> = OnceLock::new();
        WATCH.get_or_init(|| {
            let watch: &'static StallWatch = Box::leak(Box::default());
            std::thread::Builder::new()
                .name("ckf-stall-watch".into())
                .spawn(move || {
                    let mut last = Instant::now();
                    loop {
                        std::thread::sleep(TICK);
                        let now = Instant::now();
                        watch.record(now, now.duration_since(last).saturating_sub(TICK));
                        last = now;
                    }
                })
                .expect("spawn the stall watch thread");
            watch
        })
    }

    fn record(&self, ended: Instant, gap: Duration) {
        self.log.lock().expect("stall log").record(ended, gap);
    }

    /// The longest time this process did not run that ended at or after `since`.
    pub fn longest_since(&self, since: Instant) -> Duration {
        self.log.lock().expect("stall log").longest_since(since)
    }
}
