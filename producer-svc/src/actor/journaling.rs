//! The state actor's journal while it runs: every applied input logged as a record
//! ([`super::records`]), and checkpoints captured between commands.
//!
//! **A checkpoint is captured in slices** between commands, so ingest never stops for a pass
//! over the whole state. At its start the journal is told (every record logged later follows
//! the checkpoint and is replayed on top of it), and the small tables (engine publishers'
//! members and sequences, source sequences) are copied. Then each slice reads some block-map
//! lines' owners, and after them some engine members' lineage, while commands go on and are
//! logged. The lineage image is exact as of the start (a member is copied before its next
//! change, `ckf_engine::lineage`), so replayed engine events translate as they did live. The
//! members' blocks are a *fuzzy* image (each block read once, at some moment of the capture),
//! which replaying the log from the capture's start makes exact: every ownership change is a
//! set operation on one edge (`ckf_core::dc::image`, "An image in slices"). Charges are not,
//! so the capture's last slice logs every member's charge (a `Charges` record) and replay sets
//! them there; a capture during which nothing was logged (a shutdown's) is exact as it stands
//! and logs none.
//!
//! [`Journaling`] holds the journal and the capture in progress; the actor lends it the parts
//! of its state a checkpoint reads (the `DcCkfState`, the engine feed, the source sequences).

use std::cell::Cell;
use std::sync::mpsc::SyncSender;
use std::time::{Duration, Instant};

use ckf_core::dc::{DcCkfState, OwnershipCapture};
use ckf_core::sources::SourceSequences;
use ckf_engine::feed::EngineFeed;
use ckf_journal::{Journal, JournalStats};

use super::records::{Capture, LogRecordRef, PublisherRecord, encode};
use crate::engines::{EngineStep, PublisherId};
use crate::events::{IngestBatch, IngestEvent};
use crate::metrics::JournalMetrics;

/// Engine lineage blocks one checkpoint step copies (whole members, at least one): a few ms.
const LINEAGE_STEP_BLOCKS: usize = 1 << 16;

/// Where applied inputs are journaled (`[durability]`), and the checkpoint being captured
/// between commands, if any. Without a journal (memory only) every method does nothing.
#[derive(Default)]
pub(super) struct Journaling {
    journal: Option<Journal>,
    checkpoint: Option<CheckpointCapture>,
}

/// A checkpoint being captured between commands ([`Journaling::begin_checkpoint`]).
struct CheckpointCapture {
    /// The members' blocks read so far (once done, the engine lineage's copy goes on).
    ownership: OwnershipCapture,
    /// Everything else, copied where the capture began.
    rest: Capture,
    /// To the checkpoint's thread, which waits for the finished capture.
    deliver: SyncSender<Capture>,
    /// The longest step so far (the copies at the start, then each slice).
    longest_step: Duration,
    /// Whether a record was logged since the capture began.
    logged: Cell<bool>,
}

impl Journaling {
    /// From now on every applied input is journaled to `journal`.
    pub(super) fn attach(&mut self, journal: Journal) {
        self.journal = Some(journal);
    }

    /// Whether a journal is attached.
    pub(super) fn is_on(&self) -> bool {
        self.journal.is_some()
    }

    /// Whether the journal asks for a checkpoint.
    pub(super) fn wants_checkpoint(&self) -> bool {
        self.journal.as_ref().is_some_and(Journal::wants_checkpoint)
    }

    /// The journal's statistics, if one is attached.
    pub(super) fn stats(&self) -> Option<JournalStats> {
        self.journal.as_ref().map(Journal::stats)
    }

    fn log(&self, record: &LogRecordRef<'_>) {
        if let Some(journal) = &self.journal {
            journal.append(encode(record));
            if let Some(checkpoint) = &self.checkpoint {
                checkpoint.logged.set(true);
            }
        }
    }

    /// Journals an ingest batch's applied events; with none applied, still its source and
    /// sequence (the source's sequence moved on). Call only for batches whose sequence was
    /// admitted (not duplicates).
    pub(super) fn log_ingest(&self, batch: &IngestBatch, applied: &[bool]) {
        if self.journal.is_none() {
            return;
        }
        let events: Vec<&IngestEvent> = batch
            .events
            .iter()
            .zip(applied)
            .filter_map(|(e, &ok)| if ok { e.as_ref().ok() } else { None })
            .collect();
        self.log(&LogRecordRef::Ingest {
            source: batch.source_id.as_str(),
            sequence: batch.sequence,
            events,
        });
    }

    /// Journals an engine publisher's step.
    pub(super) fn log_engine(&self, publisher: &PublisherId, step: &EngineStep) {
        if self.journal.is_none() {
            return;
        }
        let publisher = PublisherRecord::from(publisher);
        self.log(&match step {
            EngineStep::Apply { sequence, batch } => LogRecordRef::EngineApply {
                publisher,
                sequence: *sequence,
                batch,
            },
            EngineStep::Clear(reason) => LogRecordRef::EngineClear {
                publisher,
                reason: (*reason).into(),
            },
        });
    }

    /// Begins a checkpoint of the current state, if a journal is open and none is being
    /// captured: the journal is told now (so every record logged from here on follows the
    /// checkpoint), the small tables are copied, and the members' blocks are read one slice
    /// per [`capture_slice`](Self::capture_slice) between commands. The checkpoint's thread
    /// waits for the capture, then sorts, encodes and writes it.
    pub(super) fn begin_checkpoint(
        &mut self,
        state: &mut DcCkfState,
        feed: &mut EngineFeed,
        sources: &SourceSequences,
    ) {
        let Some(journal) = &self.journal else {
            return;
        };
        if self.checkpoint.is_some() {
            return;
        }
        let (deliver, capture) = std::sync::mpsc::sync_channel::<Capture>(1);
        journal.checkpoint_with(move || {
            capture
                .recv()
                .expect("the state actor finishes every checkpoint capture it begins")
                .encode()
        });
        let started = Instant::now();
        let rest = capture_start(state, feed, sources);
        self.checkpoint = Some(CheckpointCapture {
            ownership: state.begin_capture(),
            rest,
            deliver,
            longest_step: started.elapsed(),
            logged: Cell::new(false),
        });
    }

    /// Whether a checkpoint's capture is in progress.
    pub(super) fn capturing(&self) -> bool {
        self.checkpoint.is_some()
    }

    /// One slice of the checkpoint being captured, if any. The last one journals the members'
    /// charges (replay sets them there: see `ckf_core::dc::image`) and hands the capture to
    /// the checkpoint's thread.
    pub(super) fn capture_slice(
        &mut self,
        state: &mut DcCkfState,
        feed: &mut EngineFeed,
        metrics: &JournalMetrics,
    ) {
        let Some(mut checkpoint) = self.checkpoint.take() else {
            return;
        };
        let started = Instant::now();
        // The members' blocks, then the engine lineage: one slice of one of them per step.
        let more = if !checkpoint.ownership.is_done() {
            state.capture_step(&mut checkpoint.ownership);
            true
        } else {
            feed.image_step(LINEAGE_STEP_BLOCKS)
        };
        if more {
            checkpoint.longest_step = checkpoint.longest_step.max(started.elapsed());
            self.checkpoint = Some(checkpoint);
            return;
        }
        // With nothing logged since the capture began, the image is exact and charged as of
        // now: no record needed (a clean shutdown's final checkpoint has no log after it).
        if checkpoint.logged.get() {
            let charges = state.charge_image();
            self.log(&LogRecordRef::Charges(&charges));
        }
        let CheckpointCapture {
            ownership,
            mut rest,
            deliver,
            longest_step,
            ..
        } = checkpoint;
        if ownership.restarts() > 0 {
            tracing::debug!(
                restarts = ownership.restarts(),
                "checkpoint capture started over after block-map rebuilds"
            );
        }
        rest.members = state.capture_images(ownership);
        rest.lineage = feed
            .take_lineage_image()
            .expect("every member's lineage copied");
        // The longest time the actor (and so ingest) stopped for this capture.
        metrics
            .checkpoint_image_seconds
            .observe(longest_step.max(started.elapsed()).as_secs_f64());
        // The checkpoint's thread waits on the other end; if it is gone (the journal failed
        // to start the checkpoint), the journal has already reported it.
        let _ = deliver.send(rest);
    }

    /// The journal, detached (a test closes it by hand).
    #[cfg(test)]
    pub(super) fn take_journal(&mut self) -> Option<Journal> {
        self.journal.take()
    }

    /// Closes the journal at shutdown (after the final checkpoint's capture): waits for that
    /// checkpoint, then says whether it was written.
    pub(super) fn close(&mut self) {
        let Some(journal) = self.journal.take() else {
            return;
        };
        // Waits for the final checkpoint: whether it was written is known after this.
        let synced = journal.sync();
        let checkpointed = !journal.stats().last_checkpoint_failed;
        match synced.and_then(|()| journal.close()) {
            Ok(()) if checkpointed => {
                tracing::info!("journal closed after a final checkpoint")
            }
            Ok(()) => tracing::warn!(
                "journal closed; the final checkpoint failed (logged above), so the next start replays the log after the last checkpoint"
            ),
            Err(e) => {
                tracing::error!(error = %e, "journal failed; the last checkpoint and log stand")
            }
        }
    }
}

/// What a checkpoint copies where its capture begins: everything but the members' blocks
/// and the engine lineage, whose capture it starts ([`EngineFeed::begin_image`]).
fn capture_start(state: &DcCkfState, feed: &mut EngineFeed, sources: &SourceSequences) -> Capture {
    let image = feed.begin_image();
    Capture {
        unique_blocks: state.stats().unique_blocks as u64,
        members: Vec::new(),
        lineage: image.lineage,
        fed: image.fed,
        sequences: image.sequences,
        identities: image.identities,
        sources: sources.export(),
    }
}

/// The whole logical state as checkpoint records (what the checkpoint thread writes),
/// captured at once.
#[cfg(test)]
pub(super) fn checkpoint_records(
    state: &mut DcCkfState,
    feed: &mut EngineFeed,
    sources: &SourceSequences,
) -> Vec<Vec<u8>> {
    let mut capture = capture_start(state, feed, sources);
    let mut ownership = state.begin_capture();
    while state.capture_step(&mut ownership) {}
    capture.members = state.capture_images(ownership);
    while feed.image_step(LINEAGE_STEP_BLOCKS) {}
    capture.lineage = feed.take_lineage_image().expect("every member copied");
    capture.encode()
}
