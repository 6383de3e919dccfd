//! The journal's metrics (`ckf_producer_journal_*`) and the last start's recovery
//! (`ckf_producer_recovery_*`, `ckf_producer_recovered_*`); also the journal's
//! [`JournalObserver`]. Set by the state actor (`actor::journaling`) and the start-up recovery
//! (`crate::durability`).

use std::time::Duration;

use ckf_journal::{JournalObserver, JournalStats};
use ckf_svc_kit::metrics::{counter, gauge, histogram, int_gauge};
use prometheus::{Gauge, Histogram, IntCounter, IntGauge, Registry};

/// Every journal metric; also the journal's [`JournalObserver`].
#[derive(Debug, Clone)]
pub struct JournalMetrics {
    /// 1 while records are made durable, 0 after a failure until a checkpoint heals it.
    pub healthy: IntGauge,
    /// Bytes of log segments and checkpoints on disk.
    pub bytes: IntGauge,
    /// Log bytes written since the last checkpoint.
    pub log_bytes: IntGauge,
    /// Seconds since the last successful group commit or checkpoint.
    pub last_commit_age_seconds: Gauge,
    /// Records dropped while the journal was failed (since start).
    pub dropped_records: IntGauge,
    /// Group commits (flush + fdatasync), seconds.
    pub commit_seconds: Histogram,
    /// Checkpoints written.
    pub checkpoints: IntCounter,
    /// Seconds to write one checkpoint (on its own thread: appends go on meanwhile).
    pub checkpoint_seconds: Histogram,
    /// Per checkpoint, the longest single step of the state actor's capture of its image
    /// (taken in slices between commands: ingest waits at most that long at a time; the
    /// sorting and encoding run on the checkpoint thread).
    pub checkpoint_image_seconds: Histogram,
    /// Journal failures (a write or sync failed: records are dropped until a checkpoint).
    pub failures: IntCounter,
    /// Failed checkpoints (while healthy, the log still holds every record; retried after
    /// `checkpoint_retry_ms`).
    pub checkpoint_failures: IntCounter,
    /// Seconds the last start spent recovering (reading and rebuilding).
    pub recovery_seconds: Gauge,
    /// Ownership edges (member, block) recovered at start: from the checkpoint plus replay.
    pub recovered_edges: IntGauge,
    /// Log records replayed at start.
    pub recovered_records: IntGauge,
}

impl JournalMetrics {
    /// Registers the metrics in `r`.
    pub fn new(r: &Registry) -> Self {
        let seconds = || prometheus::exponential_buckets(0.0005, 2.0, 16).expect("valid buckets");
        let metrics = Self {
            healthy: int_gauge(
                r,
                "ckf_producer_journal_healthy",
                "1 while the journal makes records durable; 0 after a failed write (disk full, I/O \
                 error) until a checkpoint succeeds. 1 with durability off.",
            ),
            bytes: int_gauge(
                r,
                "ckf_producer_journal_bytes",
                "Bytes of the journal's log segments and checkpoints on disk.",
            ),
            log_bytes: int_gauge(
                r,
                "ckf_producer_journal_log_bytes",
                "Log bytes written since the last checkpoint.",
            ),
            last_commit_age_seconds: gauge(
                r,
                "ckf_producer_journal_last_commit_age_seconds",
                "Seconds since the last successful group commit or checkpoint.",
            ),
            dropped_records: int_gauge(
                r,
                "ckf_producer_journal_dropped_records",
                "Log records dropped since start while the journal was failed.",
            ),
            commit_seconds: histogram(
                r,
                "ckf_producer_journal_commit_seconds",
                "Duration of one group commit (flush + fdatasync), seconds.",
                seconds(),
            ),
            checkpoints: counter(
                r,
                "ckf_producer_journal_checkpoints_total",
                "Checkpoints written.",
            ),
            checkpoint_seconds: histogram(
                r,
                "ckf_producer_journal_checkpoint_seconds",
                "Duration of writing one checkpoint (its own thread; appends go on meanwhile), seconds.",
                seconds(),
            ),
            checkpoint_image_seconds: histogram(
                r,
                "ckf_producer_journal_checkpoint_image_seconds",
                "Per checkpoint, the longest time the state actor (and so ingest) stopped for one step of capturing its image in slices, seconds (sorting and encoding happen on the checkpoint thread).",
                seconds(),
            ),
            failures: counter(
                r,
                "ckf_producer_journal_failures_total",
                "Journal failures: a write or sync failed (records are dropped until a checkpoint).",
            ),
            checkpoint_failures: counter(
                r,
                "ckf_producer_journal_checkpoint_failures_total",
                "Checkpoints that failed; while the journal is healthy the log still holds every record.",
            ),
            recovery_seconds: gauge(
                r,
                "ckf_producer_recovery_seconds",
                "Seconds the last start spent recovering the state from the journal.",
            ),
            recovered_edges: int_gauge(
                r,
                "ckf_producer_recovered_edges",
                "Ownership edges (member, block) recovered at start.",
            ),
            recovered_records: int_gauge(
                r,
                "ckf_producer_recovered_records",
                "Log records replayed at start.",
            ),
        };
        metrics.healthy.set(1);
        metrics
    }

    /// Sets the gauges from `stats`.
    pub fn observe(&self, stats: &JournalStats) {
        self.healthy.set(i64::from(stats.healthy));
        self.bytes
            .set(i64::try_from(stats.bytes_on_disk).unwrap_or(i64::MAX));
        self.log_bytes
            .set(i64::try_from(stats.log_bytes_since_checkpoint).unwrap_or(i64::MAX));
        self.dropped_records
            .set(i64::try_from(stats.dropped_records).unwrap_or(i64::MAX));
        if let Some(age) = stats.last_commit_age {
            self.last_commit_age_seconds.set(age.as_secs_f64());
        }
    }
}

impl JournalObserver for JournalMetrics {
    fn committed(&self, latency: Duration, _bytes: u64) {
        self.commit_seconds.observe(latency.as_secs_f64());
    }
    fn checkpointed(&self, took: Duration, _bytes: u64) {
        self.checkpoints.inc();
        self.checkpoint_seconds.observe(took.as_secs_f64());
    }
    fn failed(&self, _why: &str) {
        self.failures.inc();
        self.healthy.set(0);
    }
    fn checkpoint_failed(&self, _why: &str) {
        self.checkpoint_failures.inc();
    }
}
