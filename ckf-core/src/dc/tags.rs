//! Owner tags: the small dense ids members own blocks under (packed 21 bits each in the block
//! map's owners words, see `block_map.rs`, "Tag limit"), and [`TagSet`], a set of them.

/// Owner tag of a member (`1..=MAX_TAG`; 0 marks an unused inline owner entry).
pub(crate) type Tag = u32;

/// Bits of one owner tag in the packed owners word.
pub(crate) const TAG_BITS: u32 = 21;
/// Largest owner tag: `2^21 - 1`.
pub(crate) const MAX_TAG: Tag = (1 << TAG_BITS) - 1;

/// A set of owner tags as a bitmap (one bit per tag up to the largest inserted; at most
/// 256 KiB for [`MAX_TAG`]): membership is one load whatever the set's size. Tag 0 is never
/// a member.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TagSet {
    words: Vec<u64>,
    len: usize,
}

impl TagSet {
    /// Whether `tag` is in the set.
    #[inline(always)]
    pub fn contains(&self, tag: Tag) -> bool {
        self.words
            .get(tag as usize >> 6)
            .is_some_and(|w| w >> (tag & 63) & 1 != 0)
    }

    /// Adds `tag` (not 0); whether it was new.
    pub fn insert(&mut self, tag: Tag) -> bool {
        debug_assert!(tag != 0);
        let i = tag as usize >> 6;
        if i >= self.words.len() {
            self.words.resize(i + 1, 0);
        }
        let bit = 1u64 << (tag & 63);
        let new = self.words[i] & bit == 0;
        self.words[i] |= bit;
        self.len += usize::from(new);
        new
    }

    /// Removes `tag`; whether it was there. An emptied set gives its memory back.
    pub fn remove(&mut self, tag: Tag) -> bool {
        let i = tag as usize >> 6;
        let bit = 1u64 << (tag & 63);
        let Some(w) = self.words.get_mut(i).filter(|w| **w & bit != 0) else {
            return false;
        };
        *w &= !bit;
        self.len -= 1;
        if self.len == 0 {
            self.words = Vec::new();
        }
        true
    }

    /// Heap bytes.
    pub fn bytes_used(&self) -> usize {
        self.words.capacity() * 8
    }
}
