//! Clocks: `rdtsc` per query (calibrated against `Instant`), a measured probe of both clocks'
//! resolution and read cost, and on-CPU thread time for ingest.

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

/// What one clock can resolve on this machine, measured rather than assumed.
#[derive(Clone, Copy, Debug)]
pub struct ClockProbe {
    /// The clock's step, ns: the smallest difference of at least [`JITTER_NS`] between two
    /// consecutive readings that occurs in at least 1 of [`STEP_SUPPORT`] reading pairs. The
    /// clock cannot tell apart two intervals closer than this, so a timed sample is quantised to
    /// it. Smaller differences are not intervals: no reading costs under 1 ns, and on a KVM
    /// guest `rdtsc` advanced in multiples of ~26 ticks (~10 ns, as 25/26, 51/52, 77/78) with
    /// 1-tick differences in 0-5% of pairs (rounding of the scaled guest counter).
    pub step_ns: f64,
    /// The smallest non-zero difference seen at all, ns (for the record; usually the step).
    pub min_ns: f64,
    /// Cost of one reading, ns: the median difference between consecutive readings (the median,
    /// not the mean, so that a preemption during the probe on a loaded machine does not count).
    /// A per-query sample contains about one reading's cost on top of the query.
    pub read_ns: f64,
}

/// Both clocks the bench could time queries with.
#[derive(Clone, Copy, Debug)]
pub struct TimerProbe {
    /// `Instant::now()` (the vDSO `clock_gettime(CLOCK_MONOTONIC)` on Linux).
    pub instant: ClockProbe,
    /// [`ticks`] (`rdtsc` on x86-64), scaled with [`ns_per_tick`].
    pub tsc: ClockProbe,
}

/// Readings per clock in [`probe_timers`]: enough to see the step many times, short enough
/// (a few ms) to be noise in the run time.
const PROBE_READS: usize = 200_000;

/// A difference counts as the clock's step only if at least `PROBE_READS / STEP_SUPPORT`
/// consecutive pairs show it.
pub const STEP_SUPPORT: usize = 1000;

/// Differences below this (ns) between consecutive readings are rounding jitter, not the step:
/// no clock read costs under 1 ns.
pub const JITTER_NS: f64 = 1.0;

/// Step, minimum and median of the differences between consecutive readings of one clock, in the
/// clock's own units. `diffs` must not be empty.
fn clock_probe(mut diffs: Vec<u64>, scale: f64) -> ClockProbe {
    let n = diffs.len();
    diffs.sort_unstable();
    let median = diffs[(n - 1) / 2];
    diffs.retain(|&d| d > 0);
    let support = (n / STEP_SUPPORT).max(1);
    let min = diffs.first().copied().unwrap_or(0);
    // Smallest value of at least JITTER_NS whose run in the sorted differences is at least
    // `support` long.
    let step = diffs
        .chunk_by(|a, b| a == b)
        .find(|run| run.len() >= support && run[0] as f64 * scale >= JITTER_NS)
        .map_or(min, |run| run[0]);
    ClockProbe {
        step_ns: step as f64 * scale,
        min_ns: min as f64 * scale,
        read_ns: median as f64 * scale,
    }
}

/// Measures each clock's step, smallest difference and median read cost over [`PROBE_READS`]
/// back-to-back readings. `scale` is [`ns_per_tick`].
pub fn probe_timers(scale: f64) -> TimerProbe {
    let mut diffs = Vec::with_capacity(PROBE_READS);
    let mut prev = Instant::now();
    for _ in 0..PROBE_READS {
        let now = Instant::now();
        diffs.push((now - prev).as_nanos() as u64);
        prev = now;
    }
    let instant = clock_probe(std::mem::take(&mut diffs), 1.0);
    let mut prev = ticks();
    for _ in 0..PROBE_READS {
        let now = ticks();
        diffs.push(now.wrapping_sub(prev));
        prev = now;
    }
    let tsc = clock_probe(diffs, scale);
    TimerProbe { instant, tsc }
}

/// Latency summary in nanoseconds.
#[derive(Clone, Copy, Debug)]
pub struct Lat {
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub mean: f64,
    /// Number of samples summarised.
    pub samples: usize,
}

/// Exact percentiles (nearest rank on the sorted samples, no histogram bucketing) and mean of
/// tick samples, scaled to ns. `v` must not be empty.
pub fn summarize(mut v: Vec<u64>, scale: f64) -> Lat {
    v.sort_unstable();
    let pick =
        |q: f64| v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1] as f64 * scale;
    Lat {
        p50: pick(0.50),
        p99: pick(0.99),
        p999: pick(0.999),
        mean: v.iter().sum::<u64>() as f64 / v.len() as f64 * scale,
        samples: v.len(),
    }
}

/// The machine the run is on, read from `/proc` and the CPU's feature flags (not hard-coded).
pub struct Machine {
    /// `model name` of the first CPU in `/proc/cpuinfo` (or `unknown`).
    pub cpu: String,
    /// Online CPUs as the standard library sees them.
    pub cpus: usize,
    /// SIMD features the CPU reports at run time (x86-64: SSE4.2 .. AVX-512 VBMI2).
    pub simd: Vec<&'static str>,
    /// The ckf-core search kernel the indexers of this run use: `SearchKernel::best()`, ckf-core's
    /// own run-time rule (AVX-512 F+DQ+BW and BMI2, else AVX2, else portable), not a copy of it.
    pub ckf_kernel: &'static str,
    /// `/proc/sys/kernel/osrelease`.
    pub kernel: String,
    /// Nice value of this process (field 19 of `/proc/self/stat`), to record `nice -n 10` runs.
    pub nice: String,
}

/// Reads [`Machine`] once at start.
pub fn machine() -> Machine {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into());
    #[allow(unused_mut)]
    let mut simd = Vec::new();
    let ckf_kernel = ckf_core::search::SearchKernel::best().name();
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! probe {
            ($($f:tt),*) => {
                $(if std::arch::is_x86_feature_detected!($f) { simd.push($f); })*
            };
        }
        probe!(
            "sse4.2",
            "popcnt",
            "bmi2",
            "avx2",
            "avx512f",
            "avx512dq",
            "avx512bw",
            "avx512vl",
            "avx512vbmi",
            "avx512vbmi2",
            "avx512bitalg",
            "avx512vpopcntdq"
        );
    }
    #[cfg(target_arch = "aarch64")]
    if std::arch::is_aarch64_feature_detected!("neon") {
        simd.push("neon");
    }
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into());
    let nice = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // Fields after the parenthesised command name (which may contain spaces); nice is
            // field 19 overall, i.e. the 17th after the name.
            let rest = s.rsplit_once(')')?.1;
            rest.split_whitespace().nth(16).map(str::to_owned)
        })
        .unwrap_or_else(|| "unknown".into());
    Machine {
        cpu,
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        simd,
        ckf_kernel,
        kernel,
        nice,
    }
}

/// `/proc/loadavg`'s three load averages, or `unknown`.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".into())
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Nearest-rank percentile on a sorted copy: the textbook definition, as the model.
    fn model(v: &[u64], q: f64) -> u64 {
        let mut s = v.to_vec();
        s.sort_unstable();
        let rank = (q * s.len() as f64).ceil().max(1.0) as usize;
        s[rank - 1]
    }

    #[test]
    fn percentiles_are_exact_nearest_rank_over_all_samples() {
        let mut x = 0x1234_5678_9ABC_DEF0u64;
        for len in [1usize, 2, 3, 10, 999, 1000, 1001, 12_345] {
            let v: Vec<u64> = (0..len)
                .map(|_| {
                    x = ckf_core::addressing::fmix64(x.wrapping_add(0x9E37_79B9_7F4A_7C15));
                    x % 10_000
                })
                .collect();
            let l = summarize(v.clone(), 1.0);
            assert_eq!(l.samples, len);
            assert_eq!(l.p50, model(&v, 0.50) as f64, "len {len}");
            assert_eq!(l.p99, model(&v, 0.99) as f64, "len {len}");
            assert_eq!(l.p999, model(&v, 0.999) as f64, "len {len}");
            let mean = v.iter().sum::<u64>() as f64 / len as f64;
            assert!((l.mean - mean).abs() < 1e-9);
        }
    }

    #[test]
    fn percentiles_of_one_to_a_thousand_scale_to_ns() {
        let l = summarize((1..=1000).rev().collect(), 2.0);
        assert_eq!((l.p50, l.p99, l.p999), (1000.0, 1980.0, 1998.0));
    }

    #[test]
    fn clock_step_ignores_one_off_differences() {
        // 26-tick steps with frequent 1-tick jitter and some zero differences, as on a KVM
        // guest (0.385 ns per tick there; 0.5 here).
        let mut d = vec![26u64; 5000];
        d.extend([52; 1000]);
        d.extend([0; 300]);
        d.extend([1; 250]);
        let p = clock_probe(d.clone(), 0.5);
        assert_eq!(p.step_ns, 13.0);
        assert_eq!(p.min_ns, 0.5);
        // Median of 6550 differences: 300 zeros, 250 ones, 5000 x 26, ...: the 3275th is 26.
        assert_eq!(p.read_ns, 13.0);
        // A 3-tick difference in fewer than 1 of STEP_SUPPORT pairs is not the step either.
        d.extend([3; 2]);
        assert_eq!(clock_probe(d, 0.5).step_ns, 13.0);
        // With no difference common enough, the minimum is all there is.
        let p = clock_probe(vec![0, 3, 7], 1.0);
        assert_eq!((p.step_ns, p.min_ns), (3.0, 3.0));
    }

    #[test]
    fn machine_reads_proc() {
        let m = machine();
        assert!(m.cpus >= 1);
        assert!(!m.cpu.is_empty());
        // The nice value is a small signed integer when /proc is there.
        if std::path::Path::new("/proc/self/stat").exists() {
            let n: i32 = m.nice.parse().expect("nice is a number");
            assert!((-20..=19).contains(&n));
        }
    }
}
