//! Journal settings, their defaults, the metrics hooks and the counters snapshot.

use std::time::Duration;

/// Default group-commit window: at most this much of the newest changes (plus one `fdatasync`)
/// is lost on power loss; a `kill -9` loses only what the writer had not taken yet.
pub const DEFAULT_COMMIT_INTERVAL: Duration = Duration::from_millis(50);
/// Longest accepted group-commit window: the default stays well under 100 ms of exposure to a
/// power loss; up to a second may be configured for slow disks.
pub const MAX_COMMIT_INTERVAL: Duration = Duration::from_secs(1);
/// Default floor of the log size that triggers a checkpoint.
pub const DEFAULT_MIN_CHECKPOINT_BYTES: u64 = 64 << 20;
/// Default limit of queued, unwritten bytes before records become holes (see [`crate::writer`]).
pub const DEFAULT_MAX_BACKLOG_BYTES: u64 = 256 << 20;
/// Default pause between checkpoint attempts while the journal is failed.
pub const DEFAULT_RETRY_INTERVAL: Duration = Duration::from_secs(10);

/// Journal settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalConfig {
    /// Group-commit window, `1 ms..=MAX_COMMIT_INTERVAL`: how often what was written is
    /// `fdatasync`ed (what a power loss can lose, plus one sync's duration). Default
    /// [`DEFAULT_COMMIT_INTERVAL`].
    pub commit_interval: Duration,
    /// A checkpoint is wanted once the log since the last one exceeds this many bytes and the
    /// last checkpoint's size (recovery then reads at most about twice the state). Default
    /// [`DEFAULT_MIN_CHECKPOINT_BYTES`].
    pub min_checkpoint_bytes: u64,
    /// Queued but unwritten bytes above which a record becomes a hole. Default
    /// [`DEFAULT_MAX_BACKLOG_BYTES`].
    pub max_backlog_bytes: u64,
    /// While failed, a checkpoint is wanted at most this often. Default
    /// [`DEFAULT_RETRY_INTERVAL`].
    pub retry_interval: Duration,
}

impl Default for JournalConfig {
    fn default() -> Self {
        Self {
            commit_interval: DEFAULT_COMMIT_INTERVAL,
            min_checkpoint_bytes: DEFAULT_MIN_CHECKPOINT_BYTES,
            max_backlog_bytes: DEFAULT_MAX_BACKLOG_BYTES,
            retry_interval: DEFAULT_RETRY_INTERVAL,
        }
    }
}

/// Hooks for metrics; every method defaults to doing nothing. Called on the journal's threads
/// (writer, sync, checkpoint), never on the caller's.
pub trait JournalObserver: Send + Sync + 'static {
    /// A group commit of `bytes` bytes took `latency` (flush + fdatasync).
    fn committed(&self, latency: Duration, bytes: u64) {
        let _ = (latency, bytes);
    }
    /// A checkpoint of `bytes` bytes was written in `took`.
    fn checkpointed(&self, took: Duration, bytes: u64) {
        let _ = (took, bytes);
    }
    /// The journal failed (`why` names the file and the OS error).
    fn failed(&self, why: &str) {
        let _ = why;
    }
    /// Checkpoint `number` is about to be written, on the thread that writes it (its own, or
    /// the writer's while the journal is failed); its segment already receives the records
    /// that follow it. Tests block here to look at the files in the middle of a checkpoint.
    fn checkpoint_started(&self, number: u64) {
        let _ = number;
    }
    /// A checkpoint failed (`why` names the file and the OS error). While the journal is
    /// healthy this fails nothing: the log still holds every record.
    fn checkpoint_failed(&self, why: &str) {
        let _ = why;
    }
}

/// An observer that records nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoObserver;
impl JournalObserver for NoObserver {}

/// A snapshot of a journal's counters (for gauges).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalStats {
    /// Whether records are being made durable (`false` after a failure, until a checkpoint).
    pub healthy: bool,
    /// Bytes of segments and checkpoints on disk (committed).
    pub bytes_on_disk: u64,
    /// Log bytes written since the last checkpoint.
    pub log_bytes_since_checkpoint: u64,
    /// Records queued but not yet written (bytes).
    pub queued_bytes: u64,
    /// Records dropped while failed or as holes.
    pub dropped_records: u64,
    /// Time since the last successful commit or checkpoint (`None`: none since open).
    pub last_commit_age: Option<Duration>,
    /// Whether the last checkpoint attempt failed (while `healthy`, the log still holds
    /// every record).
    pub last_checkpoint_failed: bool,
}
