//! The state actor's durability: what it writes to its journal (`ckf-journal`) and how a
//! restart rebuilds its state from what the journal kept (design source, "Lane recovery and
//! failure boundaries": the producer-generation rebuild).
//!
//! * **Log records** are the actor's *inputs* that changed something, in the order it applied
//!   them: an ingest batch's applied events (with its source and sequence) and an engine
//!   publisher's step (a decoded batch with its sequence, or a clear). The actor is deterministic, so replaying
//!   them through the same code rebuilds the same exact state, lineage, source sequences and
//!   charges. Quotas are off during replay: what was applied once is never refused on restart
//!   because a limit was lowered.
//! * **Checkpoint records** hold the whole logical state: every member's blocks and charge
//!   ([`MemberImage`]), engine lineage, which members each engine publisher fed and the
//!   sequence of its last applied batch, and the source sequences. The filter table is *not* stored: it is rebuilt from the ownership,
//!   like a new producer generation, and published with a new incarnation and a barrier
//!   snapshot.
//! * **A checkpoint is captured in slices** between commands, so ingest never stops for a
//!   pass over the whole state. At its start the journal is told (every record logged later
//!   follows the checkpoint and is replayed on top of it), and the small tables (engine
//!   publishers' members and sequences, source sequences) are copied. Then each slice reads
//!   some block-map lines' owners, and after them some engine members' lineage, while commands
//!   go on and are logged. The lineage image is exact as of the start (a member is copied
//!   before its next change, `ckf_engine::lineage`), so replayed engine events translate as
//!   they did live. The members' blocks are a *fuzzy* image (each block read once, at some
//!   moment of the capture), which replaying the log from the capture's start makes exact:
//!   every ownership change is a set operation on one edge (`ckf_core::dc::image`, "An image
//!   in slices"). Charges are not, so the capture's last slice logs every member's charge (a
//!   `Charges` record) and replay sets them there; a capture during which nothing was logged
//!   (a shutdown's) is exact as it stands and logs none.
//!
//! Both are encoded with postcard (serde); a record that passes its CRC but does not decode
//! is refused like a damaged file.

use ckf_core::dc::{MemberId, MemberImage, OwnershipCapture};
use ckf_engine::event::EngineBatch;
use ckf_engine::lineage::MemberLineageImage;
use ckf_engine::sequence::ClearReason;
use serde::{Deserialize, Serialize};

use super::Actor;
use crate::engines::{EngineStep, PublisherId};
use crate::events::{IngestBatch, IngestEvent};

/// Version of the record encoding below; bumped on any change to the enums' shapes (the
/// journal's table-format identity carries it, so an old journal is refused, not misread).
///
/// v2: `EngineApply` carries the batch's sequence; checkpoints have `EngineSequences`.
/// Since commit 7eb60e7 (2026-12-05) a v2 checkpoint starts with a `Summary`, and since the
/// checkpoints captured in slices (2026-12-06) the log holds `Charges` records: variants added
/// at the end, so every earlier v2 journal still decodes. Not a bump: no record is misread
/// either way, but a producer built before them refuses a journal holding one as
/// undecodable, so going back to such a build means setting its state aside.
pub const RECORD_VERSION: u32 = 2;

/// Engine lineage blocks one checkpoint step copies (whole members, at least one): a few ms.
const LINEAGE_STEP_BLOCKS: usize = 1 << 16;

/// Blocks per checkpoint record at most (~9 bytes each encoded): records stay far below
/// `ckf_journal::frame::MAX_RECORD_BYTES`, and a checkpoint is written in pieces of a few MiB.
const BLOCKS_PER_RECORD: usize = 1 << 20;

/// One engine publisher socket, as journaled.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
struct PublisherRecord {
    worker_id: u64,
    rank: u32,
    label: String,
    endpoint: String,
}

impl From<&PublisherId> for PublisherRecord {
    fn from(p: &PublisherId) -> Self {
        Self {
            worker_id: p.worker_id,
            rank: p.rank,
            label: p.label.clone(),
            endpoint: p.endpoint.clone(),
        }
    }
}

impl From<PublisherRecord> for PublisherId {
    fn from(p: PublisherRecord) -> Self {
        Self {
            worker_id: p.worker_id,
            rank: p.rank,
            label: p.label,
            endpoint: p.endpoint,
        }
    }
}

/// How an engine step is journaled.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
enum ClearRecord {
    Gap,
    Restart,
    /// Added at the end (a build before it refuses a journal holding one as undecodable).
    Unverified,
}

impl From<ClearReason> for ClearRecord {
    fn from(r: ClearReason) -> Self {
        match r {
            ClearReason::Gap => Self::Gap,
            ClearReason::Restart => Self::Restart,
            ClearReason::Unverified => Self::Unverified,
        }
    }
}

impl From<ClearRecord> for ClearReason {
    fn from(r: ClearRecord) -> Self {
        match r {
            ClearRecord::Gap => Self::Gap,
            ClearRecord::Restart => Self::Restart,
            ClearRecord::Unverified => Self::Unverified,
        }
    }
}

/// A log record as written (borrowing the actor's input). Same shape as [`LogRecord`].
#[derive(Serialize)]
enum LogRecordRef<'a> {
    Ingest {
        source: &'a str,
        sequence: u64,
        events: Vec<&'a IngestEvent>,
    },
    EngineApply {
        publisher: PublisherRecord,
        sequence: i64,
        batch: &'a EngineBatch,
    },
    EngineClear {
        publisher: PublisherRecord,
        reason: ClearRecord,
    },
    /// Every charged member's source where a checkpoint's capture ended (see the module docs).
    Charges(&'a [(String, Vec<MemberId>)]),
}

/// A log record as read back.
#[derive(Debug, Deserialize, PartialEq)]
enum LogRecord {
    Ingest {
        source: String,
        sequence: u64,
        events: Vec<IngestEvent>,
    },
    EngineApply {
        publisher: PublisherRecord,
        sequence: i64,
        batch: EngineBatch,
    },
    EngineClear {
        publisher: PublisherRecord,
        reason: ClearRecord,
    },
    /// Added at the end (a build before it refuses a journal holding one as undecodable).
    Charges(Vec<(String, Vec<MemberId>)>),
}

/// One piece of a checkpoint.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
enum CheckpointRecord {
    /// Members' blocks and charges (a member of more than `BLOCKS_PER_RECORD` blocks spans
    /// several records).
    Members(Vec<MemberImage>),
    /// Engine lineage of some members.
    Lineage(Vec<MemberLineageImage>),
    /// Per engine publisher socket `(worker_id, rank)`: the members it fed.
    Fed(Vec<(u64, u32, Vec<MemberId>)>),
    /// Source sequences, least recently used first.
    Sources(Vec<(String, u64)>),
    /// Per engine publisher socket `(worker_id, rank)`: the sequence of its last applied
    /// batch.
    EngineSequences(Vec<(u64, u32, i64)>),
    /// The first record (since 2026-12-05): the state's size when the checkpoint was taken,
    /// so a restore sizes the block map once before storing (`DcCkfState::presize_blocks`)
    /// instead of growing it through every size on the way.
    Summary {
        /// Tracked blocks (`DcCkfStats::unique_blocks`).
        unique_blocks: u64,
    },
    /// Per engine publisher socket `(worker_id, rank)`: the identity of its last applied
    /// batch (`EngineBatch::identity`), which the restarted producer's first connection
    /// verifies against the engine's replay buffer. Added at the end: an older checkpoint has
    /// none, and its restored sequences are then re-read instead of verified.
    EngineIdentities(Vec<(u64, u32, u64)>),
}

/// A record that passed its checksum but does not decode: a bug or a version skew, treated
/// like damage (`durability.on_invalid_state` decides).
#[derive(Debug, thiserror::Error)]
#[error("{what} record {index} does not decode: {why}")]
pub struct UndecodableRecord {
    what: &'static str,
    index: usize,
    why: String,
}

/// What a restore rebuilt (for the start-up log line and the recovery metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RestoreReport {
    /// Members owning blocks after the restore (checkpoint and log).
    pub members: u64,
    /// Ownership edges restored from the checkpoint.
    pub edges: u64,
    /// Blocks of the checkpoint the rebuilt filter could not place (capacity omissions).
    pub omitted: u64,
    /// Log records replayed after the checkpoint.
    pub replayed: u64,
    /// Tracked blocks the checkpoint's summary gave (0: a checkpoint without one).
    pub summary_blocks: u64,
    /// Blocks the block map was sized for before the restore stored anything: the summary's
    /// count plus a fifth, bounded by the checkpoint's bytes and the table's slots
    /// (`DcCkfState::presize_blocks`); 0 without a summary or when the allocator refused.
    pub presized_blocks: u64,
}

/// A checkpoint's content as captured on the actor: the tracked-block count, fed members,
/// engine sequences and source sequences copied where the capture began, the engine lineage
/// of that moment (copied member by member, blocks in no order), and the members' blocks read
/// in slices until it ended (in table order, possibly repeated).
struct Capture {
    unique_blocks: u64,
    members: Vec<MemberImage>,
    lineage: Vec<MemberLineageImage>,
    fed: Vec<(u64, u32, Vec<MemberId>)>,
    sequences: Vec<(u64, u32, i64)>,
    identities: Vec<(u64, u32, u64)>,
    sources: Vec<(String, u64)>,
}

/// A checkpoint being captured between commands ([`Actor::begin_checkpoint`]).
pub(super) struct CheckpointCapture {
    /// The members' blocks read so far (once done, the engine lineage's copy goes on).
    ownership: OwnershipCapture,
    /// Everything else, copied where the capture began.
    rest: Capture,
    /// To the checkpoint's thread, which waits for the finished capture.
    deliver: std::sync::mpsc::SyncSender<Capture>,
    /// The longest step so far (the copies at the start, then each slice).
    longest_step: std::time::Duration,
    /// Whether a record was logged since the capture began.
    logged: std::cell::Cell<bool>,
}

impl Capture {
    /// The checkpoint records: the summary, members (blocks sorted, at most
    /// [`BLOCKS_PER_RECORD`] per record), lineage, fed members, engine sequences, sources.
    fn encode(self) -> Vec<Vec<u8>> {
        let mut out = vec![encode(&CheckpointRecord::Summary {
            unique_blocks: self.unique_blocks,
        })];
        let mut chunk: Vec<MemberImage> = Vec::new();
        let mut chunk_blocks = 0;
        for mut image in self.members {
            // A capture in slices may read a block twice (one a walk moved meanwhile).
            image.blocks.sort_unstable();
            image.blocks.dedup();
            for blocks in image.blocks.chunks(BLOCKS_PER_RECORD) {
                if chunk_blocks + blocks.len() > BLOCKS_PER_RECORD && !chunk.is_empty() {
                    out.push(encode(&CheckpointRecord::Members(std::mem::take(
                        &mut chunk,
                    ))));
                    chunk_blocks = 0;
                }
                chunk_blocks += blocks.len();
                chunk.push(MemberImage {
                    member: image.member,
                    charged_to: image.charged_to.clone(),
                    blocks: blocks.to_vec(),
                });
            }
        }
        if !chunk.is_empty() {
            out.push(encode(&CheckpointRecord::Members(chunk)));
        }
        let mut lineage: Vec<MemberLineageImage> = Vec::new();
        let mut lineage_blocks = 0;
        for mut image in self.lineage {
            image.blocks.sort_unstable_by_key(|e| e.engine_hash);
            lineage_blocks += image.blocks.len();
            lineage.push(image);
            if lineage_blocks >= BLOCKS_PER_RECORD / 2 {
                out.push(encode(&CheckpointRecord::Lineage(std::mem::take(
                    &mut lineage,
                ))));
                lineage_blocks = 0;
            }
        }
        if !lineage.is_empty() {
            out.push(encode(&CheckpointRecord::Lineage(lineage)));
        }
        if !self.fed.is_empty() {
            out.push(encode(&CheckpointRecord::Fed(self.fed)));
        }
        if !self.sequences.is_empty() {
            out.push(encode(&CheckpointRecord::EngineSequences(self.sequences)));
        }
        if !self.identities.is_empty() {
            out.push(encode(&CheckpointRecord::EngineIdentities(self.identities)));
        }
        for piece in self.sources.chunks(1 << 16) {
            out.push(encode(&CheckpointRecord::Sources(piece.to_vec())));
        }
        out
    }
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    postcard::to_allocvec(value).expect("postcard encodes every record type into a Vec")
}

impl Actor {
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

    /// The whole logical state as checkpoint records (what the checkpoint thread writes).
    #[cfg(test)]
    pub(super) fn checkpoint_records(&mut self) -> Vec<Vec<u8>> {
        let mut capture = self.capture_start();
        let mut ownership = self.state.begin_capture();
        while self.state.capture_step(&mut ownership) {}
        capture.members = self.state.capture_images(ownership);
        while self.feed.image_step(LINEAGE_STEP_BLOCKS) {}
        capture.lineage = self.feed.take_lineage_image().expect("every member copied");
        capture.encode()
    }

    /// What a checkpoint copies where its capture begins: everything but the members' blocks
    /// and the engine lineage, whose capture it starts ([`EngineFeed::begin_image`]).
    ///
    /// [`EngineFeed::begin_image`]: ckf_engine::feed::EngineFeed::begin_image
    fn capture_start(&mut self) -> Capture {
        let feed = self.feed.begin_image();
        Capture {
            unique_blocks: self.state.stats().unique_blocks as u64,
            members: Vec::new(),
            lineage: feed.lineage,
            fed: feed.fed,
            sequences: feed.sequences,
            identities: feed.identities,
            sources: self.sources.export(),
        }
    }

    /// Begins a checkpoint of the current state, if a journal is open and none is being
    /// captured: the journal is told now (so every record logged from here on follows the
    /// checkpoint), the small tables are copied, and the members' blocks are read one slice
    /// per [`capture_slice`](Self::capture_slice) between commands. The checkpoint's thread
    /// waits for the capture, then sorts, encodes and writes it.
    pub(super) fn begin_checkpoint(&mut self) {
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
        let started = std::time::Instant::now();
        let rest = self.capture_start();
        self.checkpoint = Some(CheckpointCapture {
            ownership: self.state.begin_capture(),
            rest,
            deliver,
            longest_step: started.elapsed(),
            logged: std::cell::Cell::new(false),
        });
    }

    /// Whether a checkpoint's capture is in progress.
    pub(super) fn capturing(&self) -> bool {
        self.checkpoint.is_some()
    }

    /// One slice of the checkpoint being captured, if any. The last one journals the members'
    /// charges (replay sets them there: see `ckf_core::dc::image`) and hands the capture to
    /// the checkpoint's thread.
    pub(super) fn capture_slice(&mut self) {
        let Some(mut checkpoint) = self.checkpoint.take() else {
            return;
        };
        let started = std::time::Instant::now();
        // The members' blocks, then the engine lineage: one slice of one of them per step.
        let more = if !checkpoint.ownership.is_done() {
            self.state.capture_step(&mut checkpoint.ownership);
            true
        } else {
            self.feed.image_step(LINEAGE_STEP_BLOCKS)
        };
        if more {
            checkpoint.longest_step = checkpoint.longest_step.max(started.elapsed());
            self.checkpoint = Some(checkpoint);
            return;
        }
        // With nothing logged since the capture began, the image is exact and charged as of
        // now: no record needed (a clean shutdown's final checkpoint has no log after it).
        if checkpoint.logged.get() {
            let charges = self.state.charge_image();
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
        rest.members = self.state.capture_images(ownership);
        rest.lineage = self
            .feed
            .take_lineage_image()
            .expect("every member's lineage copied");
        // The longest time the actor (and so ingest) stopped for this capture.
        self.metrics
            .journal
            .checkpoint_image_seconds
            .observe(longest_step.max(started.elapsed()).as_secs_f64());
        // The checkpoint's thread waits on the other end; if it is gone (the journal failed
        // to start the checkpoint), the journal has already reported it.
        let _ = deliver.send(rest);
    }

    /// Captures the checkpoint in progress to its end, at once.
    pub(super) fn finish_checkpoint(&mut self) {
        while self.checkpoint.is_some() {
            self.capture_slice();
        }
    }

    /// Rebuilds the state from a recovered journal: the checkpoint, then the log replayed
    /// through the same code as live input. Call on a fresh actor, before [`Actor::run`] and
    /// before a journal is attached (nothing replayed is journaled again).
    ///
    /// # Errors
    /// [`UndecodableRecord`]; the actor is then half-built and must be discarded.
    pub fn restore(
        &mut self,
        checkpoint: &[Vec<u8>],
        log: &[Vec<u8>],
    ) -> Result<RestoreReport, UndecodableRecord> {
        debug_assert!(
            self.journal.is_none(),
            "restore before attaching the journal"
        );
        let mut report = RestoreReport::default();
        // Every tracked block is an edge of some member, and every edge takes at least one
        // byte of a record: a summary claiming more blocks than the checkpoint has bytes is
        // wrong (a writer bug; the count passed its CRC), and is cut to that before it sizes
        // anything.
        let checkpoint_bytes: u64 = checkpoint.iter().map(|r| r.len() as u64).sum();
        let mut sources = Vec::new();
        for (index, bytes) in checkpoint.iter().enumerate() {
            let record: CheckpointRecord =
                postcard::from_bytes(bytes).map_err(|e| UndecodableRecord {
                    what: "checkpoint",
                    index,
                    why: e.to_string(),
                })?;
            match record {
                CheckpointRecord::Summary { unique_blocks } => {
                    debug_assert_eq!(index, 0, "the summary is the checkpoint's first record");
                    report.summary_blocks = unique_blocks;
                    match self
                        .state
                        .presize_blocks(unique_blocks.min(checkpoint_bytes))
                    {
                        Ok(sized_for) => report.presized_blocks = sized_for,
                        // Not fatal: the map then grows as the blocks arrive.
                        Err(e) => tracing::warn!(
                            error = %e,
                            "block map not presized for the checkpoint; it grows during the restore"
                        ),
                    }
                }
                CheckpointRecord::Members(images) => {
                    for image in images {
                        let outcome = self.state.restore_member(&image);
                        report.members += 1;
                        report.edges += u64::from(outcome.applied);
                        report.omitted += u64::from(outcome.omitted);
                    }
                }
                CheckpointRecord::Lineage(images) => self.feed.restore_lineage(images),
                CheckpointRecord::Fed(fed) => self.feed.restore_fed(fed),
                CheckpointRecord::Sources(entries) => sources.extend(entries),
                CheckpointRecord::EngineSequences(entries) => self.feed.restore_sequences(entries),
                CheckpointRecord::EngineIdentities(entries) => {
                    self.feed.restore_identities(entries);
                }
            }
        }
        self.sources.restore(sources);
        // Replay with the quotas off (see the module docs), metrics into a scratch registry.
        let quotas = self.state.quotas();
        self.state.set_quotas(ckf_core::dc::Quotas::UNLIMITED);
        let live_metrics = std::mem::take(&mut self.metrics);
        let result = self.replay(log, &mut report);
        self.metrics = live_metrics;
        self.state.set_quotas(quotas);
        result?;
        // Clears replayed from the log are swept before the producer serves (nothing waits yet).
        self.state.finish_releases();
        // The restored members were counted per record; a member spanning records once.
        report.members = self.state.members().count() as u64;
        Ok(report)
    }

    fn replay(
        &mut self,
        log: &[Vec<u8>],
        report: &mut RestoreReport,
    ) -> Result<(), UndecodableRecord> {
        for (index, bytes) in log.iter().enumerate() {
            let undecodable = |why: String| UndecodableRecord {
                what: "log",
                index,
                why,
            };
            let record: LogRecord =
                postcard::from_bytes(bytes).map_err(|e| undecodable(e.to_string()))?;
            match record {
                LogRecord::Ingest {
                    source,
                    sequence,
                    events,
                } => {
                    let source_id = ckf_core::identity::SourceId::new(source)
                        .map_err(|e| undecodable(format!("source id: {e}")))?;
                    self.ingest(&IngestBatch {
                        source_id,
                        sequence,
                        events: events.into_iter().map(Ok).collect(),
                    });
                }
                LogRecord::EngineApply {
                    publisher,
                    sequence,
                    batch,
                } => self.engine_batch(&PublisherId::from(publisher), sequence, &batch),
                LogRecord::EngineClear { publisher, reason } => {
                    self.engine_clear(&PublisherId::from(publisher), reason.into())
                }
                LogRecord::Charges(charges) => self.state.restore_charges(&charges),
            }
            report.replayed += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ckf_core::dc::{KvEvent, KvEventKind};
    use ckf_engine::event::{EngineEvent, StoredBlocks};

    #[test]
    fn borrowed_log_records_decode_as_owned_ones() {
        let source = ckf_core::identity::SourceId::new("router-1").unwrap();
        let kv = IngestEvent::Kv(KvEvent {
            member: MemberId::new(7, 1),
            kind: KvEventKind::Stored {
                block_hashes: vec![1, u64::MAX, 3],
                parent_hash: Some(9),
            },
        });
        let gone = IngestEvent::WorkerRemoved { worker_id: 4 };
        let batch = IngestBatch {
            source_id: source,
            sequence: 42,
            events: vec![
                Ok(kv.clone()),
                Err(crate::events::EventError::MissingKind { index: 1 }),
                Ok(gone.clone()),
                Ok(kv.clone()),
            ],
        };
        // Event 3 was refused (say by a quota): neither it nor the malformed one is journaled.
        let applied = [true, false, true, false];
        let events: Vec<&IngestEvent> = batch
            .events
            .iter()
            .zip(applied)
            .filter_map(|(e, ok)| if ok { e.as_ref().ok() } else { None })
            .collect();
        let bytes = encode(&LogRecordRef::Ingest {
            source: batch.source_id.as_str(),
            sequence: 42,
            events,
        });
        assert_eq!(
            postcard::from_bytes::<LogRecord>(&bytes).unwrap(),
            LogRecord::Ingest {
                source: "router-1".into(),
                sequence: 42,
                events: vec![kv, gone],
            }
        );

        let publisher = PublisherRecord {
            worker_id: 3,
            rank: 2,
            label: "3/2".into(),
            endpoint: "tcp://e:5557".into(),
        };
        let engine = EngineBatch {
            ts: 1.5,
            dp_rank: Some(2),
            events: vec![EngineEvent::Stored(StoredBlocks {
                block_hashes: vec![10, 11],
                token_ids: (0..32).collect(),
                block_size: 16,
                ..StoredBlocks::default()
            })],
            ..EngineBatch::default()
        };
        let bytes = encode(&LogRecordRef::EngineApply {
            publisher: publisher.clone(),
            sequence: -3,
            batch: &engine,
        });
        assert_eq!(
            postcard::from_bytes::<LogRecord>(&bytes).unwrap(),
            LogRecord::EngineApply {
                publisher: publisher.clone(),
                sequence: -3,
                batch: engine,
            }
        );
        let bytes = encode(&LogRecordRef::EngineClear {
            publisher: publisher.clone(),
            reason: ClearRecord::Restart,
        });
        assert_eq!(
            postcard::from_bytes::<LogRecord>(&bytes).unwrap(),
            LogRecord::EngineClear {
                publisher,
                reason: ClearRecord::Restart,
            }
        );
        // A truncated record does not decode (it is refused, never half-applied).
        assert!(postcard::from_bytes::<LogRecord>(&bytes[..bytes.len() - 1]).is_err());
    }
}

#[cfg(test)]
mod restore_tests {
    use std::collections::HashMap;
    use std::sync::Arc;
    use std::time::Duration;

    use ckf_core::dc::MemberId;
    use ckf_engine::event::{EngineBatch, EngineEvent, StoredBlocks};
    use ckf_engine::sequence::ClearReason;

    use super::{CheckpointRecord, LogRecordRef, PublisherRecord, encode};
    use crate::actor::{Actor, Cadence, Command};
    use crate::engines::{EngineStep, PublisherId};

    fn fresh() -> Actor {
        crate::actor::test_actor(
            Vec::new(),
            crate::metrics::Metrics::new(),
            Cadence {
                batch_threshold: 64,
                max_delay: Duration::from_millis(5),
                cut_when_idle: true,
                backed_up_interval: crate::actor::BACKED_UP_INTERVAL,
            },
        )
    }

    fn publisher(worker_id: u64, rank: u32) -> Arc<PublisherId> {
        Arc::new(PublisherId {
            worker_id,
            rank,
            label: format!("{worker_id}/{rank}"),
            endpoint: format!("tcp://127.0.0.1:{}", 5557 + rank),
        })
    }

    /// Two GPU blocks of 16 tokens (the default block size) under engine hashes 10, 11.
    fn store() -> EngineBatch {
        EngineBatch {
            events: vec![EngineEvent::Stored(StoredBlocks {
                block_hashes: vec![10, 11],
                token_ids: (0..32).collect(),
                block_size: 16,
                ..StoredBlocks::default()
            })],
            ..EngineBatch::default()
        }
    }

    fn step(actor: &mut Actor, p: &Arc<PublisherId>, step: EngineStep) {
        actor.handle(Command::Engine {
            publisher: Arc::clone(p),
            step,
        });
    }

    #[test]
    fn the_last_applied_sequences_survive_a_checkpoint_and_the_log() {
        let (a, b) = (publisher(7, 0), publisher(8, 1));
        let mut live = fresh();
        step(
            &mut live,
            &a,
            EngineStep::Apply {
                sequence: 5,
                batch: store(),
            },
        );
        step(
            &mut live,
            &b,
            EngineStep::Apply {
                sequence: -2,
                batch: EngineBatch::default(),
            },
        );
        assert_eq!(live.state.member_blocks(MemberId::new(7, 0)).len(), 2);
        // A clear keeps the sequence: the next batch after it will move it on.
        step(&mut live, &a, EngineStep::Clear(ClearReason::Gap));
        assert!(live.state.member_blocks(MemberId::new(7, 0)).is_empty());
        let (stored, empty) = (
            Some(store().identity()),
            Some(EngineBatch::default().identity()),
        );
        let expected = HashMap::from([((7, 0), (5, stored)), ((8, 1), (-2, empty))]);
        assert_eq!(live.engine_sequences(), expected);

        // From the checkpoint alone, identities included.
        let checkpoint = live.checkpoint_records();
        let mut restored = fresh();
        restored.restore(&checkpoint, &[]).expect("restores");
        assert_eq!(restored.engine_sequences(), expected);

        // A checkpoint written before identities were kept: the sequences without them.
        let old: Vec<Vec<u8>> = checkpoint
            .iter()
            .filter(|r| {
                !matches!(
                    postcard::from_bytes::<CheckpointRecord>(r),
                    Ok(CheckpointRecord::EngineIdentities(_))
                )
            })
            .cloned()
            .collect();
        assert_eq!(old.len() + 1, checkpoint.len());
        let mut restored = fresh();
        restored.restore(&old, &[]).expect("restores");
        assert_eq!(
            restored.engine_sequences(),
            HashMap::from([((7, 0), (5, None)), ((8, 1), (-2, None))])
        );

        // Checkpoint then log: the log's applies move the sequences on, in order.
        let log: Vec<Vec<u8>> = [(&a, 6), (&a, 7), (&publisher(9, 0), 100)]
            .into_iter()
            .map(|(p, sequence)| {
                encode(&LogRecordRef::EngineApply {
                    publisher: PublisherRecord::from(p.as_ref()),
                    sequence,
                    batch: &store(),
                })
            })
            .collect();
        let mut restored = fresh();
        let report = restored.restore(&checkpoint, &log).expect("restores");
        assert_eq!(report.replayed, 3);
        assert_eq!(
            restored.engine_sequences(),
            HashMap::from([
                ((7, 0), (7, stored)),
                ((8, 1), (-2, empty)),
                ((9, 0), (100, stored))
            ])
        );
        assert_eq!(restored.state.member_blocks(MemberId::new(7, 0)).len(), 2);

        // A fresh actor resumes nothing.
        assert!(fresh().engine_sequences().is_empty());
    }

    /// A checkpoint captured in slices while ingest goes on between them, written through a
    /// real journal: what a restart recovers (that checkpoint, then the log after its start,
    /// `Charges` record included) is the live state, every member's blocks and charge.
    #[test]
    fn a_checkpoint_captured_between_commands_recovers_the_live_state() {
        use crate::events::{IngestBatch, IngestEvent};
        use ckf_core::dc::{DcCkfConfig, DcCkfState, KvEvent, KvEventKind};
        use ckf_core::identity::SourceId;

        let dir = tempfile::tempdir().expect("tempdir");
        let identity = ckf_journal::StateIdentity {
            pool: "test/dc-a".into(),
            format: "slices test".into(),
        };
        let open = || {
            let metrics = crate::metrics::Metrics::new();
            ckf_journal::Journal::open(
                dir.path(),
                identity.clone(),
                ckf_journal::JournalConfig::default(),
                std::sync::Arc::new(metrics.journal.clone()),
            )
            .expect("journal opens")
        };
        let mut live = fresh();
        // Slices of 64 lines: the 30,000 blocks below take ~130 steps.
        live.state = DcCkfState::new(DcCkfConfig {
            slice_lines: 64,
            ..DcCkfConfig::new(live.state.format())
        })
        .expect("the default table");
        live.attach_journal(open().0);

        let hash = |i: u64| (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut sequences = HashMap::new();
        let mut send = |live: &mut Actor, source: &str, events: Vec<IngestEvent>| {
            let sequence = sequences.entry(source.to_owned()).or_insert(0u64);
            *sequence += 1;
            let batch = IngestBatch {
                source_id: SourceId::new(source).unwrap(),
                sequence: *sequence,
                events: events.into_iter().map(Ok).collect(),
            };
            live.log_ingest(&batch, &vec![true; batch.events.len()]);
            live.ingest(&batch);
        };
        let kv = |worker: u64, kind: KvEventKind| {
            IngestEvent::Kv(KvEvent {
                member: MemberId::new(worker, 0),
                kind,
            })
        };
        let stored = |worker: u64, keys: std::ops::Range<u64>| {
            kv(
                worker,
                KvEventKind::Stored {
                    block_hashes: keys.map(hash).collect(),
                    parent_hash: None,
                },
            )
        };
        for w in 0..6 {
            let source = if w % 2 == 0 { "src-a" } else { "src-b" };
            send(
                &mut live,
                source,
                vec![stored(w, w * 5_000..(w + 1) * 5_000)],
            );
        }

        // An engine publisher's member, 7/0: engine blocks 10, 11, then children of them.
        let engine = publisher(7, 0);
        let child = |sequence: i64, hash: u64, parent: u64| EngineStep::Apply {
            sequence,
            batch: EngineBatch {
                events: vec![EngineEvent::Stored(StoredBlocks {
                    block_hashes: vec![hash],
                    parent: Some(parent),
                    token_ids: (0..16).map(|t| t + hash as u32).collect(),
                    block_size: 16,
                    ..StoredBlocks::default()
                })],
                ..EngineBatch::default()
            },
        };
        step(
            &mut live,
            &engine,
            EngineStep::Apply {
                sequence: 1,
                batch: store(),
            },
        );

        live.begin_checkpoint();
        let mut steps = 0;
        while live.capturing() {
            // Between slices: stores, removals, a clear and a worker's removal, and worker 0
            // cleared then taken over by the other source (its charge moves); the engine
            // member gets a child of its block 11.
            match steps {
                5 => step(&mut live, &engine, child(2, 12, 11)),
                3 => send(&mut live, "src-a", vec![kv(0, KvEventKind::Cleared)]),
                4 => send(&mut live, "src-b", vec![stored(0, 40_000..40_100)]),
                9 => send(
                    &mut live,
                    "src-b",
                    vec![IngestEvent::WorkerRemoved { worker_id: 3 }],
                ),
                n => send(
                    &mut live,
                    "src-a",
                    vec![
                        stored(2, 30_000 + n * 10..30_000 + n * 10 + 10),
                        kv(
                            4,
                            KvEventKind::Removed {
                                block_hashes: (n * 7..n * 7 + 5)
                                    .map(|i| hash(20_000 + i))
                                    .collect(),
                            },
                        ),
                    ],
                ),
            }
            live.slices();
            steps += 1;
        }
        assert!(steps > 20, "the capture took {steps} steps");
        send(&mut live, "src-a", vec![stored(5, 50_000..50_010)]);
        // After the capture: a grandchild, which translates only through block 12's lineage.
        step(&mut live, &engine, child(3, 13, 12));
        assert_eq!(live.state.member_blocks(MemberId::new(7, 0)).len(), 4);
        live.state.finish_releases();
        let expected = live.state.ownership_image();
        assert_eq!(
            expected
                .iter()
                .find(|m| m.member == MemberId::new(0, 0))
                .and_then(|m| m.charged_to.as_deref()),
            Some("src-b")
        );
        let journal = live.journal.take().expect("journal");
        journal.sync().expect("synced");
        journal.close().expect("closed");

        let (journal, recovered) = open();
        drop(journal);
        assert!(
            recovered.checkpoint_number.is_some(),
            "the checkpoint was written"
        );
        assert!(
            recovered.records.iter().any(|r| matches!(
                postcard::from_bytes::<super::LogRecord>(r),
                Ok(super::LogRecord::Charges(_))
            )),
            "the capture's end is logged"
        );
        let mut restored = fresh();
        restored
            .restore(&recovered.checkpoint, &recovered.records)
            .expect("restores");
        assert_eq!(restored.state.ownership_image(), expected);
        assert_eq!(
            restored.state.stats().unique_blocks,
            live.state.stats().unique_blocks
        );
        assert_eq!(restored.engine_sequences(), live.engine_sequences());
        assert_eq!(restored.feed.image(), live.feed.image(), "the same lineage");
        for source in ["src-a", "src-b"] {
            assert_eq!(
                restored.state.source_held(source),
                live.state.source_held(source),
                "{source}"
            );
        }
    }

    /// A checkpoint starts with the state's size, and a restore sizes the block map from it
    /// before storing: 30,000 blocks (a fifth of them owned by two members) restore with one
    /// rebuild of an empty map. A checkpoint written before the summary existed (the same
    /// records without it) still restores the same ownership, growing the map on the way.
    #[test]
    fn a_restore_sizes_the_block_map_from_the_checkpoint_summary() {
        let mut live = fresh();
        let hashes: Vec<u64> = (1..=30_000u64)
            .map(|h| h.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .collect();
        for (i, blocks) in hashes.chunks(1_000).enumerate() {
            live.state.store(MemberId::new(i as u64 % 8, 0), blocks);
        }
        live.state.store(MemberId::new(100, 0), &hashes[..6_000]);
        let unique = live.state.stats().unique_blocks;
        assert_eq!(unique, 30_000);
        let expected = live.state.ownership_image();

        let checkpoint = live.checkpoint_records();
        assert_eq!(
            postcard::from_bytes::<CheckpointRecord>(&checkpoint[0]).unwrap(),
            CheckpointRecord::Summary {
                unique_blocks: 30_000
            }
        );
        let mut restored = fresh();
        let report = restored.restore(&checkpoint, &[]).expect("restores");
        assert_eq!(report.summary_blocks, 30_000);
        assert_eq!(report.presized_blocks, 36_000);
        assert_eq!(report.edges, 36_000);
        assert_eq!(restored.state.ownership_image(), expected);
        assert_eq!(
            restored.state.stats().block_map_rebuilds,
            1,
            "the map grew during a presized restore"
        );

        let mut old = fresh();
        let report = old.restore(&checkpoint[1..], &[]).expect("restores");
        assert_eq!((report.summary_blocks, report.presized_blocks), (0, 0));
        assert_eq!(old.state.ownership_image(), expected);
        assert!(old.state.stats().block_map_rebuilds > 5);

        // A summary claiming more blocks than the checkpoint has bytes (a writer bug) sizes
        // the map for the bytes at most, and the ownership is restored all the same.
        let mut crafted = checkpoint.clone();
        crafted[0] = super::encode(&CheckpointRecord::Summary {
            unique_blocks: u64::MAX,
        });
        let bytes: u64 = crafted.iter().map(|r| r.len() as u64).sum();
        let mut restored = fresh();
        let report = restored.restore(&crafted, &[]).expect("restores");
        assert_eq!(report.summary_blocks, u64::MAX);
        assert_eq!(
            report.presized_blocks,
            (bytes + bytes / 5).min(restored.state.format().slot_count())
        );
        assert_eq!(restored.state.ownership_image(), expected);
    }
}
