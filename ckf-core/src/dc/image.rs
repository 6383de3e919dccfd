//! Ownership images: the exact, logical part of a [`DcCkfState`] as plain values, so a producer
//! can write durability checkpoints and, on start, rebuild its state from them instead of from
//! every worker re-announcing its cache.
//!
//! An image holds what the table is a projection of (design source, "Producer invariants"):
//! each member's owned block hashes and the ingest source it is charged to ([`quota`]'s docs).
//! It holds no bucket word, kick or dirty state: the table is rebuilt from the blocks by
//! ordinary insertion, so a restored state is a new *producer generation* whose table must
//! reach consumers through a barrier snapshot (design source, "Lane recovery and failure
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
//! [`quota`]: super::quota

use super::{DcCkfState, EventOutcome, MemberId};

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
        self.proj.blocks.for_each_edge(|hash, tag| {
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
}
