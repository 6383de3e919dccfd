//! The NEON search kernel (aarch64; NEON is part of the base ISA there, so it is always
//! available on aarch64 targets). Built and tested under `qemu-aarch64` on an x86-64 machine:
//! its answers are checked like every kernel's, its speed has not been measured on aarch64
//! hardware, so `Auto` does not pick it (force it with `SearchKernel::Neon`).
//!
//! * **Locate** is the scalar [`crate::addressing::Addressing::locate`] inside
//!   [`super::prefix::prefix_loop`] (the portable kernel's loop, early exit and prefetch ring).
//! * **Row check.** A row is read as 128-bit chunks of 2 lanes (a 64-bit load for a last odd
//!   lane), compared slot-wise against the fingerprint (`vceqq_u16`), the two buckets' masks
//!   ORed, and each lane's 64-bit compare word tested for nonzero.
//!
//! # Loads and ordering
//! As in the x86 kernels the loads are inline assembly (the words are `AtomicU64`s written
//! concurrently; an intrinsic load would be a data race in the Rust memory model). An aligned
//! 128-bit SIMD load is two single-copy-atomic 64-bit reads on AArch64, so no lane word is ever
//! torn. Unlike x86-64, AArch64 may reorder loads with later loads, so each row's loads are
//! followed by `dmb ishld`: the primary row's words are read before the alternate row's (the
//! read order of [`crate::search`]) and, like the portable kernel's `Acquire` loads, before every
//! later load.

use std::arch::aarch64::{
    uint16x8_t, uint64x2_t, vceqq_u16, vdupq_n_u16, vgetq_lane_u64, vorrq_u16,
    vreinterpretq_u16_u64, vreinterpretq_u64_u16,
};
use std::arch::asm;

use super::prefix::prefix_loop;
use crate::addressing::Addressing;
use crate::bucket::{GROUP_LANES, SLOT_BITS, SLOTS, TransposedTable};

const _: () = assert!(
    SLOT_BITS == 16 && SLOTS == 4,
    "vector row check assumes four 16-bit slots per word"
);

/// Loads the 2 `u64` words at `ptr`.
///
/// # Safety
/// `ptr .. ptr + 2` inside the table allocation, 8-byte aligned.
#[inline(always)]
unsafe fn load2(ptr: *const u64) -> uint64x2_t {
    let v: uint64x2_t;
    // SAFETY: the caller's contract; reads 16 bytes at `ptr`, writes no memory.
    unsafe {
        asm!(
            "ldr {v:q}, [{p}]",
            v = lateout(vreg) v,
            p = in(reg) ptr,
            options(nostack, preserves_flags),
        );
    }
    v
}

/// Loads the `u64` word at `ptr` into element 0 (element 1 is zero).
///
/// # Safety
/// `ptr` inside the table allocation, 8-byte aligned.
#[inline(always)]
unsafe fn load1(ptr: *const u64) -> uint64x2_t {
    let v: uint64x2_t;
    // SAFETY: the caller's contract; reads 8 bytes at `ptr` (a `ldr d` zeroes the upper half).
    unsafe {
        asm!(
            "ldr {v:d}, [{p}]",
            v = lateout(vreg) v,
            p = in(reg) ptr,
            options(nostack, preserves_flags),
        );
    }
    v
}

/// Orders the loads before it before every later load (`dmb ishld`).
#[inline(always)]
fn load_barrier() {
    // SAFETY: a barrier has no operands and touches no memory; without `nomem` the compiler
    // also keeps memory accesses on their side of it.
    unsafe { asm!("dmb ishld", options(nostack, preserves_flags)) };
}

/// Chunk `k` (lanes `2k`, `2k + 1`) of the row at `row`; a 64-bit load when it is the last
/// chunk and `ODD`.
///
/// # Safety
/// `row` is the first word of a row of `2 * CHUNKS` lanes, or `2 * CHUNKS - 1` when `ODD`.
#[inline(always)]
unsafe fn load_chunk<const CHUNKS: usize, const ODD: bool>(
    row: *const u64,
    k: usize,
) -> uint64x2_t {
    // SAFETY: the caller's contract; `k < CHUNKS`.
    unsafe {
        if ODD && k + 1 == CHUNKS {
            load1(row.add(2 * k))
        } else {
            load2(row.add(2 * k))
        }
    }
}

/// Bit `l` set for each lane `l` whose word in row `first`, or (`PAIR`) in row `second`, holds
/// `fingerprint`; `first` is loaded before `second`.
///
/// # Safety
/// `first` (and with `PAIR` `second`): first words of rows with the layout of `CHUNKS` / `ODD`
/// (see [`load_chunk`]).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn row_hits<const CHUNKS: usize, const ODD: bool, const PAIR: bool>(
    first: *const u64,
    second: *const u64,
    fingerprint: u16,
) -> u32 {
    // SAFETY: forwarded.
    let a: [uint64x2_t; CHUNKS] =
        std::array::from_fn(|k| unsafe { load_chunk::<CHUNKS, ODD>(first, k) });
    load_barrier();
    let pattern = vdupq_n_u16(fingerprint);
    let b: [uint16x8_t; CHUNKS] = if PAIR {
        // SAFETY: forwarded.
        let b: [uint64x2_t; CHUNKS] =
            std::array::from_fn(|k| unsafe { load_chunk::<CHUNKS, ODD>(second, k) });
        load_barrier();
        std::array::from_fn(|k| vceqq_u16(vreinterpretq_u16_u64(b[k]), pattern))
    } else {
        [vdupq_n_u16(0); CHUNKS]
    };
    let mut hits = 0u32;
    for k in 0..CHUNKS {
        let x = vreinterpretq_u64_u16(vorrq_u16(
            vceqq_u16(vreinterpretq_u16_u64(a[k]), pattern),
            b[k],
        ));
        hits |= u32::from(vgetq_lane_u64::<0>(x) != 0) << (2 * k);
        hits |= u32::from(vgetq_lane_u64::<1>(x) != 0) << (2 * k + 1);
    }
    // A missing odd lane reads as zero: no hit (fingerprints are never 0).
    hits
}

/// Prefix depths over `table` for `hashes` (see [`crate::search`]).
pub(super) fn search(
    table: &TransposedTable,
    addressing: Addressing,
    hashes: &[u64],
    ready: u16,
) -> [u32; GROUP_LANES] {
    let lanes = table.lanes();
    let odd = lanes % 2 == 1;
    macro_rules! by_chunks {
        ($($c:literal),*) => {
            match (lanes.div_ceil(2), odd) {
                $(
                    ($c, false) => search_with::<$c, false>(table, addressing, hashes, ready),
                    ($c, true) => search_with::<$c, true>(table, addressing, hashes, ready),
                )*
                _ => unreachable!("1..=16 lanes"),
            }
        };
    }
    // SAFETY: NEON is part of the aarch64 base ISA (this module is only built there).
    unsafe { by_chunks!(1, 2, 3, 4, 5, 6, 7, 8) }
}

#[target_feature(enable = "neon")]
fn search_with<const CHUNKS: usize, const ODD: bool>(
    table: &TransposedTable,
    addressing: Addressing,
    hashes: &[u64],
    ready: u16,
) -> [u32; GROUP_LANES] {
    let rows = table.rows();
    prefix_loop(
        table,
        addressing,
        hashes,
        ready,
        |a, b, fp, _active| {
            let (a, b) = (rows.at(rows.offset(a)), rows.at(rows.offset(b)));
            // SAFETY: both rows are inside the table (clamped offsets), 8-byte aligned, with
            // `table.lanes()` words: the layout `CHUNKS` / `ODD` describe.
            unsafe { row_hits::<CHUNKS, ODD, true>(a, b, fp) }
        },
        |row, fp, _active| {
            let row = rows.at(rows.offset(row));
            // SAFETY: as above, for one row.
            unsafe { row_hits::<CHUNKS, ODD, false>(row, row, fp) }
        },
    )
}
