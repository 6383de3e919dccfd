//! Ownership images: the exact, logical part of a [`DcCkfState`] as plain values, so a producer
//! can write durability checkpoints and, on start, rebuild its state from them instead of from
//! every worker re-announcing its cache.
//!
//! An image holds what the table is a projection of (docs/design.md, "Producer invariants"):
//! each member's owned block hashes and the ingest source it is charged to ([`quota`]'s docs).
//! It holds no bucket word, kick or dirty state: the table is rebuilt from the blocks by
//! ordinary insertion, so a restored state is a new *producer generation* whose table must
//! reach consumers through a barrier snapshot (docs/design.md, "Lane recovery and failure
//! boundaries": suspect exact producer state requires a producer-generation rebuild).
//!
//! ```text
//! state.ownership_image() -> Vec<MemberImage>      sorted by member, blocks ascending
//! fresh.restore_member(&image) -> EventOutcome     per member, no quota check
//! ```
//! After restoring every image into a fresh state: the same members own the same blocks, every
//! refcount and every source's holding are equal, and [`DcCkfState::ownership_image`] returns
//! the same images — unless the rebuilt table omitted a block for capacity (insertion order
//! differs, so a table near its cliff may place fewer blocks); such blocks are counted in the
//! returned outcome as any store omission is.
//!
//! # An image in slices
//! [`ownership_image`](DcCkfState::ownership_image) holds the state for one pass over the
//! block map (~0.16 s at 10^7 blocks). A producer that must not stop that long takes its
//! checkpoint's image in slices between commands instead, as a *fuzzy* image:
//!
//! ```text
//! let mut capture = state.begin_capture();          // the log position P of the checkpoint
//! while state.capture_step(&mut capture) { /* commands run, and are logged after P */ }
//! let charges = state.charge_image();               // journaled at the end E, see below
//! let images = state.capture_images(capture);
//! ```
//! Each block's owners are read once, at some moment between P and E (a slice, or for a
//! block a walk moved meanwhile, the last step). Restoring the images and then replaying
//! every change logged after P gives the live state, because every change is a set operation
//! on one (block, member) edge (a store adds it, a removal drops it, a clear drops all of a
//! member's): an edge's final value is the one its last change after P gave it, or, with no
//! change after P, the one it had at P, which is also what the image read. So at E the
//! replayed ownership equals the live one, edge for edge. Charges are not per edge (a member
//! is charged to the source whose store found it uncharged), so the image's charges are only
//! a start: the caller journals [`charge_image`](DcCkfState::charge_image) at E and replay
//! sets them there ([`restore_charges`](DcCkfState::restore_charges)). Two limits: a store
//! the table had to omit for capacity may be placed on replay (or the reverse), as in any
//! rebuild; and the image is only as fresh as P for whatever else the caller checkpoints
//! (the caller copies that at P).
//!
//! [`quota`]: super::quota

use std::collections::HashMap;

use super::events::{EventOutcome, MemberId};
use super::hasher::FoldHashBuilder;
use super::ownership::Tag;
use super::state::DcCkfState;

/// A checkpoint's ownership image in the making ([`DcCkfState::begin_capture`]; see the
/// module docs, "An image in slices").
#[derive(Debug, Default)]
pub struct OwnershipCapture {
    /// Next block-map line to read.
    cursor: usize,
    /// The block map's rebuild count when this pass started: a rebuild moves every block,
    /// so the pass starts over.
    rebuilds: u64,
    /// Blocks read so far, per member (in table order, possibly repeated).
    blocks: HashMap<MemberId, Vec<u64>, FoldHashBuilder>,
    /// The current step's edges.
    step: Vec<(Tag, u64)>,
    /// Whether the last step ran.
    done: bool,
    /// Passes started over because the block map was rebuilt.
    restarts: u32,
}

impl OwnershipCapture {
    /// Whether every line has been read ([`DcCkfState::capture_step`] returned `false`).
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Passes started over so far because the block map was rebuilt (a growth or shrink)
    /// between steps.
    pub fn restarts(&self) -> u32 {
        self.restarts
    }
}

/// One member's exact ownership, as a durability checkpoint records it (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct MemberImage {
    /// The member.
    pub member: MemberId,
    /// The ingest source the member is charged to (it holds the member's blocks against its
    /// `max_blocks_per_source`), `None` for a member fed only by the trusted engine path.
    pub charged_to: Option<String>,
    /// The block hashes the member owns, ascending, no duplicates; never empty in an image
    /// [`DcCkfState::ownership_image`] made (a member owning nothing is not tracked).
    pub blocks: Vec<u64>,
}

impl DcCkfState {
    /// Every tracked member's [`MemberImage`], sorted by member, each one's blocks ascending.
    ///
    /// [`ownership_image_unsorted`](Self::ownership_image_unsorted), then a sort per member.
    /// Not a hot-path call: meant for periodic checkpoints.
    pub fn ownership_image(&self) -> Vec<MemberImage> {
        let mut images = self.ownership_image_unsorted();
        for image in &mut images {
            image.blocks.sort_unstable();
        }
        images
    }

    /// As [`ownership_image`](Self::ownership_image), but each member's blocks in table
    /// order (no duplicates, not sorted): the part that needs the state, so a caller can
    /// capture it while holding the state and sort elsewhere. One pass over the block map and
    /// the spill set (O(ownership edges)); memory: the images (8 bytes per edge) plus one
    /// `Vec` header per member tag.
    pub fn ownership_image_unsorted(&self) -> Vec<MemberImage> {
        let members = &self.members;
        let mut per_tag: Vec<Vec<u64>> = vec![Vec::new(); members.tag_bound()];
        for &tag in members.index.values() {
            per_tag[tag as usize - 1].reserve_exact(members.peek(tag).owned as usize);
        }
        // Retired tags (a clear still being swept) own nothing.
        let dying = &self.releases.dying;
        self.blocks.blocks.for_each_edge(|hash, tag| {
            if !dying.contains(tag) {
                per_tag[tag as usize - 1].push(hash);
            }
        });
        let mut images: Vec<MemberImage> = members
            .index
            .iter()
            .map(|(&member, &tag)| {
                let record = members.peek(tag);
                let blocks = std::mem::take(&mut per_tag[tag as usize - 1]);
                debug_assert_eq!(blocks.len(), record.owned as usize, "{member}");
                MemberImage {
                    member,
                    charged_to: (record.charge != 0)
                        .then(|| members.charges.peek(record.charge).id.to_string()),
                    blocks,
                }
            })
            .collect();
        images.sort_unstable_by_key(|image| image.member);
        images
    }

    /// Restores one member from its image: stores `image.blocks` for `image.member` as
    /// [`store`](Self::store) does, **without any quota check** (a restart must not lose what
    /// was held because a limit was lowered meanwhile; limits refuse only later stores), then
    /// charges the member to `image.charged_to` exactly as
    /// [`apply_from`](Self::apply_from) would have: only if it now owns blocks and was charged
    /// to nobody. Restoring every image of [`ownership_image`](Self::ownership_image) into a
    /// fresh state therefore gives every source the same holding.
    ///
    /// The outcome is [`store`](Self::store)'s: blocks omitted for capacity are `omitted` (with
    /// `first_error`), and are neither owned nor charged; blocks the member already owns (a
    /// duplicate in the image, or a restore into a non-empty state) are `redundant`.
    pub fn restore_member(&mut self, image: &MemberImage) -> EventOutcome {
        let outcome = self.store(image.member, &image.blocks);
        if let Some(source) = &image.charged_to {
            self.charge_if_uncharged(image.member, source);
        }
        outcome
    }

    /// Starts an ownership image taken in slices (see the module docs): from now until its
    /// last [`capture_step`](Self::capture_step), blocks a walk moves are remembered. Starting
    /// another capture abandons this one.
    pub fn begin_capture(&mut self) -> OwnershipCapture {
        self.blocks.blocks.record_moves(true);
        OwnershipCapture {
            rebuilds: self.blocks.blocks.rebuild_stats().count,
            ..OwnershipCapture::default()
        }
    }

    /// Reads the next [`slice_lines`](super::DcCkfConfig::slice_lines) block-map lines into
    /// `capture` (all of them when that is 0); the last step also reads the stash and every
    /// block moved since the capture began. Returns whether steps remain. A block-map rebuild
    /// since the previous step starts the pass over (counted in
    /// [`OwnershipCapture::restarts`]). Costs the entries read plus their edges, and a sort of
    /// the step's edges by owner.
    pub fn capture_step(&mut self, capture: &mut OwnershipCapture) -> bool {
        if capture.done {
            return false;
        }
        let rebuilds = self.blocks.blocks.rebuild_stats().count;
        if rebuilds != capture.rebuilds {
            capture.rebuilds = rebuilds;
            capture.cursor = 0;
            capture.blocks.clear();
            capture.restarts += 1;
            self.blocks.blocks.record_moves(true);
        }
        let blocks = &self.blocks.blocks;
        let lines = blocks.line_count();
        let slice = self.config.slice_lines as usize;
        let end = if slice == 0 {
            lines
        } else {
            capture.cursor.saturating_add(slice).min(lines)
        };
        let last = end >= lines;
        let step = &mut capture.step;
        blocks.for_each_edge_in(capture.cursor..end, last, |key, tag| step.push((tag, key)));
        if last {
            for key in self.blocks.blocks.take_moved() {
                self.blocks
                    .blocks
                    .for_each_owner(key, |key, tag| step.push((tag, key)));
            }
            self.blocks.blocks.record_moves(false);
        }
        // Grouped by tag, so each tag's member is looked up once per step. A retired tag (a
        // clear being swept) has no member: its edges are gone already.
        step.sort_unstable_by_key(|&(tag, _)| tag);
        for run in step.chunk_by(|a, b| a.0 == b.0) {
            if let Some(member) = self.members.peek(run[0].0).id {
                capture
                    .blocks
                    .entry(member)
                    .or_default()
                    .extend(run.iter().map(|&(_, key)| key));
            }
        }
        step.clear();
        capture.cursor = end;
        capture.done = last;
        !last
    }

    /// The images of a finished capture (see the module docs: to be restored, then the log
    /// after the capture's start replayed): per member the blocks read, **in no order and
    /// possibly repeated** (sort and deduplicate where it costs the state nothing), each
    /// charged to its source as of now.
    ///
    /// # Panics
    /// When `capture` is not [done](OwnershipCapture::is_done).
    pub fn capture_images(&self, capture: OwnershipCapture) -> Vec<MemberImage> {
        assert!(capture.done, "capture_images before the last capture_step");
        capture
            .blocks
            .into_iter()
            .map(|(member, blocks)| MemberImage {
                member,
                charged_to: self.charged_to(member),
                blocks,
            })
            .collect()
    }

    /// The source `member` is charged to, if it owns blocks and has one.
    fn charged_to(&self, member: MemberId) -> Option<String> {
        let tag = self.members.tag(member)?;
        let charge = self.members.peek(tag).charge;
        (charge != 0).then(|| self.members.charges.peek(charge).id.to_string())
    }

    /// Every source and the members charged to it (sources sorted, each one's members
    /// sorted): what [`restore_charges`](Self::restore_charges) sets again. A source is
    /// named once, so the image stays small however many members it holds.
    pub fn charge_image(&self) -> Vec<(String, Vec<MemberId>)> {
        let mut by_source: HashMap<String, Vec<MemberId>> = HashMap::new();
        for &member in self.members.index.keys() {
            if let Some(source) = self.charged_to(member) {
                by_source.entry(source).or_default().push(member);
            }
        }
        let mut charges: Vec<(String, Vec<MemberId>)> = by_source.into_iter().collect();
        charges.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        for (_, members) in &mut charges {
            members.sort_unstable();
        }
        charges
    }

    /// Makes `charges` the members' charges: every tracked member is uncharged, then each
    /// listed member that owns blocks is charged to its source (a member listed twice keeps
    /// the first). Sources' holdings follow. O(members).
    pub fn restore_charges(&mut self, charges: &[(String, Vec<MemberId>)]) {
        let tags: Vec<Tag> = self.members.index.values().copied().collect();
        for tag in tags {
            self.members.uncharge(tag);
        }
        for (source, members) in charges {
            for &member in members {
                self.charge_if_uncharged(member, source);
            }
        }
    }
}
