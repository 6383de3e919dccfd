//! Multi-lane prefix search over the transposed table (design source, "Global transposed
//! consumer": one probe compares the same candidate buckets across every ready lane, with an
//! early exit once no lane still matches).
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
//! This module owns the query loop (capture, read order, early exit, prefetch distance, kernel
//! choice). It never touches a bucket word itself: the slot test, the atomic row loads and the
//! prefetch are [`crate::bucket`]'s ([`TransposedTable`]'s row-pair check and row view), the
//! fingerprint and candidate buckets are [`crate::addressing`]'s. `search/avx512.rs` is the same
//! loop with vector locate and row checks, built on those owners' constants.
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

use crate::addressing::{Addressing, Location};
use crate::bucket::{self, MAX_LANES, TransposedTable};
use crate::global::GlobalCkfIndexer;
use crate::identity::LaneIndex;

#[cfg(target_arch = "x86_64")]
mod avx512;

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
        self.iter().fold(None, |best, (l, d)| match best {
            Some((_, bd)) if bd >= d => best,
            _ => Some((l, d)),
        })
    }

    /// Number of ready lanes.
    pub fn ready_count(&self) -> u32 {
        self.ready.count_ones()
    }
}

/// Tables at least this large get their rows prefetched a few positions ahead; smaller ones
/// (about the size of a core's L2) are cache-resident and the prefetch would only cost
/// instructions.
pub(crate) const PREFETCH_MIN_BYTES: usize = 1 << 20;

/// The prefix loop shared by every row-check implementation; `row_hits(lo, hi, fp, active)`
/// returns the lanes (a superset filter is fine, it is masked with `active`) whose `lo` or `hi`
/// row word holds `fp`.
#[inline(always)]
fn prefix_loop<F>(
    table: &TransposedTable,
    addressing: Addressing,
    hashes: &[u64],
    ready: u16,
    mut row_hits: F,
) -> [u32; MAX_LANES]
where
    F: FnMut(usize, usize, u16, u32) -> u32,
{
    let mut depths = [0u32; MAX_LANES];
    let n = hashes.len();
    let mut active = u32::from(ready);
    let mut pos = 0usize;
    // One step: probe position `pos` at `loc`; false once no lane still matches.
    let mut step = |pos: usize, loc: Location, active: &mut u32| {
        let lo = loc.bucket_a.min(loc.bucket_b) as usize;
        let hi = loc.bucket_a.max(loc.bucket_b) as usize;
        let hits = row_hits(lo, hi, loc.fingerprint, *active) & *active;
        let mut missed = *active & !hits;
        while missed != 0 {
            let l = missed.trailing_zeros() as usize;
            missed &= missed - 1;
            depths[l] = pos as u32;
        }
        *active = hits;
        hits != 0
    };
    if table.bytes() < PREFETCH_MIN_BYTES {
        while pos < n && step(pos, addressing.locate(hashes[pos]), &mut active) {
            pos += 1;
        }
    } else {
        let mut ring = [Location {
            fingerprint: 0,
            bucket_a: 0,
            bucket_b: 0,
        }; RING];
        let rows = table.rows();
        for (i, &h) in hashes[..n.min(PREFETCH_AHEAD)].iter().enumerate() {
            let loc = addressing.locate(h);
            rows.prefetch(loc.bucket_a as usize);
            rows.prefetch(loc.bucket_b as usize);
            ring[i % RING] = loc;
        }
        while pos < n {
            let ahead = pos + PREFETCH_AHEAD;
            if ahead < n {
                let loc = addressing.locate(hashes[ahead]);
                rows.prefetch(loc.bucket_a as usize);
                rows.prefetch(loc.bucket_b as usize);
                ring[ahead % RING] = loc;
            }
            if !step(pos, ring[pos % RING], &mut active) {
                break;
            }
            pos += 1;
        }
    }
    if pos == n {
        while active != 0 {
            let l = active.trailing_zeros() as usize;
            active &= active - 1;
            depths[l] = n as u32;
        }
    }
    depths
}

fn search_scalar(
    table: &TransposedTable,
    addressing: Addressing,
    hashes: &[u64],
    ready: u16,
) -> [u32; MAX_LANES] {
    prefix_loop(table, addressing, hashes, ready, |lo, hi, fp, active| {
        table.row_pair_hits(lo, hi, bucket::broadcast(fp), active)
    })
}

impl GlobalCkfIndexer {
    /// Prefix depth of `block_hashes` in every lane ready at capture (see the module docs for
    /// the algorithm, the read order and the weak-read contract). Allocation-free.
    ///
    /// Depths are `u32`; a query longer than `u32::MAX` blocks is cut to its first `u32::MAX`.
    /// On x86-64 CPUs with AVX-512 (F, BW) and BMI2 the rows are compared with vector loads
    /// (detected at run time); elsewhere a portable SWAR loop gives the same answers.
    pub fn find_prefix_matches(&self, block_hashes: &[u64]) -> PrefixMatches {
        // Captured once, Acquire: the lane set of this query (weak-read contract).
        let ready = self.ready_mask();
        let hashes = &block_hashes[..block_hashes.len().min(u32::MAX as usize)];
        let depths = self.search_with(hashes, ready, Kernel::detect());
        PrefixMatches { ready, depths }
    }

    /// Same as [`GlobalCkfIndexer::find_prefix_matches`] with the portable row check forced
    /// (for differential tests and benchmarks of the two kernels).
    pub fn find_prefix_matches_portable(&self, block_hashes: &[u64]) -> PrefixMatches {
        let ready = self.ready_mask();
        let hashes = &block_hashes[..block_hashes.len().min(u32::MAX as usize)];
        let depths = self.search_with(hashes, ready, Kernel::Portable);
        PrefixMatches { ready, depths }
    }

    #[inline]
    fn search_with(&self, hashes: &[u64], ready: u16, kernel: Kernel) -> [u32; MAX_LANES] {
        let table = self.table();
        let addressing = *self.addressing();
        match kernel {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Kernel::Avx512` is only produced after run-time feature detection.
            Kernel::Avx512 => unsafe {
                avx512::search(table, self.manifest().format.seed, hashes, ready)
            },
            Kernel::Portable => search_scalar(table, addressing, hashes, ready),
        }
    }
}

/// Which row check the CPU supports.
#[derive(Clone, Copy)]
enum Kernel {
    #[cfg(target_arch = "x86_64")]
    Avx512,
    Portable,
}

impl Kernel {
    #[inline]
    fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512dq")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("bmi2")
        {
            return Kernel::Avx512;
        }
        Kernel::Portable
    }
}
