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
//! 4. On large tables the rows of the position `PREFETCH_POSITIONS` (24) steps ahead are
//!    prefetched while each position is probed, so the cache misses of an out-of-cache table
//!    overlap instead of being paid one after another.
//!
//! No heap allocation: [`PrefixMatches`] is a fixed-size value.
//!
//! This module owns the query loop (capture, read order, early exit, prefetch distance, kernel
//! choice). It never touches a bucket word itself: the slot test, the atomic row loads and the
//! prefetch are [`crate::bucket`]'s ([`TransposedTable`]'s row-pair check and row view), the
//! fingerprint and candidate buckets are [`crate::addressing`]'s. `search/avx512.rs` and
//! `search/avx2.rs` are the same loop with vector locate and row checks, built on those owners'
//! constants; `search/neon.rs` runs this module's loop with a NEON row check. Which one a query
//! runs is [`SearchKernel`]'s choice (best available, or forced; never one the CPU lacks).
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
use crate::tokens::SequenceHashes;
use std::sync::atomic::Ordering;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "aarch64")]
mod neon;

/// Test support shared by the vector kernels' bit-for-bit checks of their locate against
/// [`Addressing::locate`] (`search/avx512.rs`, `search/avx2.rs`).
#[cfg(all(test, target_arch = "x86_64"))]
mod locate_check {
    use crate::addressing::{Addressing, MAX_BUCKETS};

    /// `(bucket count, lanes)` of the tables every vector locate is checked on: the smallest
    /// counts, even counts that are not powers of two (format v2), a large power of two and the
    /// largest count, with lane counts that make the row offsets odd multiples.
    pub(super) const SHAPES: [(u64, u64); 7] = [
        (2, 1),
        (4, 3),
        (6, 7),
        (1000, 16),
        (1 << 20, 5),
        (3_000_002, 9),
        (MAX_BUCKETS, 2),
    ];

    /// Inverse of `fmix64` (each xor-shift by 33 undoes itself; odd multipliers invert mod
    /// 2^64): block hashes whose mixed word is chosen, so the edge buckets are hit on purpose.
    fn unfmix64(mut k: u64) -> u64 {
        use crate::addressing::{FMIX_C1, FMIX_C2, FMIX_SHIFT};
        let inv = |c: u64| {
            let mut x = c;
            for _ in 0..6 {
                x = x.wrapping_mul(2u64.wrapping_sub(c.wrapping_mul(x)));
            }
            x
        };
        k ^= k >> FMIX_SHIFT;
        k = k.wrapping_mul(inv(FMIX_C2));
        k ^= k >> FMIX_SHIFT;
        k = k.wrapping_mul(inv(FMIX_C1));
        k ^ (k >> FMIX_SHIFT)
    }

    /// Bucket counts where a 32-bit multiply or a signed compare would go wrong first: the
    /// format's limit, counts just below / above powers of two, and the smallest ones.
    const EDGE_COUNTS: [u64; 10] = [
        MAX_BUCKETS,
        (1 << 32) - 4,
        (1 << 31) + 2,
        1 << 31,
        (1 << 31) - 2,
        (1 << 16) + 2,
        (1 << 16) - 2,
        6,
        4,
        2,
    ];

    /// Every fingerprint (raw 0 included) with the bucket bits at 0, 1, the middle and the top
    /// (`bucket_a` = 0 and `n - 1`), so offsets and alternates reach both ends of the table.
    fn edge_hashes(seed: u64) -> Vec<u64> {
        let mut v = Vec::new();
        for fp in 0..=u64::from(u16::MAX) {
            for low in [0u64, 1, 0x8000_0000, 0xFFFF_FFFE, 0xFFFF_FFFF] {
                v.push(unfmix64(fp << 48 | 0x5A5A << 32 | low) ^ seed);
            }
        }
        v
    }

    /// A vector locate, `locate(hashes, seed, buckets, lanes) -> (fp, lo, hi)`, against the
    /// scalar rule on every [`EDGE_COUNTS`] table and every [`edge_hashes`] chunk; panics on the
    /// first difference, or when a table's first or last bucket was never reached.
    pub(super) fn check_edges(
        mut locate: impl FnMut(&[u64; 8], u64, u64, u64) -> ([u64; 8], [u64; 8], [u64; 8]),
    ) {
        for (i, &buckets) in EDGE_COUNTS.iter().enumerate() {
            let seed = 0x5EED ^ buckets;
            let lanes = [1u64, 16, 7][i % 3];
            let addressing =
                Addressing::new(&crate::addressing::TableFormat::new(buckets, seed).unwrap())
                    .unwrap();
            let (mut top, mut bottom) = (false, false);
            for hashes in edge_hashes(seed).chunks_exact(8) {
                let hashes: &[u64; 8] = hashes.try_into().unwrap();
                let (fp, lo, hi) = locate(hashes, seed, buckets, lanes);
                assert_chunk(&addressing, lanes, hashes, (&fp, &lo, &hi));
                top |= hi.iter().any(|&o| o == (buckets - 1) * lanes);
                bottom |= lo.contains(&0);
            }
            assert!(top && bottom, "n={buckets}: edges not reached");
        }
    }

    /// Panics unless position `i` of a located chunk (`fp`, and the row offsets `lo`, `hi` of
    /// the lower and higher candidate bucket, in words) is what the scalar rule gives for
    /// `hashes[i]`, for all 8 positions.
    pub(super) fn assert_chunk(
        addressing: &Addressing,
        lanes: u64,
        hashes: &[u64; 8],
        (fp, lo, hi): (&[u64; 8], &[u64; 8], &[u64; 8]),
    ) {
        for (i, &h) in hashes.iter().enumerate() {
            let loc = addressing.locate(h);
            let (a, b) = (u64::from(loc.bucket_a), u64::from(loc.bucket_b));
            assert_eq!(fp[i], u64::from(loc.fingerprint), "{h:#x}");
            assert_eq!(lo[i], a.min(b) * lanes, "{h:#x}");
            assert_eq!(hi[i], a.max(b) * lanes, "{h:#x}");
        }
    }
}

/// How many positions ahead of the probe a large table's rows are prefetched, in every kernel
/// (issue 12 part 8). A long query on a table far beyond the LLC is bound by how many cache
/// misses the core keeps in flight (4 lines per position at 16 lanes), so the distance must
/// cover a DRAM latency's worth of probes. 24 positions ahead, one position's rows per probe,
/// cut the flushed-LLC p99 of Mooncake queries on 256 MiB / 1 GiB tables to ~0.75x the old
/// scheme (a whole 8-position chunk's 32 lines prefetched at once, 8-16 positions ahead; the
/// burst overflows the miss buffers), while 8 positions ahead was slower and 32 no better
/// (ckf-core README, "Tails"). A multiple of the vector kernels' 8-position chunk.
pub(crate) const PREFETCH_POSITIONS: usize = 24;
const _: () = assert!(PREFETCH_POSITIONS.is_multiple_of(8) && PREFETCH_POSITIONS > 0);
/// Ring of located positions (a power of two > PREFETCH_POSITIONS).
const RING: usize = 32;
const _: () = assert!(RING.is_power_of_two() && RING > PREFETCH_POSITIONS);

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
    // One step: probe position `pos` at `loc`; false once no lane still matches. A function
    // forced inline rather than a closure: the closure, called from both loops below, was
    // compiled out of line (a call per position).
    #[inline(always)]
    fn step<F: FnMut(usize, usize, u16, u32) -> u32>(
        row_hits: &mut F,
        depths: &mut [u32; MAX_LANES],
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
    if table.bytes() < PREFETCH_MIN_BYTES {
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

/// A prefix-search kernel: the code that compares a query position's two candidate rows against
/// its fingerprint across the lanes. Every kernel gives the same answers on every table and
/// query (`tests/search_kernels.rs` checks each one the CPU has against the portable one and
/// against an exact model) and keeps the same weak-read contract; they differ only in speed.
///
/// Chosen once per indexer (best available at construction, see [`SearchKernel::best`]) and
/// changeable with [`GlobalCkfIndexer::set_search_kernel`]; forcing a kernel the CPU lacks is
/// refused with [`SearchKernelError::Unavailable`], never run. Names (for configs, flags, logs
/// and metric labels) are the lower-case ones of [`SearchKernel::name`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum SearchKernel {
    /// The best kernel this CPU supports: AVX-512 > AVX2 > portable. Resolved when set.
    #[default]
    Auto = 0,
    /// Portable Rust (any target): one SWAR membership test per lane word, branch-free lane mask.
    Portable = 1,
    /// x86-64 with AVX2: a 16-lane row in four 256-bit loads per bucket (`search/avx2.rs`).
    Avx2 = 2,
    /// x86-64 with AVX-512 F/DQ/BW and BMI2: 8-way vector locate, a 16-lane row in two 512-bit
    /// loads per bucket (`search/avx512.rs`).
    Avx512 = 3,
    /// aarch64 NEON: a row in 128-bit loads of 2 lanes with a load barrier after each row
    /// (`search/neon.rs`). Tested under emulation only, not yet measured on aarch64 hardware,
    /// so `Auto` does not choose it: force it.
    Neon = 4,
}

/// Errors choosing a [`SearchKernel`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SearchKernelError {
    /// A name that is not one of `auto`, `portable`, `avx2`, `avx512`, `neon`.
    #[error("unknown search kernel {0:?}: expected one of auto, portable, avx2, avx512, neon")]
    Unknown(String),
    /// A kernel this CPU (or target) cannot run.
    #[error(
        "search kernel {kernel} is not available on this CPU (it needs {needs}); available: {available}"
    )]
    Unavailable {
        /// The kernel asked for.
        kernel: SearchKernel,
        /// The CPU features (or target) it needs.
        needs: &'static str,
        /// The kernels this CPU runs, comma-separated, best first.
        available: String,
    },
}

impl SearchKernel {
    /// Every kernel name, `Auto` first.
    pub const ALL: [SearchKernel; 5] = [
        SearchKernel::Auto,
        SearchKernel::Portable,
        SearchKernel::Avx2,
        SearchKernel::Avx512,
        SearchKernel::Neon,
    ];

    /// The lower-case name used in configs, flags, logs and metric labels (`auto`, `portable`,
    /// `avx2`, `avx512`, `neon`).
    pub const fn name(self) -> &'static str {
        match self {
            SearchKernel::Auto => "auto",
            SearchKernel::Portable => "portable",
            SearchKernel::Avx2 => "avx2",
            SearchKernel::Avx512 => "avx512",
            SearchKernel::Neon => "neon",
        }
    }

    /// What the kernel needs from the CPU, for error messages.
    pub const fn requirement(self) -> &'static str {
        match self {
            SearchKernel::Auto | SearchKernel::Portable => "nothing",
            SearchKernel::Avx2 => "x86-64 with AVX2",
            SearchKernel::Avx512 => "x86-64 with AVX-512 F, DQ, BW and BMI2",
            SearchKernel::Neon => "aarch64 (NEON)",
        }
    }

    /// Whether this CPU runs the kernel (run-time detection on x86-64; `Auto` and `Portable`
    /// always).
    pub fn is_available(self) -> bool {
        #[cfg(feature = "testing")]
        if test_hooks::hidden(self) {
            return false;
        }
        match self {
            SearchKernel::Auto | SearchKernel::Portable => true,
            #[cfg(target_arch = "x86_64")]
            SearchKernel::Avx2 => std::arch::is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            SearchKernel::Avx512 => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512dq")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("bmi2")
            }
            #[cfg(not(target_arch = "x86_64"))]
            SearchKernel::Avx2 | SearchKernel::Avx512 => false,
            // NEON is part of the aarch64 base ISA.
            SearchKernel::Neon => cfg!(target_arch = "aarch64"),
        }
    }

    /// The fastest kernel this CPU runs: AVX-512 > AVX2 > portable (never `Auto`; never `Neon`
    /// either until it is measured on aarch64 hardware).
    pub fn best() -> SearchKernel {
        [SearchKernel::Avx512, SearchKernel::Avx2]
            .into_iter()
            .find(|k| k.is_available())
            .unwrap_or(SearchKernel::Portable)
    }

    /// The concrete kernels this CPU runs, best first (never `Auto`; `Neon` last: unmeasured).
    pub fn available() -> Vec<SearchKernel> {
        [
            SearchKernel::Avx512,
            SearchKernel::Avx2,
            SearchKernel::Portable,
            SearchKernel::Neon,
        ]
        .into_iter()
        .filter(|k| k.is_available())
        .collect()
    }

    /// The concrete kernel this choice runs: `Auto` becomes [`SearchKernel::best`], any other
    /// kernel itself when the CPU runs it.
    ///
    /// # Errors
    /// [`SearchKernelError::Unavailable`] when the CPU lacks the kernel's features.
    pub fn resolve(self) -> Result<SearchKernel, SearchKernelError> {
        match self {
            SearchKernel::Auto => Ok(SearchKernel::best()),
            k if k.is_available() => Ok(k),
            k => Err(SearchKernelError::Unavailable {
                kernel: k,
                needs: k.requirement(),
                available: SearchKernel::available()
                    .iter()
                    .map(|k| k.name())
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }

    fn from_code(code: u8) -> SearchKernel {
        match code {
            1 => SearchKernel::Portable,
            2 => SearchKernel::Avx2,
            3 => SearchKernel::Avx512,
            4 => SearchKernel::Neon,
            _ => SearchKernel::Auto,
        }
    }
}

impl std::fmt::Display for SearchKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for SearchKernel {
    type Err = SearchKernelError;

    /// Parses a name of [`SearchKernel::name`] (exact, lower case).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SearchKernel::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| SearchKernelError::Unknown(s.to_owned()))
    }
}

impl GlobalCkfIndexer {
    /// Prefix depth of `block_hashes` in every lane ready at capture (see the module docs for
    /// the algorithm, the read order and the weak-read contract). Allocation-free.
    ///
    /// Depths are `u32`; a query longer than `u32::MAX` blocks is cut to its first `u32::MAX`.
    /// Runs with this indexer's kernel ([`GlobalCkfIndexer::search_kernel`]: by default the best
    /// the CPU has, AVX-512 > AVX2 > portable, detected at run time); every kernel gives the
    /// same answers.
    pub fn find_prefix_matches(&self, block_hashes: &[u64]) -> PrefixMatches {
        // Relaxed: the kernel is a configuration value, and every value ever stored is one the
        // CPU runs (checked by `set_search_kernel`), so any value read is safe to run.
        let kernel = SearchKernel::from_code(self.search_kernel.load(Ordering::Relaxed));
        self.search_resolved(block_hashes, kernel)
    }

    /// Same as [`GlobalCkfIndexer::find_prefix_matches`] with the portable row check forced
    /// (for differential tests and benchmarks of the kernels).
    pub fn find_prefix_matches_portable(&self, block_hashes: &[u64]) -> PrefixMatches {
        self.search_resolved(block_hashes, SearchKernel::Portable)
    }

    /// Same as [`GlobalCkfIndexer::find_prefix_matches`] with `kernel` forced for this query
    /// (`Auto`: the best available), for differential tests and benchmarks.
    ///
    /// # Errors
    /// [`SearchKernelError::Unavailable`] when the CPU lacks `kernel`; nothing is searched.
    pub fn find_prefix_matches_with(
        &self,
        kernel: SearchKernel,
        block_hashes: &[u64],
    ) -> Result<PrefixMatches, SearchKernelError> {
        let kernel = kernel.resolve()?;
        Ok(self.search_resolved(block_hashes, kernel))
    }

    /// The kernel [`GlobalCkfIndexer::find_prefix_matches`] runs (never `Auto`).
    pub fn search_kernel(&self) -> SearchKernel {
        SearchKernel::from_code(self.search_kernel.load(Ordering::Relaxed))
    }

    /// Makes every later query run with `kernel` (`Auto`: the best available) and returns the
    /// concrete kernel now in use. Queries already running finish with the kernel they started
    /// with; all kernels give the same answers, so callers see no difference but speed.
    ///
    /// # Errors
    /// [`SearchKernelError::Unavailable`] when the CPU lacks `kernel`; the kernel in use is
    /// unchanged.
    pub fn set_search_kernel(
        &self,
        kernel: SearchKernel,
    ) -> Result<SearchKernel, SearchKernelError> {
        let kernel = kernel.resolve()?;
        // Relaxed: see `find_prefix_matches`; the value was checked just above.
        self.search_kernel.store(kernel as u8, Ordering::Relaxed);
        Ok(kernel)
    }

    /// Runs one query with a resolved (available, never `Auto`) kernel.
    #[inline]
    fn search_resolved(&self, block_hashes: &[u64], kernel: SearchKernel) -> PrefixMatches {
        // Captured once, Acquire: the lane set of this query (weak-read contract).
        let ready = self.ready_mask();
        let hashes = &block_hashes[..block_hashes.len().min(u32::MAX as usize)];
        #[cfg(feature = "testing")]
        test_hooks::count_run(kernel);
        PrefixMatches {
            ready,
            depths: self.run_kernel(kernel, hashes, ready),
        }
    }

    /// Prefix depth of the block hashes `block_hashes` yields, in every lane ready at capture:
    /// the same answer as [`GlobalCkfIndexer::find_prefix_matches`] on all of them collected,
    /// but the iterator is pulled only as far as some lane may still match, and on a large
    /// table the pulling overlaps the search's cache misses.
    ///
    /// For a caller that computes the hashes (a query by token ids hashes every block, and a
    /// router holding per-block hashes chains them): hashes are pulled [`LAZY_STEP`] at a
    /// time and each step is searched with this indexer's kernel. On a table of at least
    /// 1 MiB, the rows of each pulled hash are prefetched as it is pulled, and the step after
    /// is pulled before a step is searched, so computing the next hashes hides the misses of
    /// the current ones. The iterator is never pulled past the step after the one where the
    /// deepest lane missed (at most that lane's miss position + `2 x LAZY_STEP` hashes; on a
    /// smaller table at most its miss position + `LAZY_STEP`), never after it returned `None`,
    /// and not at all when no lane is ready. Allocation-free; depths are capped at `u32::MAX`
    /// positions as in the slice form. Each step runs the slice kernel, whose prologue locates
    /// and prefetches the step's positions again (already cached: a few instructions per hash;
    /// a loop pulling one hash per probe, without that, was tried and not shown faster:
    /// ckf-core README, "Token queries: lazy hashing").
    pub fn find_prefix_matches_lazy<I>(&self, block_hashes: I) -> PrefixMatches
    where
        I: IntoIterator<Item = u64>,
    {
        // Relaxed: as in `find_prefix_matches`.
        let kernel = SearchKernel::from_code(self.search_kernel.load(Ordering::Relaxed));
        self.search_lazy(block_hashes.into_iter(), kernel)
    }

    /// Prefix depths of a request's token blocks ([`SequenceHashes`]), as `FindMatchesByTokens`
    /// answers: the same answer as [`GlobalCkfIndexer::find_prefix_matches`] on the collected
    /// hashes, computed one of three ways (ckf-core README, "Token queries: lazy hashing"):
    /// * at most [`LAZY_MIN_BLOCKS`] full blocks: hashed whole onto the stack (no allocation)
    ///   and searched as a slice;
    /// * more, with at least [`LAZY_MIN_BLOCK_TOKENS`] tokens per block:
    ///   [`GlobalCkfIndexer::find_prefix_matches_lazy`], so hashing stops a step or two after
    ///   the last lane's miss, and the rows' misses overlap the (slow) hashing;
    /// * more, with smaller blocks: hashed whole into a `Vec` and searched as a slice. There
    ///   the lazy form lost, p99 at least 1.35x at 16 and 128 tokens per block (presumably its
    ///   prefetches, issued as fast as small blocks hash, overrun the core's miss buffers).
    pub fn find_prefix_matches_by_tokens(&self, hashes: SequenceHashes<'_>) -> PrefixMatches {
        let blocks = hashes.len();
        if blocks > LAZY_MIN_BLOCKS {
            if hashes.block_size() >= LAZY_MIN_BLOCK_TOKENS {
                return self.find_prefix_matches_lazy(hashes);
            }
            return self.find_prefix_matches(&hashes.collect::<Vec<u64>>());
        }
        let mut block_hashes = [0u64; LAZY_MIN_BLOCKS];
        for (slot, h) in block_hashes.iter_mut().zip(hashes) {
            *slot = h;
        }
        self.find_prefix_matches(&block_hashes[..blocks])
    }

    /// Same as [`GlobalCkfIndexer::find_prefix_matches_lazy`] with `kernel` forced for this
    /// query (`Auto`: the best available), for differential tests and benchmarks.
    ///
    /// # Errors
    /// [`SearchKernelError::Unavailable`] when the CPU lacks `kernel`; the iterator is not
    /// pulled.
    pub fn find_prefix_matches_lazy_with<I>(
        &self,
        kernel: SearchKernel,
        block_hashes: I,
    ) -> Result<PrefixMatches, SearchKernelError>
    where
        I: IntoIterator<Item = u64>,
    {
        let kernel = kernel.resolve()?;
        Ok(self.search_lazy(block_hashes.into_iter(), kernel))
    }

    /// The lazy query loop (see [`GlobalCkfIndexer::find_prefix_matches_lazy`]): steps of
    /// [`LAZY_STEP`] hashes, each searched with `kernel` over the lanes still matching.
    fn search_lazy(
        &self,
        hashes: impl Iterator<Item = u64>,
        kernel: SearchKernel,
    ) -> PrefixMatches {
        // Captured once, Acquire: every step searches a subset of these lanes.
        let ready = self.ready_mask();
        #[cfg(feature = "testing")]
        test_hooks::count_run(kernel);
        let mut depths = [0u32; MAX_LANES];
        let mut active = ready;
        if active == 0 {
            return PrefixMatches { ready, depths };
        }
        let table = self.table();
        let ahead = table.bytes() >= PREFETCH_MIN_BYTES;
        let mut source = LazySource {
            hashes,
            left: u32::MAX as usize,
            addressing: *self.addressing(),
            rows: ahead.then(|| table.rows()),
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
            let step = self.run_kernel(kernel, &steps[current][..len], active);
            let mut lanes = active;
            while lanes != 0 {
                let l = lanes.trailing_zeros() as usize;
                lanes &= lanes - 1;
                if (step[l] as usize) < len {
                    depths[l] = done + step[l];
                    active &= !(1 << l);
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

    /// Depths of `hashes` in the lanes of `ready` with a resolved kernel (0 for other lanes).
    #[inline]
    fn run_kernel(&self, kernel: SearchKernel, hashes: &[u64], ready: u16) -> [u32; MAX_LANES] {
        let table = self.table();
        let addressing = *self.addressing();
        match kernel {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `kernel` is resolved: `SearchKernel::Avx512` only after run-time detection
            // of its features (`resolve`, `best`).
            SearchKernel::Avx512 => unsafe {
                avx512::search(table, self.manifest().format.seed, hashes, ready)
            },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above, AVX2 detected.
            SearchKernel::Avx2 => unsafe {
                avx2::search(table, self.manifest().format.seed, hashes, ready)
            },
            #[cfg(target_arch = "aarch64")]
            SearchKernel::Neon => neon::search(table, addressing, hashes, ready),
            _ => search_scalar(table, addressing, hashes, ready),
        }
    }
}

/// Block hashes a lazy query ([`GlobalCkfIndexer::find_prefix_matches_lazy`]) pulls and
/// searches per step: the prefetch distance of the slice form (24 positions), so
/// the rows of one step are in flight while the next step is hashed.
pub const LAZY_STEP: usize = PREFETCH_POSITIONS;

/// Full blocks above which [`GlobalCkfIndexer::find_prefix_matches_by_tokens`] hashes lazily:
/// two steps, the most a lazy query pulls before its first search on a large table.
pub const LAZY_MIN_BLOCKS: usize = 2 * LAZY_STEP;

/// Tokens per block from which [`GlobalCkfIndexer::find_prefix_matches_by_tokens`] hashes a
/// long request lazily: the block size where hashing a block (~100 ns at 512 tokens) is slow
/// enough for the memory system to keep up with the four row lines each pulled hash
/// prefetches. At 512 it saved 17-19% at p99 on requests that stop matching halfway and cost
/// 7-9% on ones that match to the end; at 16 and 128 it lost 1.35-1.43x at p99 (ckf-core
/// README, "Token queries: lazy hashing").
pub const LAZY_MIN_BLOCK_TOKENS: usize = 512;

/// The lazy query's side of its iterator: pulls up to a step of hashes, prefetching each one's
/// rows as it arrives when `rows` is set (a large table), so the misses start while the rest
/// of the step is still being computed.
struct LazySource<'t, I> {
    hashes: I,
    /// Positions the query may still pull (the `u32` depth cap).
    left: usize,
    addressing: Addressing,
    rows: Option<bucket::Rows<'t>>,
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
            if let Some(rows) = &self.rows {
                let loc = self.addressing.locate(h);
                rows.prefetch(loc.bucket_a as usize);
                rows.prefetch(loc.bucket_b as usize);
            }
            step[n] = h;
            n += 1;
            self.left -= 1;
        }
        n
    }
}

/// Test hooks (feature `testing` only): which kernel a thread's queries really ran, and hiding
/// kernels from detection to exercise the "CPU lacks it" refusals on any machine.
#[cfg(feature = "testing")]
pub(crate) mod test_hooks {
    use super::SearchKernel;
    use std::cell::Cell;

    thread_local! {
        static RUNS: Cell<[u64; 5]> = const { Cell::new([0; 5]) };
        static HIDDEN: Cell<u8> = const { Cell::new(0) };
    }

    pub(crate) fn count_run(kernel: SearchKernel) {
        RUNS.with(|r| {
            let mut v = r.get();
            v[kernel as usize] += 1;
            r.set(v);
        });
    }

    pub(crate) fn runs(kernel: SearchKernel) -> u64 {
        RUNS.with(|r| r.get()[kernel as usize])
    }

    pub(crate) fn hidden(kernel: SearchKernel) -> bool {
        HIDDEN.with(|h| h.get() & (1 << kernel as u8) != 0)
    }

    pub(crate) fn with_hidden<R>(kernels: &[SearchKernel], f: impl FnOnce() -> R) -> R {
        let before = HIDDEN.with(|h| h.get());
        let mask = kernels.iter().fold(before, |m, &k| m | (1 << k as u8));
        HIDDEN.with(|h| h.set(mask));
        // Restored even when `f` panics (a failing assertion), so later tests on this thread
        // see the real CPU.
        struct Restore(u8);
        impl Drop for Restore {
            fn drop(&mut self) {
                HIDDEN.with(|h| h.set(self.0));
            }
        }
        let _restore = Restore(before);
        f()
    }
}
