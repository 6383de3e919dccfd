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
/// Ring of located positions (a power of two > PREFETCH_POSITIONS).
const RING: usize = 32;
const _: () = assert!(RING.is_power_of_two() && RING > PREFETCH_POSITIONS);

/// The prefix loop shared by every row-check implementation; `row_hits(lo, hi, fp, active)`
/// returns the lanes (a superset filter is fine, it is masked with `active`) whose `lo` or `hi`
/// row word holds `fp`.
#[inline(always)]
pub(super) fn prefix_loop<F>(
    table: &TransposedTable,
    addressing: Addressing,
    hashes: &[u64],
    ready: u16,
    mut row_hits: F,
) -> [u32; GROUP_LANES]
where
    F: FnMut(usize, usize, u16, u32) -> u32,
{
    let mut depths = [0u32; GROUP_LANES];
    let n = hashes.len();
    let mut active = u32::from(ready);
    let mut pos = 0usize;
    // One step: probe position `pos` at `loc`; false once no lane still matches. A function
    // forced inline rather than a closure: the closure, called from both loops below, was
    // compiled out of line (a call per position).
    #[inline(always)]
    fn step<F: FnMut(usize, usize, u16, u32) -> u32>(
        row_hits: &mut F,
        depths: &mut [u32; GROUP_LANES],
        pos: usize,
        loc: Location,
        active: &mut u32,
    ) -> bool {
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
    }
    if !table.prefetches_rows() {
        while pos < n
            && step(
                &mut row_hits,
                &mut depths,
                pos,
                addressing.locate(hashes[pos]),
                &mut active,
            )
        {
            pos += 1;
        }
    } else {
        let mut ring = [Location {
            fingerprint: 0,
            bucket_a: 0,
            bucket_b: 0,
        }; RING];
        let rows = table.rows();
        for (i, &h) in hashes[..n.min(PREFETCH_POSITIONS)].iter().enumerate() {
            let loc = addressing.locate(h);
            rows.prefetch(loc.bucket_a as usize);
            rows.prefetch(loc.bucket_b as usize);
            ring[i % RING] = loc;
        }
        while pos < n {
            let ahead = pos + PREFETCH_POSITIONS;
            if ahead < n {
                let loc = addressing.locate(hashes[ahead]);
                rows.prefetch(loc.bucket_a as usize);
                rows.prefetch(loc.bucket_b as usize);
                ring[ahead % RING] = loc;
            }
            if !step(
                &mut row_hits,
                &mut depths,
                pos,
                ring[pos % RING],
                &mut active,
            ) {
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

pub(super) fn search_scalar(
    table: &TransposedTable,
    addressing: Addressing,
    hashes: &[u64],
    ready: u16,
) -> [u32; GROUP_LANES] {
    prefix_loop(table, addressing, hashes, ready, |lo, hi, fp, active| {
        table.row_pair_hits(lo, hi, bucket::broadcast(fp), active)
    })
}
