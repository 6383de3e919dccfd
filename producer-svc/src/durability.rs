//! `[durability]`: opening the producer's journal (`ckf-journal`) at start, deciding what to do
//! with unusable state, and the `ckf_producer_journal_*` / `ckf_producer_recovery_*` metrics.
//! What goes into the journal, and the rebuild from it, are the state actor's
//! (`actor::durability`).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ckf_core::identity::ProducerIdentity;
use ckf_journal::{Journal, JournalObserver, JournalStats, Recovered, StateIdentity};
use ckf_svc_kit::metrics::{counter, gauge, histogram, int_gauge};
use prometheus::{Gauge, Histogram, IntCounter, IntGauge, Registry};

use crate::actor::{Actor, RECORD_VERSION, RestoreReport};
use crate::config::{DurabilityConfig, OnInvalidState};

/// Why the producer's state directory could not be used.
#[derive(Debug, thiserror::Error)]
pub enum DurabilityError {
    /// The journal could not be opened: I/O, a lock held by another producer, or (with
    /// `on_invalid_state = "refuse"`) damaged or foreign state.
    #[error("durability.data_dir: {0}{hint}", hint = hint(.0))]
    Journal(#[from] ckf_journal::JournalError),
    /// A record passed its checksum but does not decode (with `on_invalid_state = "refuse"`).
    #[error("durability.data_dir {dir}: {source}{SET_ASIDE_HINT}")]
    Undecodable {
        /// The data directory.
        dir: String,
        /// The record.
        #[source]
        source: crate::actor::UndecodableRecord,
    },
}

/// How to start anyway, in both spellings an operator may use (config file or flag).
const SET_ASIDE_HINT: &str = "; to keep the files aside and start empty, set durability.on_invalid_state = \"set-aside\" (or pass --on-invalid-state set-aside) once";

fn hint(e: &ckf_journal::JournalError) -> &'static str {
    if e.is_invalid_state() {
        SET_ASIDE_HINT
    } else {
        ""
    }
}

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

/// The journal identity of `identity`: its pool, and its table format with the record
/// encoding's version (so state of another format, or of an older encoding, is refused).
pub fn state_identity(identity: &ProducerIdentity) -> StateIdentity {
    let f = &identity.format;
    StateIdentity {
        pool: identity.pool.to_string(),
        format: format!(
            "table v{} buckets={} seed={:#x} fingerprint_bits={} slots={} records v{RECORD_VERSION}",
            f.version, f.bucket_count, f.seed, f.fingerprint_bits, f.slots_per_bucket
        ),
    }
}

/// Opens the journal in `config.data_dir` for `identity` and rebuilds the actor `fresh()`
/// builds from it; with `on_invalid_state = "set-aside"`, unusable state is moved aside and
/// the producer starts empty. Returns the actor with the journal attached. Blocking (reads
/// and rebuilds): call from a blocking thread.
///
/// # Errors
/// [`DurabilityError`].
pub fn recover(
    dir: &Path,
    config: &DurabilityConfig,
    identity: &ProducerIdentity,
    metrics: &JournalMetrics,
    mut fresh: impl FnMut() -> Actor,
) -> Result<Actor, DurabilityError> {
    let started = Instant::now();
    let id = state_identity(identity);
    let observer: Arc<dyn JournalObserver> = Arc::new(metrics.clone());
    let open = || Journal::open(dir, id.clone(), config.journal(), Arc::clone(&observer));
    let set_aside = |why: &dyn std::fmt::Display| -> Result<(), DurabilityError> {
        let moved = Journal::set_aside(dir)?;
        tracing::error!(
            error = %why,
            moved_to = %moved.display(),
            "unusable state set aside (durability.on_invalid_state = \"set-aside\"); starting empty"
        );
        Ok(())
    };
    let (journal, recovered) = match open() {
        Ok(opened) => opened,
        Err(e) if e.is_invalid_state() && config.on_invalid_state == OnInvalidState::SetAside => {
            set_aside(&e)?;
            open()?
        }
        Err(e) => return Err(e.into()),
    };
    let Recovered {
        checkpoint,
        records,
        bytes_read,
        torn,
        ..
    } = recovered;
    if let Some(torn) = &torn {
        tracing::warn!(
            segment = %torn.path.display(),
            offset = torn.offset,
            dropped_bytes = torn.dropped_bytes,
            fault = %torn.fault,
            "journal tail torn (the last write before a crash); cut off"
        );
    }
    let mut actor = fresh();
    let (mut actor, journal, report) = match actor.restore(&checkpoint, &records) {
        Ok(report) => (actor, journal, report),
        Err(source) if config.on_invalid_state == OnInvalidState::SetAside => {
            drop(journal);
            set_aside(&source)?;
            let (journal, _) = open()?;
            (fresh(), journal, RestoreReport::default())
        }
        Err(source) => {
            return Err(DurabilityError::Undecodable {
                dir: dir.display().to_string(),
                source,
            });
        }
    };
    let took = started.elapsed();
    let stats = actor.state_stats();
    metrics.recovery_seconds.set(took.as_secs_f64());
    metrics
        .recovered_edges
        .set(i64::try_from(stats.ownership_edges).unwrap_or(i64::MAX));
    metrics
        .recovered_records
        .set(i64::try_from(report.replayed).unwrap_or(i64::MAX));
    let absolute = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned());
    tracing::info!(
        data_dir = %absolute.display(),
        members = report.members,
        checkpoint_edges = report.edges,
        omitted = report.omitted,
        log_records = report.replayed,
        summary_blocks = report.summary_blocks,
        presized_blocks = report.presized_blocks,
        unique_blocks = stats.unique_blocks,
        block_map_rebuilds = stats.block_map_rebuilds,
        edges = stats.ownership_edges,
        bytes_read,
        took_ms = took.as_millis() as u64,
        "{}",
        if report.edges == 0 && report.replayed == 0 {
            "the journal holds no state yet (a new data_dir): starting empty"
        } else {
            "state recovered from the journal"
        }
    );
    if report.omitted > 0 {
        tracing::warn!(
            omitted = report.omitted,
            "the rebuilt filter could not place every recovered block (table full); they are omissions"
        );
    }
    actor.attach_journal(journal);
    Ok(actor)
}
