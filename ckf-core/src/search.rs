//! Multi-lane prefix search over the transposed table (docs/design.md, "Global transposed
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
//!    both bucket rows are compared against the fingerprint for every lane that still matches
//!    (on a table beyond the last-level cache the primary row `a`, and the alternate row `b`
//!    only for the lanes `a` missed), giving a per-row lane hit mask; lanes that miss get their
//!    depth fixed at this position.
//! 3. The loop exits as soon as no lane still matches.
//! 4. On large tables the rows of the position `PREFETCH_POSITIONS` (24) steps ahead are
//!    prefetched while each position is probed, so the cache misses of an out-of-cache table
//!    overlap instead of being paid one after another. Beyond the last-level cache only the
//!    primary row is prefetched, 40 positions ahead (both rows for the first 16 positions); a
//!    position's primary row is
//!    checked 8 positions before its decision and its alternate row prefetched then if an active
//!    lane missed (`search/prefix.rs`, `prefix_loop`).
//! 5. A domain of more than 16 lanes ([`LaneGroups`]) runs steps 2-4 once per lane group
//!    holding a ready lane, each group with its own early exit, and merges the depths; the
//!    ready mask is still captured once for all groups.
//!
//! No heap allocation: [`PrefixMatches`] is a fixed-size value.
//!
//! This module owns the query loop (capture, read order, early exit, prefetch distance, kernel
//! choice). It never touches a bucket word itself: the slot test, the atomic row loads and the
//! prefetch are [`crate::bucket`]'s ([`TransposedTable`](crate::bucket::TransposedTable)'s row-pair check and row view), the
//! fingerprint and candidate buckets are [`crate::addressing`]'s. `search/avx512.rs` and
//! `search/avx2.rs` are the same loop with vector locate and row checks, built on those owners'
//! constants; that loop is written once, in `search/ring.rs`, and each of them supplies only its
//! locate and row check. `search/neon.rs` runs this module's loop with a NEON row check. Which
//! one a query runs is [`SearchKernel`]'s choice (best available, or forced; never one the CPU
//! lacks).
//!
//! # Read order and the relocation window (`docs/design.md`, "Cuckoo filter cases", case 12)
//! A delta relocating fingerprint `f` from bucket `s` to bucket `d` (the other candidate of `f`)
//! carries `d`'s image before `s`'s image, each installed with a `Release` store, and the query
//! loads words with `Acquire`. The query reads `f`'s **primary candidate bucket first**
//! (`bucket_a`, where insertion puts a fingerprint whenever it has room), and on a table beyond
//! the last-level cache reads the alternate bucket only for the lanes the primary one missed:
//! * move out of the primary bucket (`s` = primary): the query reads `s` first. If it still
//!   sees `f` in `s`, it is a hit. If it sees `s` without `f`, that load read the delta's `s`
//!   store, which happens after the `d` store, so the following load of `d` sees `f`. Never
//!   missed.
//! * move into the primary bucket (`d` = primary): the query may read `d` before the delta's `d`
//!   store (no `f` yet) and then `s` after the delta's `s` store (`f` gone): a **transient
//!   miss**. The window is the time between the query's two loads (a few nanoseconds; up to a
//!   vector chunk of positions, ~100 ns, where the alternate row is read on demand) overlapping
//!   the time between the two stores; `tests/concurrency.rs` measures how often it happens. The
//!   same holds for chains of moves and for moves spread across two deltas.
//!
//! Without a retry (forbidden by the weak-read contract) no read order closes both directions;
//! primary-first is a fixed, documented choice: moves out of the primary bucket are provably
//! safe, and it lets a large table's query skip the alternate row where the primary one holds
//! the fingerprint. At 93% slot load with kick-heavy churn it leaves about as many windows as
//! lower-index-first did (`tests/concurrency.rs`: 104 stable-block moves into the primary bucket
//! in 6,000 deltas, against 107 toward the lower one).

use crate::addressing::Addressing;
use crate::bucket::groups::LaneGroups;
use crate::bucket::{GROUP_LANES, MAX_LANES};

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod kernel;
mod lazy;
#[cfg(all(test, target_arch = "x86_64"))]
mod locate_check;
mod matches;
#[cfg(target_arch = "aarch64")]
mod neon;
mod prefix;
#[cfg(target_arch = "x86_64")]
mod ring;

#[cfg(feature = "testing")]
pub(crate) use kernel::test_hooks;
pub use kernel::{SearchKernel, SearchKernelError};
pub(crate) use lazy::search_lazy;
pub use lazy::{LAZY_MIN_BLOCK_TOKENS, LAZY_MIN_BLOCKS, LAZY_STEP};
pub use matches::PrefixMatches;

/// Prefix depth of `block_hashes` in every lane of `ready` (the query's one capture of the
/// ready mask) with the resolved `kernel`, one lane group after another (each group holding a
/// ready lane is searched on its own, with its own early exit); `seed` is the table format's.
/// A query longer than `u32::MAX` blocks is cut to its first `u32::MAX`. Allocation-free.
#[inline]
pub(crate) fn find(
    table: &LaneGroups,
    addressing: Addressing,
    seed: u64,
    kernel: SearchKernel,
    block_hashes: &[u64],
    ready: u64,
) -> PrefixMatches {
    let hashes = &block_hashes[..block_hashes.len().min(u32::MAX as usize)];
    #[cfg(feature = "testing")]
    test_hooks::count_run(kernel);
    let mut depths = [0u32; MAX_LANES];
    if table.groups().len() > 1 && table.prefetches_rows() {
        warm_later_groups(table, addressing, hashes, ready);
    }
    for (g, group) in table.groups().iter().enumerate() {
        let group_ready = lazy::group_mask(ready, g);
        if group_ready != 0 {
            let found = kernel.run(group, addressing, seed, hashes, group_ready);
            depths[g * GROUP_LANES..][..GROUP_LANES].copy_from_slice(&found);
        }
    }
    PrefixMatches { ready, depths }
}

/// Positions whose rows in the second and later lane groups are prefetched before the first
/// group is searched: the positions a group's own probe loop does not prefetch ahead (it
/// prefetches [`prefix::PREFETCH_POSITIONS`] ahead from its start). Measured (`cargo bench -p
/// ckf-core --bench search -- lanes`, 64 / 16 lanes, Mooncake, 256 MiB, p50, interleaved quick
/// runs): 8 warm positions 3.1-3.3x, 24: 2.2-2.5x; 32 and 48 no better, and 48 slower on a
/// 2 MiB table.
const WARM_POSITIONS: usize = prefix::PREFETCH_POSITIONS;

/// Prefetches the rows of the first [`WARM_POSITIONS`] positions (when the alternate rows are
/// read on demand: of the first [`prefix::ON_DEMAND_PREFETCH_POSITIONS`], past
/// [`prefix::BOTH_ROWS_FIRST`] the primary row only) in every lane group after the
/// first holding a ready lane, so those groups' first misses overlap the first group's search
/// instead of following it.
fn warm_later_groups(table: &LaneGroups, addressing: Addressing, hashes: &[u64], ready: u64) {
    let on_demand = table.groups()[0].reads_alternate_on_demand();
    let warm = if on_demand {
        prefix::ON_DEMAND_PREFETCH_POSITIONS
    } else {
        WARM_POSITIONS
    };
    for (i, &h) in hashes.iter().take(warm).enumerate() {
        let loc = addressing.locate(h);
        for (g, group) in table.groups().iter().enumerate().skip(1) {
            if lazy::group_mask(ready, g) != 0 {
                let rows = group.rows();
                rows.prefetch(loc.bucket_a as usize);
                if !on_demand || i < prefix::BOTH_ROWS_FIRST {
                    rows.prefetch(loc.bucket_b as usize);
                }
            }
        }
    }
}
