//! Exact ownership storage: one map keyed by block hash holds the refcount *and* the owners,
//! so a store or remove costs one hash probe for both (the design's `member_blocks` and
//! `dc_refcounts` in a single structure).
//!
//! * Members get a small dense *tag* (`1..`, 0 = none) while they own blocks; tags are reused
//!   after a member's last block goes.
//! * [`Owners`] keeps up to three owner tags inline (most blocks have one or two owners); any
//!   further owners of that block live in a spill set of `(block hash, tag)`.
//!   Invariant: `refcount == inline owners + spilled owners of that hash`.
//! * There is no per-member block set. Clearing a member (or a worker's ranks, in one go) is a
//!   single pass over the block map that drops the member's tags: O(unique blocks), a few
//!   nanoseconds per block. Clears are rare (a worker restart or cache reset) while stores and
//!   removes are the hot path; a per-member set would cost every store and remove a second hash
//!   probe and 9-18 bytes per ownership edge.

use std::collections::{HashMap, HashSet};

use super::MemberId;
use super::hasher::FoldHashBuilder;
use super::quota::Charges;

/// Owner tag of a member (`>= 1`; 0 marks an unused inline owner entry).
pub(crate) type Tag = u32;

/// Owners beyond the inline three: `(block hash, tag)`.
pub(crate) type Spill = HashSet<(u64, Tag), FoldHashBuilder>;

/// Refcount and inline owners of one tracked block (16 bytes).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Owners {
    pub refcount: u32,
    pub inline: [Tag; 3],
}

impl Owners {
    #[inline]
    fn inline_len(&self) -> u32 {
        self.inline.iter().filter(|&&t| t != 0).count() as u32
    }
}

/// Block hash -> owners, plus the spill set for blocks with more than three owners.
#[derive(Debug, Clone, Default)]
pub(crate) struct BlockOwners {
    pub map: HashMap<u64, Owners, FoldHashBuilder>,
    spill: Spill,
}

impl BlockOwners {
    /// Whether `tag` owns `hash` given its entry `o`.
    #[inline]
    pub fn has_owner(spill: &Spill, hash: u64, o: &Owners, tag: Tag) -> bool {
        o.inline.contains(&tag) || (o.refcount > o.inline_len() && spill.contains(&(hash, tag)))
    }

    /// Whether `tag` owns `hash`.
    pub fn owns(&self, hash: u64, tag: Tag) -> bool {
        self.map
            .get(&hash)
            .is_some_and(|o| Self::has_owner(&self.spill, hash, o, tag))
    }

    /// Adds `tag` as an owner of an existing entry (caller checked it is not one already).
    #[inline]
    pub fn add_owner(spill: &mut Spill, hash: u64, o: &mut Owners, tag: Tag) {
        match o.inline.iter_mut().find(|t| **t == 0) {
            Some(hole) => *hole = tag,
            None => {
                spill.insert((hash, tag));
            }
        }
        o.refcount += 1;
    }

    /// Drops `tag` as an owner of `hash`'s entry `o`; `false` when it was not one.
    #[inline]
    pub fn drop_owner(spill: &mut Spill, hash: u64, o: &mut Owners, tag: Tag) -> bool {
        if let Some(t) = o.inline.iter_mut().find(|t| **t == tag) {
            *t = 0;
        } else if !(o.refcount > o.inline_len() && spill.remove(&(hash, tag))) {
            return false;
        }
        o.refcount -= 1;
        true
    }

    /// Calls `f(hash, tag)` once per ownership edge, in no order: the inline owners in one pass
    /// over the map, then the spilled ones (an edge lives in exactly one of the two). O(edges).
    pub fn for_each_edge(&self, mut f: impl FnMut(u64, Tag)) {
        for (&hash, o) in &self.map {
            for &tag in o.inline.iter().filter(|&&t| t != 0) {
                f(hash, tag);
            }
        }
        for &(hash, tag) in &self.spill {
            f(hash, tag);
        }
    }

    /// The map and the spill set, borrowed apart (for the entry API).
    #[inline]
    pub fn parts(&mut self) -> (&mut HashMap<u64, Owners, FoldHashBuilder>, &mut Spill) {
        (&mut self.map, &mut self.spill)
    }

    /// Heap bytes (capacity-based estimate, see `DcCkfStats::bytes_used`).
    pub fn bytes_used(&self) -> usize {
        super::stats::hash_table_bytes(self.map.capacity(), std::mem::size_of::<(u64, Owners)>())
            + super::stats::hash_table_bytes(
                self.spill.capacity(),
                std::mem::size_of::<(u64, Tag)>(),
            )
    }
}

/// One member's bookkeeping.
#[derive(Debug, Clone, Default)]
pub(crate) struct MemberRecord {
    pub id: Option<MemberId>,
    /// Blocks the member owns now.
    pub owned: u32,
    /// Slot of the source the member is charged to in [`Charges`] (0 = none; see
    /// `quota`'s docs).
    pub charge: u32,
}

/// Member id -> tag, and the per-tag records.
#[derive(Debug, Clone, Default)]
pub(crate) struct Members {
    pub index: HashMap<MemberId, Tag, FoldHashBuilder>,
    records: Vec<MemberRecord>,
    free: Vec<Tag>,
    /// What each source holds (blocks of the members charged to it).
    pub charges: Charges,
}

impl Members {
    /// The tag of `member`, if it owns blocks.
    #[inline]
    pub fn tag(&self, member: MemberId) -> Option<Tag> {
        self.index.get(&member).copied()
    }

    /// The tag of `member`, assigning one if needed.
    pub fn tag_or_insert(&mut self, member: MemberId) -> Tag {
        if let Some(&t) = self.index.get(&member) {
            return t;
        }
        let t = match self.free.pop() {
            Some(t) => t,
            None => {
                self.records.push(MemberRecord::default());
                self.records.len() as Tag
            }
        };
        self.records[t as usize - 1].id = Some(member);
        self.index.insert(member, t);
        t
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
        let slot = self.charges.slot_or_insert(source);
        let record = &mut self.records[tag as usize - 1];
        debug_assert_eq!(record.charge, 0, "member charged twice");
        record.charge = slot;
        let charge = self.charges.get(slot);
        charge.members += 1;
        charge.held += u64::from(record.owned);
    }

    /// Gives memory back after members left: shrinks the index when it is far below its
    /// capacity (see `shrink_map`) and drops free records at the end of the record table.
    pub fn shrink(&mut self) {
        super::shrink_map(&mut self.index);
        if self.index.is_empty() {
            self.index = HashMap::default();
            self.records = Vec::new();
            self.free = Vec::new();
            return;
        }
        // Tags are positions, so only a free tail can go; same hysteresis as the maps.
        if self.records.len() > super::SHRINK_MIN_CAPACITY
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
    }
}
