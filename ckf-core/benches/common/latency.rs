//! Per-query latency for the search bench: the cycle counter (`rdtsc` on x86-64, calibrated
//! against `Instant`), and percentiles of the timed samples from an HDR histogram.

use std::hint::black_box;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// The cycle counter (`rdtsc`), or nanoseconds since an origin where there is none.
#[inline(always)]
pub fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: rdtsc has no memory effects; available on every x86_64 CPU.
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

/// Nanoseconds per [`ticks`] unit, measured over 100 ms of sleep.
pub fn ns_per_tick() -> f64 {
    let (t0, c0) = (Instant::now(), ticks());
    std::thread::sleep(Duration::from_millis(100));
    let (t1, c1) = (Instant::now(), ticks());
    (t1 - t0).as_nanos() as f64 / (c1 - c0) as f64
}

/// Latency summary of timed samples, in nanoseconds.
pub struct Lat {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Mean.
    pub mean: f64,
}

/// Summarizes samples in ticks (`scale` ns per tick): p50 and p99 from an HDR histogram (3
/// significant digits), the mean exact.
pub fn summarize(v: Vec<u64>, scale: f64) -> Lat {
    let mut h = Histogram::<u64>::new(3).expect("3 significant digits is a valid precision");
    for &t in &v {
        h.record(t)
            .expect("an auto-resizing histogram records any value");
    }
    Lat {
        p50: h.value_at_quantile(0.50) as f64 * scale,
        p99: h.value_at_quantile(0.99) as f64 * scale,
        mean: v.iter().sum::<u64>() as f64 / v.len() as f64 * scale,
    }
}

/// Times `f(query)` per query over `passes` passes of `queries`.
pub fn time_each<F: FnMut(&[u64]) -> u32>(
    queries: &[Vec<u64>],
    samples: usize,
    scale: f64,
    mut f: F,
) -> Lat {
    for q in queries.iter().take(2000) {
        black_box(f(q));
    }
    let mut v = Vec::with_capacity(samples);
    let mut i = 0;
    while v.len() < samples {
        let q = &queries[i % queries.len()];
        i += 1;
        let t0 = ticks();
        let r = f(black_box(q));
        let t1 = ticks();
        black_box(r);
        v.push(t1 - t0);
    }
    summarize(v, scale)
}
