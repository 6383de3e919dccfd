//! The state actor's journal records: what it writes to its journal (`ckf-journal`) and reads
//! back at a restart (`docs/design.md`, "Lane recovery and failure boundaries": the
//! producer-generation rebuild). Writing them is [`super::journaling`]'s, the rebuild from them
//! [`super::restore`]'s.
//!
//! * **Log records** are the actor's *inputs* that changed something, in the order it applied
//!   them: an ingest batch's applied events (with its source and sequence) and an engine
//!   publisher's step (a decoded batch with its sequence, or a clear). The actor is deterministic, so replaying
//!   them through the same code rebuilds the same exact state, lineage, source sequences and
//!   charges. Quotas are off during replay: what was applied once is never refused on restart
//!   because a limit was lowered. A `Charges` record holds every member's charge where a
//!   checkpoint's capture ended (see [`super::journaling`]).
//! * **Checkpoint records** hold the whole logical state: every member's blocks and charge
//!   ([`MemberImage`]), engine lineage, which members each engine publisher fed and the
//!   sequence of its last applied batch, and the source sequences. The filter table is *not* stored: it is rebuilt from the ownership,
//!   like a new producer generation, and published with a new incarnation and a barrier
//!   snapshot.
//!
//! Both are encoded with postcard (serde); a record that passes its CRC but does not decode
//! is refused like a damaged file.

use ckf_core::dc::{MemberId, MemberImage};
use ckf_engine::event::EngineBatch;
use ckf_engine::lineage::MemberLineageImage;
use ckf_engine::sequence::ClearReason;
use serde::{Deserialize, Serialize};

use crate::engines::PublisherId;
use crate::events::IngestEvent;

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

/// Blocks per checkpoint record at most (~9 bytes each encoded): records stay far below
/// `ckf_journal::record::MAX_RECORD_BYTES`, and a checkpoint is written in pieces of a few MiB.
const BLOCKS_PER_RECORD: usize = 1 << 20;

/// One engine publisher socket, as journaled.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(super) struct PublisherRecord {
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
pub(super) enum ClearRecord {
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
pub(super) enum LogRecordRef<'a> {
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
pub(super) enum LogRecord {
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
pub(super) enum CheckpointRecord {
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
    /// `"checkpoint"` or `"log"`.
    pub(super) what: &'static str,
    /// The record's index in its part.
    pub(super) index: usize,
    /// The decoder's complaint.
    pub(super) why: String,
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
pub(super) struct Capture {
    pub(super) unique_blocks: u64,
    pub(super) members: Vec<MemberImage>,
    pub(super) lineage: Vec<MemberLineageImage>,
    pub(super) fed: Vec<(u64, u32, Vec<MemberId>)>,
    pub(super) sequences: Vec<(u64, u32, i64)>,
    pub(super) identities: Vec<(u64, u32, u64)>,
    pub(super) sources: Vec<(String, u64)>,
}

impl Capture {
    /// The checkpoint records: the summary, members (blocks sorted, at most
    /// [`BLOCKS_PER_RECORD`] per record), lineage, fed members, engine sequences, sources.
    pub(super) fn encode(self) -> Vec<Vec<u8>> {
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

pub(super) fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    postcard::to_allocvec(value).expect("postcard encodes every record type into a Vec")
}

#[cfg(test)]
mod tests;
