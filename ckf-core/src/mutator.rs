//! Mutator: cuckoo insertion with bounded kicks and complete rollback; removal of one copy.
//!
//! The mutator owns the producer's packed bucket words (docs/design.md, "Producer storage and
//! relocation") and nothing else: it knows fingerprints and buckets, never block hashes or
//! owners. [`crate::dc::DcCkfState`] decides *when* to insert or remove; the mutator decides
//! *where*.
//!
//! # Insertion
//! 1. Put the fingerprint in an empty slot of either candidate bucket (bucket A first).
//! 2. Otherwise relocate ("kick"): pick a start bucket and a victim slot, put the new
//!    fingerprint there, and move the victim to its alternate bucket
//!    ([`Addressing::alternate`], the same function `locate` uses, so the insert path and the
//!    kick path cannot disagree: `docs/design.md`, "Cuckoo filter cases", case 3). Repeat with the next victim until
//!    an empty slot is found or `max_kicks` victims have been moved.
//! 3. On failure every write is undone from the undo log in reverse order, so the table bytes
//!    are identical to before the attempt (case 5) and the caller records a pre-commit omission.
//!
//! `max_kicks` bounds the search, not the table: reaching it does not prove the table is full.
//! `max_kicks == 0` disables relocation: a block is placed only if one of its two buckets has an
//! empty slot.
//!
//! # Victim choice
//! The victim slot and the start bucket come from a hash of (fingerprint being placed, kick
//! count, a per-table counter that advances on every relocating insert). A plain
//! `(fingerprint + kicks) % 4` is periodic: fingerprints that differ by a multiple of 4 walk the
//! same slots in lock-step and can cycle among a few buckets until the kick budget is spent,
//! failing far below the designed load (the eviction slot must not be a function of the
//! fingerprint and the kick count alone). Mixing
//! in the counter also means a retried insert explores a different path. The choice is still
//! deterministic for a given sequence of operations.
//!
//! Among the four slots (starting at the hashed one) the walk takes the first victim whose
//! alternate bucket is not already on the current path (an approximate 1,024-bit path filter)
//! and has an empty slot, so that kick ends the walk; if no alternate has room, the first
//! victim off the path. The walk starts in the hashed one of the two candidate buckets unless
//! only the other one has such a victim. The one-step look-ahead reads four buckets per kick, but they are
//! independent loads, where every extra kick of a blind walk is a dependent cache miss (on a
//! table far beyond the caches, the dominant cost of an insertion at high load).
//! A walk that re-enters a bucket it changed produces a net swap between buckets, which no
//! image order can publish without a transient miss (`docs/design.md`, "Cuckoo filter cases", case 12, see
//! [`crate::dirty`]); avoiding it also avoids wasting kicks on loops.
//!
//! # Hot path
//! No allocation: the undo log is a reused `Vec` that only grows to `max_kicks + 1` entries.

use crate::addressing::{Addressing, Location, fmix64};
use crate::bucket;

/// One write to a bucket: its index and the word it held before the write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Write {
    /// Bucket index.
    pub bucket: u32,
    /// The bucket's word before this write.
    pub before: u64,
}

/// Why an insertion did not happen. The table is unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InsertFailed {
    /// Victims moved before giving up (`== max_kicks`).
    pub kicks: u32,
}

/// Approximate set of the buckets on the current kick path: 1,024 bits indexed by a hash of the
/// bucket. A false positive only makes the walk skip a victim it could have taken.
#[derive(Default)]
struct PathFilter([u64; 16]);

impl PathFilter {
    #[inline(always)]
    fn bit(b: u32) -> (usize, u64) {
        let h = (u64::from(b).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54) as usize;
        (h >> 6, 1u64 << (h & 63))
    }
    #[inline(always)]
    fn mark(&mut self, b: u32) {
        let (w, m) = Self::bit(b);
        self.0[w] |= m;
    }
    #[inline(always)]
    fn contains(&self, b: u32) -> bool {
        let (w, m) = Self::bit(b);
        self.0[w] & m != 0
    }
}

/// Packed producer buckets plus the insertion/removal rules. Single owner, no locking.
#[derive(Debug, Clone)]
pub struct Mutator {
    addressing: Addressing,
    buckets: Vec<u64>,
    max_kicks: u32,
    /// Writes of the last operation, in order (the undo log, reused).
    writes: Vec<Write>,
    /// Advances on every relocating insert; mixed into the victim choice.
    counter: u64,
}

impl Mutator {
    /// An all-empty table for `addressing` with the given kick bound.
    ///
    /// # Panics
    /// When the bucket count does not fit `usize` (cannot happen for a validated format on a
    /// 64-bit target).
    pub fn new(addressing: Addressing, max_kicks: u32) -> Self {
        let n = usize::try_from(addressing.bucket_count()).expect("bucket count fits usize");
        Self {
            addressing,
            // Huge pages where the kernel offers them: a block's two random buckets are two
            // TLB misses on a large table with 4 KiB pages.
            buckets: crate::memory::zeroed_vec(n),
            max_kicks,
            writes: Vec::with_capacity(max_kicks.min(4096) as usize + 1),
            counter: 0,
        }
    }

    /// The addressing the table was built for.
    pub fn addressing(&self) -> &Addressing {
        &self.addressing
    }

    /// The packed table, `bucket_count` words, index = bucket.
    pub fn buckets(&self) -> &[u64] {
        &self.buckets
    }

    /// The kick bound.
    pub fn max_kicks(&self) -> u32 {
        self.max_kicks
    }

    /// Writes made by the last successful [`Mutator::insert`] or [`Mutator::remove`], in order.
    /// A bucket may appear more than once; its first entry holds its original word.
    pub fn last_writes(&self) -> &[Write] {
        &self.writes
    }

    /// Bytes held by the table and the undo log (capacity-based).
    pub fn bytes_used(&self) -> usize {
        self.buckets.capacity() * 8 + self.writes.capacity() * std::mem::size_of::<Write>()
    }

    /// Whether either candidate bucket holds `loc.fingerprint` (lossy membership).
    #[inline]
    pub fn contains(&self, loc: Location) -> bool {
        bucket::contains(self.buckets[loc.bucket_a as usize], loc.fingerprint)
            || bucket::contains(self.buckets[loc.bucket_b as usize], loc.fingerprint)
    }

    /// Hints the CPU to fetch both candidate buckets of `loc` (their cache lines), ahead of an
    /// [`insert`](Self::insert), [`remove`](Self::remove) or [`contains`](Self::contains).
    /// Never faults; a no-op on targets without a prefetch instruction.
    #[inline(always)]
    pub(crate) fn prefetch(&self, loc: Location) {
        let base = self.buckets.as_ptr();
        crate::memory::prefetch(base.wrapping_add(loc.bucket_a as usize));
        crate::memory::prefetch(base.wrapping_add(loc.bucket_b as usize));
    }

    /// When both candidate buckets of `loc` are full (an insertion would relocate), hints the
    /// CPU to fetch the alternate bucket of each of their eight residents: the first kick of
    /// [`insert`](Self::insert) reads four of them. Reads the two candidate words, so call it
    /// once they are likely cached (after [`prefetch`](Self::prefetch)). Never faults.
    #[inline]
    pub(crate) fn prefetch_relocation(&self, loc: Location) {
        let a = self.buckets[loc.bucket_a as usize];
        let b = self.buckets[loc.bucket_b as usize];
        if bucket::find_empty(a).is_some() || bucket::find_empty(b).is_some() {
            return;
        }
        let base = self.buckets.as_ptr();
        for (at, word) in [(loc.bucket_a, a), (loc.bucket_b, b)] {
            for alt in self.alternates(at, word) {
                crate::memory::prefetch(base.wrapping_add(alt as usize));
            }
        }
    }

    #[inline(always)]
    fn write(&mut self, b: u32, word: u64) {
        let before = std::mem::replace(&mut self.buckets[b as usize], word);
        self.writes.push(Write { bucket: b, before });
    }

    /// Inserts one copy of `loc.fingerprint` into its bucket pair, relocating at most
    /// `max_kicks` resident fingerprints.
    ///
    /// Returns the number of victims moved. On success [`Mutator::last_writes`] lists every
    /// changed bucket.
    ///
    /// # Errors
    /// [`InsertFailed`] when no empty slot was reached within `max_kicks` kicks; every write
    /// has been rolled back and the table bytes equal those before the call.
    pub fn insert(&mut self, loc: Location) -> Result<u32, InsertFailed> {
        self.writes.clear();
        let fp = loc.fingerprint;
        for b in [loc.bucket_a, loc.bucket_b] {
            let word = self.buckets[b as usize];
            if let Some(s) = bucket::find_empty(word) {
                self.write(b, bucket::with_slot(word, s, fp));
                return Ok(0);
            }
        }
        self.relocate(loc)
    }

    /// The alternate bucket of each of `word`'s four residents, `word` being bucket `b`'s.
    #[inline(always)]
    fn alternates(&self, b: u32, word: u64) -> [u32; bucket::SLOTS] {
        std::array::from_fn(|s| self.addressing.alternate(b, bucket::slot(word, s)))
    }

    /// Whether some resident of a bucket, whose residents' alternates are `alts`, could move to
    /// an empty slot of its alternate.
    #[inline(always)]
    fn has_room(&self, alts: &[u32; bucket::SLOTS]) -> bool {
        alts.iter()
            .any(|&alt| bucket::find_empty(self.buckets[alt as usize]).is_some())
    }

    #[cold]
    fn relocate(&mut self, loc: Location) -> Result<u32, InsertFailed> {
        self.counter = self.counter.wrapping_add(1);
        let salt = self.counter.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut fp = loc.fingerprint;
        let (first, second) = if fmix64(salt ^ u64::from(fp)) & 1 == 0 {
            (loc.bucket_a, loc.bucket_b)
        } else {
            (loc.bucket_b, loc.bucket_a)
        };
        // Start where one kick suffices if either bucket allows it (both buckets' alternates
        // were prefetched by `prefetch_relocation`). Each bucket's alternates are computed once
        // and serve both this choice and the kick from it.
        let first_alts = self.alternates(first, self.buckets[first as usize]);
        let (mut b, mut alts) = if self.has_room(&first_alts) {
            (first, first_alts)
        } else {
            let second_alts = self.alternates(second, self.buckets[second as usize]);
            if self.has_room(&second_alts) {
                (second, second_alts)
            } else {
                (first, first_alts)
            }
        };
        let mut path = PathFilter::default();
        path.mark(b);
        for kick in 0..self.max_kicks {
            let word = self.buckets[b as usize];
            let mix = fmix64((u64::from(fp) | (u64::from(kick) << 16)) ^ salt);
            let first = (mix >> 62) as usize;
            // Prefer a victim whose alternate is off the current path: a walk that re-enters a
            // bucket it already changed makes a net swap no delta order can cover (see
            // `crate::dirty`, "Cycles") and wastes kicks. Among those, one whose alternate has
            // an empty slot ends the walk with this kick: the four alternates are independent
            // loads (and prefetched by `prefetch_relocation` for the first kick), where each
            // further kick of a blind walk is one more dependent cache miss.
            let candidates = || (0..4).map(|j| (first + j) & 3);
            let victim_slot = candidates()
                .find(|&s| {
                    let alt = alts[s];
                    !path.contains(alt) && bucket::find_empty(self.buckets[alt as usize]).is_some()
                })
                .or_else(|| candidates().find(|&s| !path.contains(alts[s])))
                .unwrap_or(first);
            let victim = bucket::slot(word, victim_slot);
            self.write(b, bucket::with_slot(word, victim_slot, fp));
            fp = victim;
            b = alts[victim_slot];
            path.mark(b);
            let word = self.buckets[b as usize];
            if let Some(s) = bucket::find_empty(word) {
                self.write(b, bucket::with_slot(word, s, fp));
                return Ok(kick + 1);
            }
            alts = self.alternates(b, word);
        }
        self.rollback();
        Err(InsertFailed {
            kicks: self.max_kicks,
        })
    }

    fn rollback(&mut self) {
        while let Some(w) = self.writes.pop() {
            self.buckets[w.bucket as usize] = w.before;
        }
    }

    /// Removes exactly one copy of `loc.fingerprint` from its bucket pair (bucket A first).
    ///
    /// Any matching copy is the right one: a fingerprint in bucket `x` can only belong to the
    /// pair `{x, alternate(x, fp)}`, so every copy found here represents a hash of this same
    /// (fingerprint, pair) and copies are interchangeable.
    ///
    /// Returns `false` (table unchanged) when neither bucket holds the fingerprint; the caller
    /// only removes fingerprints it inserted, so that means its exact state is inconsistent.
    pub fn remove(&mut self, loc: Location) -> bool {
        self.writes.clear();
        for b in [loc.bucket_a, loc.bucket_b] {
            let word = self.buckets[b as usize];
            if let Some(s) = bucket::find(word, loc.fingerprint) {
                self.write(b, bucket::with_slot(word, s, bucket::EMPTY_SLOT));
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addressing::TableFormat;

    fn mutator(buckets: u64, kicks: u32) -> Mutator {
        let f = TableFormat::new(buckets, 7).unwrap();
        Mutator::new(Addressing::new(&f).unwrap(), kicks)
    }

    #[test]
    fn failed_insert_restores_every_byte() {
        let mut m = mutator(4, 50);
        let a = *m.addressing();
        let mut h = 0u64;
        loop {
            h += 1;
            let before = m.buckets().to_vec();
            if m.insert(a.locate(h)).is_err() {
                assert_eq!(m.buckets(), &before[..]);
                break;
            }
        }
        let occupied: u32 = m.buckets().iter().map(|&w| bucket::occupied(w)).sum();
        assert!(
            occupied >= 8,
            "a 16-slot table filled only {occupied} slots"
        );
    }

    #[test]
    fn zero_kicks_never_relocates() {
        let mut m = mutator(8, 0);
        let a = *m.addressing();
        for h in 0..1000u64 {
            let before = m.buckets().to_vec();
            match m.insert(a.locate(h)) {
                Ok(k) => assert_eq!(k, 0),
                Err(e) => {
                    assert_eq!(e.kicks, 0);
                    assert_eq!(m.buckets(), &before[..]);
                }
            }
        }
    }
}
