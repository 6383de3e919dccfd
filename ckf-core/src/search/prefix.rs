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

/// Positions a large table's query goes on past a primary-row miss before it reads that
/// position's alternate row for the lanes that missed (the row is prefetched at the miss), so
/// the alternate row's cache miss overlaps the next positions' probes instead of stalling the
/// query. A power of two.
pub(crate) const DEFER: usize = 8;
const _: () = assert!(DEFER.is_power_of_two() && DEFER < RING);

/// Leading positions whose alternate rows a large table's query prefetches with their primary
/// rows: where most lanes stop (a lane without the request's first block misses at position 0),
/// so their alternate rows are needed at once. A multiple of the vector kernels' chunk.
pub(crate) const BOTH_ROWS_FIRST: usize = 8;
const _: () = assert!(BOTH_ROWS_FIRST.is_multiple_of(8) && BOTH_ROWS_FIRST <= PREFETCH_POSITIONS);

/// The alternate-row checks a large table's query has deferred ([`DEFER`]): for position `p`,
/// slot `p % DEFER` holds the lanes that missed `p`'s primary row, its alternate row and its
/// fingerprint; `lanes == 0` is an empty slot. Those lanes stay active (tentatively) until the
/// check is settled: a lane whose fingerprint is in neither row gets its depth at `p`. Checks
/// settle oldest first, so a lane's depth is its first miss, as if each position had read both
/// rows.
#[derive(Clone, Copy)]
pub(super) struct Deferred {
    pos: [u32; DEFER],
    row: [usize; DEFER],
    fp: [u16; DEFER],
    lanes: [u32; DEFER],
}

impl Deferred {
    pub(super) const EMPTY: Self = Self {
        pos: [0; DEFER],
        row: [0; DEFER],
        fp: [0; DEFER],
        lanes: [0; DEFER],
    };

    /// Defers the alternate-row check of position `pos` (`row`: the kernel's handle of that
    /// row) for `lanes`; the slot must have been settled.
    #[inline(always)]
    pub(super) fn defer(&mut self, pos: usize, row: usize, fp: u16, lanes: u32) {
        let s = pos % DEFER;
        debug_assert_eq!(self.lanes[s], 0, "deferred check overwritten unsettled");
        self.pos[s] = pos as u32;
        self.row[s] = row;
        self.fp[s] = fp;
        self.lanes[s] = lanes;
    }

    /// Settles slot `s`: `hits(row, fp, lanes)` checks the deferred row for the lanes still
    /// active; those it does not hold leave `active` with their depth.
    #[inline(always)]
    pub(super) fn settle<F: FnMut(usize, u16, u32) -> u32>(
        &mut self,
        s: usize,
        hits: &mut F,
        active: &mut u32,
        depths: &mut [u32; GROUP_LANES],
    ) {
        let lanes = self.lanes[s] & *active;
        self.lanes[s] = 0;
        if lanes != 0 {
            let mut gone = lanes & !hits(self.row[s], self.fp[s], lanes);
            *active &= !gone;
            while gone != 0 {
                depths[gone.trailing_zeros() as usize] = self.pos[s];
                gone &= gone - 1;
            }
        }
    }

    /// Settles every deferred check, oldest first; `pos` is the next position to probe (the
    /// checks held are of `pos - DEFER .. pos`).
    #[inline(always)]
    pub(super) fn settle_all<F: FnMut(usize, u16, u32) -> u32>(
        &mut self,
        pos: usize,
        hits: &mut F,
        active: &mut u32,
        depths: &mut [u32; GROUP_LANES],
    ) {
        for k in 0..DEFER {
            self.settle((pos + k) % DEFER, hits, active, depths);
        }
    }
}

/// The prefix loop shared by every row-check implementation. `pair_hits(a, b, fp, active)`
/// returns the lanes (a superset filter is fine, it is masked with `active`) whose word in
/// bucket `a`'s or bucket `b`'s row holds `fp`, reading `a`'s row first; `row_hits(bucket, fp,
/// active)` the same for one row.
///
/// A cached table's query checks both candidate rows of each position at once. A large table's
/// query (rows prefetched) reads each position's primary row (bucket `a`, where insertion puts
/// a fingerprint whenever it has room) and prefetches only primary rows ahead; the lanes a
/// primary row misses get their alternate row read [`DEFER`] positions later ([`Deferred`]),
/// at once when no lane hit the primary row (nothing else to overlap with). On a table where
/// most fingerprints sit in their primary bucket that halves the lines a long query pulls from
/// memory.
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
    let mut ring = [Location {
        fingerprint: 0,
        bucket_a: 0,
        bucket_b: 0,
    }; RING];
    let rows = table.rows();
    if !table.reads_alternate_on_demand() {
        let prefetch = table.prefetches_rows();
        if prefetch {
            for (i, &h) in hashes[..n.min(PREFETCH_POSITIONS)].iter().enumerate() {
                let loc = addressing.locate(h);
                rows.prefetch(loc.bucket_a as usize);
                rows.prefetch(loc.bucket_b as usize);
                ring[i % RING] = loc;
            }
        }
        while pos < n && active != 0 {
            let loc = if prefetch {
                let ahead = pos + PREFETCH_POSITIONS;
                if ahead < n {
                    let loc = addressing.locate(hashes[ahead]);
                    rows.prefetch(loc.bucket_a as usize);
                    rows.prefetch(loc.bucket_b as usize);
                    ring[ahead % RING] = loc;
                }
                ring[pos % RING]
            } else {
                addressing.locate(hashes[pos])
            };
            let (a, b) = (loc.bucket_a as usize, loc.bucket_b as usize);
            let hits = pair_hits(a, b, loc.fingerprint, active) & active;
            let mut missed = active & !hits;
            while missed != 0 {
                depths[missed.trailing_zeros() as usize] = pos as u32;
                missed &= missed - 1;
            }
            active = hits;
            pos += 1;
        }
    } else {
        let mut deferred = Deferred::EMPTY;
        for (i, &h) in hashes[..n.min(PREFETCH_POSITIONS)].iter().enumerate() {
            let loc = addressing.locate(h);
            rows.prefetch(loc.bucket_a as usize);
            if i < BOTH_ROWS_FIRST {
                rows.prefetch(loc.bucket_b as usize);
            }
            ring[i % RING] = loc;
        }
        while pos < n && active != 0 {
            let ahead = pos + PREFETCH_POSITIONS;
            if ahead < n {
                let loc = addressing.locate(hashes[ahead]);
                rows.prefetch(loc.bucket_a as usize);
                ring[ahead % RING] = loc;
            }
            deferred.settle(pos % DEFER, &mut row_hits, &mut active, &mut depths);
            let loc = ring[pos % RING];
            let (a, b) = (loc.bucket_a as usize, loc.bucket_b as usize);
            let hits = row_hits(a, loc.fingerprint, active) & active;
            let missed = active & !hits;
            if missed != 0 {
                if hits == 0 {
                    deferred.settle_all(pos, &mut row_hits, &mut active, &mut depths);
                    deferred.defer(pos, b, loc.fingerprint, active);
                    deferred.settle(pos % DEFER, &mut row_hits, &mut active, &mut depths);
                } else {
                    rows.prefetch(b);
                    deferred.defer(pos, b, loc.fingerprint, missed);
                }
            }
            pos += 1;
        }
        deferred.settle_all(pos, &mut row_hits, &mut active, &mut depths);
    }
    if pos == n {
        while active != 0 {
            depths[active.trailing_zeros() as usize] = n as u32;
            active &= active - 1;
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
    prefix_loop(
        table,
        addressing,
        hashes,
        ready,
        |a, b, fp, active| table.row_pair_hits(a, b, bucket::broadcast(fp), active),
        |row, fp, active| table.row_hits(row, bucket::broadcast(fp), active),
    )
}
