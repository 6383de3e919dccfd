//! State shared between the journal handle and its writer, sync and checkpoint threads.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

/// State shared between the handle and the writer thread.
#[derive(Debug)]
pub(crate) struct Shared {
    pub opened: Instant,
    pub healthy: AtomicBool,
    pub queued_bytes: AtomicU64,
    pub log_bytes_since_checkpoint: AtomicU64,
    pub last_checkpoint_bytes: AtomicU64,
    pub bytes_on_disk: AtomicU64,
    pub dropped_records: AtomicU64,
    pub checkpoint_in_flight: AtomicBool,
    /// Whether the last checkpoint attempt failed (the next waits `retry_interval`).
    pub checkpoint_failed: AtomicBool,
    /// Milliseconds since `opened` of the last commit; `u64::MAX` = never.
    pub last_commit_ms: AtomicU64,
    pub last_attempt: Mutex<Option<Instant>>,
    /// The sync thread's last failure, for the writer to act on.
    pub sync_error: Mutex<Option<String>>,
}

impl Shared {
    pub(crate) fn mark_commit(&self) {
        let ms = u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        self.last_commit_ms.store(ms, Ordering::Relaxed);
    }

    pub(crate) fn mark_checkpoint_attempt(&self) {
        *self.last_attempt.lock().expect("journal lock") = Some(Instant::now());
    }
}
