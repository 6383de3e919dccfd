//! Clears in slices: a member's `Cleared`, a worker's removal and the engine path's member
//! clears drop every edge of some owner tags, and the block map has no per-member block list
//! (see `ownership`'s docs), so finding those edges means sweeping the whole map. This module
//! makes that sweep cheap per block and cuts it into slices the caller runs between other work.
//!
//! * **At the clear** the tags are *retired*: their members own nothing from then on (a later
//!   store by the same member gets a fresh tag), their sources' holdings drop at once, and the
//!   clear's outcome counts every edge released. Exact queries ([`DcCkfState::refcount`](crate::dc::DcCkfState::refcount),
//!   [`DcCkfState::owns`](crate::dc::DcCkfState::owns), the ownership image) already leave retired tags out.
//! * **The sweep** drops the retired tags from the blocks, [`DcCkfConfig::slice_lines`]
//!   block-map lines per [`DcCkfState::release_step`](crate::dc::DcCkfState::release_step); a block left without owners loses its
//!   fingerprint then, so the table (and what is published from it) follows slice by slice.
//!   The test per block is one bit of a [`TagSet`], so a sweep costs the table's entries plus the
//!   edges it drops, however many tags (dp ranks) retire together.
//! * **A retired tag is freed** (reusable) only when its edge count reaches 0. Stores between
//!   slices may move entries across the sweep's cursor (cuckoo displacement, a growth or a
//!   shrink); a tag whose edges were not all found in one pass gets another pass, so no freed
//!   tag is ever left on a block.
//! * Retirements during a pass join it; the pass ends once every retired edge is dropped, or
//!   at the end of the table (then the stash is swept too).
//!
//! [`DcCkfConfig::slice_lines`]: crate::dc::DcCkfConfig::slice_lines

use super::blocks::Blocks;
use super::ownership::Members;
use super::tags::{Tag, TagSet};

/// The clears in progress.
#[derive(Debug, Clone, Default)]
pub(crate) struct Releases {
    /// Retired tags whose edges are still being dropped.
    pub dying: TagSet,
    /// The same tags, in retirement order.
    tags: Vec<Tag>,
    /// Next block-map line of the current pass.
    cursor: usize,
    /// Edges of retired tags not dropped yet.
    pub remaining: u64,
}

impl Releases {
    /// Whether no clear is in progress.
    pub fn is_empty(&self) -> bool {
        self.tags.is_empty()
    }

    /// Heap bytes.
    pub fn bytes_used(&self) -> usize {
        self.dying.bytes_used() + self.tags.capacity() * std::mem::size_of::<Tag>()
    }
}

impl Releases {
    /// Retires `tags` (see the module docs); returns the edges they held, which the sweep will
    /// drop.
    pub(super) fn retire(&mut self, members: &mut Members, tags: &[Tag]) -> u64 {
        let mut edges = 0u64;
        for &tag in tags {
            edges += u64::from(members.peek(tag).owned);
            members.retire(tag);
            if self.dying.insert(tag) {
                self.tags.push(tag);
            }
        }
        self.remaining += edges;
        edges
    }

    /// Sweeps one slice of the clears in progress (not empty): `slice_lines` block-map lines
    /// (the whole map when that is 0), see the module docs. Returns whether work remains; when
    /// it returns `false` every clear is finished and the caller gives the memory back.
    pub(super) fn sweep_slice(
        &mut self,
        members: &mut Members,
        blocks: &mut Blocks,
        slice_lines: u32,
    ) -> bool {
        let lines = blocks.blocks.line_count();
        let slice = slice_lines as usize;
        let start = self.cursor;
        let end = if slice == 0 {
            lines
        } else {
            start.saturating_add(slice).min(lines)
        };
        let at_end = end >= lines;
        let remaining = &mut self.remaining;
        blocks.sweep(start..end, at_end, &self.dying, |tag| {
            members.record(tag).owned -= 1;
            *remaining -= 1;
        });
        self.cursor = end;
        if self.remaining > 0 && !at_end {
            return true;
        }
        // The pass is over: free the tags it emptied; the rest (entries moved behind the
        // cursor meanwhile) take another pass.
        self.cursor = 0;
        let dying = &mut self.dying;
        self.tags.retain(|&tag| {
            if members.peek(tag).owned > 0 {
                return true;
            }
            members.free_retired(tag);
            dying.remove(tag);
            false
        });
        if !self.tags.is_empty() {
            return true;
        }
        debug_assert_eq!(self.remaining, 0);
        self.tags = Vec::new();
        false
    }
}

#[cfg(test)]
mod tests;
