//! Per member: engine block hash -> canonical block hash.
//!
//! (Rule in the crate README, "Lineage rule".)

use std::collections::BTreeMap;

use ckf_core::dc::{KvEvent, MemberId};
use ckf_core::tokens::BlockSeed;

use crate::event::EngineEvent;
use crate::filters::{EngineFilters, Skip};

/// Why (part of) an event was not turned into a [`KvEvent`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SkipReason {
    /// The filter rule refused the event ([`crate::filters`]).
    Filter(Skip),
    /// A store whose parent engine hash this member's lineage does not know: the canonical
    /// chain cannot be computed, so nothing of the event is applied.
    Orphan,
    /// A removed engine hash this member's lineage does not know (a no-op).
    UnknownRemoval,
    /// A stored engine hash already known with a different canonical hash (an engine hash
    /// collision or an engine bug): the first mapping is kept, the block is not re-applied.
    Conflict,
    /// An event of a type this crate does not know.
    UnknownEvent,
}

impl SkipReason {
    /// A short stable label for metrics: the [`Skip::label`], or `"orphan"`,
    /// `"unknown_removal"`, `"conflict"`, `"unknown_event"`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Filter(s) => s.label(),
            Self::Orphan => "orphan",
            Self::UnknownRemoval => "unknown_removal",
            Self::Conflict => "conflict",
            Self::UnknownEvent => "unknown_event",
        }
    }
}

/// The result of translating one engine event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Translation {
    /// The event to apply to `DcCkfState`, if any (block hashes canonical).
    pub kv_event: Option<KvEvent>,
    /// What was skipped, with the number of blocks (1 for an event without blocks); each
    /// reason at most once.
    pub skipped: Vec<(SkipReason, u32)>,
}

/// One known engine block of a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    canonical: u64,
    seed: BlockSeed,
}

#[derive(Debug, Clone, Default)]
struct MemberLineage {
    /// Engine hash -> canonical hash and the seed of its chain.
    blocks: std::collections::HashMap<u64, Entry>,
    /// Canonical hash -> number of engine hashes of this member mapping to it (>= 1).
    refs: std::collections::HashMap<u64, u32>,
}

/// Every member's engine-to-canonical map (see the module docs and the crate README).
#[derive(Debug, Clone, Default)]
pub struct Lineage {
    members: BTreeMap<MemberId, MemberLineage>,
}

impl Lineage {
    /// An empty lineage.
    pub fn new() -> Self {
        Self::default()
    }

    /// Translates one engine event of `member` into a canonical [`KvEvent`], updating the
    /// lineage. Pure bookkeeping: the caller applies `kv_event` to the state.
    pub fn translate(
        &mut self,
        member: MemberId,
        event: &EngineEvent,
        filters: &EngineFilters,
    ) -> Translation {
        let _ = (member, event, filters);
        todo!()
    }

    /// Forgets `member`'s lineage (after its state was cleared: restart, failed replay).
    /// Returns whether it had one.
    pub fn clear_member(&mut self, member: MemberId) -> bool {
        self.members.remove(&member).is_some()
    }

    /// Members with a (non-empty) lineage, sorted.
    pub fn members(&self) -> Vec<MemberId> {
        self.members.keys().copied().collect()
    }

    /// The canonical hash and seed `member` maps `engine_hash` to, if known.
    pub fn lookup(&self, member: MemberId, engine_hash: u64) -> Option<(u64, BlockSeed)> {
        let e = self.members.get(&member)?.blocks.get(&engine_hash)?;
        Some((e.canonical, e.seed))
    }

    /// Number of engine hashes `member`'s lineage holds.
    pub fn len(&self, member: MemberId) -> usize {
        self.members.get(&member).map_or(0, |m| m.blocks.len())
    }

    /// Estimated heap bytes held (entries times their size, hash-table overhead included
    /// roughly), for a memory gauge.
    pub fn bytes_used(&self) -> usize {
        todo!()
    }
}
