//! Memory hints for the large tables: transparent huge pages (Linux) and the cache prefetch.
//! Both are hints only: they change how fast the tables are reached, never their contents.
//! This module is the crate's one owner of the prefetch instruction ([`prefetch`]) and of the
//! huge-page advice; the filter table, the block map and the consumer's row view call them.
//!
//! # Transparent huge pages
//!
//! A block touches random rows or lines of the table: two rows per block for the consumer's
//! search, two filter buckets and two block-map lines for the producer's ingest. On a table far
//! larger than the caches every one of them is also a TLB miss, and with 4 KiB pages (worse,
//! under nested paging in a VM) the page walk costs as much as the row itself. Backing the
//! table with 2 MiB pages removes most of those walks.
//!
//! Two ways in, both advisory (on failure: older kernel, THP disabled, no free huge pages, the
//! table simply keeps 4 KiB pages; contents are never changed):
//! * [`zeroed_vec`] (producer filter table and block map): the allocation's 2 MiB-aligned
//!   interior is marked `MADV_HUGEPAGE` *before* it is first written, so the zero fill itself
//!   faults in huge pages wherever THP is in `madvise` (or `always`) mode.
//! * [`advise`] (consumer table, allocated and zeroed before it runs): the range is marked
//!   `MADV_HUGEPAGE` and then collapsed synchronously with `MADV_COLLAPSE` (Linux >= 6.1).
//!
//! # Prefetch
//!
//! [`prefetch`] hints the CPU to fetch one cache line ahead of its use, so the misses of a
//! table far larger than the caches overlap instead of being paid one after another.

/// Tables smaller than this are left alone (they mostly live in the caches anyway).
pub(crate) const MIN_BYTES: usize = 8 << 20;

/// Best effort; returns whether the kernel accepted the collapse of the table's interior.
/// `start` and `bytes` are the consumer table's allocation (its first word and its size).
pub(crate) fn advise(start: *const u8, bytes: usize) -> bool {
    if bytes < MIN_BYTES {
        return false;
    }
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        // Linux UAPI value (include/uapi/asm-generic/mman-common.h); not in every libc target.
        const MADV_COLLAPSE: libc::c_int = 25;
        let start = start as usize;
        let end = start + bytes;
        let lo = start.next_multiple_of(HUGE);
        let hi = end & !(HUGE - 1);
        if hi <= lo {
            return false;
        }
        let (addr, len) = (lo as *mut libc::c_void, hi - lo);
        // SAFETY: `[lo, hi)` lies inside the table's live allocation, which is owned by the
        // indexer being built and not yet shared; both advices only change how the kernel backs
        // the pages (MADV_COLLAPSE copies contents into the huge page), never the contents.
        unsafe {
            libc::madvise(addr, len, libc::MADV_HUGEPAGE) == 0
                && libc::madvise(addr, len, MADV_COLLAPSE) == 0
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = start;
        false
    }
}

/// `vec![T::default(); n]` (for the tables: zero words and empty lines), with the
/// allocation's pages marked `MADV_HUGEPAGE` before the fill writes them when it is at least
/// [`MIN_BYTES`]: the fill then faults in 2 MiB pages, no collapse needed. The fill is one pass
/// of writes over the table, once per allocation, where `calloc` might have left untouched
/// zero pages: the table's pages count in RSS from the start.
///
/// # Panics
/// Like `Vec::with_capacity` when the size overflows or the allocator fails.
pub(crate) fn zeroed_vec<T: Copy + Default>(n: usize) -> Vec<T> {
    let mut v: Vec<T> = Vec::with_capacity(n);
    let bytes = n * std::mem::size_of::<T>();
    if bytes >= MIN_BYTES {
        advise_untouched(v.as_ptr().cast(), bytes);
    }
    v.resize(n, T::default());
    v
}

/// Marks the 2 MiB-aligned interior of `[ptr, ptr + bytes)` `MADV_HUGEPAGE`. Best effort;
/// returns whether the kernel accepted. Pages already faulted in keep their size.
fn advise_untouched(ptr: *const u8, bytes: usize) -> bool {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = ptr as usize;
        let lo = start.next_multiple_of(HUGE);
        let hi = (start + bytes) & !(HUGE - 1);
        if hi <= lo {
            return false;
        }
        // SAFETY: `[lo, hi)` lies inside a live allocation owned by the caller; the advice
        // only changes how the kernel backs its pages, never their contents.
        unsafe { libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_HUGEPAGE) == 0 }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (ptr, bytes);
        false
    }
}

/// Where a query's row prefetches put the lines they fetch ([`prefetch_to`]).
///
/// A query on a table far beyond the caches is bound by how many misses the core keeps in
/// flight. A prefetch into the L1 holds one of the L1's few miss buffers until its line
/// arrives; a prefetch into the L2 (`PREFETCHT1`) is tracked by the L2's larger miss queue, so
/// more rows are in flight at once. Measured with `bench-compare` and the search bench's
/// `-- lanes`, binaries alternated in one session (docs/performance.md, "Query search"):
/// * Intel Xeon family 6 model 167: 16 lanes on 256 MiB p99 8.4-9.4 -> 6.8-7.6 us (with the
///   caller's chain), 64 lanes on 1 GiB p99 29-32 -> 24-25 us;
/// * AMD EPYC Zen 4 (family 25 model 17): 16 lanes on 256 MiB p99 8.2-9.5 -> 5.3-6.0 us (0.68-0.72x
///   CRTC's, was 1.00), 64 lanes on 1 GiB p50 3.0-3.5 -> 1.8-2.0 us and p99 31-39 -> 24-27 us;
///
/// but on a 2 MiB table (cache-resident) the L2 hint cost 8-12% at p50 (Intel), since the rows
/// are then read from the L2 instead of the L1: tables under [`L2_PREFETCH_MIN_BYTES`] keep the
/// L1. AMD cores up to Zen 3 treat both hints alike (AMD's optimization guides), so the L2 hint
/// costs them nothing. The producer's prefetches, which are followed by writes, were slower
/// into the L2 (Intel, 2^20 buckets 9.1-9.3 -> 8.6 M block ops/s) and stay in the L1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PrefetchLevel {
    /// `PREFETCHT0`: into every level.
    L1,
    /// `PREFETCHT1`: into the L2 and below.
    L2,
}

/// Tables (one lane group's) from this size take [`PrefetchLevel::L2`]: far beyond a core's L2
/// and its usual share of the LLC, where a row comes from DRAM.
pub(crate) const L2_PREFETCH_MIN_BYTES: usize = 64 << 20;

impl PrefetchLevel {
    /// The level for the rows of a table of `bytes`: [`PrefetchLevel::L2`] from
    /// [`L2_PREFETCH_MIN_BYTES`], else [`PrefetchLevel::L1`].
    pub(crate) const fn for_rows(bytes: usize) -> Self {
        if bytes >= L2_PREFETCH_MIN_BYTES {
            PrefetchLevel::L2
        } else {
            PrefetchLevel::L1
        }
    }
}

/// Hints the CPU to fetch the cache line holding `p` into `level` ([`prefetch`] for the L1).
#[inline(always)]
pub(crate) fn prefetch_to<T>(p: *const T, level: PrefetchLevel) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _MM_HINT_T1, _mm_prefetch};
        // SAFETY: a prefetch never faults and has no architectural effect, whatever the address.
        unsafe {
            match level {
                PrefetchLevel::L1 => _mm_prefetch::<_MM_HINT_T0>(p.cast()),
                PrefetchLevel::L2 => _mm_prefetch::<_MM_HINT_T1>(p.cast()),
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, level);
}

/// Hints the CPU to fetch the cache line holding `p`. Never faults; a no-op on targets without
/// a prefetch instruction.
#[inline(always)]
pub(crate) fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        // SAFETY: a prefetch never faults and has no architectural effect, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_tables_prefetch_their_rows_into_the_l2() {
        assert_eq!(
            PrefetchLevel::for_rows(L2_PREFETCH_MIN_BYTES),
            PrefetchLevel::L2
        );
        assert_eq!(
            PrefetchLevel::for_rows(L2_PREFETCH_MIN_BYTES - 1),
            PrefetchLevel::L1,
            "a smaller table keeps the L1 on every CPU"
        );
    }
}
