//! The probe loop of the vector kernels (`search/avx2.rs`, `search/avx512.rs`), written once: a
//! ring of located 8-position chunks, the prefetch schedule on large tables, the per-lane depth
//! bookkeeping and the early exit. Each kernel supplies only its ISA parts: the vector locate of
//! a chunk and the row check.
//!
//! The loop is a macro ([`probe_loop!`]) expanded inside each kernel's `#[target_feature]`
//! function, so it is compiled with that kernel's features and to the same code as a loop
//! written there by hand (the same instructions, counted with callgrind). A generic
//! `#[inline(always)]` function taking the two parts through a trait was inlined as well, but
//! its register allocation differed (a stack reload per prefetching position), and the AVX2
//! kernel measured 8-15% slower on a 256 MiB table in this crate's search bench.

use crate::bucket::GROUP_LANES;

/// Positions per located chunk.
pub(super) const POSITIONS: usize = 8;

/// Located positions of one chunk (8 positions): fingerprint and the row offsets (in words) of
/// the primary (`a`) and the alternate (`b`) candidate bucket. 64-byte aligned, so each array
/// is one aligned 512-bit store or two aligned 256-bit stores.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(super) struct Chunk {
    pub(super) fp: [u64; POSITIONS],
    pub(super) a: [u64; POSITIONS],
    pub(super) b: [u64; POSITIONS],
}

impl Chunk {
    pub(super) const EMPTY: Self = Self {
        fp: [0; POSITIONS],
        a: [0; POSITIONS],
        b: [0; POSITIONS],
    };
}

/// The depths of a query that found no position to probe (empty, or no ready lane).
pub(super) const NO_DEPTHS: [u32; GROUP_LANES] = [0; GROUP_LANES];

/// Prefix depths over `$table` for `$hashes` (see [`crate::search`]), returned from the
/// enclosing function (the early exit is a `return`) or as the macro's value.
///
/// * `locate(start, out, buckets, lanes) => EXPR` locates the 8 positions of `$hashes` from
///   `start` (zero-padded past the end) into `out: &mut Chunk`: fingerprints and row offsets
///   `bucket * lanes`, each inside the table (`buckets` is the table's bucket count, checked
///   against `MAX_BUCKETS`, `lanes` its lane count as `u64`).
/// * `pair_hits(a, b, fp) => EXPR` gives bit `l` for each lane `l` whose word in row `a` or
///   row `b` (`*const u64`, the first words of two rows of the table, from the offsets above)
///   holds `fp: u16`, loading every word of row `a` first; bits past the row may be set (the
///   loop masks with the active lanes). The check of a position on a table within the
///   last-level cache.
/// * `row_hits(row, fp) => EXPR` the same for one row: a larger table's check of a position's
///   primary row, and of its alternate row for the lanes that missed the primary one
///   ([`crate::search::prefix::prefix_loop`] describes the schedule).
///
/// These two are where the kernel's `unsafe` row loads go.
macro_rules! probe_loop {
    (
        $table:expr, $hashes:expr, $ready:expr,
        locate($start:ident, $out:ident, $buckets:ident, $lanes:ident) => $locate:expr,
        pair_hits($a:ident, $b:ident, $fp:ident) => $pair_hits:expr,
        row_hits($row:ident, $fp1:ident) => $row_hits:expr $(,)?
    ) => {{
        use $crate::search::prefix::set_depths;
        use $crate::search::ring::{Chunk, NO_DEPTHS, POSITIONS};
        let table: &$crate::bucket::TransposedTable = $table;
        let hashes: &[u64] = $hashes;
        let lanes = table.lanes();
        let rows = table.rows();
        let buckets = table.bucket_count() as u64;
        assert!(
            buckets <= $crate::addressing::MAX_BUCKETS,
            "table of {buckets} buckets is past the format's limit"
        );
        let prefetch = table.prefetches_rows();
        let on_demand = table.reads_alternate_on_demand();
        let n = hashes.len();
        let mut depths = NO_DEPTHS;
        let mut active = u32::from($ready);
        if n == 0 || active == 0 {
            return depths;
        }
        // Ring of located chunks: chunk `k` lives in `ring[k % AHEAD]`, located AHEAD - 1
        // chunks before it is probed. On large tables, while position `i` of chunk `k` is
        // probed, the rows of position `i` of chunk `k + SPREAD` are prefetched: a steady
        // PREFETCH_POSITIONS ahead, four lines per probe (the first SPREAD chunks' rows are
        // prefetched before the loop). A whole chunk's 32 lines at once overflowed the core's
        // miss buffers (`PREFETCH_POSITIONS`).
        const SPREAD: usize = $crate::search::prefix::PREFETCH_POSITIONS / POSITIONS;
        const AHEAD: usize = SPREAD + 1;
        // The same for a table whose alternate rows are read on demand: farther ahead, as each
        // position prefetches half the lines (`ON_DEMAND_PREFETCH_POSITIONS`).
        const SPREAD_OD: usize = $crate::search::prefix::ON_DEMAND_PREFETCH_POSITIONS / POSITIONS;
        const AHEAD_OD: usize = SPREAD_OD + 1;
        const BOTH_CHUNKS: usize = $crate::search::prefix::BOTH_ROWS_FIRST / POSITIONS;
        // The primary rows are checked one chunk ahead: the portable loop's PEEK.
        const _: () = assert!($crate::search::prefix::PEEK == POSITIONS && BOTH_CHUNKS >= 1);
        let chunks = n.div_ceil(POSITIONS);
        // Locates chunk `k` into `ring[k % ring.len()]`.
        let stage = |k: usize, ring: &mut [Chunk]| {
            let slot = k % ring.len();
            let $out: &mut Chunk = &mut ring[slot];
            let ($start, $buckets, $lanes) = (k * POSITIONS, buckets, lanes as u64);
            $locate
        };
        if !on_demand {
            let mut ring = [Chunk::EMPTY; AHEAD];
            for k in 0..chunks.min(AHEAD - 1) {
                stage(k, &mut ring);
            }
            if prefetch {
                for k in 0..chunks.min(SPREAD) {
                    let slot = &ring[k % AHEAD];
                    for i in 0..(n - k * POSITIONS).min(POSITIONS) {
                        rows.prefetch_offset(slot.a[i] as usize);
                        rows.prefetch_offset(slot.b[i] as usize);
                    }
                }
            }
            for k in 0..chunks {
                if k + AHEAD - 1 < chunks {
                    stage(k + AHEAD - 1, &mut ring);
                }
                let cur = &ring[k % AHEAD];
                let start = k * POSITIONS;
                // Positions of chunk `k + SPREAD` (located above) whose rows to prefetch: none
                // past the query's end or on a cache-resident table.
                let ahead = &ring[(k + SPREAD) % AHEAD];
                let ahead_len = if prefetch && k + SPREAD < chunks {
                    (n - (k + SPREAD) * POSITIONS).min(POSITIONS)
                } else {
                    0
                };
                for i in 0..(n - start).min(POSITIONS) {
                    if i < ahead_len {
                        rows.prefetch_offset(ahead.a[i] as usize);
                        rows.prefetch_offset(ahead.b[i] as usize);
                    }
                    // Offsets are `bucket * lanes` with `bucket < bucket_count`: inside the table.
                    let ($a, $b, $fp) = (
                        rows.at(cur.a[i] as usize),
                        rows.at(cur.b[i] as usize),
                        cur.fp[i] as u16,
                    );
                    let hits: u32 = $pair_hits & active;
                    set_depths(&mut depths, active & !hits, start + i);
                    active = hits;
                    if active == 0 {
                        return depths;
                    }
                }
            }
        } else {
            let mut ring = [Chunk::EMPTY; AHEAD_OD];
            for k in 0..chunks.min(AHEAD_OD - 1) {
                stage(k, &mut ring);
            }
            for k in 0..chunks.min(SPREAD_OD) {
                let slot = &ring[k % AHEAD_OD];
                for i in 0..(n - k * POSITIONS).min(POSITIONS) {
                    rows.prefetch_offset(slot.a[i] as usize);
                    if k < BOTH_CHUNKS {
                        rows.prefetch_offset(slot.b[i] as usize);
                    }
                }
            }
            // Offsets are `bucket * lanes` with `bucket < bucket_count`: inside the table.
            let check = |offset: usize, fp: u16| -> u32 {
                let ($row, $fp1) = (rows.at(offset), fp);
                $row_hits
            };
            // Primary-row hits of the current chunk's positions and of the next chunk's, each
            // checked one chunk before its position is decided, so a miss's alternate row is
            // prefetched in time; the first BOTH_CHUNKS chunks (both rows prefetched from the
            // start) are checked as they are decided.
            let mut peeked = [0u32; POSITIONS];
            let mut peeked_next = [0u32; POSITIONS];
            for k in 0..chunks {
                if k + AHEAD_OD - 1 < chunks {
                    stage(k + AHEAD_OD - 1, &mut ring);
                }
                let cur = &ring[k % AHEAD_OD];
                let next = &ring[(k + 1) % AHEAD_OD];
                let start = k * POSITIONS;
                // Positions of chunk `k + SPREAD_OD` (located above) whose primary rows to
                // prefetch, and of chunk `k + 1` whose primary rows to check: none past the
                // query's end.
                let ahead = &ring[(k + SPREAD_OD) % AHEAD_OD];
                let ahead_len = if k + SPREAD_OD < chunks {
                    (n - (k + SPREAD_OD) * POSITIONS).min(POSITIONS)
                } else {
                    0
                };
                let next_len = if k + 1 < chunks {
                    (n - (k + 1) * POSITIONS).min(POSITIONS)
                } else {
                    0
                };
                for i in 0..(n - start).min(POSITIONS) {
                    if i < ahead_len {
                        rows.prefetch_offset(ahead.a[i] as usize);
                    }
                    let fp = cur.fp[i] as u16;
                    let mut hits = if k < BOTH_CHUNKS {
                        check(cur.a[i] as usize, fp)
                    } else {
                        peeked[i]
                    } & active;
                    let missed = active & !hits;
                    if missed != 0 {
                        hits |= check(cur.b[i] as usize, fp) & missed;
                        set_depths(&mut depths, missed & !hits, start + i);
                        active = hits;
                        if active == 0 {
                            return depths;
                        }
                    }
                    // After the decision, so a query never waits for a row past its end.
                    if k + 1 >= BOTH_CHUNKS && i < next_len {
                        let hits = check(next.a[i] as usize, next.fp[i] as u16);
                        peeked_next[i] = hits;
                        if active & !hits != 0 {
                            rows.prefetch_offset(next.b[i] as usize);
                        }
                    }
                }
                peeked = peeked_next;
            }
        }
        set_depths(&mut depths, active, n);
        depths
    }};
}
pub(super) use probe_loop;
