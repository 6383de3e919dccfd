//! The AVX2 search kernel (x86-64 with AVX2, detected at run time): for CPUs without AVX-512
//! (AMD Zen 2/3, most Intel client parts).
//!
//! * **Locate** is the scalar [`crate::addressing::Addressing::locate`], driven by
//!   [`super::prefix_loop`] (the same query loop, early exit and prefetch ring as the portable
//!   kernel). AVX2 has no 64-bit multiply, so an emulated 4-way `fmix64` would cost about what
//!   the scalar multiplies cost; the scalar locate also keeps this kernel free of a second copy
//!   of the addressing rule.
//! * **Row check.** A row of up to 16 lanes is read as up to four 256-bit chunks (4 lanes each)
//!   per bucket, the lower bucket's chunks first. Each chunk is compared slot-wise against the
//!   fingerprint (16-bit elements), the two buckets' compare masks are ORed, and a 64-bit
//!   "is zero" compare plus `movmskpd` gives one miss bit per lane: no `pext` (microcoded and slow
//!   on AMD Zen 2), no table lookup.
//!
//! # Why the row loads are inline assembly
//! As in `search/avx512.rs`: the words are `AtomicU64`s written concurrently by ingestion, so an
//! intrinsic vector load would be a data race in the Rust memory model. An `asm!` block is opaque
//! to the compiler and, not being `pure`, is never reordered with the query's other loads, so the
//! lower-bucket-first order of [`crate::search`] holds. On x86-64 each aligned 8-byte element of
//! a vector load (`vmovdqu`, `vpmaskmovq`) is read in a single access (never torn), and loads are
//! not reordered with other loads, which gives every element the `Acquire` semantics of the
//! portable path. Tearing *between* elements is harmless: lane words are independent images (the
//! weak-read contract). A row of fewer than 16 lanes ends in a masked load (`vpmaskmovq`), which
//! never touches (nor faults on) the words past the row.

use std::arch::asm;
use std::arch::x86_64::{
    __m256i, _mm256_castsi256_pd, _mm256_cmpeq_epi16, _mm256_cmpeq_epi64, _mm256_movemask_pd,
    _mm256_or_si256, _mm256_set1_epi16, _mm256_setzero_si256,
};

use super::prefix_loop;
use crate::addressing::Addressing;
use crate::bucket::{MAX_LANES, SLOT_BITS, SLOTS, TransposedTable};

// The row check compares 16-bit elements (`_mm256_cmpeq_epi16`, `_mm256_set1_epi16`, the vector
// form of `bucket::broadcast`), four per 64-bit lane word.
const _: () = assert!(
    SLOT_BITS == 16 && SLOTS == 4,
    "vector row check assumes four 16-bit slots per word"
);

/// Lane words per 256-bit chunk.
const CHUNK: usize = 4;

/// Loads the 4 `u64` words at `ptr`.
///
/// # Safety
/// `ptr .. ptr + 4` must lie inside the table allocation, 8-byte aligned.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load_full(ptr: *const u64) -> __m256i {
    let v: __m256i;
    // SAFETY: see the function contract; reads 32 bytes at `ptr`, writes no memory.
    unsafe {
        asm!(
            "vmovdqu {v}, ymmword ptr [{p}]",
            v = lateout(ymm_reg) v,
            p = in(reg) ptr,
            options(nostack, preserves_flags),
        );
    }
    v
}

/// Loads the words `ptr[i]` whose element `i` of `mask` has its sign bit set (the others read
/// as 0 and are never accessed).
///
/// # Safety
/// Every selected element must lie inside the table allocation and be 8-byte aligned.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load_masked(ptr: *const u64, mask: __m256i) -> __m256i {
    let v: __m256i;
    // SAFETY: see the function contract; `vpmaskmovq` reads only the selected elements and
    // suppresses faults on the others; writes no memory.
    unsafe {
        asm!(
            "vpmaskmovq {v}, {m}, ymmword ptr [{p}]",
            v = lateout(ymm_reg) v,
            m = in(ymm_reg) mask,
            p = in(reg) ptr,
            options(nostack, preserves_flags),
        );
    }
    v
}

/// Loads chunk `k` (lanes `4k .. 4k + 4`) of the row at `row`; the last chunk is masked when
/// `MASKED_TAIL`.
///
/// # Safety
/// `row` is the first word of a table row holding `CHUNKS` chunks (the last one partial and
/// selected by `tail` when `MASKED_TAIL`).
#[inline(always)]
unsafe fn load_chunk<const CHUNKS: usize, const MASKED_TAIL: bool>(
    row: *const u64,
    k: usize,
    tail: __m256i,
) -> __m256i {
    // SAFETY: the caller's contract; `k < CHUNKS` so `row + 4k` starts inside the row.
    unsafe {
        if MASKED_TAIL && k + 1 == CHUNKS {
            load_masked(row.add(CHUNK * k), tail)
        } else {
            load_full(row.add(CHUNK * k))
        }
    }
}

/// Bit `l` set for each lane `l` (< `4 * CHUNKS`) whose word in row `lo` or row `hi` holds
/// `fingerprint`; every word of the lower row is loaded before any word of the higher one.
///
/// # Safety
/// `lo` and `hi` point at the first word of rows of the table; the rows have `4 * CHUNKS`
/// lanes, or (`MASKED_TAIL`) `4 * (CHUNKS - 1)` plus the lanes whose `tail` element is negative.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn row_hits<const CHUNKS: usize, const MASKED_TAIL: bool>(
    lo: *const u64,
    hi: *const u64,
    fingerprint: u16,
    tail: __m256i,
) -> u32 {
    let pattern = _mm256_set1_epi16(fingerprint as i16);
    let zero = _mm256_setzero_si256();
    // SAFETY: forwarded (both rows exist with this chunk layout).
    let a: [__m256i; CHUNKS] =
        std::array::from_fn(|k| unsafe { load_chunk::<CHUNKS, MASKED_TAIL>(lo, k, tail) });
    // SAFETY: as above.
    let b: [__m256i; CHUNKS] =
        std::array::from_fn(|k| unsafe { load_chunk::<CHUNKS, MASKED_TAIL>(hi, k, tail) });
    let mut misses = 0u32;
    for k in 0..CHUNKS {
        // 0xFFFF in every slot equal to the fingerprint, in either bucket.
        let slots = _mm256_or_si256(
            _mm256_cmpeq_epi16(a[k], pattern),
            _mm256_cmpeq_epi16(b[k], pattern),
        );
        // All-ones 64-bit element where no slot of the lane hit; its sign bit is the miss bit.
        let missed = _mm256_cmpeq_epi64(slots, zero);
        misses |= (_mm256_movemask_pd(_mm256_castsi256_pd(missed)) as u32) << (CHUNK * k);
    }
    // Lanes past the row (masked or absent) read as misses here; the caller masks with the
    // active lanes, which are all inside the row.
    !misses
}

/// Prefix depths over `table` for `hashes` (see [`crate::search`]).
///
/// # Safety
/// The CPU supports AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn search(
    table: &TransposedTable,
    addressing: Addressing,
    hashes: &[u64],
    ready: u16,
) -> [u32; MAX_LANES] {
    let lanes = table.lanes();
    let chunks = lanes.div_ceil(CHUNK);
    let masked = !lanes.is_multiple_of(CHUNK);
    // SAFETY (all arms): forwarded; `chunks` and `masked` describe this table's rows.
    unsafe {
        match (chunks, masked) {
            (1, false) => search_with::<1, false>(table, addressing, hashes, ready),
            (1, true) => search_with::<1, true>(table, addressing, hashes, ready),
            (2, false) => search_with::<2, false>(table, addressing, hashes, ready),
            (2, true) => search_with::<2, true>(table, addressing, hashes, ready),
            (3, false) => search_with::<3, false>(table, addressing, hashes, ready),
            (3, true) => search_with::<3, true>(table, addressing, hashes, ready),
            (4, false) => search_with::<4, false>(table, addressing, hashes, ready),
            _ => search_with::<4, true>(table, addressing, hashes, ready),
        }
    }
}

/// # Safety
/// As [`search`]; `CHUNKS` and `MASKED_TAIL` describe the table's rows
/// (`CHUNKS = ceil(lanes / 4)`, `MASKED_TAIL = lanes % 4 != 0`).
#[target_feature(enable = "avx2")]
unsafe fn search_with<const CHUNKS: usize, const MASKED_TAIL: bool>(
    table: &TransposedTable,
    addressing: Addressing,
    hashes: &[u64],
    ready: u16,
) -> [u32; MAX_LANES] {
    let tail = tail_mask(table.lanes());
    let rows = table.rows();
    prefix_loop(table, addressing, hashes, ready, |lo, hi, fp, _active| {
        // `lo`, `hi` are candidate buckets of `addressing` (< bucket_count): `offset` keeps them
        // inside the table.
        let (lo, hi) = (rows.at(rows.offset(lo)), rows.at(rows.offset(hi)));
        // SAFETY: both rows are inside the table, 8-byte aligned (the table is 128-byte aligned
        // and words are 8 bytes), with the chunk layout of `CHUNKS`/`MASKED_TAIL` and `tail`;
        // our caller guarantees AVX2.
        unsafe { row_hits::<CHUNKS, MASKED_TAIL>(lo, hi, fp, tail) }
    })
}

/// The `vpmaskmovq` mask of a row's last chunk: element `i` selected (all ones) when lane
/// `4 * (chunks - 1) + i` exists.
#[inline]
#[target_feature(enable = "avx2")]
fn tail_mask(lanes: usize) -> __m256i {
    let in_last = lanes - CHUNK * (lanes.div_ceil(CHUNK) - 1);
    let m: [i64; CHUNK] = std::array::from_fn(|i| if i < in_last { -1 } else { 0 });
    // SAFETY: `m` is 32 readable bytes (unaligned load of a local array, not table memory).
    unsafe { std::arch::x86_64::_mm256_loadu_si256(m.as_ptr().cast()) }
}
