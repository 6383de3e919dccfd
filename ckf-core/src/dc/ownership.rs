//! Exact ownership storage: one map keyed by block hash holds the refcount *and* the owners,
//! so a store or remove costs one hash probe for both (the design's `member_blocks` and
//! `dc_refcounts` in a single structure: [`super::block_map`]); this module holds the members.
//!
//! * Members get a small dense *tag* (`1..=MAX_TAG`, 0 = none) while they own blocks; tags are
//!   reused after a member's last block goes. At most [`MAX_TAG`] (2^21 - 1) members own blocks
//!   at once: the block map packs three 21-bit tags per entry.
//! * The block map keeps up to three owner tags inline (most blocks have one or two owners);
//!   any further owners of that block live in its spill map.
//!   Invariant: `refcount == inline owners + spilled owners of that hash`.
//! * There is no per-member block set. Clearing a member (or a worker's ranks, in one go) is a
//!   single pass over the block map that drops the member's tags: O(unique blocks), a few
//!   nanoseconds per block. Clears are rare (a worker restart or cache reset) while stores and
//!   removes are the hot path; a per-member set would cost every store and remove a second hash
//!   probe and 9-18 bytes per ownership edge.

use std::collections::HashMap;

use super::events::MemberId;
use super::hasher::FoldHashBuilder;
use super::quota::Charges;

pub(crate) use super::tags::{MAX_TAG, Tag};

/// One member's bookkeeping.
#[derive(Debug, Clone, Default)]
pub(crate) struct MemberRecord {
    pub id: Option<MemberId>,
    /// Blocks the member owns now.
    pub owned: u32,
    /// Charge index of the source the member is charged to in [`Charges`] (0 = none; see
    /// `quota`'s docs).
    pub charge: u32,
}

/// Member id -> tag, and the per-tag records.
#[derive(Debug, Clone)]
pub(crate) struct Members {
    pub index: HashMap<MemberId, Tag, FoldHashBuilder>,
    /// Largest tag handed out ([`MAX_TAG`]; lowered by tests to reach the limit cheaply).
    pub tag_limit: Tag,
    records: Vec<MemberRecord>,
    free: Vec<Tag>,
    /// What each source holds (blocks of the members charged to it).
    pub charges: Charges,
    /// Tags (dp ranks) per worker id.
    workers: HashMap<u64, u32, FoldHashBuilder>,
}

impl Default for Members {
    fn default() -> Self {
        Self {
            index: HashMap::default(),
            tag_limit: MAX_TAG,
            records: Vec::new(),
            free: Vec::new(),
            charges: Charges::default(),
            workers: HashMap::default(),
        }
    }
}

impl Members {
    /// The tag of `member`, if it owns blocks.
    #[inline]
    pub fn tag(&self, member: MemberId) -> Option<Tag> {
        self.index.get(&member).copied()
    }

    /// The tag of `member`, assigning one if needed. `None` when `member` has no tag and
    /// `tag_limit` members already own blocks (the block map packs 21-bit tags).
    pub fn tag_or_insert(&mut self, member: MemberId) -> Option<Tag> {
        if let Some(&t) = self.index.get(&member) {
            return Some(t);
        }
        let t = match self.free.pop() {
            Some(t) => t,
            None if self.records.len() < self.tag_limit as usize => {
                self.records.push(MemberRecord::default());
                self.records.len() as Tag
            }
            None => return None,
        };
        self.records[t as usize - 1].id = Some(member);
        self.index.insert(member, t);
        *self.workers.entry(member.worker_id).or_default() += 1;
        Some(t)
    }

    /// Ranks of `worker_id` owning blocks.
    pub fn worker_ranks(&self, worker_id: u64) -> u32 {
        self.workers.get(&worker_id).copied().unwrap_or(0)
    }

    /// The tags of `worker_id`'s ranks. O(members) when the worker has any.
    pub fn worker_tags(&self, worker_id: u64) -> Vec<Tag> {
        if self.worker_ranks(worker_id) == 0 {
            return Vec::new();
        }
        self.index
            .iter()
            .filter(|(m, _)| m.worker_id == worker_id)
            .map(|(_, &t)| t)
            .collect()
    }

    /// Detaches `tag` from its member: the member owns nothing from now on (its index entry
    /// goes, its source's holding drops by what it owned), while the record keeps `owned` as
    /// the edges left to sweep. The tag stays taken until [`free_retired`](Self::free_retired).
    pub fn retire(&mut self, tag: Tag) {
        let record = &mut self.records[tag as usize - 1];
        let Some(id) = record.id.take() else {
            return;
        };
        self.index.remove(&id);
        Self::forget_rank(&mut self.workers, id.worker_id);
        self.uncharge(tag);
    }

    /// Takes `tag`'s member off its source's charge, if it has one: the source no longer
    /// holds its blocks.
    pub fn uncharge(&mut self, tag: Tag) {
        let record = &mut self.records[tag as usize - 1];
        let charge = std::mem::take(&mut record.charge);
        if charge != 0 {
            let owned = u64::from(record.owned);
            self.charges.get(charge).held -= owned;
            self.charges.release_member(charge);
        }
    }

    /// Makes a retired tag whose edges are all swept reusable.
    pub fn free_retired(&mut self, tag: Tag) {
        debug_assert_eq!(self.records[tag as usize - 1].owned, 0);
        debug_assert!(self.records[tag as usize - 1].id.is_none());
        self.free.push(tag);
    }

    fn forget_rank(workers: &mut HashMap<u64, u32, FoldHashBuilder>, worker_id: u64) {
        if let Some(n) = workers.get_mut(&worker_id) {
            *n -= 1;
            if *n == 0 {
                workers.remove(&worker_id);
            }
        }
    }

    /// One past the largest tag ever handed out and not shrunk away: every live tag is below
    /// it (for tables indexed by `tag - 1`).
    pub fn tag_bound(&self) -> usize {
        self.records.len()
    }

    /// The bookkeeping record of a tag.
    #[inline]
    pub fn record(&mut self, tag: Tag) -> &mut MemberRecord {
        &mut self.records[tag as usize - 1]
    }

    /// The bookkeeping record of a tag, read-only.
    #[inline]
    pub fn peek(&self, tag: Tag) -> &MemberRecord {
        &self.records[tag as usize - 1]
    }

    /// Frees `tag` if its member owns nothing (and releases its source charge).
    pub fn release_if_empty(&mut self, tag: Tag) {
        let record = &mut self.records[tag as usize - 1];
        if record.owned == 0
            && let Some(id) = record.id.take()
        {
            self.index.remove(&id);
            Self::forget_rank(&mut self.workers, id.worker_id);
            self.free.push(tag);
            let charge = std::mem::take(&mut record.charge);
            if charge != 0 {
                self.charges.release_member(charge);
            }
        }
    }

    /// `tag`'s member owns `added` more and `dropped` fewer blocks than its record says:
    /// updates the record and its charged source's holding.
    #[inline]
    pub fn adjust(&mut self, tag: Tag, added: u32, dropped: u32) {
        let record = &mut self.records[tag as usize - 1];
        record.owned = record.owned + added - dropped;
        if record.charge != 0 {
            let charge = self.charges.get(record.charge);
            charge.held = charge.held + u64::from(added) - u64::from(dropped);
        }
    }

    /// Charges `tag`'s member (which must be uncharged) to `source`: the source now holds its
    /// blocks.
    pub fn charge(&mut self, tag: Tag, source: &str) {
        let index = self.charges.index_or_insert(source);
        let record = &mut self.records[tag as usize - 1];
        debug_assert_eq!(record.charge, 0, "member charged twice");
        record.charge = index;
        let charge = self.charges.get(index);
        charge.members += 1;
        charge.held += u64::from(record.owned);
    }

    /// Gives memory back after members left: shrinks the index when it is far below its
    /// capacity (see `shrink_map`) and drops free records at the end of the record table.
    pub fn shrink(&mut self) {
        super::maps::shrink_map(&mut self.index);
        super::maps::shrink_map(&mut self.workers);
        if self.index.is_empty() {
            self.index = HashMap::default();
            self.workers = HashMap::default();
            self.records = Vec::new();
            self.free = Vec::new();
            return;
        }
        // Tags are positions, so only a free tail can go; same hysteresis as the maps.
        if self.records.len() > super::maps::SHRINK_MIN_CAPACITY
            && self.index.len() < self.records.len() / 4
        {
            while self.records.last().is_some_and(|r| r.id.is_none()) {
                self.records.pop();
            }
            let len = self.records.len() as Tag;
            self.free.retain(|&t| t <= len);
            self.records.shrink_to(self.records.len() * 2);
            self.free.shrink_to(self.free.len() * 2);
        }
    }

    /// Heap bytes (capacity-based estimate).
    pub fn bytes_used(&self) -> usize {
        super::stats::hash_table_bytes(
            self.index.capacity(),
            std::mem::size_of::<(MemberId, Tag)>(),
        ) + self.records.capacity() * std::mem::size_of::<MemberRecord>()
            + self.free.capacity() * 4
            + self.charges.bytes_used()
            + super::stats::hash_table_bytes(self.workers.capacity(), 16)
    }
}
