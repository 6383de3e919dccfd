//! The lazy query: block hashes pulled from an iterator a step at a time, each step searched
//! with the slice kernel, so hashing stops soon after the last lane misses and, on a large
//! table, overlaps the rows' cache misses.

use crate::addressing::Addressing;
use crate::bucket::groups::LaneGroups;
use crate::bucket::{self, GROUP_LANES, MAX_LANES};

use super::kernel::SearchKernel;
#[cfg(feature = "testing")]
use super::kernel::test_hooks;
use super::matches::PrefixMatches;
use super::prefix::PREFETCH_POSITIONS;

/// Block hashes a lazy query ([`GlobalCkfIndexer::find_prefix_matches_lazy`](crate::global::GlobalCkfIndexer::find_prefix_matches_lazy)) pulls and
/// searches per step: the prefetch distance of the slice form (24 positions), so
/// the rows of one step are in flight while the next step is hashed.
pub const LAZY_STEP: usize = PREFETCH_POSITIONS;

/// Full blocks above which [`GlobalCkfIndexer::find_prefix_matches_by_tokens`](crate::global::GlobalCkfIndexer::find_prefix_matches_by_tokens) hashes lazily:
/// two steps, the most a lazy query pulls before its first search on a large table.
pub const LAZY_MIN_BLOCKS: usize = 2 * LAZY_STEP;

/// Tokens per block from which [`GlobalCkfIndexer::find_prefix_matches_by_tokens`](crate::global::GlobalCkfIndexer::find_prefix_matches_by_tokens) hashes a
/// long request lazily: the block size where hashing a block (~100 ns at 512 tokens) is slow
/// enough for the memory system to keep up with the four row lines each pulled hash
/// prefetches. At 512 it saved 17-19% at p99 on requests that stop matching halfway and cost
/// 7-9% on ones that match to the end; at 16 and 128 it lost 1.35-1.43x at p99
/// (`benches/tokens.rs`).
pub const LAZY_MIN_BLOCK_TOKENS: usize = 512;

/// Lane groups ([`LaneGroups`]) a consumer has at most.
const MAX_GROUPS: usize = MAX_LANES / GROUP_LANES;

/// The lazy query's side of its iterator: pulls up to a step of hashes, prefetching each one's
/// rows in every searched group as it arrives when the table is large (`rows` set), so the
/// misses start while the rest of the step is still being computed. Both candidate rows, also
/// on a table whose alternate rows the slice form reads on demand: each step is a search of its
/// own whose first 16 positions read both rows at once (`search/prefix.rs`, `BOTH_ROWS_FIRST`),
/// and a lazy query's blocks (512 tokens and more) take ~100 ns each to hash, time enough for
/// the lines; not measured against prefetching primary rows alone.
struct LazySource<'t, I> {
    hashes: I,
    /// Positions the query may still pull (the `u32` depth cap).
    left: usize,
    addressing: Addressing,
    rows: [Option<bucket::Rows<'t>>; MAX_GROUPS],
    /// Whether any group's rows are prefetched.
    prefetch: bool,
}

impl<I: Iterator<Item = u64>> LazySource<'_, I> {
    /// Fills the front of `step`; returns how many hashes it got (fewer than a step only once
    /// the iterator or the cap is exhausted, after which it is never pulled again).
    #[inline]
    fn pull(&mut self, step: &mut [u64; LAZY_STEP]) -> usize {
        let mut n = 0;
        while n < LAZY_STEP && self.left > 0 {
            let Some(h) = self.hashes.next() else {
                self.left = 0;
                break;
            };
            if self.prefetch {
                let loc = self.addressing.locate(h);
                for rows in self.rows.iter().flatten() {
                    rows.prefetch(loc.bucket_a as usize);
                    rows.prefetch(loc.bucket_b as usize);
                }
            }
            step[n] = h;
            n += 1;
            self.left -= 1;
        }
        n
    }
}

/// The ready lanes of group `g` in a consumer-wide mask, as that group's 16-bit mask.
#[inline(always)]
pub(super) fn group_mask(mask: u64, g: usize) -> u16 {
    (mask >> (g * GROUP_LANES)) as u16
}

/// The lazy query loop (see
/// [`GlobalCkfIndexer::find_prefix_matches_lazy`](crate::global::GlobalCkfIndexer::find_prefix_matches_lazy)):
/// steps of [`LAZY_STEP`] hashes, each searched with the resolved `kernel` in every lane group
/// over the lanes of `ready` (the query's one capture of the ready mask) still matching.
pub(crate) fn search_lazy(
    table: &LaneGroups,
    addressing: Addressing,
    seed: u64,
    hashes: impl Iterator<Item = u64>,
    kernel: SearchKernel,
    ready: u64,
) -> PrefixMatches {
    #[cfg(feature = "testing")]
    test_hooks::count_run(kernel);
    let mut depths = [0u32; MAX_LANES];
    let mut active = ready;
    if active == 0 {
        return PrefixMatches { ready, depths };
    }
    let ahead = table.prefetches_rows();
    let mut rows = [None; MAX_GROUPS];
    for (g, group) in table.groups().iter().enumerate() {
        if ahead && group_mask(ready, g) != 0 {
            rows[g] = Some(group.rows());
        }
    }
    let mut source = LazySource {
        hashes,
        left: u32::MAX as usize,
        addressing,
        rows,
        prefetch: ahead,
    };
    let mut steps = [[0u64; LAZY_STEP]; 2];
    let mut current = 0;
    let mut len = source.pull(&mut steps[current]);
    // Positions of the steps already searched.
    let mut done = 0u32;
    while len > 0 {
        // On a large table the next step is hashed while this step's rows arrive; on a
        // small one it is pulled only if a lane still matches.
        let next_len = if ahead && len == LAZY_STEP {
            source.pull(&mut steps[1 - current])
        } else {
            0
        };
        for (g, group) in table.groups().iter().enumerate() {
            let group_active = group_mask(active, g);
            if group_active == 0 {
                continue;
            }
            let step = kernel.run(
                group,
                addressing,
                seed,
                &steps[current][..len],
                group_active,
            );
            let mut lanes = group_active;
            while lanes != 0 {
                let l = lanes.trailing_zeros() as usize;
                lanes &= lanes - 1;
                if (step[l] as usize) < len {
                    let lane = g * GROUP_LANES + l;
                    depths[lane] = done + step[l];
                    active &= !(1 << lane);
                }
            }
        }
        // `len <= LAZY_STEP` and the positions pulled never pass `u32::MAX`.
        done += len as u32;
        if active == 0 || len < LAZY_STEP {
            break;
        }
        if ahead {
            current = 1 - current;
            len = next_len;
        } else {
            len = source.pull(&mut steps[current]);
        }
    }
    while active != 0 {
        let l = active.trailing_zeros() as usize;
        active &= active - 1;
        depths[l] = done;
    }
    PrefixMatches { ready, depths }
}
