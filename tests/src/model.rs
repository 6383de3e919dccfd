//! The exact model of one DC's cache content: which member owns which block hashes, as the
//! events sent to its producer say. It is the oracle the indexer's lane is compared against.

use std::collections::{BTreeMap, BTreeSet};

/// Member (worker id, dp rank 0) -> owned block hashes, plus every hash ever stored.
#[derive(Debug, Clone, Default)]
pub struct DcModel {
    owned: BTreeMap<u64, BTreeSet<u64>>,
    ever: BTreeSet<u64>,
}

impl DcModel {
    /// `worker` stores `hashes`.
    pub fn store(&mut self, worker: u64, hashes: &[u64]) {
        self.owned.entry(worker).or_default().extend(hashes);
        self.ever.extend(hashes);
    }

    /// `worker` evicts `hashes` (unknown ones are no-ops).
    pub fn remove(&mut self, worker: u64, hashes: &[u64]) {
        if let Some(set) = self.owned.get_mut(&worker) {
            for h in hashes {
                set.remove(h);
            }
        }
    }

    /// `worker` drops every block.
    pub fn clear(&mut self, worker: u64) {
        self.owned.remove(&worker);
    }

    /// Expects `hashes` to be absent from the lane unless a member owns them (e.g. the content
    /// of a dead incarnation that a new one replaced).
    pub fn expect_absent(&mut self, hashes: &[u64]) {
        self.ever.extend(hashes);
    }

    /// Each worker's owned hashes.
    pub fn owned(&self) -> &BTreeMap<u64, BTreeSet<u64>> {
        &self.owned
    }

    /// Hashes owned by at least one member (refcount > 0), ascending.
    pub fn tracked(&self) -> Vec<u64> {
        let set: BTreeSet<u64> = self.owned.values().flatten().copied().collect();
        set.into_iter().collect()
    }

    /// Hashes stored at some point and owned by no member now, ascending.
    pub fn gone(&self) -> Vec<u64> {
        let tracked: BTreeSet<u64> = self.tracked().into_iter().collect();
        self.ever.difference(&tracked).copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refcounts_across_members() {
        let mut m = DcModel::default();
        m.store(1, &[10, 11, 12]);
        m.store(2, &[11]);
        m.remove(1, &[11, 99]);
        assert_eq!(m.tracked(), vec![10, 11, 12]);
        m.clear(2);
        assert_eq!(m.tracked(), vec![10, 12]);
        assert_eq!(m.gone(), vec![11]);
    }
}
