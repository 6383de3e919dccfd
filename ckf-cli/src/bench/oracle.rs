//! The exact oracle index: which DC holds which block hash, at every step of a replay.
//!
//! The fleet simulator updates it on every store and eviction, so it is the truth the indexer's
//! answers are judged against. Per DC and block hash it also keeps when the block was last
//! stored or dropped (the DC's event-batch sequence) and whether the producer reported a
//! capacity omission for it, so a wrong depth can be explained (in-flight delta, omission) or
//! flagged as unexplained.

use std::collections::HashMap;

/// What the oracle knows about one block hash in one DC.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockTruth {
    /// Ranks of the DC that hold the block (0 = the DC does not hold it).
    pub holders: u32,
    /// DC batch sequence of the last store that made the DC hold it (0 = never).
    pub stored_at: u64,
    /// DC batch sequence of the last eviction that made the DC drop it (0 = never).
    pub dropped_at: u64,
    /// The producer reported a capacity omission for an event carrying this block since the DC
    /// last started holding it. Sticky until no rank holds it: the omitted rank keeps the block
    /// untracked even when another rank's store of it succeeds later.
    pub omission_suspect: bool,
}

/// Exact per-DC block holdings.
#[derive(Debug, Clone)]
pub struct Oracle {
    dcs: Vec<HashMap<u64, BlockTruth>>,
}

impl Oracle {
    /// An empty oracle for `dcs` DCs.
    pub fn new(dcs: usize) -> Self {
        Self {
            dcs: vec![HashMap::new(); dcs],
        }
    }

    /// Number of DCs.
    pub fn dcs(&self) -> usize {
        self.dcs.len()
    }

    /// A rank of `dc` started holding `hash` in DC batch `seq`.
    pub fn on_store(&mut self, dc: usize, hash: u64, seq: u64) {
        let truth = self.dcs[dc].entry(hash).or_default();
        if truth.holders == 0 {
            truth.stored_at = seq;
        }
        truth.holders += 1;
    }

    /// A rank of `dc` evicted `hash` in DC batch `seq`.
    ///
    /// # Panics
    /// When no rank of `dc` held `hash` (a simulator bug).
    pub fn on_drop(&mut self, dc: usize, hash: u64, seq: u64) {
        let truth = self.dcs[dc]
            .get_mut(&hash)
            .filter(|t| t.holders > 0)
            .expect("oracle: dropping a block no rank holds");
        truth.holders -= 1;
        if truth.holders == 0 {
            truth.dropped_at = seq;
            truth.omission_suspect = false;
        }
    }

    /// Records that the producer omitted blocks of an event storing `hashes` in `dc`: every block
    /// of the event becomes suspect (the result counts omitted blocks, it does not name them).
    pub fn on_omission(&mut self, dc: usize, hashes: &[u64]) {
        for hash in hashes {
            if let Some(truth) = self.dcs[dc].get_mut(hash) {
                truth.omission_suspect = true;
            }
        }
    }

    /// What the oracle knows about `hash` in `dc` (default when never seen).
    pub fn truth(&self, dc: usize, hash: u64) -> BlockTruth {
        self.dcs[dc].get(&hash).copied().unwrap_or_default()
    }

    /// Whether some rank of `dc` holds `hash`.
    pub fn holds(&self, dc: usize, hash: u64) -> bool {
        self.dcs[dc].get(&hash).is_some_and(|t| t.holders > 0)
    }

    /// The exact prefix depth of `hashes` in `dc`: leading blocks held by some rank of the DC.
    pub fn depth(&self, dc: usize, hashes: &[u64]) -> usize {
        hashes.iter().take_while(|&&h| self.holds(dc, h)).count()
    }

    /// [`Oracle::depth`] for every DC, by DC index.
    pub fn depths(&self, hashes: &[u64]) -> Vec<usize> {
        (0..self.dcs.len())
            .map(|dc| self.depth(dc, hashes))
            .collect()
    }

    /// Distinct block hashes held in `dc`.
    pub fn held_blocks(&self, dc: usize) -> usize {
        self.dcs[dc].values().filter(|t| t.holders > 0).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_counts_leading_held_blocks_per_dc() {
        let mut o = Oracle::new(2);
        for h in [1, 2, 4] {
            o.on_store(0, h, 1);
        }
        o.on_store(1, 1, 1);
        assert_eq!(o.depths(&[1, 2, 3, 4]), vec![2, 1]);
        assert_eq!(o.depth(0, &[]), 0);
        assert_eq!(o.held_blocks(0), 3);
    }

    #[test]
    fn a_block_stays_held_until_its_last_holder_drops_it() {
        let mut o = Oracle::new(1);
        o.on_store(0, 7, 1);
        o.on_store(0, 7, 2);
        assert_eq!(o.truth(0, 7).stored_at, 1);
        o.on_drop(0, 7, 3);
        assert!(o.holds(0, 7));
        assert_eq!(o.truth(0, 7).dropped_at, 0);
        o.on_drop(0, 7, 4);
        assert!(!o.holds(0, 7));
        assert_eq!(o.truth(0, 7).dropped_at, 4);
        o.on_store(0, 7, 5);
        assert_eq!(o.truth(0, 7).stored_at, 5);
    }

    #[test]
    fn omission_marks_stay_until_the_dc_drops_the_block() {
        let mut o = Oracle::new(1);
        o.on_store(0, 1, 1);
        o.on_store(0, 2, 1);
        o.on_omission(0, &[1, 2]);
        assert!(o.truth(0, 1).omission_suspect && o.truth(0, 2).omission_suspect);
        o.on_store(0, 2, 2);
        o.on_drop(0, 2, 3);
        assert!(o.truth(0, 2).omission_suspect, "one holder left");
        o.on_drop(0, 2, 4);
        assert!(!o.truth(0, 2).omission_suspect);
        assert!(o.truth(0, 1).omission_suspect);
    }

    #[test]
    #[should_panic(expected = "no rank holds")]
    fn dropping_an_unheld_block_is_a_bug() {
        Oracle::new(1).on_drop(0, 9, 1);
    }
}
