//! Packed buckets and the transposed consumer table.
//!
//! A bucket is one `u64` holding four 16-bit slots: slot `i` occupies bits `16*i .. 16*i+16`
//! (slot 0 in the low bits, slot 3 in bits 48..63). A slot value of 0 means empty; fingerprints
//! are never 0 (see [`crate::addressing`]). Occupied slots are *not* packed to the left: any
//! slot may be empty while a later one is full (`cuckoo-cases.md` case 8).
//!
//! All bit manipulation of bucket words lives here, so the rest of the crate never touches raw
//! slot masks (case 9).

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

/// Number of 16-bit slots in one bucket word.
pub const SLOTS: usize = 4;
/// The empty-slot marker.
pub const EMPTY_SLOT: u16 = 0;

const LOW15: u64 = 0x7FFF_7FFF_7FFF_7FFF;
const HIGH: u64 = 0x8000_8000_8000_8000;
const ONES: u64 = 0x0001_0001_0001_0001;

/// High bit of each 16-bit lane set exactly where that lane of `x` is zero (exact SWAR test,
/// no carries between lanes).
#[inline(always)]
fn zero_lanes(x: u64) -> u64 {
    !(((x & LOW15).wrapping_add(LOW15)) | x | LOW15)
}

/// Fingerprint in slot `slot` (0..4) of `word`.
///
/// # Panics
/// Debug builds panic when `slot >= 4`.
#[inline(always)]
pub fn slot(word: u64, slot: usize) -> u16 {
    debug_assert!(slot < SLOTS);
    (word >> (16 * slot)) as u16
}

/// `word` with slot `slot` (0..4) set to `fingerprint`; the other three slots are unchanged.
#[inline(always)]
pub fn with_slot(word: u64, slot: usize, fingerprint: u16) -> u64 {
    debug_assert!(slot < SLOTS);
    let shift = 16 * slot;
    (word & !(0xFFFFu64 << shift)) | (u64::from(fingerprint) << shift)
}

/// Whether any slot of `word` holds `fingerprint` (branch-free). `fingerprint` must be nonzero,
/// otherwise empty slots would match.
#[inline(always)]
pub fn contains(word: u64, fingerprint: u16) -> bool {
    zero_lanes(word ^ (u64::from(fingerprint) * ONES)) != 0
}

/// Index of the first slot holding `fingerprint`, if any.
#[inline]
pub fn find(word: u64, fingerprint: u16) -> Option<usize> {
    let z = zero_lanes(word ^ (u64::from(fingerprint) * ONES));
    (z != 0).then(|| (z.trailing_zeros() / 16) as usize)
}

/// Index of the first empty slot, if any.
#[inline]
pub fn find_empty(word: u64) -> Option<usize> {
    let z = zero_lanes(word);
    (z != 0).then(|| (z.trailing_zeros() / 16) as usize)
}

/// Number of occupied (nonzero) slots, 0..=4.
#[inline]
pub fn occupied(word: u64) -> u32 {
    SLOTS as u32 - (zero_lanes(word) & HIGH).count_ones()
}

/// The four slots of `word`, slot 0 first.
#[inline]
pub fn slots(word: u64) -> [u16; SLOTS] {
    [slot(word, 0), slot(word, 1), slot(word, 2), slot(word, 3)]
}

/// Maximum number of lanes (DC pools) one consumer table holds.
pub const MAX_LANES: usize = 16;

/// Cache-line alignment of the consumer table allocation (two 64-byte lines, so a 16-lane row of
/// 128 bytes never straddles more lines than it must).
const TABLE_ALIGN: usize = 128;

/// The consumer's bucket-major, lane-minor table of `AtomicU64` bucket images.
///
/// Word `(bucket, lane)` lives at index `bucket * lanes + lane`, so the row of one bucket holds
/// that bucket's image in every lane side by side (design source, "Global transposed consumer").
/// The table is sized to the configured lane count (1..=16): `bucket_count * lanes * 8` bytes.
///
/// Concurrency: every word is an independent atomic; writers store whole images, readers load
/// whole images. There is no cross-word atomicity (the weak-read contract, see
/// [`crate::global`]).
pub struct TransposedTable {
    ptr: NonNull<AtomicU64>,
    len: usize,
    lanes: usize,
    bucket_count: usize,
}

// SAFETY: the table owns its allocation and only hands out shared references to `AtomicU64`s,
// which are themselves `Sync`.
unsafe impl Send for TransposedTable {}
// SAFETY: as above; all mutation goes through atomics.
unsafe impl Sync for TransposedTable {}

/// Errors creating a [`TransposedTable`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    /// Lane count outside 1..=16.
    #[error("lane count {0} is outside 1..={MAX_LANES}")]
    LaneCount(usize),
    /// `bucket_count * lanes * 8` does not fit the address space or the allocator refused it.
    #[error("cannot allocate a table of {buckets} buckets x {lanes} lanes")]
    Allocation {
        /// Requested buckets.
        buckets: u64,
        /// Requested lanes.
        lanes: usize,
    },
}

impl TransposedTable {
    /// An all-empty table of `bucket_count` buckets by `lanes` lanes (1..=16). Pages are zeroed
    /// lazily by the allocator, so a large table costs no time until touched.
    ///
    /// # Errors
    /// [`TableError::LaneCount`] or [`TableError::Allocation`].
    pub fn new(bucket_count: u64, lanes: usize) -> Result<Self, TableError> {
        if !(1..=MAX_LANES).contains(&lanes) {
            return Err(TableError::LaneCount(lanes));
        }
        let fail = TableError::Allocation {
            buckets: bucket_count,
            lanes,
        };
        let len = usize::try_from(bucket_count)
            .ok()
            .and_then(|b| b.checked_mul(lanes))
            .filter(|&l| l > 0)
            .ok_or(fail.clone())?;
        let bytes = len.checked_mul(8).ok_or(fail.clone())?;
        let layout = Layout::from_size_align(bytes, TABLE_ALIGN).map_err(|_| fail.clone())?;
        // SAFETY: `layout` has nonzero size (len > 0). A zeroed `AtomicU64` is a valid 0.
        let raw = unsafe { alloc_zeroed(layout) }.cast::<AtomicU64>();
        let ptr = NonNull::new(raw).ok_or(fail)?;
        Ok(Self {
            ptr,
            len,
            lanes,
            bucket_count: bucket_count as usize,
        })
    }

    /// Configured lane count (1..=16).
    #[inline]
    pub fn lanes(&self) -> usize {
        self.lanes
    }

    /// Number of buckets.
    #[inline]
    pub fn bucket_count(&self) -> usize {
        self.bucket_count
    }

    /// Bytes held by the bucket words (`bucket_count * lanes * 8`).
    pub fn bytes(&self) -> usize {
        self.len * 8
    }

    #[inline(always)]
    fn words(&self) -> &[AtomicU64] {
        // SAFETY: `ptr` points to `len` initialised (zeroed) `AtomicU64`s owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The row of `bucket`: one image per lane, `lanes()` words long.
    ///
    /// # Panics
    /// When `bucket >= bucket_count()`.
    #[inline(always)]
    pub fn row(&self, bucket: usize) -> &[AtomicU64] {
        let start = bucket * self.lanes;
        &self.words()[start..start + self.lanes]
    }

    /// Loads the image of (`bucket`, `lane`) with `Acquire` ordering.
    ///
    /// # Panics
    /// When `bucket` or `lane` is out of range.
    #[inline]
    pub fn load(&self, bucket: usize, lane: usize) -> u64 {
        assert!(lane < self.lanes, "lane {lane} out of range");
        self.row(bucket)[lane].load(Ordering::Acquire)
    }

    /// Installs one bucket image with a single `Release` store (design source: "Each consumer
    /// bucket image is installed with one atomic u64 store"). `Release` keeps the order of a
    /// delta's stores visible to an `Acquire` reader, which the relocation ordering of
    /// `cuckoo-cases.md` case 12 relies on.
    ///
    /// # Panics
    /// When `bucket` or `lane` is out of range.
    #[inline]
    pub fn store(&self, bucket: usize, lane: usize, image: u64) {
        assert!(lane < self.lanes, "lane {lane} out of range");
        self.row(bucket)[lane].store(image, Ordering::Release);
    }

    /// Hints the CPU to fetch the row of `bucket` (every lane) into cache. A no-op on targets
    /// without a prefetch instruction; never faults, even for an out-of-range bucket (the index
    /// is masked into range).
    #[inline(always)]
    pub fn prefetch_row(&self, bucket: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
            let start = (bucket % self.bucket_count) * self.lanes;
            let p = self.words()[start..].as_ptr().cast::<i8>();
            // SAFETY: prefetch never faults; `p` points inside the allocation.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p) };
            if self.lanes * 8 > 64 || (start * 8) % 64 + self.lanes * 8 > 64 {
                // SAFETY: as above; the row's last word is inside the allocation.
                let q = unsafe { p.add(self.lanes * 8 - 8) };
                unsafe { _mm_prefetch::<_MM_HINT_T0>(q) };
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = bucket;
    }

    /// Copies one lane out as plain words (`bucket_count` long), for tests and convergence
    /// checks. Each word is loaded atomically; the copy as a whole is not a snapshot.
    pub fn lane_words(&self, lane: usize) -> Vec<u64> {
        (0..self.bucket_count).map(|b| self.load(b, lane)).collect()
    }
}

impl Drop for TransposedTable {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.len * 8, TABLE_ALIGN).expect("layout was valid");
        // SAFETY: allocated in `new` with exactly this layout.
        unsafe { dealloc(self.ptr.as_ptr().cast(), layout) };
    }
}

impl std::fmt::Debug for TransposedTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransposedTable")
            .field("bucket_count", &self.bucket_count)
            .field("lanes", &self.lanes)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_masks_leave_other_slots_unchanged() {
        // case 9: write 0xFFFF then 0x0001 into each slot in turn.
        let base = 0x1111_2222_3333_4444u64;
        for s in 0..SLOTS {
            for fp in [0xFFFFu16, 0x0001] {
                let w = with_slot(base, s, fp);
                assert_eq!(slot(w, s), fp);
                for o in (0..SLOTS).filter(|&o| o != s) {
                    assert_eq!(
                        slot(w, o),
                        slot(base, o),
                        "slot {o} changed writing slot {s}"
                    );
                }
            }
        }
        assert_eq!(with_slot(0, 3, 0xFFFF), 0xFFFF_0000_0000_0000);
    }

    #[test]
    fn membership_is_exact_per_slot() {
        let w = with_slot(with_slot(0, 1, 0x8001), 3, 0x0001);
        assert!(contains(w, 0x8001));
        assert!(contains(w, 0x0001));
        assert!(!contains(w, 0x8000));
        assert!(!contains(w, 0x0002));
        assert_eq!(find(w, 0x0001), Some(3));
        assert_eq!(find(w, 0x8001), Some(1));
        assert_eq!(find_empty(w), Some(0));
        assert_eq!(occupied(w), 2);
        assert_eq!(find_empty(u64::MAX), None);
        assert_eq!(occupied(0), 0);
        // exhaustive over a fingerprint in every slot next to tricky neighbours
        for fp in [1u16, 2, 0x7FFF, 0x8000, 0xFFFF] {
            for s in 0..SLOTS {
                let w = with_slot(0x0001_FFFF_8000_7FFF & !(0xFFFF << (16 * s)), s, fp);
                assert_eq!(find(w, fp).map(|i| slot(w, i)), Some(fp));
            }
        }
    }

    #[test]
    fn table_rejects_bad_lane_counts() {
        assert_eq!(
            TransposedTable::new(16, 0).unwrap_err(),
            TableError::LaneCount(0)
        );
        assert_eq!(
            TransposedTable::new(16, 17).unwrap_err(),
            TableError::LaneCount(17)
        );
        let t = TransposedTable::new(16, 3).unwrap();
        assert_eq!(t.bytes(), 16 * 3 * 8);
        t.store(5, 2, 42);
        assert_eq!(t.load(5, 2), 42);
        assert_eq!(t.row(5)[2].load(Ordering::Relaxed), 42);
        assert_eq!(t.load(5, 1), 0);
        t.prefetch_row(1 << 40);
    }
}
