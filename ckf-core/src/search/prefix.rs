//! The portable prefix loop every kernel shares or mirrors: locate each position, check its two
//! candidate rows across the lanes still matching, exit early once none does, and on large
//! tables prefetch the rows [`PREFETCH_POSITIONS`] positions ahead. Also the prefetch distance
//! and threshold the vector kernels' loop (`search/ring.rs`, for `search/avx512.rs` and
//! `search/avx2.rs`) builds on.

use crate::addressing::{Addressing, Location};
use crate::bucket::{self, GROUP_LANES, TransposedTable};

/// How many positions ahead of the probe a large table's rows are prefetched, in every kernel,
/// chosen for the tail latency of long queries on tables far larger than the caches. A long query on a table far beyond the LLC is bound by how many cache
/// misses the core keeps in flight (4 lines per position at 16 lanes), so the distance must
/// cover a DRAM latency's worth of probes. 24 positions ahead, one position's rows per probe,
/// cut the flushed-LLC p99 of Mooncake queries on 256 MiB / 1 GiB tables to ~0.75x the old
/// scheme (a whole 8-position chunk's 32 lines prefetched at once, 8-16 positions ahead; the
/// burst overflows the miss buffers), while 8 positions ahead was slower and 32 no better
/// (`cargo bench -p ckf-core --bench search -- cold`; docs/performance.md, "Query search"). A
/// multiple of the vector kernels' 8-position chunk.
pub(crate) const PREFETCH_POSITIONS: usize = 24;
const _: () = assert!(PREFETCH_POSITIONS.is_multiple_of(8) && PREFETCH_POSITIONS > 0);
/// How many positions ahead a query prefetches the primary rows of a table whose alternate
/// rows it reads on demand (`crate::memory::alternate_on_demand`): farther than
/// [`PREFETCH_POSITIONS`], since each position prefetches half the lines. Measured (`cargo
/// bench -p ckf-core --bench search -- lanes`, AMD EPYC Zen 4, 256 MiB, two runs alternated):
/// 40 against 24, Mooncake p99 16 lanes 2.4-2.5 -> 1.9-2.0 us, 64 lanes 8.5-8.6 -> 6.9-7.0 us,
/// p50 unchanged. A multiple of the vector kernels' 8-position chunk.
pub(crate) const ON_DEMAND_PREFETCH_POSITIONS: usize = 40;
const _: () = assert!(
    ON_DEMAND_PREFETCH_POSITIONS.is_multiple_of(8)
        && ON_DEMAND_PREFETCH_POSITIONS >= PREFETCH_POSITIONS
);
/// Rings of located positions (powers of two beyond each prefetch distance): the loop that
/// reads both rows, and the one that reads alternate rows on demand.
const RING_PAIR: usize = 32;
const RING: usize = 64;
const _: () = assert!(RING_PAIR.is_power_of_two() && RING_PAIR > PREFETCH_POSITIONS);
const _: () = assert!(RING.is_power_of_two() && RING > ON_DEMAND_PREFETCH_POSITIONS);

/// How many positions before its decision a large table's query checks a position's primary
/// row when the alternate row is read on demand, prefetching the alternate row at once when an
/// active lane missed the primary one: so the alternate row is in flight by the time the
/// position is decided. The vector kernels' chunk: each chunk's primary rows are checked while
/// the chunk before it is decided.
pub(crate) const PEEK: usize = 8;

/// Leading positions whose alternate rows a large table's query prefetches with their primary
/// rows: where most lanes stop (a lane without the request's first block misses at position 0),
/// so their alternate rows are needed at once. A multiple of the vector kernels' chunk.
pub(crate) const BOTH_ROWS_FIRST: usize = 16;
const _: () = assert!(
    BOTH_ROWS_FIRST.is_multiple_of(PEEK)
        && BOTH_ROWS_FIRST >= PEEK
        && BOTH_ROWS_FIRST <= PREFETCH_POSITIONS
);

/// Sets the depth of every lane in `lanes` to `depth` (the position where they stopped
/// matching, or the query's length for the lanes that never did).
#[inline(always)]
pub(super) fn set_depths(depths: &mut [u32; GROUP_LANES], mut lanes: u32, depth: usize) {
    while lanes != 0 {
        depths[lanes.trailing_zeros() as usize] = depth as u32;
        lanes &= lanes - 1;
    }
}

/// Locates position `pos` of `hashes` into its slot of `ring`, prefetching its primary row and,
/// with `both`, its alternate row: one step of a prefetching loop's look-ahead.
#[inline(always)]
fn stage<const R: usize>(
    addressing: Addressing,
    rows: &bucket::Rows<'_>,
    hashes: &[u64],
    pos: usize,
    both: bool,
    ring: &mut [Location; R],
) {
    let loc = addressing.locate(hashes[pos]);
    rows.prefetch(loc.bucket_a as usize);
    if both {
        rows.prefetch(loc.bucket_b as usize);
    }
    ring[pos % R] = loc;
}

/// The prefix loop shared by every row-check implementation. `pair_hits(a, b, fp, active)`
/// returns the lanes (a superset filter is fine, it is masked with `active`) whose word in
/// bucket `a`'s or bucket `b`'s row holds `fp`, reading `a`'s row first; `row_hits(bucket, fp,
/// active)` the same for one row.
///
/// A table in the cache checks both candidate rows of each position at once, prefetching both
/// [`PREFETCH_POSITIONS`] ahead when it is larger than about an L2. A table beyond the
/// last-level cache (`crate::memory::alternate_on_demand`) prefetches only primary rows,
/// [`ON_DEMAND_PREFETCH_POSITIONS`] ahead
/// (bucket `a`, where insertion puts a fingerprint whenever it has room; both rows for the first
/// [`BOTH_ROWS_FIRST`] positions) and reads a position's alternate row only for the lanes its
/// primary row missed: the primary row is checked [`PEEK`] positions before the position is
/// decided, and the alternate row prefetched then if an active lane missed. Where most
/// fingerprints sit in their primary bucket, a long query pulls about half the lines.
#[inline(always)]
pub(super) fn prefix_loop<F, G>(
    table: &TransposedTable,
    addressing: Addressing,
    hashes: &[u64],
    ready: u16,
    mut pair_hits: F,
    mut row_hits: G,
) -> [u32; GROUP_LANES]
where
    F: FnMut(usize, usize, u16, u32) -> u32,
    G: FnMut(usize, u16, u32) -> u32,
{
    let mut depths = [0u32; GROUP_LANES];
    let n = hashes.len();
    let mut active = u32::from(ready);
    let mut pos = 0usize;
    // A located position's placeholder in the prefetching loops' rings.
    const EMPTY: Location = Location {
        fingerprint: 0,
        bucket_a: 0,
        bucket_b: 0,
    };
    let rows = table.rows();
    // Both rows of position `pos` at once. A function forced inline rather than a closure: a
    // closure called from two loops was compiled out of line (a call per position).
    #[inline(always)]
    fn pair_step<F: FnMut(usize, usize, u16, u32) -> u32>(
        pair_hits: &mut F,
        depths: &mut [u32; GROUP_LANES],
        pos: usize,
        loc: Location,
        active: &mut u32,
    ) {
        let (a, b) = (loc.bucket_a as usize, loc.bucket_b as usize);
        let hits = pair_hits(a, b, loc.fingerprint, *active) & *active;
        set_depths(depths, *active & !hits, pos);
        *active = hits;
    }
    if !table.prefetches_rows() {
        while pos < n && active != 0 {
            let loc = addressing.locate(hashes[pos]);
            pair_step(&mut pair_hits, &mut depths, pos, loc, &mut active);
            pos += 1;
        }
    } else if !table.reads_alternate_on_demand() {
        let mut ring = [EMPTY; RING_PAIR];
        for i in 0..n.min(PREFETCH_POSITIONS) {
            stage(addressing, &rows, hashes, i, true, &mut ring);
        }
        while pos < n && active != 0 {
            if pos + PREFETCH_POSITIONS < n {
                stage(
                    addressing,
                    &rows,
                    hashes,
                    pos + PREFETCH_POSITIONS,
                    true,
                    &mut ring,
                );
            }
            pair_step(
                &mut pair_hits,
                &mut depths,
                pos,
                ring[pos % RING_PAIR],
                &mut active,
            );
            pos += 1;
        }
    } else {
        let mut ring = [EMPTY; RING];
        // Primary-row hits of the positions PEEK ahead, by position (mod 2 * PEEK).
        let mut peeked = [0u32; 2 * PEEK];
        for i in 0..n.min(ON_DEMAND_PREFETCH_POSITIONS) {
            stage(addressing, &rows, hashes, i, i < BOTH_ROWS_FIRST, &mut ring);
        }
        while pos < n && active != 0 {
            if pos + ON_DEMAND_PREFETCH_POSITIONS < n {
                let ahead = pos + ON_DEMAND_PREFETCH_POSITIONS;
                stage(addressing, &rows, hashes, ahead, false, &mut ring);
            }
            let loc = ring[pos % RING];
            let mut hits = if pos < BOTH_ROWS_FIRST {
                row_hits(loc.bucket_a as usize, loc.fingerprint, active)
            } else {
                peeked[pos % (2 * PEEK)]
            } & active;
            let missed = active & !hits;
            if missed != 0 {
                hits |= row_hits(loc.bucket_b as usize, loc.fingerprint, missed) & missed;
                set_depths(&mut depths, missed & !hits, pos);
                active = hits;
            }
            // After the decision, so a query never waits for a row past its end.
            let next = pos + PEEK;
            if next >= BOTH_ROWS_FIRST && next < n && active != 0 {
                let loc = ring[next % RING];
                let hits = row_hits(loc.bucket_a as usize, loc.fingerprint, active);
                peeked[next % (2 * PEEK)] = hits;
                if active & !hits != 0 {
                    rows.prefetch(loc.bucket_b as usize);
                }
            }
            pos += 1;
        }
    }
    if pos == n {
        set_depths(&mut depths, active, n);
    }
    depths
}

pub(super) fn search_scalar(
    table: &TransposedTable,
    addressing: Addressing,
    hashes: &[u64],
    ready: u16,
) -> [u32; GROUP_LANES] {
    prefix_loop(
        table,
        addressing,
        hashes,
        ready,
        |a, b, fp, active| table.row_pair_hits(a, b, bucket::broadcast(fp), active),
        |row, fp, active| table.row_hits(row, bucket::broadcast(fp), active),
    )
}
