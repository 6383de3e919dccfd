//! The AVX-512 search kernel (x86-64 with AVX-512 F/DQ/BW and BMI2, detected at run time).
//!
//! * **Locate, 8 positions at a time.** The format-v2 addressing of [`crate::addressing`]
//!   (`fmix64`, fingerprint, both candidate buckets) is computed for 8 block hashes in 512-bit
//!   registers, `PREFETCH_POSITIONS` / 8 chunks ahead of the chunk being probed, and on
//!   large tables the rows of the position that far ahead are prefetched while each position is
//!   probed. `locate8_matches_addressing` checks it against
//!   [`crate::addressing::Addressing::locate`] bit for bit.
//! * **Row check.** A row of up to 16 lanes is read with (at most) two 512-bit loads per
//!   bucket, compared slot-wise against the fingerprint into a 64-bit slot mask (4 bits per
//!   lane), and folded to one bit per lane.
//!
//! Nothing here is a second copy of a rule: the mix constants and the fingerprint shift are
//! imported from [`crate::addressing`], the slot width, the per-word fold of the slot mask, the
//! row addressing and the prefetch from [`crate::bucket`]; the loop that drives them (ring of
//! located chunks, prefetch schedule, early exit) is the vector kernels' shared
//! `probe_loop!` of `search/ring.rs`; this module only owns their vector form.
//!
//! # Why the row loads are inline assembly
//! The words are `AtomicU64`s written concurrently by ingestion, so a plain (intrinsic) vector
//! load would be a data race in the Rust memory model. An `asm!` block is opaque to the compiler
//! and, not being `pure`, is never reordered with the query's other loads, so the
//! primary-bucket-first order of [`crate::search`] holds. On x86-64 each aligned 8-byte element of
//! a vector load is read in a single access (never torn), and loads are not reordered with other
//! loads, which gives every element the `Acquire` semantics of the portable path. Tearing
//! *between* elements is harmless: lane words are independent images (the weak-read contract).

use std::arch::asm;
use std::arch::x86_64::{
    __m512i, _mm512_cmpeq_epi16_mask, _mm512_cmpgt_epu64_mask, _mm512_loadu_si512,
    _mm512_mask_add_epi64, _mm512_max_epu64, _mm512_mul_epu32, _mm512_mullo_epi64, _mm512_or_si512,
    _mm512_set1_epi16, _mm512_set1_epi64, _mm512_srli_epi64, _mm512_store_si512, _mm512_sub_epi64,
    _mm512_xor_si512, _pext_u64,
};

use super::ring::{Chunk, probe_loop};
use crate::addressing::{FINGERPRINT_SHIFT, FMIX_C1, FMIX_C2, FMIX_SHIFT};
use crate::bucket::{self, FIRST_SLOT_BITS, GROUP_LANES, SLOT_BITS, TransposedTable};

// The row check compares 16-bit elements (`_mm512_cmpeq_epi16_mask`, `_mm512_set1_epi16`, the
// vector form of `bucket::broadcast`): one element per slot of the packed bucket.
const _: () = assert!(SLOT_BITS == 16, "vector row check assumes 16-bit slots");

/// [`crate::addressing::fmix64`] on 8 words, with that function's constants.
#[inline]
#[target_feature(enable = "avx512f,avx512dq")]
fn fmix64x8(k: __m512i) -> __m512i {
    let k = _mm512_xor_si512(k, _mm512_srli_epi64::<FMIX_SHIFT>(k));
    let k = _mm512_mullo_epi64(k, _mm512_set1_epi64(FMIX_C1 as i64));
    let k = _mm512_xor_si512(k, _mm512_srli_epi64::<FMIX_SHIFT>(k));
    let k = _mm512_mullo_epi64(k, _mm512_set1_epi64(FMIX_C2 as i64));
    _mm512_xor_si512(k, _mm512_srli_epi64::<FMIX_SHIFT>(k))
}

/// Format-v2 `locate` of 8 block hashes into `out` (row offsets = bucket * `lanes`).
/// `buckets` is the table's (even) bucket count, at most `MAX_BUCKETS < 2^32`: the fast range
/// keeps `a` and the offset below it and the modular subtraction keeps `b` below it, so every
/// offset is inside the table.
#[inline]
#[target_feature(enable = "avx512f,avx512dq")]
fn locate8(hashes: &[u64; 8], seed: u64, buckets: u64, lanes: u64, out: &mut Chunk) {
    // SAFETY: `hashes` is 64 readable bytes (unaligned load).
    let x = unsafe { _mm512_loadu_si512(hashes.as_ptr().cast()) };
    let h = fmix64x8(_mm512_xor_si512(x, _mm512_set1_epi64(seed as i64)));
    let one = _mm512_set1_epi64(1);
    let n = _mm512_set1_epi64(buckets as i64);
    let fp = _mm512_max_epu64(_mm512_srli_epi64::<FINGERPRINT_SHIFT>(h), one);
    // `fast_range`: `vpmuludq` multiplies the low 32 bits of each element by `n` (< 2^32).
    let a = _mm512_srli_epi64::<32>(_mm512_mul_epu32(h, n));
    let o = _mm512_or_si512(
        _mm512_srli_epi64::<32>(_mm512_mul_epu32(fmix64x8(fp), n)),
        one,
    );
    // `alternate`: `(o - a) mod n`, adding `n` back where the difference wrapped.
    let d = _mm512_sub_epi64(o, a);
    let b = _mm512_mask_add_epi64(d, _mm512_cmpgt_epu64_mask(a, o), d, n);
    let stride = _mm512_set1_epi64(lanes as i64);
    let (a, b) = (_mm512_mullo_epi64(a, stride), _mm512_mullo_epi64(b, stride));
    // SAFETY: `Chunk` is 64-byte aligned and each array is 64 bytes.
    unsafe {
        _mm512_store_si512(out.fp.as_mut_ptr().cast(), fp);
        _mm512_store_si512(out.a.as_mut_ptr().cast(), a);
        _mm512_store_si512(out.b.as_mut_ptr().cast(), b);
    }
}

/// Locates chunk `index` (8 positions from `index * 8`, zero-padded past the end).
#[inline]
#[target_feature(enable = "avx512f,avx512dq")]
fn locate_chunk(
    hashes: &[u64],
    start: usize,
    seed: u64,
    buckets: u64,
    lanes: u64,
    out: &mut Chunk,
) {
    if let Some(full) = hashes.get(start..start + 8) {
        locate8(
            full.try_into().expect("8 hashes"),
            seed,
            buckets,
            lanes,
            out,
        );
    } else {
        let mut pad = [0u64; 8];
        let rest = &hashes[start.min(hashes.len())..];
        pad[..rest.len()].copy_from_slice(rest);
        locate8(&pad, seed, buckets, lanes, out);
    }
}

/// Loads the `u64` words `ptr[i]` for every bit `i` set in `mask` (the others read as 0).
///
/// # Safety
/// Every selected element must lie inside the table allocation and be 8-byte aligned.
/// Unselected elements are never accessed (AVX-512 masked loads suppress faults).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load_words(ptr: *const u64, mask: u8) -> __m512i {
    let v: __m512i;
    // SAFETY: see the function contract; the asm reads memory only at `ptr` under `mask`,
    // writes no memory and uses no stack.
    unsafe {
        asm!(
            "vmovdqu64 {v}{{{k}}}{{z}}, zmmword ptr [{p}]",
            v = lateout(zmm_reg) v,
            k = in(kreg) mask,
            p = in(reg) ptr,
            options(nostack, preserves_flags),
        );
    }
    v
}

/// Loads the 8 `u64` words at `ptr` (half a row of a 16-lane table).
///
/// # Safety
/// `ptr .. ptr + 8` must lie inside the table allocation, 8-byte aligned.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load_full(ptr: *const u64) -> __m512i {
    let v: __m512i;
    // SAFETY: see the function contract; reads 64 bytes at `ptr`, writes no memory.
    unsafe {
        asm!(
            "vmovdqu64 {v}, zmmword ptr [{p}]",
            v = lateout(zmm_reg) v,
            p = in(reg) ptr,
            options(nostack, preserves_flags),
        );
    }
    v
}

/// Bit `l` set for each lane `l` whose word in row `first`, or (`PAIR`) in row `second`,
/// holds `fingerprint`; every word of `first` is loaded before any word of `second`. With
/// `FULL16` the rows have 16 lanes (four full loads per pair), otherwise `lo_mask` selects
/// lanes 0..8 and `hi_mask` lanes 8..16 (0 with at most 8 lanes).
///
/// # Safety
/// `first` (and with `PAIR` `second`) points at the first word of a row of the table; the
/// masks (or `FULL16`) select exactly the row's lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,bmi2")]
unsafe fn row_hits<const FULL16: bool, const PAIR: bool>(
    first: *const u64,
    second: *const u64,
    fingerprint: u16,
    lo_mask: u8,
    hi_mask: u8,
) -> u32 {
    let pattern = _mm512_set1_epi16(fingerprint as i16);
    let hit = |v: __m512i| u64::from(_mm512_cmpeq_epi16_mask(v, pattern));
    let slots = if FULL16 {
        // SAFETY: a 16-lane row is 16 words; the caller guarantees the rows exist.
        let (a0, a1) = unsafe { (load_full(first), load_full(first.add(8))) };
        let mut slots = hit(a0) | hit(a1) << 32;
        if PAIR {
            // SAFETY: as above, for `second`.
            let (b0, b1) = unsafe { (load_full(second), load_full(second.add(8))) };
            slots |= hit(b0) | hit(b1) << 32;
        }
        slots
    } else {
        // SAFETY: the caller's contract covers lanes 0..8 of the rows.
        let mut slots = hit(unsafe { load_words(first, lo_mask) });
        if hi_mask != 0 {
            // SAFETY: lanes 8.. exist (hi_mask != 0), so `first + 8` is inside the row.
            slots |= hit(unsafe { load_words(first.add(8), hi_mask) }) << 32;
        }
        if PAIR {
            // SAFETY: as above, for `second`.
            slots |= hit(unsafe { load_words(second, lo_mask) });
            if hi_mask != 0 {
                // SAFETY: as above.
                slots |= hit(unsafe { load_words(second.add(8), hi_mask) }) << 32;
            }
        }
        slots
    };
    // One bit per slot, 4 per lane word: fold each word's slot bits and gather one bit per lane
    // (the slot layout and the fold are `bucket`'s).
    _pext_u64(bucket::fold_slot_hits(slots), FIRST_SLOT_BITS) as u32
}

/// Prefix depths over `table` for `hashes` (see [`crate::search`]).
///
/// # Safety
/// The CPU supports AVX-512 F, DQ, BW and BMI2.
#[target_feature(enable = "avx512f,avx512dq,avx512bw,bmi2")]
pub(super) unsafe fn search(
    table: &TransposedTable,
    seed: u64,
    hashes: &[u64],
    ready: u16,
) -> [u32; GROUP_LANES] {
    if table.lanes() == GROUP_LANES {
        // SAFETY: forwarded; the table has 16 lanes.
        unsafe { search_with::<true>(table, seed, hashes, ready) }
    } else {
        // SAFETY: forwarded.
        unsafe { search_with::<false>(table, seed, hashes, ready) }
    }
}

/// # Safety
/// As [`search`]; `FULL16` only when the table has 16 lanes.
#[target_feature(enable = "avx512f,avx512dq,avx512bw,bmi2")]
unsafe fn search_with<const FULL16: bool>(
    table: &TransposedTable,
    seed: u64,
    hashes: &[u64],
    ready: u16,
) -> [u32; GROUP_LANES] {
    let lanes = table.lanes();
    let lo_mask = (0xFFu32 >> (8 - lanes.min(8))) as u8;
    let hi_mask = ((1u32 << lanes.saturating_sub(8)) - 1) as u8;
    probe_loop!(
        table, hashes, ready,
        locate(start, out, buckets, lanes) =>
            locate_chunk(hashes, start, seed, buckets, lanes, out),
        // SAFETY: both rows are inside the table, 8-byte aligned, `lanes` words long; the masks /
        // FULL16 select exactly those lanes; our caller guarantees the features.
        pair_hits(a, b, fp) => unsafe { row_hits::<FULL16, true>(a, b, fp, lo_mask, hi_mask) },
        // SAFETY: as above, for one row.
        row_hits(row, fp) => unsafe { row_hits::<FULL16, false>(row, row, fp, lo_mask, hi_mask) },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addressing::{Addressing, TableFormat, fmix64};

    #[test]
    fn locate8_matches_addressing() {
        if !(std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512dq"))
        {
            return;
        }
        for (buckets, lanes) in crate::search::locate_check::SHAPES {
            let format = TableFormat::new(buckets, 0xABCD ^ buckets).unwrap();
            let addressing = Addressing::new(&format).unwrap();
            let mut out = Chunk::EMPTY;
            for k in 0..2000u64 {
                let hashes: [u64; 8] = std::array::from_fn(|i| fmix64(k * 8 + i as u64));
                // SAFETY: features checked above.
                unsafe { locate8(&hashes, format.seed, buckets, lanes, &mut out) };
                let located = (&out.fp, &out.a, &out.b);
                crate::search::locate_check::assert_chunk(&addressing, lanes, &hashes, located);
            }
        }
    }

    /// The vector locate against the scalar rule at the bucket counts and hash bits where the
    /// two could first disagree (`search::locate_check::check_edges`).
    #[test]
    fn locate8_matches_addressing_at_the_edges() {
        if !(std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512dq"))
        {
            return;
        }
        crate::search::locate_check::check_edges(|hashes, seed, buckets, lanes| {
            let mut out = Chunk::EMPTY;
            // SAFETY: features checked above.
            unsafe { locate8(hashes, seed, buckets, lanes, &mut out) };
            (out.fp, out.a, out.b)
        });
    }
}
