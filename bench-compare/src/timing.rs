//! Clocks: `rdtsc` per query (calibrated against `Instant`) and on-CPU thread time for ingest.

use std::time::{Duration, Instant};

/// Raw timestamp counter (x86-64), or nanoseconds elsewhere.
#[inline(always)]
pub fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: rdtsc has no memory effects and exists on every x86-64 CPU.
    unsafe {
        core::arch::x86_64::_rdtsc()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        use std::sync::OnceLock;
        static START: OnceLock<Instant> = OnceLock::new();
        START.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

/// Nanoseconds per tick, measured over 100 ms.
pub fn ns_per_tick() -> f64 {
    let (t0, c0) = (Instant::now(), ticks());
    std::thread::sleep(Duration::from_millis(100));
    let (t1, c1) = (Instant::now(), ticks());
    (t1 - t0).as_nanos() as f64 / (c1 - c0) as f64
}

/// Latency summary in nanoseconds.
#[derive(Clone, Copy, Debug)]
pub struct Lat {
    pub p50: f64,
    pub p99: f64,
    pub mean: f64,
}

/// Percentiles and mean of tick samples, scaled to ns.
pub fn summarize(mut v: Vec<u64>, scale: f64) -> Lat {
    v.sort_unstable();
    let pick = |q: f64| v[((v.len() as f64 - 1.0) * q) as usize] as f64 * scale;
    Lat {
        p50: pick(0.50),
        p99: pick(0.99),
        mean: v.iter().sum::<u64>() as f64 / v.len() as f64 * scale,
    }
}

/// Nanoseconds this thread has spent on a CPU (`/proc/thread-self/schedstat`), falling back to
/// the wall clock. On a shared machine this keeps other processes' load out of ingest rates.
pub fn cpu_ns() -> u64 {
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| ORIGIN.get_or_init(Instant::now).elapsed().as_nanos() as u64)
}
