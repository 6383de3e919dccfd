//! Multi-lane prefix search over the transposed table (design source, "Global transposed
//! consumer"; DESIGN.md section 3, "search").
//!
//! For a block-hash sequence `h[0..n]`, the prefix depth of a lane is the number of leading
//! blocks whose fingerprint is present in one of their two candidate buckets of that lane: the
//! position of the first miss, or `n`. It is exact with respect to the table (the table itself is
//! a lossy projection: false positives at about 1.2e-4 per probe, no false negatives for tracked
//! blocks).
//!
//! # How one query runs
//! 1. The ready mask is captured **once** with `Acquire`; only those lanes are searched and
//!    reported ([`PrefixMatches::ready_mask`]).
//! 2. For each position the block hash is located (fingerprint + candidate buckets `a`, `b`);
//!    both bucket rows are compared against the fingerprint for every lane that still matches,
//!    giving a per-row lane hit mask; lanes that miss get their depth fixed at this position.
//! 3. The loop exits as soon as no lane still matches.
//! 4. The rows of the position a few steps ahead are prefetched, so the cache misses of an
//!    out-of-cache table overlap instead of being paid one after another.
//!
//! No heap allocation: [`PrefixMatches`] is a fixed-size value.
//!
//! # Read order and the relocation window (`cuckoo-cases.md` case 12)
//! A delta relocating fingerprint `f` from bucket `s` to bucket `d` (the other candidate of `f`)
//! carries `d`'s image before `s`'s image, each installed with a `Release` store, and the query
//! loads words with `Acquire`. The query reads the **lower-index candidate bucket first**:
//! * move toward the higher bucket (`s < d`): the query reads `s` first. If it still sees `f` in
//!   `s`, it is a hit. If it sees `s` without `f`, that load read the delta's `s` store, which
//!   happens after the `d` store, so the following load of `d` sees `f`. Never missed.
//! * move toward the lower bucket (`d < s`): the query may read `d` before the delta's `d` store
//!   (no `f` yet) and then `s` after the delta's `s` store (`f` gone): a **transient miss**. The
//!   window is the time between the query's two loads (a few nanoseconds) overlapping the time
//!   between the two stores; `tests/concurrency.rs` measures how often it happens. The same holds
//!   for chains of moves and for moves spread across two deltas.
//!
//! Without a retry (forbidden by the weak-read contract) no read order closes both directions;
//! lower-first is a fixed, documented choice that makes half of all moves provably safe.

use std::sync::atomic::Ordering;

use crate::addressing::Location;
use crate::bucket::{MAX_LANES, TransposedTable};
use crate::global::GlobalCkfIndexer;
use crate::identity::LaneIndex;

/// How many positions ahead the rows are prefetched.
const PREFETCH_AHEAD: usize = 4;
/// Ring of located positions (a power of two > PREFETCH_AHEAD).
const RING: usize = 8;

/// The result of one prefix query: the lanes that were ready when the query captured the mask,
/// and the prefix depth of each. A fixed-size stack value (no heap).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixMatches {
    ready: u16,
    depths: [u32; MAX_LANES],
}

impl PrefixMatches {
    /// Lanes that were ready at capture (bit `i` = lane `i`). Every reported lane is in it.
    #[inline]
    pub fn ready_mask(&self) -> u16 {
        self.ready
    }

    /// Prefix depth of `lane` (leading blocks present), or `None` when it was not ready.
    #[inline]
    pub fn depth(&self, lane: LaneIndex) -> Option<u32> {
        (usize::from(lane) < MAX_LANES && self.ready & (1 << lane) != 0)
            .then(|| self.depths[usize::from(lane)])
    }

    /// `(lane, depth)` for every ready lane, in lane order (depth may be 0).
    pub fn iter(&self) -> impl Iterator<Item = (LaneIndex, u32)> + '_ {
        let mut mask = self.ready;
        std::iter::from_fn(move || {
            if mask == 0 {
                return None;
            }
            let lane = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            Some((lane as LaneIndex, self.depths[lane]))
        })
    }

    /// `(lane, depth)` for ready lanes with depth > 0.
    pub fn matching(&self) -> impl Iterator<Item = (LaneIndex, u32)> + '_ {
        self.iter().filter(|&(_, d)| d > 0)
    }

    /// The deepest ready lane (lowest lane index on ties), if any lane is ready.
    pub fn best(&self) -> Option<(LaneIndex, u32)> {
        self.iter()
            .fold(None, |best, (l, d)| match best {
                Some((_, bd)) if bd >= d => best,
                _ => Some((l, d)),
            })
    }

    /// Number of ready lanes.
    pub fn ready_count(&self) -> u32 {
        self.ready.count_ones()
    }
}

const ONES: u64 = 0x0001_0001_0001_0001;
const HIGH: u64 = 0x8000_8000_8000_8000;

/// Nonzero iff some 16-bit slot of `w` equals `fingerprint_pattern`'s slots (exact as a boolean:
/// the classic has-zero test can only add false flags above a true zero slot).
#[inline(always)]
fn hit(w: u64, pattern: u64) -> u64 {
    let x = w ^ pattern;
    x.wrapping_sub(ONES) & !x & HIGH
}

/// Bit `l` set for each lane `l` in `active` whose word in `row_a` or `row_b` holds the
/// fingerprint. `row_a` is loaded before `row_b` lane by lane... see the module docs: the caller
/// passes the lower-index bucket as `row_a`.
#[inline(always)]
fn row_hits(table: &TransposedTable, lo: usize, hi: usize, pattern: u64, active: u32) -> u32 {
    let ra = table.row(lo);
    let rb = table.row(hi);
    let mut hits = 0u32;
    let mut m = active;
    while m != 0 {
        let l = m.trailing_zeros() as usize;
        m &= m - 1;
        // Acquire: pairs with the Release stores of a delta (relocation order, module docs).
        let a = ra[l].load(Ordering::Acquire);
        let b = rb[l].load(Ordering::Acquire);
        hits |= u32::from((hit(a, pattern) | hit(b, pattern)) != 0) << l;
    }
    hits
}

impl GlobalCkfIndexer {
    /// Prefix depth of `block_hashes` in every lane ready at capture (see the module docs for
    /// the algorithm, the read order and the weak-read contract). Allocation-free.
    ///
    /// Depths are `u32`; a query longer than `u32::MAX` blocks is cut to its first `u32::MAX`.
    pub fn find_prefix_matches(&self, block_hashes: &[u64]) -> PrefixMatches {
        let ready = self.ready_mask();
        let mut depths = [0u32; MAX_LANES];
        let hashes = &block_hashes[..block_hashes.len().min(u32::MAX as usize)];
        let n = hashes.len();
        let table = self.table();
        let addressing = *self.addressing();

        let mut ring = [Location {
            fingerprint: 0,
            bucket_a: 0,
            bucket_b: 0,
        }; RING];
        let warm = n.min(PREFETCH_AHEAD);
        for (i, &h) in hashes[..warm].iter().enumerate() {
            let loc = addressing.locate(h);
            table.prefetch_row(loc.bucket_a as usize);
            table.prefetch_row(loc.bucket_b as usize);
            ring[i % RING] = loc;
        }

        let mut active = u32::from(ready);
        let mut pos = 0usize;
        while pos < n && active != 0 {
            let ahead = pos + PREFETCH_AHEAD;
            if ahead < n {
                let loc = addressing.locate(hashes[ahead]);
                table.prefetch_row(loc.bucket_a as usize);
                table.prefetch_row(loc.bucket_b as usize);
                ring[ahead % RING] = loc;
            }
            let loc = ring[pos % RING];
            let (lo, hi) = if loc.bucket_a < loc.bucket_b {
                (loc.bucket_a, loc.bucket_b)
            } else {
                (loc.bucket_b, loc.bucket_a)
            };
            let pattern = u64::from(loc.fingerprint) * ONES;
            let hits = row_hits(table, lo as usize, hi as usize, pattern, active);
            let mut missed = active & !hits;
            while missed != 0 {
                let l = missed.trailing_zeros() as usize;
                missed &= missed - 1;
                depths[l] = pos as u32;
            }
            active = hits;
            pos += 1;
        }
        let mut rest = active;
        while rest != 0 {
            let l = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            depths[l] = n as u32;
        }
        PrefixMatches { ready, depths }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hit_is_exact_per_word() {
        for fp in [1u16, 2, 0x7FFF, 0x8000, 0xFFFF] {
            let p = u64::from(fp) * ONES;
            for s in 0..4 {
                let w = crate::bucket::with_slot(0x0002_FFFE_8001_7FFE, s, fp);
                assert_ne!(hit(w, p), 0);
            }
            for w in [0u64, 0x0002_FFFE_8001_7FFE, u64::MAX ^ p] {
                if !crate::bucket::contains(w, fp) {
                    assert_eq!(hit(w, p), 0, "{w:#x} {fp:#x}");
                }
            }
        }
    }
}
