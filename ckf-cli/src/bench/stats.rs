//! Latency statistics, all from HDR histograms (`hdrhistogram`): [`Summary`] of a sample set,
//! and the nanosecond latency histograms of `ckf load` and the lag bench read in microseconds
//! ([`latency_histogram`], [`quantile_us`]).

use hdrhistogram::Histogram;
use serde::Serialize;

/// Resolution of the recorded samples: 1/1000 of the sample unit (a nanosecond for samples
/// in microseconds), since the histogram counts integers.
const SCALE: f64 = 1_000.0;
/// Largest recorded value, in 1/[`SCALE`] units (2^50: about 10^12 sample units, e.g. 13 days
/// in microseconds); larger samples count as this value.
const HIGHEST: u64 = 1 << 50;
/// Largest sample counted, in the sample unit (`HIGHEST` / `SCALE`).
const LARGEST: f64 = HIGHEST as f64 / SCALE;
/// Significant decimal digits the histogram keeps: a percentile is within 0.1% of the
/// nearest-rank sample.
const SIGNIFICANT_DIGITS: u8 = 3;

/// Percentiles of a sample set, in the sample unit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Number of samples.
    pub count: usize,
    /// Arithmetic mean (exact).
    pub mean: f64,
    /// Median (nearest rank, within 0.1%).
    pub p50: f64,
    /// 90th percentile (nearest rank, within 0.1%).
    pub p90: f64,
    /// 99th percentile (nearest rank, within 0.1%).
    pub p99: f64,
    /// Largest sample (exact).
    pub max: f64,
}

impl Summary {
    /// Summarises `samples` (non-negative; a negative or NaN sample counts as 0, one above
    /// 10^12 as 10^12). All zero when empty.
    pub fn of(samples: &[f64]) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        let mut histogram = Histogram::<u64>::new_with_bounds(1, HIGHEST, SIGNIFICANT_DIGITS)
            .expect("static histogram bounds are valid");
        for &sample in samples {
            // `as` saturates (NaN and negatives become 0); values above HIGHEST record as it.
            histogram.saturating_record((sample * SCALE).round() as u64);
        }
        let at = |quantile: f64| histogram.value_at_quantile(quantile) as f64 / SCALE;
        Self {
            count: samples.len(),
            // Clamped as the percentiles are, so the mean never exceeds the largest percentile.
            mean: samples.iter().map(|s| s.clamp(0.0, LARGEST)).sum::<f64>() / samples.len() as f64,
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            max: samples.iter().copied().fold(0.0, f64::max),
        }
    }
}

/// Largest latency a [`latency_histogram`] records (60 s, in nanoseconds); longer ones count as
/// it when recorded with `saturating_record`.
pub const HIGHEST_NS: u64 = 60_000_000_000;

/// An empty histogram of latencies in nanoseconds, 1 ns to [`HIGHEST_NS`], 3 significant digits
/// (a percentile within 0.1%).
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIGHEST_NS, SIGNIFICANT_DIGITS)
        .expect("static histogram bounds are valid")
}

/// `histogram` (nanoseconds) at `quantile` (0..=1), in microseconds; 0 when empty.
pub fn quantile_us(histogram: &Histogram<u64>, quantile: f64) -> f64 {
    if histogram.is_empty() {
        return 0.0;
    }
    histogram.value_at_quantile(quantile) as f64 / 1_000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(got: f64, want: f64) -> bool {
        (got - want).abs() <= want * 1e-3
    }

    #[test]
    fn nearest_rank_percentiles_within_a_tenth_of_a_percent() {
        let v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let s = Summary::of(&v);
        assert_eq!((s.count, s.max), (100, 100.0));
        assert!(close(s.p50, 50.0) && close(s.p99, 99.0), "{s:?}");
        assert!(close(Summary::of(&[3.0]).p99, 3.0));
        assert_eq!(Summary::of(&[]), Summary::default());
        // Fractions of the unit survive (samples in microseconds, sub-microsecond values).
        let s = Summary::of(&[0.25, 0.5, 0.75, 1.5]);
        assert!(close(s.p50, 0.5) && close(s.p99, 1.5), "{s:?}");
        assert_eq!(s.max, 1.5);
        // A sample past the largest counts as it in the mean too: the mean stays below p99.
        let s = Summary::of(&[1.0, 1e300]);
        assert!(s.mean <= s.p99 && s.p99 <= LARGEST * 1.001, "{s:?}");
    }

    #[test]
    fn matches_a_sorted_nearest_rank_model() {
        // Skewed samples: many small, a long tail.
        let samples: Vec<f64> = (0..10_000u32)
            .map(|i| f64::from(i % 97) * 0.37 + f64::from(i / 1000).powi(3))
            .collect();
        let mut sorted = samples.clone();
        sorted.sort_by(f64::total_cmp);
        let rank =
            |p: f64| sorted[((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1];
        let s = Summary::of(&samples);
        assert!(close(s.p50, rank(0.50)), "{} vs {}", s.p50, rank(0.50));
        assert!(close(s.p90, rank(0.90)), "{} vs {}", s.p90, rank(0.90));
        let mean = samples.iter().sum::<f64>() / samples.len() as f64;
        assert!((s.mean - mean).abs() < 1e-9, "{} vs {mean}", s.mean);
        assert!(close(s.p99, rank(0.99)), "{} vs {}", s.p99, rank(0.99));
        assert_eq!(s.max, *sorted.last().unwrap());
    }
}
