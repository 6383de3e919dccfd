//! Dropping retired owner tags from the block map: slices of lines swept against a
//! [`TagSet`], whole-map releases, and the refcount that leaves dying tags out.

use super::*;

impl BlockMap {
    /// Lines of the table (the unit of [`sweep`](Self::sweep)'s ranges).
    pub fn line_count(&self) -> usize {
        self.lines.len()
    }

    /// Drops every tag in `dying` from every block in lines `range` (cut to the table), the
    /// stash too when `stash` is set: calls `dropped(tag)` per edge dropped and `emptied(key)`
    /// for each block left without owners (already removed). Costs the entries in `range` and,
    /// per block, its owners: the set test is one bit, whatever the number of dying tags.
    pub fn sweep(
        &mut self,
        range: std::ops::Range<usize>,
        stash: bool,
        dying: &TagSet,
        mut dropped: impl FnMut(Tag),
        mut emptied: impl FnMut(u64),
    ) {
        let Self {
            lines,
            len,
            stash: stashed,
            spill,
            spill_tags,
            ..
        } = self;
        let end = range.end.min(lines.len());
        let start = range.start.min(end);
        for entry in lines[start..end].iter_mut().flat_map(|l| l.0.iter_mut()) {
            if entry.owners == 0 || !Self::any_dying(entry.owners, dying) {
                continue;
            }
            entry.owners = Self::strip(
                spill,
                spill_tags,
                entry.key,
                entry.owners,
                dying,
                &mut dropped,
            );
            if entry.owners == 0 {
                emptied(entry.key);
                *entry = Entry::default();
                *len -= 1;
            }
        }
        if stash {
            stashed.retain(|&key, word| {
                if !Self::any_dying(*word, dying) {
                    return true;
                }
                *word = Self::strip(spill, spill_tags, key, *word, dying, &mut dropped);
                if *word != 0 {
                    return true;
                }
                emptied(key);
                *len -= 1;
                false
            });
        }
    }

    /// Whether `word` may hold a dying tag: one of its inline tags is, or it spills (the
    /// spilled tags are looked at by [`strip`](Self::strip)).
    #[inline(always)]
    pub(super) fn any_dying(word: u64, dying: &TagSet) -> bool {
        word & SPILL_FLAG != 0 || (0..INLINE).any(|i| dying.contains(tag_at(word, i)))
    }

    /// `word` (of `key`) without its dying tags, spilled ones first so every refill of an
    /// inline hole is a live tag.
    pub(super) fn strip(
        spill: &mut HashMap<u64, Vec<Tag>, FoldHashBuilder>,
        spill_tags: &mut usize,
        key: u64,
        mut word: u64,
        dying: &TagSet,
        dropped: &mut impl FnMut(Tag),
    ) -> u64 {
        if word & SPILL_FLAG != 0
            && let Some(v) = spill.get_mut(&key)
        {
            v.retain(|&t| {
                let dies = dying.contains(t);
                if dies {
                    dropped(t);
                }
                !dies
            });
            if v.is_empty() {
                *spill_tags -= v.capacity();
                spill.remove(&key);
                word &= !SPILL_FLAG;
            }
        }
        for i in 0..INLINE {
            let t = tag_at(word, i);
            if dying.contains(t)
                && let Some(w) = Self::dropped(spill, spill_tags, key, word, t)
            {
                dropped(t);
                word = w;
            }
        }
        word
    }

    /// Drops every tag in `tags` from every block (one [`sweep`](Self::sweep) of the whole
    /// map); calls `emptied(key)` for each block left without owners. Returns the edges
    /// released.
    #[cfg(test)]
    pub fn release_all(&mut self, tags: &[Tag], emptied: impl FnMut(u64)) -> u64 {
        let mut dying = TagSet::default();
        for &t in tags {
            dying.insert(t);
        }
        let mut released = 0u64;
        self.sweep(0..usize::MAX, true, &dying, |_| released += 1, emptied);
        released
    }

    /// Owners of `key` outside `dying` (0 when untracked).
    pub fn live_refcount(&self, key: u64, dying: &TagSet) -> u32 {
        let Some(pos) = self.find(key, self.probe(key)) else {
            return 0;
        };
        let word = self.word(pos, key);
        let inline = (0..INLINE)
            .filter(|&i| {
                let t = tag_at(word, i);
                t != 0 && !dying.contains(t)
            })
            .count() as u32;
        let spilled = if word & SPILL_FLAG != 0 {
            self.spill
                .get(&key)
                .map_or(0, |v| v.iter().filter(|&&t| !dying.contains(t)).count()) as u32
        } else {
            0
        };
        inline + spilled
    }
}
