//! Judging the indexer's answers against the exact oracle.
//!
//! For every query and every DC, the reported prefix depth `r` (from `FindMatches`) is compared
//! with the oracle's exact depth `o`:
//! - `r == o`: exact.
//! - `r < o` (under-estimate): the index misses block `o`'s predecessor chain at position `r`.
//!   That block is *explained* when the producer reported a capacity omission for it
//!   ([`BlockTruth::omission_suspect`]) or when its store is *in flight*: sent in a DC batch newer
//!   than the DC's visibility watermark (the newest batch a probe has seen become visible; the
//!   producer and indexer keep each DC's batches in order, so every older batch is visible too).
//!   Anything else is *unexplained*: a lost or misapplied update. It must be zero.
//! - `r > o` (over-estimate): block `o` is absent from the DC but the index has it. It is an
//!   in-flight removal when the DC dropped it in a batch newer than the watermark, otherwise a
//!   fingerprint false positive (the filter's designed, bounded error).
//!
//! Best-DC agreement: the DC the deepest-prefix rule ([`best_dc`]) picks from the reported depths has the
//! same exact depth as the DC it picks from the oracle's depths (same loads): the index led to a
//! decision as good as perfect knowledge would have.

use serde::Serialize;

use crate::bench::oracle::{BlockTruth, Oracle};
use crate::bench::policy::best_dc;

/// Under-estimates by cause.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct UnderEstimates {
    /// All under-estimates (= the three causes below).
    pub total: u64,
    /// Explained by a producer capacity omission.
    pub omission: u64,
    /// Explained by a store not yet visible (newer than the DC's watermark).
    pub in_flight: u64,
    /// Neither: must be zero.
    pub unexplained: u64,
}

/// Over-estimates by cause.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct OverEstimates {
    /// All over-estimates (= the two causes below).
    pub total: u64,
    /// A removal newer than the DC's watermark.
    pub in_flight_removal: u64,
    /// Otherwise: a fingerprint false positive.
    pub false_positive: u64,
}

/// Accuracy counters for a set of queries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Accuracy {
    /// Queries judged.
    pub queries: u64,
    /// (query, DC) pairs with a ready lane (= exact + over + under).
    pub lane_answers: u64,
    /// (query, DC) pairs whose lane was not ready (not in the answer).
    pub lanes_not_ready: u64,
    /// Answers equal to the oracle's depth.
    pub exact: u64,
    /// Answers deeper than the oracle's.
    pub over_estimates: OverEstimates,
    /// Answers shallower than the oracle's.
    pub under_estimates: UnderEstimates,
    /// Queries where the best DC by the reported depths has the oracle's best depth.
    pub best_dc_agreements: u64,
    /// `best_dc_agreements / queries` (1 when no query).
    pub best_dc_agreement: f64,
}

impl Accuracy {
    /// Judges one query: `reported[dc]` is the indexer's depth (`None`: lane not ready),
    /// `watermarks[dc]` the DC's newest batch known visible, `load` the DC loads used for
    /// tie-breaks.
    pub fn record(
        &mut self,
        hashes: &[u64],
        reported: &[Option<usize>],
        oracle: &Oracle,
        watermarks: &[u64],
        load: &[u64],
    ) {
        self.queries += 1;
        let exact = oracle.depths(hashes);
        for (dc, (&r, &o)) in reported.iter().zip(&exact).enumerate() {
            let Some(r) = r else {
                self.lanes_not_ready += 1;
                continue;
            };
            self.lane_answers += 1;
            if r == o {
                self.exact += 1;
            } else if r < o {
                let truth: BlockTruth = oracle.truth(dc, hashes[r]);
                let u = &mut self.under_estimates;
                u.total += 1;
                if truth.omission_suspect {
                    u.omission += 1;
                } else if truth.stored_at > watermarks[dc] {
                    u.in_flight += 1;
                } else {
                    u.unexplained += 1;
                }
            } else {
                let truth = oracle.truth(dc, hashes[o]);
                let v = &mut self.over_estimates;
                v.total += 1;
                if truth.dropped_at > watermarks[dc] {
                    v.in_flight_removal += 1;
                } else {
                    v.false_positive += 1;
                }
            }
        }
        let by_index = best_dc(reported, load);
        let known: Vec<Option<usize>> = exact.iter().copied().map(Some).collect();
        let by_oracle = best_dc(&known, load);
        if exact[by_index] == exact[by_oracle] {
            self.best_dc_agreements += 1;
        }
        self.best_dc_agreement = self.best_dc_agreements as f64 / self.queries as f64;
    }

    /// Whether the counters are consistent (every sum adds up).
    pub fn consistent(&self, dcs: u64) -> bool {
        let u = self.under_estimates;
        let v = self.over_estimates;
        u.total == u.omission + u.in_flight + u.unexplained
            && v.total == v.in_flight_removal + v.false_positive
            && self.lane_answers == self.exact + u.total + v.total
            && self.lane_answers + self.lanes_not_ready == self.queries * dcs
            && self.best_dc_agreements <= self.queries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn oracle() -> Oracle {
        let mut o = Oracle::new(2);
        for (h, seq) in [(1, 1), (2, 2), (3, 5)] {
            o.on_store(0, h, seq);
        }
        o.on_store(1, 1, 1);
        o
    }

    #[test]
    fn under_estimates_are_split_by_cause() {
        let o = oracle();
        let mut a = Accuracy::default();
        // DC 0 truth depth 3. Reported 2: block 3 stored at seq 5 > watermark 4 -> in flight.
        a.record(&[1, 2, 3], &[Some(2), Some(1)], &o, &[4, 9], &[0, 0]);
        assert_eq!(a.under_estimates.in_flight, 1);
        // Watermark 5 covers it -> unexplained.
        a.record(&[1, 2, 3], &[Some(2), Some(1)], &o, &[5, 9], &[0, 0]);
        assert_eq!(a.under_estimates.unexplained, 1);
        let mut o2 = o.clone();
        o2.on_omission(0, &[3]);
        a.record(&[1, 2, 3], &[Some(2), Some(1)], &o2, &[5, 9], &[0, 0]);
        assert_eq!(a.under_estimates.omission, 1);
        assert_eq!(a.exact, 3, "DC 1 was exact every time");
        assert!(a.consistent(2));
    }

    #[test]
    fn over_estimates_split_and_agreement() {
        let mut o = oracle();
        o.on_drop(1, 1, 7);
        let mut a = Accuracy::default();
        // DC 1 no longer holds block 1 (dropped at 7); reported 1.
        a.record(&[1, 2], &[Some(2), Some(1)], &o, &[9, 6], &[0, 0]);
        assert_eq!(a.over_estimates.in_flight_removal, 1);
        a.record(&[1, 2], &[Some(2), Some(1)], &o, &[9, 7], &[0, 0]);
        assert_eq!(a.over_estimates.false_positive, 1);
        assert_eq!(a.best_dc_agreements, 2);
        // Reported depths point at DC 1 although DC 0 is deeper: disagreement.
        a.record(&[1, 2], &[Some(0), Some(1)], &o, &[9, 7], &[0, 0]);
        assert_eq!(a.best_dc_agreements, 2);
        // A lane that is not ready.
        a.record(&[1, 2], &[Some(2), None], &o, &[9, 7], &[0, 0]);
        assert_eq!(a.lanes_not_ready, 1);
        assert_eq!(a.queries, 4);
        assert!(a.consistent(2));
        assert!((a.best_dc_agreement - 0.75).abs() < 1e-12);
    }
}
