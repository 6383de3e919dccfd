//! The AVX2 search kernel (x86-64 with AVX2, detected at run time): for CPUs without AVX-512
//! (AMD Zen 2/3, most Intel client parts).
//!
//! * **Locate, 4 positions per vector, 8 per chunk.** The format-v2 addressing of
//!   [`crate::addressing`] (`fmix64`, fingerprint, both candidate buckets) computed in 256-bit
//!   registers, chunks ahead of the one being probed, with the rows of the position
//!   `PREFETCH_POSITIONS` ahead prefetched on large tables (the vector kernels' shared loop,
//!   `probe_loop!` of `search/ring.rs`). AVX2 has no 64-bit multiply:
//!   it is built from three 32x32->64 multiplies (`vpmuludq`). Bucket indices are below 2^32,
//!   so the signed 64-bit compare orders them. `locate4_matches_addressing` checks the result
//!   against [`crate::addressing::Addressing::locate`] bit for bit.
//! * **Row check.** A row of up to 16 lanes is read as up to four 256-bit chunks (4 lanes each)
//!   per bucket, the primary bucket's chunks first. Each chunk is compared slot-wise against the
//!   fingerprint (16-bit elements), the two buckets' compare masks are ORed (one bucket's alone
//!   where the alternate row is read on demand), and a 64-bit
//!   "is zero" compare plus `movmskpd` gives one miss bit per lane: no `pext` (microcoded and slow
//!   on AMD Zen 2), no table lookup.
//!
//! # Why the row loads are inline assembly
//! As in `search/avx512.rs`: the words are `AtomicU64`s written concurrently by ingestion, so an
//! intrinsic vector load would be a data race in the Rust memory model. An `asm!` block is opaque
//! to the compiler and, not being `pure`, is never reordered with the query's other loads, so the
//! primary-bucket-first order of [`crate::search`] holds. On x86-64 each aligned 8-byte element of
//! a vector load (`vmovdqu`, `vpmaskmovq`) is read in a single access (never torn), and loads are
//! not reordered with other loads, which gives every element the `Acquire` semantics of the
//! portable path. Tearing *between* elements is harmless: lane words are independent images (the
//! weak-read contract). A row of fewer than 16 lanes ends in a masked load (`vpmaskmovq`), which
//! never touches (nor faults on) the words past the row.

use std::arch::asm;
use std::arch::x86_64::{
    __m256i, _mm256_add_epi64, _mm256_and_si256, _mm256_castsi256_pd, _mm256_cmpeq_epi16,
    _mm256_cmpeq_epi64, _mm256_cmpgt_epi64, _mm256_loadu_si256, _mm256_movemask_pd,
    _mm256_mul_epu32, _mm256_or_si256, _mm256_set1_epi16, _mm256_set1_epi64x, _mm256_setzero_si256,
    _mm256_slli_epi64, _mm256_srli_epi64, _mm256_store_si256, _mm256_sub_epi64, _mm256_xor_si256,
};

use super::ring::{Chunk, probe_loop};
use crate::addressing::{FINGERPRINT_SHIFT, FMIX_C1, FMIX_C2, FMIX_SHIFT};
use crate::bucket::{GROUP_LANES, SLOT_BITS, SLOTS, TransposedTable};

// The row check compares 16-bit elements (`_mm256_cmpeq_epi16`, `_mm256_set1_epi16`, the vector
// form of `bucket::broadcast`), four per 64-bit lane word.
const _: () = assert!(
    SLOT_BITS == 16 && SLOTS == 4,
    "vector row check assumes four 16-bit slots per word"
);

/// The AVX2 shift intrinsics take their count as `i32` (the AVX-512 ones as `u32`).
const FMIX_SHIFT_I: i32 = FMIX_SHIFT as i32;
const FINGERPRINT_SHIFT_I: i32 = FINGERPRINT_SHIFT as i32;

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

/// Bit `l` set for each lane `l` (< `4 * CHUNKS`) whose word in row `first`, or (`PAIR`) in
/// row `second`, holds `fingerprint`; every word of `first` is loaded before any word of
/// `second`.
///
/// # Safety
/// `first` (and with `PAIR` `second`) points at the first word of a row of the table; the rows
/// have `4 * CHUNKS` lanes, or (`MASKED_TAIL`) `4 * (CHUNKS - 1)` plus the lanes whose `tail`
/// element is negative.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn row_hits<const CHUNKS: usize, const MASKED_TAIL: bool, const PAIR: bool>(
    first: *const u64,
    second: *const u64,
    fingerprint: u16,
    tail: __m256i,
) -> u32 {
    let pattern = _mm256_set1_epi16(fingerprint as i16);
    let zero = _mm256_setzero_si256();
    // SAFETY: forwarded (the rows exist with this chunk layout).
    let a: [__m256i; CHUNKS] =
        std::array::from_fn(|k| unsafe { load_chunk::<CHUNKS, MASKED_TAIL>(first, k, tail) });
    // SAFETY: as above (`second` is only read with `PAIR`).
    let b: [__m256i; CHUNKS] = std::array::from_fn(|k| {
        if PAIR {
            unsafe { load_chunk::<CHUNKS, MASKED_TAIL>(second, k, tail) }
        } else {
            zero
        }
    });
    let mut misses = 0u32;
    for k in 0..CHUNKS {
        // 0xFFFF in every slot equal to the fingerprint, in either row.
        let mut slots = _mm256_cmpeq_epi16(a[k], pattern);
        if PAIR {
            slots = _mm256_or_si256(slots, _mm256_cmpeq_epi16(b[k], pattern));
        }
        // All-ones 64-bit element where no slot of the lane hit; its sign bit is the miss bit.
        let missed = _mm256_cmpeq_epi64(slots, zero);
        misses |= (_mm256_movemask_pd(_mm256_castsi256_pd(missed)) as u32) << (CHUNK * k);
    }
    // Lanes past the row (masked or absent) read as misses here; the caller masks with the
    // active lanes, which are all inside the row.
    !misses
}

/// `a * c` (wrapping, 64-bit) on 4 words, from 32x32->64 multiplies: AVX2 has no `vpmullq`.
#[inline]
#[target_feature(enable = "avx2")]
fn mul64(a: __m256i, c: u64) -> __m256i {
    let c_lo = _mm256_set1_epi64x(i64::from(c as u32));
    let c_hi = _mm256_set1_epi64x((c >> 32) as i64);
    let lo_lo = _mm256_mul_epu32(a, c_lo);
    let cross = _mm256_add_epi64(
        _mm256_mul_epu32(_mm256_srli_epi64::<32>(a), c_lo),
        _mm256_mul_epu32(a, c_hi),
    );
    _mm256_add_epi64(lo_lo, _mm256_slli_epi64::<32>(cross))
}

/// [`crate::addressing::fmix64`] on 4 words, with that function's constants.
#[inline]
#[target_feature(enable = "avx2")]
fn fmix64x4(k: __m256i) -> __m256i {
    let k = _mm256_xor_si256(k, _mm256_srli_epi64::<FMIX_SHIFT_I>(k));
    let k = mul64(k, FMIX_C1);
    let k = _mm256_xor_si256(k, _mm256_srli_epi64::<FMIX_SHIFT_I>(k));
    let k = mul64(k, FMIX_C2);
    _mm256_xor_si256(k, _mm256_srli_epi64::<FMIX_SHIFT_I>(k))
}

/// Format-v2 `locate` of 4 block hashes into `fp`, `a`, `b` (row offsets = bucket * `lanes`).
/// `buckets` is the table's (even) bucket count, at most `MAX_BUCKETS < 2^32`: the fast range
/// keeps `a` and the offset below it and the modular subtraction keeps `b` below it, so every
/// offset is inside the table.
#[inline]
#[target_feature(enable = "avx2")]
fn locate4(
    hashes: &[u64],
    seed: u64,
    buckets: u64,
    lanes: u64,
    fp_out: &mut [u64],
    a_out: &mut [u64],
    b_out: &mut [u64],
) {
    assert!(hashes.len() >= 4 && fp_out.len() >= 4 && a_out.len() >= 4 && b_out.len() >= 4);
    // SAFETY: `hashes` has at least 4 readable words (unaligned load).
    let x = unsafe { _mm256_loadu_si256(hashes.as_ptr().cast()) };
    let h = fmix64x4(_mm256_xor_si256(x, _mm256_set1_epi64x(seed as i64)));
    let zero = _mm256_setzero_si256();
    let one = _mm256_set1_epi64x(1);
    let n = _mm256_set1_epi64x(buckets as i64);
    // Fingerprint: the top 16 bits, 0 remapped to 1 (`max(.., 1)` of the scalar rule).
    let fp = _mm256_srli_epi64::<FINGERPRINT_SHIFT_I>(h);
    let fp = _mm256_or_si256(fp, _mm256_and_si256(_mm256_cmpeq_epi64(fp, zero), one));
    // `fast_range`: `vpmuludq` multiplies the low 32 bits of each element by `n` (< 2^32).
    let a = _mm256_srli_epi64::<32>(_mm256_mul_epu32(h, n));
    let o = _mm256_or_si256(
        _mm256_srli_epi64::<32>(_mm256_mul_epu32(fmix64x4(fp), n)),
        one,
    );
    // `alternate`: `(o - a) mod n`, adding `n` back where the difference wrapped (both are
    // below 2^32, so the signed compare orders them).
    let d = _mm256_sub_epi64(o, a);
    let b = _mm256_add_epi64(d, _mm256_and_si256(_mm256_cmpgt_epi64(a, o), n));
    // Bucket and lane count both fit 32 bits: one 32x32->64 multiply.
    let stride = _mm256_set1_epi64x(lanes as i64);
    let (a, b) = (_mm256_mul_epu32(a, stride), _mm256_mul_epu32(b, stride));
    // SAFETY: each output has at least 4 writable words (asserted above); unaligned-safe
    // stores are not needed because the callers pass 32-byte aligned halves of a `Chunk`, but
    // `_mm256_store_si256` requires that alignment, which `Chunk`'s layout guarantees.
    unsafe {
        _mm256_store_si256(fp_out.as_mut_ptr().cast(), fp);
        _mm256_store_si256(a_out.as_mut_ptr().cast(), a);
        _mm256_store_si256(b_out.as_mut_ptr().cast(), b);
    }
}

/// Locates the chunk of 8 positions from `start` (zero-padded past the end) into `out`.
#[inline]
#[target_feature(enable = "avx2")]
fn locate_chunk(
    hashes: &[u64],
    start: usize,
    seed: u64,
    buckets: u64,
    lanes: u64,
    out: &mut Chunk,
) {
    let mut pad = [0u64; 8];
    let src = match hashes.get(start..start + 8) {
        Some(full) => full,
        None => {
            let rest = &hashes[start.min(hashes.len())..];
            pad[..rest.len()].copy_from_slice(rest);
            &pad
        }
    };
    let Chunk { fp, a, b } = out;
    locate4(
        &src[..4],
        seed,
        buckets,
        lanes,
        &mut fp[..4],
        &mut a[..4],
        &mut b[..4],
    );
    locate4(
        &src[4..],
        seed,
        buckets,
        lanes,
        &mut fp[4..],
        &mut a[4..],
        &mut b[4..],
    );
}

/// Prefix depths over `table` for `hashes` (see [`crate::search`]).
///
/// # Safety
/// The CPU supports AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn search(
    table: &TransposedTable,
    seed: u64,
    hashes: &[u64],
    ready: u16,
) -> [u32; GROUP_LANES] {
    let lanes = table.lanes();
    let chunks = lanes.div_ceil(CHUNK);
    let masked = !lanes.is_multiple_of(CHUNK);
    // SAFETY (all arms): forwarded; `chunks` and `masked` describe this table's rows.
    unsafe {
        match (chunks, masked) {
            (1, false) => search_with::<1, false>(table, seed, hashes, ready),
            (1, true) => search_with::<1, true>(table, seed, hashes, ready),
            (2, false) => search_with::<2, false>(table, seed, hashes, ready),
            (2, true) => search_with::<2, true>(table, seed, hashes, ready),
            (3, false) => search_with::<3, false>(table, seed, hashes, ready),
            (3, true) => search_with::<3, true>(table, seed, hashes, ready),
            (4, false) => search_with::<4, false>(table, seed, hashes, ready),
            _ => search_with::<4, true>(table, seed, hashes, ready),
        }
    }
}

/// # Safety
/// As [`search`]; `CHUNKS` and `MASKED_TAIL` describe the table's rows
/// (`CHUNKS = ceil(lanes / 4)`, `MASKED_TAIL = lanes % 4 != 0`).
#[target_feature(enable = "avx2")]
unsafe fn search_with<const CHUNKS: usize, const MASKED_TAIL: bool>(
    table: &TransposedTable,
    seed: u64,
    hashes: &[u64],
    ready: u16,
) -> [u32; GROUP_LANES] {
    let tail = tail_mask(table.lanes());
    probe_loop!(
        table, hashes, ready,
        locate(start, out, buckets, lanes) =>
            locate_chunk(hashes, start, seed, buckets, lanes, out),
        // SAFETY: both rows are inside the table, 8-byte aligned, with the chunk layout of
        // `CHUNKS` / `MASKED_TAIL` and `tail`; our caller guarantees AVX2.
        pair_hits(a, b, fp) => unsafe { row_hits::<CHUNKS, MASKED_TAIL, true>(a, b, fp, tail) },
        // SAFETY: as above, for one row.
        row_hits(row, fp) => unsafe { row_hits::<CHUNKS, MASKED_TAIL, false>(row, row, fp, tail) },
    )
}

/// The `vpmaskmovq` mask of a row's last chunk: element `i` selected (all ones) when lane
/// `4 * (chunks - 1) + i` exists.
#[inline]
#[target_feature(enable = "avx2")]
fn tail_mask(lanes: usize) -> __m256i {
    let in_last = lanes - CHUNK * (lanes.div_ceil(CHUNK) - 1);
    let m: [i64; CHUNK] = std::array::from_fn(|i| if i < in_last { -1 } else { 0 });
    // SAFETY: `m` is 32 readable bytes (unaligned load of a local array, not table memory).
    unsafe { _mm256_loadu_si256(m.as_ptr().cast()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addressing::{Addressing, TableFormat, fmix64};

    #[test]
    fn locate4_matches_addressing() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            eprintln!("AVX2 not available on this CPU: locate4 check skipped");
            return;
        }
        for (buckets, lanes) in crate::search::locate_check::SHAPES {
            let format = TableFormat::new(buckets, 0xABCD ^ buckets).unwrap();
            let addressing = Addressing::new(&format).unwrap();
            let mut out = Chunk::EMPTY;
            // Hashes whose raw fingerprint is 0 (the remap) are among 2^16-in-1 cases; the
            // loop covers ~16,000 positions, and `raw_zero` below forces some.
            let raw_zero: Vec<u64> = (0..2_000_000u64)
                .filter(|&h| addressing.raw_fingerprint(h) == 0)
                .take(8)
                .collect();
            assert!(!raw_zero.is_empty());
            for k in 0..2001u64 {
                let hashes: [u64; 8] = if k == 2000 {
                    std::array::from_fn(|i| raw_zero[i % raw_zero.len()])
                } else {
                    std::array::from_fn(|i| fmix64(k * 8 + i as u64))
                };
                // SAFETY: AVX2 checked above.
                unsafe { locate_chunk(&hashes, 0, format.seed, buckets, lanes, &mut out) };
                let located = (&out.fp, &out.a, &out.b);
                crate::search::locate_check::assert_chunk(&addressing, lanes, &hashes, located);
            }
        }
    }

    /// The vector locate against the scalar rule at the bucket counts and hash bits where the
    /// two could first disagree (`search::locate_check::check_edges`).
    #[test]
    fn locate4_matches_addressing_at_the_edges() {
        if !(std::arch::is_x86_feature_detected!("avx2")) {
            return;
        }
        crate::search::locate_check::check_edges(|hashes, seed, buckets, lanes| {
            let mut out = Chunk::EMPTY;
            // SAFETY: AVX2 checked above.
            unsafe { locate_chunk(hashes, 0, seed, buckets, lanes, &mut out) };
            (out.fp, out.a, out.b)
        });
    }
}
