//! Producer statistics and the memory estimate behind `bytes_used`.

/// A point-in-time view of one producer's state: sizes, load and the memory estimate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DcCkfStats {
    /// Members owning at least one block.
    pub members: usize,
    /// Distinct tracked block hashes (refcount > 0).
    pub unique_blocks: usize,
    /// `(member, block hash)` ownership edges (sum of refcounts).
    pub ownership_edges: u64,
    /// Fingerprints physically in the table; equals `unique_blocks` while the state is
    /// consistent.
    pub resident_fingerprints: u64,
    /// Buckets in the table.
    pub bucket_count: u64,
    /// Slots in the table (`bucket_count * 4`).
    pub slot_count: u64,
    /// `resident_fingerprints / slot_count`, 0.0..=1.0.
    pub load_factor: f64,
    /// Stores omitted since start: for table capacity, or because the member limit was reached
    /// ([`BlockError`](super::BlockError)).
    pub omissions_total: u64,
    /// Removals of unknown `(member, block hash)` edges since start (idempotent no-ops).
    pub unknown_removals_total: u64,
    /// Fingerprints relocated by successful insertions since start.
    pub kicks_total: u64,
    /// Publication batches taken since start.
    pub batches_total: u64,
    /// Image-ordering cycles broken since start (see [`crate::dirty`]).
    pub cycles_broken_total: u64,
    /// Times a final-owner removal found no matching fingerprint (0 unless the exact state is
    /// corrupt; the producer then needs a generation rebuild, `docs/design.md`, "Lane recovery and failure
    /// boundaries").
    pub missing_fingerprints_total: u64,
    /// Dirty buckets not yet sampled into a batch.
    pub pending_dirty: usize,
    /// Bytes of the packed table (`bucket_count * 8`).
    pub table_bytes: u64,
    /// Estimated bytes held by the whole producer state: table, undo log, dirty tracker, and the
    /// exact state ([`exact_bytes`](Self::exact_bytes)), computed from their allocated
    /// *capacities* (std hash maps in the hashbrown layout: per-bucket entry plus one control
    /// byte, buckets = capacity * 8 / 7 rounded to a power of two). It excludes allocator
    /// overhead and is exact up to that.
    pub bytes_used: u64,
    /// Bytes of the exact state alone, included in `bytes_used`: the block map (64-byte lines
    /// of four 16-byte entries, its stash and its spill map of fourth-and-later owners) and the
    /// member table (index, records, free tags, source charges); from allocated capacities
    /// like `bytes_used`. The packed filter table and the publication buffers are not in it.
    pub exact_bytes: u64,
    /// The exact block map's rebuilds since start: each growth (by 1.5x at 90% load), shrink
    /// and reservation rehashes every tracked block inside the store, removal or start that
    /// triggered it, a pause of the DC's ingest.
    /// [`DcCkfConfig::reserve_blocks`](super::DcCkfConfig::reserve_blocks) avoids the growths
    /// up to a known size. Their wall time is not here, so that two states that went through
    /// the same operations compare equal: see
    /// [`DcCkfState::block_map_rebuilds`](super::DcCkfState::block_map_rebuilds).
    pub block_map_rebuilds: u64,
}

impl DcCkfStats {
    /// `bytes_used / unique_blocks`, or 0.0 for an empty state.
    pub fn bytes_per_tracked_block(&self) -> f64 {
        if self.unique_blocks == 0 {
            0.0
        } else {
            self.bytes_used as f64 / self.unique_blocks as f64
        }
    }

    /// `exact_bytes / unique_blocks` (bytes of exact state per tracked block), or 0.0 for an
    /// empty state. The block map keeps its load between 60% and 90% while it grows, so this
    /// is about 18-27 bytes plus the spill of blocks with more than three owners.
    pub fn exact_bytes_per_tracked_block(&self) -> f64 {
        if self.unique_blocks == 0 {
            0.0
        } else {
            self.exact_bytes as f64 / self.unique_blocks as f64
        }
    }
}

/// Heap bytes of a hashbrown table (std `HashMap`/`HashSet`) with usable `capacity` and
/// `entry_bytes` per element: `buckets * (entry_bytes + 1) + 16` control-group bytes.
pub(crate) fn hash_table_bytes(capacity: usize, entry_bytes: usize) -> usize {
    if capacity == 0 {
        return 0;
    }
    let buckets = (capacity.saturating_mul(8) / 7).next_power_of_two();
    buckets * (entry_bytes + 1) + 16
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn estimate_covers_the_allocation() {
        for n in [1usize, 3, 4, 7, 8, 100, 10_000] {
            let m: HashMap<u64, u32> = (0..n as u64).map(|k| (k, 1)).collect();
            let est = hash_table_bytes(m.capacity(), 16);
            // At least one entry plus control byte per element, at most ~2.3x that.
            assert!(est >= n * 17, "n={n} est={est}");
            assert!(est <= n * 17 * 3 + 64, "n={n} est={est}");
        }
        assert_eq!(hash_table_bytes(0, 16), 0);
    }
}
