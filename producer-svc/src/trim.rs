//! Handing freed heap memory back to the operating system after the exact state shrank.
//!
//! `ckf-core` shrinks its exact maps when they empty (`DcCkfState`'s hysteresis), but that only
//! returns the memory to the allocator, and glibc's malloc keeps it by default. Measured with
//! the real binary (`tests/tests/quotas.rs`, 1M blocks stored then cleared; ~50 MiB of block map
//! at the peak): with the maps shrinking and `malloc_trim` alone the RSS stayed at 59 MiB after
//! every block was gone (baseline 9 MiB), because
//! - glibc's *dynamic* mmap threshold rises to the size of every freed mmapped block (up to
//!   32 MiB), so after the first hash-table doublings the next big tables come from the state
//!   actor thread's arena instead of their own mappings;
//! - memory freed at the top of a thread arena is only given back when it exceeds the trim
//!   threshold (raised with the mmap threshold, up to 64 MiB), and `malloc_trim` does not trim
//!   the top of non-main arenas.
//!
//! So the producer binary fixes the mmap threshold at [`MMAP_THRESHOLD_BYTES`] at start
//! ([`configure_allocator`]; setting it turns the dynamic adjustment off): every allocation of
//! 1 MiB or more (the big hash tables, the dirty tracker's buffers) gets its own mapping and is
//! unmapped the moment it is freed. That took the same run to 17.6 MiB (6 MiB of it the
//! now-written table and dirty index). Allocations that large are rare (a table doubling), so
//! the extra `mmap`/`munmap` calls cost nothing measurable. `malloc_trim(0)` stays for what
//! smaller chunks leave behind (it releases the free pages inside every arena's free chunks
//! with `madvise(MADV_DONTNEED)`); its own share was not measured separately. It walks the free
//! lists, so the actor calls it only after the estimated state size fell by
//! [`TRIM_DROP_BYTES`] since the last trim, at most once a second (on the gauge refresh and
//! `GetStats`), never per event. Other allocators / targets: no-ops.

use std::time::{Duration, Instant};

/// Allocations of at least this many bytes get their own mapping (glibc `M_MMAP_THRESHOLD`).
pub const MMAP_THRESHOLD_BYTES: i32 = 1 << 20;

/// Fixes glibc's mmap threshold at [`MMAP_THRESHOLD_BYTES`] (see the module docs). Call once at
/// process start, before the state is built; process-wide. Returns whether glibc accepted it.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn configure_allocator() -> bool {
    // SAFETY: mallopt only changes malloc tuning parameters; it takes the allocator's lock.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1 }
}

/// Other targets: nothing to configure.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn configure_allocator() -> bool {
    false
}

/// State-size drop (bytes of `DcCkfStats::bytes_used`) since the last trim that triggers one.
pub const TRIM_DROP_BYTES: u64 = 16 << 20;

/// Shortest time between two trims.
const TRIM_INTERVAL: Duration = Duration::from_secs(1);

/// Tracks the state size and trims after a large drop.
#[derive(Debug, Default)]
pub struct Trim {
    /// Largest state size seen since the last trim.
    peak: u64,
    last: Option<Instant>,
    /// Trims done (for logs and tests).
    pub trims: u64,
}

impl Trim {
    /// Records the current state size; trims when it fell by [`TRIM_DROP_BYTES`] from the peak
    /// since the last trim (at most once per second).
    pub fn observe(&mut self, bytes: u64) {
        self.peak = self.peak.max(bytes);
        if self.peak - bytes < TRIM_DROP_BYTES {
            return;
        }
        if self.last.is_some_and(|t| t.elapsed() < TRIM_INTERVAL) {
            return;
        }
        let released = release_free_memory();
        self.trims += 1;
        self.last = Some(Instant::now());
        tracing::info!(
            from = self.peak,
            to = bytes,
            released,
            "state shrank; free heap pages returned to the OS"
        );
        self.peak = bytes;
    }
}

/// `malloc_trim(0)`: whether glibc released memory.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn release_free_memory() -> bool {
    // SAFETY: malloc_trim only walks and releases the allocator's free chunks; it takes the
    // arena locks itself and has no preconditions.
    unsafe { libc::malloc_trim(0) == 1 }
}

/// Other targets: nothing to do (their allocators return memory on their own or not at all).
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn release_free_memory() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_only_after_a_large_drop() {
        let mut t = Trim::default();
        t.observe(100 << 20);
        t.observe(90 << 20);
        assert_eq!(t.trims, 0);
        t.observe(80 << 20);
        assert_eq!(t.trims, 1);
        // The peak restarts from the trimmed size; within a second nothing else is trimmed.
        t.observe(200 << 20);
        t.observe(10 << 20);
        assert_eq!(t.trims, 1);
    }
}
