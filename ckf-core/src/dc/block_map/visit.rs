//! Walking the block map's edges and keys (ownership images, member scans, tests), the moves
//! recorder, memory figures and the invariant check.

use super::*;

impl BlockMap {
    /// Calls `f(key)` for every tracked block, in table order (tests).
    #[cfg(test)]
    pub fn for_each_key(&self, mut f: impl FnMut(u64)) {
        for entry in self.lines.iter().flat_map(|l| l.0.iter()) {
            if entry.owners != 0 {
                f(entry.key);
            }
        }
        for &key in self.stash.keys() {
            f(key);
        }
    }

    /// Calls `f(key, tag)` once per ownership edge, in no particular order. O(edges).
    pub fn for_each_edge(&self, f: impl FnMut(u64, Tag)) {
        self.for_each_edge_in(0..usize::MAX, true, f);
    }

    /// Calls `f(key, tag)` once per ownership edge of the blocks in lines `range` (cut to the
    /// table), and of the stash when `stash` is set. O(entries in range + their edges).
    pub fn for_each_edge_in(
        &self,
        range: std::ops::Range<usize>,
        stash: bool,
        mut f: impl FnMut(u64, Tag),
    ) {
        let end = range.end.min(self.lines.len());
        let start = range.start.min(end);
        for entry in self.lines[start..end].iter().flat_map(|l| l.0.iter()) {
            if entry.owners != 0 {
                self.visit_edges(entry.key, entry.owners, &mut f);
            }
        }
        if stash {
            for (&key, &word) in &self.stash {
                self.visit_edges(key, word, &mut f);
            }
        }
    }

    /// Calls `f(key, tag)` for every owner of `key` (none when untracked).
    pub fn for_each_owner(&self, key: u64, mut f: impl FnMut(u64, Tag)) {
        if let Some(pos) = self.find(key, self.probe(key)) {
            self.visit_edges(key, self.word(pos, key), &mut f);
        }
    }

    #[inline]
    pub(super) fn visit_edges(&self, key: u64, word: u64, f: &mut impl FnMut(u64, Tag)) {
        for i in 0..INLINE {
            let t = tag_at(word, i);
            if t != 0 {
                f(key, t);
            }
        }
        if word & SPILL_FLAG != 0 {
            for &t in self.spill.get(&key).into_iter().flatten() {
                f(key, t);
            }
        }
    }

    /// From now on (`on`) or no longer, remembers every key a walk moves to another line or
    /// to the stash; turning it on forgets what was remembered. A scan by line ranges between
    /// insertions ([`for_each_edge_in`](Self::for_each_edge_in)) misses a key moved from a
    /// line ahead of it to one behind it, and revisits these ([`take_moved`](Self::take_moved)).
    /// A rebuild moves every key: see [`rebuild_stats`](Self::rebuild_stats)'s count.
    pub fn record_moves(&mut self, on: bool) {
        self.moved = on.then(Vec::new);
    }

    /// Keys walks have moved to another line or to the stash since the map was built (a
    /// rebuild's moves are counted in [`rebuild_stats`](Self::rebuild_stats) instead): a scan
    /// by line ranges that saw this count change may have missed a key.
    pub fn moves(&self) -> u64 {
        self.moves
    }

    /// The keys moved since [`record_moves`](Self::record_moves) was turned on (possibly
    /// repeated), and recording goes on from none.
    pub fn take_moved(&mut self) -> Vec<u64> {
        self.moved.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Heap bytes, from the allocated capacities: the lines (`lines * 64`), the stash and spill
    /// maps (hashbrown layout, see `stats::hash_table_bytes`) and the spill vectors.
    pub fn bytes_used(&self) -> usize {
        self.lines.capacity() * std::mem::size_of::<Line>()
            + crate::dc::stats::hash_table_bytes(
                self.stash.capacity(),
                std::mem::size_of::<(u64, u64)>(),
            )
            + crate::dc::stats::hash_table_bytes(
                self.spill.capacity(),
                std::mem::size_of::<(u64, Vec<Tag>)>(),
            )
            + self.spill_tags * std::mem::size_of::<Tag>()
            + self.moved.as_ref().map_or(0, |m| m.capacity() * 8)
    }

    /// Checks the internal invariants (tests).
    #[cfg(test)]
    pub fn check(&self) {
        let n = self.lines.len();
        assert_eq!(self.grow_at, Self::grow_at(self.slot_capacity()));
        assert!(
            n >= self.reserved_lines,
            "{n} lines under the {} reserved",
            self.reserved_lines
        );
        let mut count = 0;
        for (l, line) in self.lines.iter().enumerate() {
            for entry in line.0.iter().filter(|s| s.owners != 0) {
                let (a, b) = self.probe(entry.key).lines(n);
                assert!(
                    l == a || l == b,
                    "{:#x} in line {l}, not {a} or {b}",
                    entry.key
                );
                count += 1;
            }
        }
        count += self.stash.len();
        assert_eq!(count, self.len);
        let mut tags = 0;
        let mut check_word = |key: u64, word: u64| {
            let spilled = self.spill.get(&key);
            assert_eq!(word & SPILL_FLAG != 0, spilled.is_some(), "{key:#x}");
            if let Some(v) = spilled {
                assert!(!v.is_empty());
                assert_eq!(inline_len(word), 3);
                tags += v.capacity();
            }
        };
        for entry in self.lines.iter().flat_map(|l| l.0.iter()) {
            if entry.owners != 0 {
                check_word(entry.key, entry.owners);
            }
        }
        for (&k, &w) in &self.stash {
            check_word(k, w);
        }
        assert_eq!(tags, self.spill_tags);
        assert_eq!(self.spill.len(), {
            let mut c = 0;
            self.for_each_key(|k| c += usize::from(self.spill.contains_key(&k)));
            c
        });
    }
}
