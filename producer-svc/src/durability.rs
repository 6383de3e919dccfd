//! `[durability]`: opening the producer's journal (`ckf-journal`) at start, deciding what to do
//! with unusable state, and setting the recovery metrics (`ckf_producer_recovery_*`, defined
//! with the journal's in `metrics::journal`). What goes into the journal, and the rebuild from
//! it, are the state actor's (`actor::records`, `actor::journaling`, `actor::restore`).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use ckf_core::identity::ProducerIdentity;
use ckf_journal::{Journal, JournalObserver, Recovered, StateIdentity};

use crate::actor::{Actor, RECORD_VERSION, RestoreReport, UndecodableRecord};
use crate::config::{DurabilityConfig, OnInvalidState};
use crate::metrics::JournalMetrics;

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
        source: UndecodableRecord,
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
