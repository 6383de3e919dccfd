//! `SourceSequences`: the per-source batch sequence rule of the producer's ingest, with a bounded
//! memory.
//!
//! Each event source (for example one worker's event publisher) numbers its batches. The first
//! batch seen from a source may start anywhere; after that each batch should be the previous
//! one + 1:
//!
//! | received `s`, last applied `l` | [`SequenceCheck`] | applied? |
//! | --- | --- | --- |
//! | source not tracked | `First` | yes |
//! | `s == l + 1` | `InOrder` | yes |
//! | `s > l + 1` | `Gap { expected: l + 1, received: s }` (batches in between never arrived) | yes: its events are newer than what was lost |
//! | `s <= l` | `Duplicate { last: l }` (a replay, e.g. a retry after a lost response) | no, refused whole |
//!
//! A refused duplicate never moves a source backwards. So a source's numbering only ever moves
//! forward: after a source has sent sequence `s`, nothing at or below `s` applies again under
//! its id, and a source that sent `u64::MAX` can send nothing more. A source that restarts its
//! numbering (a restarted publisher process) must use a new source id, which names the new
//! incarnation; the old id ages out of the LRU below.
//!
//! # Bounded memory
//! Sources come and go (a source id names one source *incarnation*), so the tracker keeps at
//! most `capacity` sources. Admitting a batch from an untracked source while full evicts the
//! **least recently admitted** source (any admission, duplicates included, counts as a use).
//! An evicted source is forgotten: its next batch is classified `First` and applied, so a
//! replay older than the eviction is no longer detected. Evictions are counted
//! ([`SourceSequences::evictions`]) so the service can export how often that happens; size the
//! capacity above the number of concurrently active sources. Memory is therefore bounded by the
//! capacity ([`SourceSequences::bytes_used`]: about 100 bytes plus the id per source), never by
//! the number of source ids ever seen. Ids are validated by the caller
//! ([`crate::identity::SourceId`]: 1..=128 bytes, no control characters).

use std::num::NonZeroUsize;

use lru::LruCache;

/// Sources tracked by default: comfortably above the active sources of one DC pool (one per
/// worker event publisher plus control sources), at roughly 100 bytes each (~6.5 MiB).
pub const DEFAULT_MAX_TRACKED_SOURCES: NonZeroUsize = NonZeroUsize::new(65_536).unwrap();

/// Estimated bytes of one tracked source besides its id and the hash table: the LRU entry
/// (`String` header, `u64` sequence, two list links) in its own heap block, plus the allocator's
/// per-block overhead (glibc: 8-byte header, 16-byte rounding).
const ENTRY_OVERHEAD_BYTES: usize =
    heap_block(size_of::<String>() + size_of::<u64>() + 2 * size_of::<usize>());

/// Bytes one hash-table slot of the LRU index costs: key pointer, entry pointer, control byte.
const SLOT_BYTES: usize = 2 * size_of::<usize>() + 1;

/// Bytes the allocator takes for a request of `n` bytes (glibc malloc: `n` + 8-byte header,
/// rounded up to 16, at least 32).
const fn heap_block(n: usize) -> usize {
    let b = (n + 8).div_ceil(16) * 16;
    if b < 32 { 32 } else { b }
}

/// How a batch's sequence relates to its source's history (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SequenceCheck {
    /// First batch seen from this source (or since it was evicted).
    First,
    /// Exactly the previous sequence + 1.
    InOrder,
    /// Batches `expected..received` never arrived; this batch is applied.
    Gap {
        /// The sequence that should have come next.
        expected: u64,
        /// The sequence that arrived.
        received: u64,
    },
    /// Not newer than `last`, the last applied sequence: a replay, refused.
    Duplicate {
        /// The last applied sequence of the source.
        last: u64,
    },
}

impl SequenceCheck {
    /// Whether the batch must be applied (everything but a [`SequenceCheck::Duplicate`]).
    pub fn applies(self) -> bool {
        !matches!(self, Self::Duplicate { .. })
    }
}

/// Last applied sequence per source, for at most `capacity` sources (least recently admitted
/// evicted first; see the module docs).
#[derive(Debug)]
pub struct SourceSequences {
    /// Grows with the sources seen (never reserved up front: a large configured capacity costs
    /// nothing until that many sources exist); `capacity` is enforced on insertion.
    last: LruCache<String, u64>,
    capacity: NonZeroUsize,
    /// Heap bytes of the tracked ids' characters (allocator blocks, see `heap_block`).
    id_bytes: usize,
    evictions: u64,
}

impl Default for SourceSequences {
    /// A tracker of [`DEFAULT_MAX_TRACKED_SOURCES`] sources.
    fn default() -> Self {
        Self::new(DEFAULT_MAX_TRACKED_SOURCES)
    }
}

impl SourceSequences {
    /// An empty tracker of at most `capacity` sources.
    pub fn new(capacity: NonZeroUsize) -> Self {
        Self {
            last: LruCache::unbounded(),
            capacity,
            id_bytes: 0,
            evictions: 0,
        }
    }

    /// Classifies `sequence` for `source` and, unless it is a duplicate, records it as the
    /// source's last applied sequence. The source becomes the most recently used; a new source
    /// admitted while full evicts the least recently used one.
    pub fn admit(&mut self, source: &str, sequence: u64) -> SequenceCheck {
        let Some(last) = self.last.get_mut(source) else {
            if self.last.len() >= self.capacity.get()
                && let Some((evicted, _)) = self.last.pop_lru()
            {
                self.id_bytes -= heap_block(evicted.len());
                self.evictions += 1;
            }
            self.last.push(source.to_owned(), sequence);
            self.id_bytes += heap_block(source.len());
            return SequenceCheck::First;
        };
        if sequence <= *last {
            return SequenceCheck::Duplicate { last: *last };
        }
        let check = if sequence == *last + 1 {
            SequenceCheck::InOrder
        } else {
            SequenceCheck::Gap {
                expected: *last + 1,
                received: sequence,
            }
        };
        *last = sequence;
        check
    }

    /// Every tracked `(source, last applied sequence)`, least recently used first: what a
    /// durability checkpoint records so that a restarted producer still refuses replays
    /// ([`restore`](Self::restore) rebuilds the same order). O(tracked sources); not a use.
    pub fn export(&self) -> Vec<(String, u64)> {
        self.last
            .iter()
            .rev()
            .map(|(source, &last)| (source.clone(), last))
            .collect()
    }

    /// Replaces the tracked sources with `entries`, given least recently used first (as
    /// [`export`](Self::export) returns them): afterwards [`admit`](Self::admit) answers as it
    /// did in the exported tracker, and evicts in the same order. The capacity stays this
    /// tracker's: when `entries` holds more sources, the oldest are dropped first and counted
    /// in [`evictions`](Self::evictions) (they are forgotten, as any evicted source is). A source
    /// named twice keeps the larger sequence (a source never moves backwards) at the later
    /// position. The previous contents are dropped without counting; the eviction count is
    /// kept.
    pub fn restore(&mut self, entries: impl IntoIterator<Item = (String, u64)>) {
        self.last.clear();
        self.id_bytes = 0;
        for (source, sequence) in entries {
            let sequence = match self.last.pop(&source) {
                Some(earlier) => {
                    self.id_bytes -= heap_block(source.len());
                    earlier.max(sequence)
                }
                None => sequence,
            };
            if self.last.len() >= self.capacity.get()
                && let Some((evicted, _)) = self.last.pop_lru()
            {
                self.id_bytes -= heap_block(evicted.len());
                self.evictions += 1;
            }
            self.id_bytes += heap_block(source.len());
            self.last.push(source, sequence);
        }
    }

    /// The last applied sequence of `source`, if it is tracked (does not count as a use).
    pub fn last(&self, source: &str) -> Option<u64> {
        self.last.peek(source).copied()
    }

    /// Sources tracked now (at most [`capacity`](Self::capacity)).
    pub fn len(&self) -> usize {
        self.last.len()
    }

    /// Whether no source is tracked.
    pub fn is_empty(&self) -> bool {
        self.last.is_empty()
    }

    /// Most sources tracked at once.
    pub fn capacity(&self) -> NonZeroUsize {
        self.capacity
    }

    /// Sources evicted so far to make room (each one's next batch is classified `First`).
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Estimated heap bytes of the tracked sources: per source its id's heap block and its LRU
    /// entry's (allocator overhead included), plus the index's hash table at hashbrown's load
    /// (buckets = len * 8 / 7 rounded up to a power of two). Bounded by
    /// `capacity * (ENTRY + SLOT + id)` bytes whatever the number of sources ever seen. An
    /// estimate for a gauge (`ckf_producer_tracked_source_bytes`, `GetStats.bytes_used`), not
    /// an allocator measurement.
    pub fn bytes_used(&self) -> usize {
        let len = self.last.len();
        let slots = if len == 0 {
            0
        } else {
            (len * 8 / 7).next_power_of_two() * SLOT_BYTES
        };
        self.id_bytes + len * ENTRY_OVERHEAD_BYTES + slots
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap(n: usize) -> NonZeroUsize {
        NonZeroUsize::new(n).unwrap()
    }

    #[test]
    fn gaps_and_replays_are_classified_per_source() {
        let mut s = SourceSequences::default();
        assert_eq!(s.admit("a", 10), SequenceCheck::First);
        assert_eq!(s.admit("a", 11), SequenceCheck::InOrder);
        assert_eq!(s.admit("b", 0), SequenceCheck::First);
        assert_eq!(
            s.admit("a", 14),
            SequenceCheck::Gap {
                expected: 12,
                received: 14
            }
        );
        assert_eq!(s.admit("a", 14), SequenceCheck::Duplicate { last: 14 });
        assert_eq!(s.admit("a", 3), SequenceCheck::Duplicate { last: 14 });
        // A refused replay does not move the source backwards.
        assert_eq!(s.admit("a", 15), SequenceCheck::InOrder);
        assert_eq!(s.admit("b", 1), SequenceCheck::InOrder);
        assert_eq!(s.len(), 2);
        assert_eq!(
            s.admit("b", u64::MAX),
            SequenceCheck::Gap {
                expected: 2,
                received: u64::MAX
            }
        );
        assert_eq!(
            s.admit("b", u64::MAX),
            SequenceCheck::Duplicate { last: u64::MAX }
        );
        assert_eq!(s.evictions(), 0);
    }

    #[test]
    fn a_huge_capacity_reserves_nothing_up_front() {
        // Reserving the capacity would try to allocate far more than any machine has.
        let mut s = SourceSequences::new(NonZeroUsize::MAX);
        assert_eq!(s.admit("a", 1), SequenceCheck::First);
        assert_eq!(s.admit("a", 2), SequenceCheck::InOrder);
        assert_eq!((s.len(), s.capacity()), (1, NonZeroUsize::MAX));
        assert!(s.bytes_used() < 4096, "{}", s.bytes_used());
    }

    #[test]
    fn a_full_tracker_forgets_the_least_recently_used_source() {
        let mut s = SourceSequences::new(cap(2));
        s.admit("a", 1);
        s.admit("bb", 1);
        // A duplicate is a use too: "a" is now the most recent.
        assert_eq!(s.admit("a", 1), SequenceCheck::Duplicate { last: 1 });
        assert_eq!(s.admit("ccc", 7), SequenceCheck::First);
        assert_eq!((s.len(), s.evictions()), (2, 1));
        assert_eq!(s.last("bb"), None);
        assert_eq!(s.last("a"), Some(1));
        // The evicted source's replay is no longer detected: it starts over.
        assert_eq!(s.admit("bb", 1), SequenceCheck::First);
        assert_eq!(s.last("a"), None);
        assert_eq!(s.evictions(), 2);
        assert_eq!(
            s.bytes_used(),
            2 * 32 + 2 * ENTRY_OVERHEAD_BYTES + 2 * SLOT_BYTES
        );
        assert_eq!(s.capacity(), cap(2));
    }

    #[test]
    fn a_hundred_thousand_sources_stay_within_the_capacity() {
        // A flood of fresh source ids (memory exhaustion by id churn): 100k distinct source ids, each one batch. At most `capacity`
        // stay tracked, and the estimate is bounded by the capacity, not the ids ever seen.
        let mut s = SourceSequences::new(cap(4096));
        let id = |i: usize| format!("{i:0>120}");
        for i in 0..100_000 {
            assert_eq!(s.admit(&id(i), 1), SequenceCheck::First);
        }
        assert_eq!(s.len(), 4096);
        assert_eq!(s.evictions(), 100_000 - 4096);
        // The most recent 4096 are the ones kept.
        assert_eq!(s.last(&id(99_999)), Some(1));
        assert_eq!(s.last(&id(100_000 - 4096)), Some(1));
        assert_eq!(s.last(&id(100_000 - 4097)), None);
        let per_source = heap_block(120) + ENTRY_OVERHEAD_BYTES;
        let bound = 4096 * per_source + 8192 * SLOT_BYTES;
        assert_eq!(s.bytes_used(), bound);
        assert!(bound < 1 << 20, "{bound}");
    }

    #[test]
    fn restore_keeps_the_order_and_drops_the_oldest_beyond_capacity() {
        let mut s = SourceSequences::new(cap(3));
        s.admit("a", 1);
        s.admit("b", 5);
        s.admit("c", 9);
        s.admit("a", 2);
        let image = s.export();
        let owned = |v: &[(&str, u64)]| -> Vec<(String, u64)> {
            v.iter().map(|&(id, n)| (id.to_owned(), n)).collect()
        };
        assert_eq!(image, owned(&[("b", 5), ("c", 9), ("a", 2)]));

        let mut small = SourceSequences::new(cap(2));
        small.admit("stale", 100);
        small.restore(image.clone());
        assert_eq!(small.export(), owned(&[("c", 9), ("a", 2)]));
        assert_eq!((small.evictions(), small.last("stale")), (1, None));
        assert_eq!(
            small.bytes_used(),
            2 * 32 + 2 * ENTRY_OVERHEAD_BYTES + 2 * SLOT_BYTES
        );

        // A repeated source keeps its larger sequence at its later position.
        let mut twice = SourceSequences::new(cap(3));
        twice.restore(owned(&[("a", 7), ("b", 1), ("a", 3)]));
        assert_eq!(twice.export(), owned(&[("b", 1), ("a", 7)]));
        assert_eq!(twice.admit("a", 7), SequenceCheck::Duplicate { last: 7 });
        assert_eq!(
            twice.bytes_used(),
            2 * 32 + 2 * ENTRY_OVERHEAD_BYTES + 2 * SLOT_BYTES
        );
        assert_eq!(twice.evictions(), 0);
    }

    #[test]
    fn allocator_blocks_round_like_glibc() {
        assert_eq!(heap_block(0), 32);
        assert_eq!(heap_block(24), 32);
        assert_eq!(heap_block(25), 48);
        assert_eq!(heap_block(120), 128);
        assert_eq!(ENTRY_OVERHEAD_BYTES, 64);
    }
}
