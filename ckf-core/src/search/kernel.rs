//! [`SearchKernel`]: which prefix-search kernel a query runs (best available, or forced; never
//! one the CPU lacks), and the dispatch to it.

use crate::addressing::Addressing;
use crate::bucket::{GROUP_LANES, TransposedTable};

#[cfg(target_arch = "aarch64")]
use super::neon;
use super::prefix::search_scalar;
#[cfg(target_arch = "x86_64")]
use super::{avx2, avx512};

/// A prefix-search kernel: the code that compares a query position's two candidate rows against
/// its fingerprint across the lanes. Every kernel gives the same answers on every table and
/// query (`tests/search_kernels.rs` checks each one the CPU has against the portable one and
/// against an exact model) and keeps the same weak-read contract; they differ only in speed.
///
/// Chosen once per indexer (best available at construction, see [`SearchKernel::best`]) and
/// changeable with
/// [`GlobalCkfIndexer::set_search_kernel`](crate::global::GlobalCkfIndexer::set_search_kernel); forcing a kernel the CPU lacks is
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

    /// The kernel stored as `code` (`kernel as u8`); an unknown code is `Auto`.
    pub(crate) fn from_code(code: u8) -> SearchKernel {
        match code {
            1 => SearchKernel::Portable,
            2 => SearchKernel::Avx2,
            3 => SearchKernel::Avx512,
            4 => SearchKernel::Neon,
            _ => SearchKernel::Auto,
        }
    }
}

impl SearchKernel {
    /// Depths of `hashes` in the lanes of `ready` with this resolved kernel (0 for other lanes);
    /// `seed` is the table format's (the vector kernels locate with it).
    #[inline]
    pub(crate) fn run(
        self,
        table: &TransposedTable,
        addressing: Addressing,
        seed: u64,
        hashes: &[u64],
        ready: u16,
    ) -> [u32; GROUP_LANES] {
        // Only the x86-64 kernels locate with the seed (the others through `addressing`).
        #[cfg(not(target_arch = "x86_64"))]
        let _ = seed;
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `kernel` is resolved: `SearchKernel::Avx512` only after run-time detection
            // of its features (`resolve`, `best`).
            SearchKernel::Avx512 => unsafe { avx512::search(table, seed, hashes, ready) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above, AVX2 detected.
            SearchKernel::Avx2 => unsafe { avx2::search(table, seed, hashes, ready) },
            #[cfg(target_arch = "aarch64")]
            SearchKernel::Neon => neon::search(table, addressing, hashes, ready),
            _ => search_scalar(table, addressing, hashes, ready),
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

/// Test hooks (feature `testing` only): which kernel a thread's queries really ran, and hiding
/// kernels from detection to exercise the "CPU lacks it" refusals on any machine.
#[cfg(feature = "testing")]
pub(crate) mod test_hooks {
    use crate::search::kernel::SearchKernel;
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
