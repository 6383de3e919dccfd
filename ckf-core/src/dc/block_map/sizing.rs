//! The block map's size: reservations and presizing, growth at [`MAX_LOAD`], shrink after
//! removals, and the rehash behind both (prefetched [`REBUILD_PREFETCH_DISTANCE`] entries
//! ahead), with its [`RebuildStats`].

use super::*;

impl BlockMap {
    /// `floor(MAX_LOAD * capacity)`: for an integer `len`, `len > floor(x)` iff `len > x`, so
    /// comparing against it grows at exactly the load the float check would.
    pub(super) fn grow_at(capacity: usize) -> usize {
        (MAX_LOAD * capacity as f64) as usize
    }

    /// Lines for `entries` entries at most [`MAX_LOAD`] full: the fewest lines whose
    /// [`grow_at`](Self::grow_at) is at least `entries` (0 for none).
    pub(super) fn lines_for(entries: usize) -> usize {
        if entries == 0 {
            return 0;
        }
        let mut lines =
            ((entries as f64 / (MAX_LOAD * LINE_ENTRIES as f64)).ceil() as usize).max(MIN_LINES);
        while Self::grow_at(lines * LINE_ENTRIES) < entries {
            lines += 1;
        }
        lines
    }

    /// Sizes the map for `entries` entries now and keeps it at least that size: no insertion
    /// grows it (and pauses ingest for a rebuild) until it holds more than `entries`, and no
    /// shrink, not even of an empty map, goes below it. `0` drops an earlier reservation (the
    /// lines stay until a shrink gives them back). Costs `lines_for(entries) * 64` bytes,
    /// about 17.8 bytes per reserved entry, from the start. Rebuilds once when the map is
    /// smaller (a pause like a growth's, counted in [`rebuild_stats`](Self::rebuild_stats)).
    ///
    /// # Panics
    /// Like `Vec::with_capacity` when the allocator fails; the producer asks the allocator
    /// first (`DcCkfState::new`).
    pub fn reserve(&mut self, entries: usize) {
        self.reserved_lines = Self::lines_for(entries);
        if self.lines.len() < self.reserved_lines {
            self.rebuild(self.reserved_lines);
        }
    }

    /// Sizes the map for `entries` entries now, like [`reserve`](Self::reserve) but without
    /// keeping that size as a floor: a later [`shrink`](Self::shrink) may give the lines back
    /// as for any map. For a caller that knows how many entries are about to arrive (a restore
    /// from a checkpoint), so they land without a growth on the way. Rebuilds once when the
    /// map is smaller, never when it is already that large.
    ///
    /// # Panics
    /// Like `Vec::with_capacity` when the allocator fails; ask it first
    /// (`DcCkfState::presize_blocks` does).
    pub fn presize(&mut self, entries: usize) {
        let lines = Self::lines_for(entries);
        if self.lines.len() < lines {
            self.rebuild(lines);
        }
    }

    /// Bytes of the lines [`reserve`](Self::reserve)`(entries)` allocates.
    pub fn reserve_bytes(entries: usize) -> usize {
        Self::lines_for(entries) * std::mem::size_of::<Line>()
    }

    /// Rebuilds since the map was built (growths, shrinks, reservations) and their wall time.
    pub fn rebuild_stats(&self) -> RebuildStats {
        self.rebuilds
    }

    /// Grows by 1.5x (or to the minimum).
    pub(super) fn grow(&mut self) {
        let n = self.lines.len();
        let target = (n * GROWTH_NUM / GROWTH_DEN).max(n + 1).max(MIN_LINES);
        self.rebuild(target);
    }

    /// Rehashes every entry into `lines` lines (enough for all of them): the old lines in
    /// order, then the stash.
    ///
    /// Pipelined: the two new lines of the entry [`REBUILD_PREFETCH_DISTANCE`] places ahead are
    /// prefetched before an entry is placed, so the placements' cache misses overlap. The order
    /// of placement is the one-at-a-time order, so the resulting table (and every later walk,
    /// salted by `counter`) is the same as placing one entry after the other. A rebuild stops
    /// ingest (it runs inside the insertion or removal that triggers it), so its length is a
    /// pause the producer's whole DC feels; see [`REBUILD_PREFETCH_DISTANCE`] for the figures.
    pub(super) fn rebuild(&mut self, lines: usize) {
        let started = std::time::Instant::now();
        self.rehash(lines);
        let took = started.elapsed();
        self.rebuilds.count += 1;
        self.rebuilds.total += took;
        self.rebuilds.longest = self.rebuilds.longest.max(took);
    }

    /// [`rebuild`](Self::rebuild)'s work, untimed.
    pub(super) fn rehash(&mut self, lines: usize) {
        // Huge pages where the kernel offers them (a lookup's lines are random TLB misses).
        let old = std::mem::replace(&mut self.lines, crate::memory::zeroed_vec(lines));
        self.grow_at = Self::grow_at(lines * LINE_ENTRIES);
        let stash = std::mem::take(&mut self.stash);
        let entries = old
            .iter()
            .flat_map(|l| l.0.iter())
            .filter(|s| s.owners != 0)
            .map(|s| (s.key, s.owners))
            .chain(stash);
        // `ring[i % DISTANCE]` holds entry `i` (key, owners, probe) from its prefetch to its
        // placement, which happens when entry `i + DISTANCE` takes its place, or in the drain.
        const DISTANCE: usize = REBUILD_PREFETCH_DISTANCE;
        let mut ring = [(0u64, 0u64, Probe::ZERO); DISTANCE];
        let mut prefetched = 0usize;
        for (key, owners) in entries {
            let probe = self.probe(key);
            self.prefetch(probe);
            let (due_key, due_owners, due_probe) =
                std::mem::replace(&mut ring[prefetched % DISTANCE], (key, owners, probe));
            if prefetched >= DISTANCE {
                self.place(due_key, due_probe, due_owners);
            }
            prefetched += 1;
        }
        for i in prefetched.saturating_sub(DISTANCE)..prefetched {
            let (key, owners, probe) = ring[i % DISTANCE];
            self.place(key, probe, owners);
        }
    }

    /// Gives memory back: an empty map frees everything; a table above `min_entries` entries and
    /// under a quarter full is rehashed to half full. A [`reserve`](Self::reserve)d size is a
    /// floor for both: an empty map keeps (or is cut back to) its reserved lines. The gap
    /// between the two factors (and the 90% growth point) is the hysteresis: after a shrink the table must lose half its
    /// entries again before the next shrink and grow by 80% before it grows, so a size that
    /// oscillates does not rehash back and forth. O(len) when it shrinks, amortized over the
    /// removals that made it sparse.
    pub fn shrink(&mut self, min_entries: usize) {
        let floor = self.reserved_lines;
        if self.len == 0 {
            if self.lines.len() > floor {
                if floor == 0 {
                    self.lines = Vec::new();
                    self.grow_at = 0;
                } else {
                    self.rebuild(floor);
                }
            }
            // Empty, so the stash holds nothing: its memory goes back whatever the floor.
            self.stash = HashMap::default();
        } else if self.slot_capacity() > min_entries.max(floor * LINE_ENTRIES)
            && self.len < self.slot_capacity() / 4
        {
            self.rebuild(
                (self.len * 2)
                    .div_ceil(LINE_ENTRIES)
                    .max(MIN_LINES)
                    .max(floor),
            );
        }
        crate::dc::maps::shrink_map(&mut self.spill);
    }
}
