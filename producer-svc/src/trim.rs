//! Handing freed heap memory back to the operating system after the exact state shrank.
//!
//! `ckf-core` shrinks its exact maps when they empty (`DcCkfState`'s hysteresis), but that only
//! returns the memory to the allocator. glibc's malloc keeps it: the state actor's thread
//! allocates from its own arena, whose freed chunks stay mapped unless they sit at the very top
//! of the arena, and its dynamic mmap threshold (raised to the size of the largest freed
//! mmapped block, up to 32 MiB) moves the big hash tables of a grown state from `mmap` (freed
//! at once) into arenas. Measured with the real binary (`tests/tests/quotas.rs`, 1M blocks
//! stored then cleared): without `malloc_trim` the RSS stayed tens of MiB above its baseline
//! after every block was gone; with it the RSS comes back near the baseline. So after the
//! estimated state size fell by [`TRIM_DROP_BYTES`] since the last trim (checked at most once
//! a second, on the gauge refresh), the actor calls `malloc_trim(0)`, which releases the free
//! pages of every arena (`madvise(MADV_DONTNEED)`). It costs a walk over the free chunks
//! (well under a millisecond for a few hundred MiB of heap), so it runs only after a large
//! drop, never on the hot path of one event. Other allocators / targets: a no-op.

use std::time::{Duration, Instant};

/// State-size drop (bytes of `DcCkfStats::bytes_used`) since the last trim that triggers one.
pub const TRIM_DROP_BYTES: u64 = 16 << 20;

/// Shortest time between two trims.
const TRIM_INTERVAL: Duration = Duration::from_secs(1);

/// Tracks the state size and trims after a large drop.
#[derive(Debug)]
pub struct Trim {
    /// Largest state size seen since the last trim.
    peak: u64,
    last: Option<Instant>,
    /// Trims done (for logs and tests).
    pub trims: u64,
}

impl Default for Trim {
    fn default() -> Self {
        Self {
            peak: 0,
            last: None,
            trims: 0,
        }
    }
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
        tracing::debug!(
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
