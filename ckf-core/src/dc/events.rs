//! KV events and their per-event outcomes (docs/design.md, "Producer invariants").

use std::fmt;

use thiserror::Error;

/// One data-parallel rank of one inference worker: the unit that owns KV blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct MemberId {
    /// Worker id, unique within the pool.
    pub worker_id: u64,
    /// Data-parallel rank within the worker.
    pub dp_rank: u32,
}

impl MemberId {
    /// `(worker_id, dp_rank)`.
    pub const fn new(worker_id: u64, dp_rank: u32) -> Self {
        Self { worker_id, dp_rank }
    }
}

impl fmt::Display for MemberId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "worker {} rank {}", self.worker_id, self.dp_rank)
    }
}

/// What happened to a member's cache.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum KvEventKind {
    /// The member now holds these blocks (block hashes in sequence order).
    Stored {
        /// Sequence block hashes, processed in order.
        block_hashes: Vec<u64>,
        /// Hash of the block preceding the first one, if any. Carried for sources that chain
        /// events; ownership does not depend on it.
        parent_hash: Option<u64>,
    },
    /// The member evicted these blocks.
    Removed {
        /// Sequence block hashes, processed in order.
        block_hashes: Vec<u64>,
    },
    /// The member dropped every block it held.
    Cleared,
}

impl KvEventKind {
    /// A short stable label for metrics: `"stored"`, `"removed"`, `"cleared"`.
    pub fn label(&self) -> &'static str {
        match self {
            KvEventKind::Stored { .. } => "stored",
            KvEventKind::Removed { .. } => "removed",
            KvEventKind::Cleared => "cleared",
        }
    }

    /// The block hashes a store or removal names, in order; empty for [`KvEventKind::Cleared`].
    pub fn block_hashes(&self) -> &[u64] {
        match self {
            KvEventKind::Stored { block_hashes, .. } | KvEventKind::Removed { block_hashes } => {
                block_hashes
            }
            KvEventKind::Cleared => &[],
        }
    }
}

/// One KV event of one member.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct KvEvent {
    /// The member whose cache changed.
    pub member: MemberId,
    /// The change.
    pub kind: KvEventKind,
}

/// Why one block of an event was not applied. The block left no trace in the exact state or
/// the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum BlockError {
    /// Cuckoo insertion found no empty slot within the kick bound: a pre-commit omission
    /// (docs/design.md, "Producer storage and relocation"). No ownership edge was added, no
    /// refcount changed, no bucket was dirtied; a later store of the block may succeed.
    #[error("block {block_hash:#018x} omitted: no free slot within {kicks} kicks")]
    CapacityExhausted {
        /// The omitted block hash.
        block_hash: u64,
        /// Kicks attempted (the configured `max_kicks`).
        kicks: u32,
    },
    /// The member owns no blocks and `limit` other members already do: the exact block map
    /// packs 21-bit owner tags, so at most `limit` (2^21 - 1) members own blocks at once. Like
    /// a capacity omission: no ownership edge, no refcount change, no table change; a store
    /// succeeds once a member has left (its last block removed or cleared).
    #[error("block {block_hash:#018x} omitted: {limit} members already own blocks")]
    MemberLimit {
        /// The omitted block hash.
        block_hash: u64,
        /// Members that may own blocks at once.
        limit: u32,
    },
}

/// What one event (or one store/remove/clear call) did, block by block.
///
/// `applied + omitted + unknown + redundant` equals the number of blocks in the event (for a
/// clear: the number of blocks the member held).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventOutcome {
    /// Blocks whose ownership edge was added (store) or removed (remove, clear).
    pub applied: u32,
    /// Stores omitted for capacity (pre-commit; see [`BlockError::CapacityExhausted`] and
    /// [`BlockError::MemberLimit`]).
    pub omitted: u32,
    /// Removals of a `(member, block hash)` edge that does not exist: idempotent no-ops that
    /// never delete by fingerprint.
    pub unknown: u32,
    /// Stores of a block the member already owns: idempotent no-ops.
    pub redundant: u32,
    /// The first block error of the event, kept for observability.
    pub first_error: Option<BlockError>,
}

impl EventOutcome {
    pub(crate) fn fail(&mut self, error: BlockError) {
        self.omitted += 1;
        self.first_error.get_or_insert(error);
    }

    /// Adds another outcome's counts; keeps the earlier first error.
    pub fn merge(&mut self, other: EventOutcome) {
        self.applied += other.applied;
        self.omitted += other.omitted;
        self.unknown += other.unknown;
        self.redundant += other.redundant;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}
