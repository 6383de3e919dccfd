//! Small summary statistics for latency samples.

use serde::Serialize;

/// Percentiles of a sample set, in the sample unit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Number of samples.
    pub count: usize,
    /// Median (nearest rank).
    pub p50: f64,
    /// 99th percentile (nearest rank).
    pub p99: f64,
    /// Largest sample.
    pub max: f64,
}

impl Summary {
    /// Summarises `samples` (sorted in place). All zero when empty.
    pub fn of(samples: &mut [f64]) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        samples.sort_by(f64::total_cmp);
        Self {
            count: samples.len(),
            p50: percentile(samples, 50.0),
            p99: percentile(samples, 99.0),
            max: samples[samples.len() - 1],
        }
    }
}

/// Nearest-rank percentile `p` (0..=100) of sorted, non-empty `sorted`.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let s = Summary::of(&mut v);
        assert_eq!((s.count, s.p50, s.p99, s.max), (100, 50.0, 99.0, 100.0));
        let mut one = vec![3.0];
        assert_eq!(Summary::of(&mut one).p99, 3.0);
        assert_eq!(Summary::of(&mut []).count, 0);
    }
}
