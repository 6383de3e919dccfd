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

/// Consumer tables (every lane group counted) at least this large get their rows prefetched a
/// few positions ahead of a query's probe; smaller ones (about the size of a core's L2) are
/// cache-resident and the prefetch would only cost instructions.
const PREFETCH_MIN_BYTES: usize = 1 << 20;

/// How a query prefetches the rows of a consumer table of `bytes` (every lane group counted: a
/// query reads them all): not at all under [`PREFETCH_MIN_BYTES`], else into
/// [`PrefetchLevel::for_rows`].
pub(crate) fn row_prefetch(bytes: usize) -> Option<PrefetchLevel> {
    (bytes >= PREFETCH_MIN_BYTES).then(|| PrefetchLevel::for_rows(bytes))
}

/// Whether a query on a consumer table of `bytes` (every lane group counted) prefetches only
/// each position's primary row and reads the alternate row on demand, for the lanes the
/// primary row missed (`crate::search::prefix::prefix_loop`): when the table is larger than
/// this machine's last-level cache ([`llc_bytes`]). Out of cache a long query is bound by the
/// lines it has in flight, and the primary row holds nearly every fingerprint, so it pulls
/// about half the lines; in cache the alternate row's late read costs more than its line.
/// Measured (`cargo bench -p ckf-core --bench search -- lanes`, Mooncake, binaries
/// alternated, AMD EPYC Zen 4): on 256 MiB, 16 lanes p99 2.9-3.6 -> 1.9-2.1 us, 64 lanes p99
/// 10.6-12.9 -> 6.9-7.6 us, p50 unchanged; on a 2 MiB table (in the L3) an earlier form that
/// read the alternate row late lost 20-35% at p50, hence the threshold.
pub(crate) fn alternate_on_demand(bytes: usize) -> bool {
    #[cfg(feature = "testing")]
    if let Some(forced) = test_hooks::forced_on_demand() {
        return forced && bytes >= PREFETCH_MIN_BYTES;
    }
    bytes >= PREFETCH_MIN_BYTES && bytes > llc_bytes()
}

/// The last-level cache assumed when the OS does not tell it.
const DEFAULT_LLC_BYTES: usize = 32 << 20;

/// The last-level cache in bytes, read once per process from Linux's description of CPU 0's
/// caches (`/sys/devices/system/cpu/cpu0/cache/index*`, as `lscpu` reads it): the size of the
/// highest-level data or unified cache, when that level is above 2; [`DEFAULT_LLC_BYTES`]
/// otherwise (no description, or one that lists no cache beyond the L2, as some guests and
/// arm64 servers with a system-level cache do). Not glibc's `sysconf(_SC_LEVEL3_CACHE_SIZE)`:
/// on an AMD EPYC Zen 4 guest it reported 320 MiB for a 32 MiB L3.
pub(crate) fn llc_bytes() -> usize {
    static LLC: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *LLC.get_or_init(|| {
        let read = |dir: &std::path::Path, name: &str| {
            std::fs::read_to_string(dir.join(name)).map(|s| s.trim().to_owned())
        };
        let Ok(dirs) = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache") else {
            return DEFAULT_LLC_BYTES;
        };
        let caches = dirs.flatten().filter_map(|d| {
            let dir = d.path();
            let kind = read(&dir, "type").ok()?;
            let level: u32 = read(&dir, "level").ok()?.parse().ok()?;
            let bytes = parse_cache_size(&read(&dir, "size").ok()?)?;
            (kind != "Instruction").then_some((level, bytes))
        });
        match caches.max() {
            Some((level, bytes)) if level > 2 => bytes,
            _ => DEFAULT_LLC_BYTES,
        }
    })
}

/// A sysfs cache `size` (`32768K`, `1M`, or bytes) in bytes.
fn parse_cache_size(size: &str) -> Option<usize> {
    let (digits, unit) = match size.as_bytes().last()? {
        b'K' => (&size[..size.len() - 1], 1 << 10),
        b'M' => (&size[..size.len() - 1], 1 << 20),
        b'G' => (&size[..size.len() - 1], 1 << 30),
        _ => (size, 1),
    };
    digits.parse::<usize>().ok()?.checked_mul(unit)
}

/// Test hook: force [`alternate_on_demand`] for the tables this thread creates, so the
/// on-demand query loop is tested on tables of a few MiB.
#[cfg(feature = "testing")]
pub mod test_hooks {
    use std::cell::Cell;

    thread_local! {
        static FORCED: Cell<Option<bool>> = const { Cell::new(None) };
    }

    /// `Some(on)`: tables of at least 1 MiB this thread creates from now on read alternate rows
    /// on demand (`true`) or never (`false`); `None`: by size, as in production.
    pub fn force_alternate_on_demand(forced: Option<bool>) {
        FORCED.with(|f| f.set(forced));
    }

    pub(super) fn forced_on_demand() -> Option<bool> {
        FORCED.with(Cell::get)
    }
}

/// Where a query's row prefetches put the lines they fetch ([`prefetch_to`]).
///
/// A query on a table beyond the core's L2 is bound by how many misses the core keeps in
/// flight. A prefetch into the L1 holds one of the L1's few miss buffers until its line
/// arrives; a prefetch into the L2 (`PREFETCHT1`) is tracked by the L2's larger miss queue, so
/// more rows are in flight at once. But when the table fits the L2, its rows are read from the
/// L2 instead of the L1 and the L2 hint only costs. So a consumer table (a domain's, every lane
/// group: a query reads them all) larger than this core's L2 takes the L2, a smaller one the L1
/// ([`PrefetchLevel::for_rows`]). Measured with `bench-compare`, binaries alternated in one
/// session (docs/performance.md, "Query search"):
/// * Intel Xeon family 6 model 167 (L2 2 MiB): 256 MiB 16 lanes p99 8.4-9.4 -> 6.8-7.6 us,
///   1 GiB 64 lanes p99 29-32 -> 24-25 us; on the 2 MiB table the L2 hint cost 8-12% at p50.
/// * AMD EPYC Zen 4, family 25 model 17 (L2 1 MiB): 256 MiB 16 lanes p99 0.99-1.04x -> 0.66-0.67x
///   CRTC's; the 2 MiB 16-lane table p99 0.59x -> 0.38-0.42x CRTC's; the 8 MiB 64-lane table
///   (2 MiB per lane group) p99 1.11-1.21x -> 0.65-0.69x CRTC's.
///
/// AMD cores up to Zen 3 treat both hints alike (AMD's optimization guides). The producer's
/// prefetches, which are followed by writes, were slower into the L2 (Intel, 2^20 buckets
/// 9.1-9.3 -> 8.6 M block ops/s) and stay in the L1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PrefetchLevel {
    /// `PREFETCHT0`: into every level.
    L1,
    /// `PREFETCHT1`: into the L2 and below.
    L2,
}

/// The L2 size assumed when the OS does not tell it: the smallest of current server cores'.
const DEFAULT_L2_BYTES: usize = 1 << 20;

impl PrefetchLevel {
    /// The level for the rows of a consumer table of `bytes` (every lane group of a domain):
    /// [`PrefetchLevel::L2`] when it is larger than this core's L2 cache ([`l2_cache_bytes`]),
    /// else [`PrefetchLevel::L1`].
    pub(crate) fn for_rows(bytes: usize) -> Self {
        if bytes > l2_cache_bytes() {
            PrefetchLevel::L2
        } else {
            PrefetchLevel::L1
        }
    }
}

/// This core's L2 cache in bytes, read once per process from the C library (glibc's
/// `sysconf(_SC_LEVEL2_CACHE_SIZE)`, from `CPUID`); [`DEFAULT_L2_BYTES`] where it does not say.
pub(crate) fn l2_cache_bytes() -> usize {
    static L2: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *L2.get_or_init(|| {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        {
            // SAFETY: `sysconf` reads a configuration value; no memory is passed.
            let reported = unsafe { libc::sysconf(libc::_SC_LEVEL2_CACHE_SIZE) };
            if let Ok(bytes @ 1..) = usize::try_from(reported) {
                return bytes;
            }
        }
        DEFAULT_L2_BYTES
    })
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
    fn cache_sizes_parse_as_sysfs_writes_them() {
        assert_eq!(parse_cache_size("32768K"), Some(32 << 20));
        assert_eq!(parse_cache_size("1M"), Some(1 << 20));
        assert_eq!(parse_cache_size("4096"), Some(4096));
        assert_eq!(parse_cache_size(""), None);
        assert_eq!(parse_cache_size("12Q"), None);
        // Whatever the host describes, no table below the prefetch threshold reads alternate
        // rows on demand, and one far beyond any last-level cache does.
        assert!(!alternate_on_demand(PREFETCH_MIN_BYTES - 8));
        assert!(alternate_on_demand(1 << 40));
    }

    /// Tables larger than the L2 the C library reports (as `getconf LEVEL2_CACHE_SIZE` prints
    /// it) prefetch into the L2; the others into the L1.
    #[test]
    fn tables_larger_than_the_l2_prefetch_their_rows_into_it() {
        let l2 = l2_cache_bytes();
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        if let Ok(out) = std::process::Command::new("getconf")
            .arg("LEVEL2_CACHE_SIZE")
            .output()
        {
            let reported: usize = String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse()
                .unwrap_or(0);
            let expected = if reported > 0 {
                reported
            } else {
                DEFAULT_L2_BYTES
            };
            assert_eq!(l2, expected, "getconf says {reported}");
        }
        assert_eq!(PrefetchLevel::for_rows(l2 + 8), PrefetchLevel::L2);
        assert_eq!(PrefetchLevel::for_rows(l2), PrefetchLevel::L1);
        assert_eq!(PrefetchLevel::for_rows(1 << 30), PrefetchLevel::L2);
        assert_eq!(row_prefetch(PREFETCH_MIN_BYTES - 8), None);
        assert_eq!(
            row_prefetch(1 << 30),
            Some(PrefetchLevel::L2),
            "a large table is prefetched into the L2"
        );
    }
}
