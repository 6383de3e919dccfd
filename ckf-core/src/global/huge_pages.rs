//! Transparent huge pages for large consumer tables (Linux).
//!
//! A query touches two random rows per block. On a table far larger than the caches every row is
//! also a TLB miss, and with 4 KiB pages (worse, under nested paging in a VM) the page walk costs
//! as much as the row itself. Backing the table with 2 MiB pages removes most of those walks.
//!
//! The table is allocated (and zeroed) before this runs, so the range is first marked
//! `MADV_HUGEPAGE` and then collapsed synchronously with `MADV_COLLAPSE` (Linux >= 6.1). Both are
//! advisory: on failure (older kernel, THP disabled, no free huge pages) the table simply keeps
//! 4 KiB pages. Contents are never changed.

use crate::bucket::TransposedTable;

/// Tables smaller than this are left alone (they mostly live in the caches anyway).
pub(super) const MIN_BYTES: usize = 8 << 20;

/// Best effort; returns whether the kernel accepted the collapse of the table's interior.
pub(super) fn advise(table: &TransposedTable) -> bool {
    if table.bytes() < MIN_BYTES {
        return false;
    }
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        // Linux UAPI value (include/uapi/asm-generic/mman-common.h); not in every libc target.
        const MADV_COLLAPSE: libc::c_int = 25;
        let start = table.row(0).as_ptr() as usize;
        let end = start + table.bytes();
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
    false
}
