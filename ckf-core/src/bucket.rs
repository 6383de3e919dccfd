//! Packed buckets and the transposed consumer table: the one module that touches bucket words.
//!
//! A bucket is one `u64` holding [`SLOTS`] slots of [`SLOT_BITS`] bits: slot `i` occupies bits
//! `16*i .. 16*i+16` (slot 0 in the low bits, slot 3 in bits 48..63). A slot value of 0 means
//! empty; fingerprints are never 0 (see [`crate::addressing`]). Occupied slots are *not* packed
//! to the left: any slot may be empty while a later one is full (`docs/design.md`, "Cuckoo filter cases", case 8).
//!
//! What this module owns, so the rest of the crate never touches raw slot masks (case 9):
//! * the slot layout ([`SLOT_BITS`], [`SLOTS`], [`EMPTY_SLOT`]); `addressing` derives the format's
//!   fingerprint width and slot count from it;
//! * every word-level operation: read or write one slot, the "broadcast the fingerprint and test
//!   all four slots at once" membership test ([`broadcast`], [`holds_broadcast`], [`contains`]),
//!   first matching / first empty slot, occupancy; the mutator, the dirty tracker and the
//!   portable search call these, and the vector kernels (`search/avx512.rs`, `search/avx2.rs`,
//!   `search/neon.rs`) take the slot layout (and AVX-512 the per-word fold of its slot-compare
//!   mask) from here;
//! * the consumer's [`TransposedTable`] of `AtomicU64` images with its orderings (`Release`
//!   install, `Acquire` load), the portable row-pair check of the search, and the raw row view
//!   (`Rows`) with the row prefetch that both search kernels use.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::memory::{PrefetchLevel, alternate_on_demand, prefetch_to, row_prefetch};

/// Width of one slot (one fingerprint) in bits.
pub const SLOT_BITS: u32 = 16;
/// Number of slots in one bucket word.
pub const SLOTS: usize = 4;
/// The empty-slot marker.
pub const EMPTY_SLOT: u16 = 0;

const _: () = assert!(
    SLOT_BITS as usize * SLOTS == 64,
    "slots fill exactly one u64 word"
);

/// The bits of slot 0.
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;
/// The lowest bit of every slot: `x * ONES` repeats a slot value in all four slots.
const ONES: u64 = u64::MAX / SLOT_MASK;
/// The highest bit of every slot.
const HIGH: u64 = ONES << (SLOT_BITS - 1);
/// Every slot's bits but its highest.
const LOW15: u64 = !HIGH;

/// High bit of each slot set exactly where that slot of `x` is zero (exact per slot, no carries
/// between slots).
#[inline(always)]
fn zero_slots(x: u64) -> u64 {
    !(((x & LOW15).wrapping_add(LOW15)) | x | LOW15)
}

/// Fingerprint in slot `slot` (0..4) of `word`.
///
/// # Panics
/// Debug builds panic when `slot >= 4`.
#[inline(always)]
pub fn slot(word: u64, slot: usize) -> u16 {
    debug_assert!(slot < SLOTS);
    (word >> (SLOT_BITS as usize * slot)) as u16
}

/// `word` with slot `slot` (0..4) set to `fingerprint`; the other three slots are unchanged.
#[inline(always)]
pub fn with_slot(word: u64, slot: usize, fingerprint: u16) -> u64 {
    debug_assert!(slot < SLOTS);
    let shift = SLOT_BITS as usize * slot;
    (word & !(SLOT_MASK << shift)) | (u64::from(fingerprint) << shift)
}

/// `fingerprint` repeated in all four slots: the pattern [`holds_broadcast`] compares a word
/// against. Computed once per query position and reused for every lane's words.
#[inline(always)]
pub const fn broadcast(fingerprint: u16) -> u64 {
    fingerprint as u64 * ONES
}

/// Whether any slot of `word` equals the fingerprint repeated in `pattern` (from
/// [`broadcast`]); branch-free, four operations after the XOR. The fingerprint must be nonzero,
/// otherwise empty slots match.
///
/// The classic has-zero-slot test on `word ^ pattern`: a borrow can only set a flag above a slot
/// that really is zero, so the result is exact as a boolean (not as a per-slot mask).
#[inline(always)]
pub fn holds_broadcast(word: u64, pattern: u64) -> bool {
    let x = word ^ pattern;
    x.wrapping_sub(ONES) & !x & HIGH != 0
}

/// Whether any slot of `a` or of `b` equals the fingerprint repeated in `pattern`: the
/// [`holds_broadcast`] test of both words with one final mask and compare (a lane's two
/// candidate words are always tested together by the search).
#[inline(always)]
pub fn holds_either(a: u64, b: u64, pattern: u64) -> bool {
    let x = a ^ pattern;
    let y = b ^ pattern;
    ((x.wrapping_sub(ONES) & !x) | (y.wrapping_sub(ONES) & !y)) & HIGH != 0
}

/// Whether any slot of `word` holds `fingerprint` (branch-free). `fingerprint` must be nonzero,
/// otherwise empty slots would match.
#[inline(always)]
pub fn contains(word: u64, fingerprint: u16) -> bool {
    holds_broadcast(word, broadcast(fingerprint))
}

/// Index of the first slot holding `fingerprint`, if any.
#[inline]
pub fn find(word: u64, fingerprint: u16) -> Option<usize> {
    let z = zero_slots(word ^ broadcast(fingerprint));
    (z != 0).then(|| (z.trailing_zeros() / SLOT_BITS) as usize)
}

/// Index of the first empty slot, if any.
#[inline]
pub fn find_empty(word: u64) -> Option<usize> {
    let z = zero_slots(word);
    (z != 0).then(|| (z.trailing_zeros() / SLOT_BITS) as usize)
}

/// The slots of `old` whose (nonzero) fingerprint is not in the same slot of `new`, as the
/// highest bit of each such slot: the candidates for a fingerprint `old -> new` lost. Zero for
/// a word that only gained fingerprints in empty slots, the most common change, so the caller
/// skips it with one test.
#[inline(always)]
pub fn replaced_slots(old: u64, new: u64) -> u64 {
    HIGH & !zero_slots(old) & !zero_slots(old ^ new)
}

/// The slot of the lowest set bit of a slot mask (one bit per slot, as
/// [`replaced_slots`] returns).
#[inline(always)]
pub fn mask_slot(mask: u64) -> usize {
    (mask.trailing_zeros() / SLOT_BITS) as usize
}

/// Copies of `fingerprint` in `word` (0..=4; `fingerprint` nonzero). Branch-free: the slots'
/// equality bits are summed into the top slot by one multiply.
#[inline(always)]
pub fn copies(word: u64, fingerprint: u16) -> u32 {
    let equal = zero_slots(word ^ broadcast(fingerprint)) >> (SLOT_BITS - 1);
    (equal.wrapping_mul(ONES) >> (64 - SLOT_BITS)) as u32
}

/// Number of occupied (nonzero) slots, 0..=4.
#[inline]
pub fn occupied(word: u64) -> u32 {
    SLOTS as u32 - (zero_slots(word) & HIGH).count_ones()
}

/// The four slots of `word`, slot 0 first.
#[inline]
pub fn slots(word: u64) -> [u16; SLOTS] {
    [slot(word, 0), slot(word, 1), slot(word, 2), slot(word, 3)]
}

/// In a per-slot hit mask of consecutive words (bit `SLOTS * w + s` = slot `s` of word `w`, as a
/// vector compare of 16-bit elements produces it), the lowest bit of each word's group:
/// `0x1111_1111_1111_1111`. Gathering these bits of [`fold_slot_hits`]'s result (`pext`) gives
/// one bit per word.
// Used by the AVX-512 kernel only (and this module's tests).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) const FIRST_SLOT_BITS: u64 = u64::MAX / ((1 << SLOTS) - 1);

/// Folds a per-slot hit mask (see [`FIRST_SLOT_BITS`]) so that bit `SLOTS * w` is set when any
/// slot of word `w` hit; bits between those are meaningless.
// Used by the AVX-512 kernel only (and this module's tests).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
#[inline(always)]
pub(crate) const fn fold_slot_hits(slot_hits: u64) -> u64 {
    const _: () = assert!(SLOTS == 4, "the fold below ORs 4 slot bits together");
    let t = slot_hits | (slot_hits >> 1);
    t | (t >> 2)
}

/// Lanes (DC pools) one [`TransposedTable`] holds: a **lane group**. A consumer of more lanes
/// keeps one table per group of 16 ([`groups::LaneGroups`]); the search kernels work on one group.
pub const GROUP_LANES: usize = 16;

/// Lanes one consumer ([`groups::LaneGroups`], one indexer domain) holds: four lane groups.
pub const MAX_LANES: usize = 64;
const _: () = assert!(MAX_LANES.is_multiple_of(GROUP_LANES) && MAX_LANES <= 64);

/// Cache-line alignment of the consumer table allocation (two 64-byte lines, so a 16-lane row of
/// 128 bytes never straddles more lines than it must).
const TABLE_ALIGN: usize = 128;

/// The consumer's bucket-major, lane-minor table of `AtomicU64` bucket images.
///
/// Word `(bucket, lane)` lives at index `bucket * lanes + lane`, so the row of one bucket holds
/// that bucket's image in every lane side by side (docs/design.md, "Global transposed consumer").
/// The table is sized to its lane count (1..=16, one lane group): `bucket_count * lanes * 8`
/// bytes.
///
/// Concurrency: every word is an independent atomic; writers store whole images, readers load
/// whole images. There is no cross-word atomicity (the weak-read contract, see
/// [`crate::global`]).
pub struct TransposedTable {
    ptr: NonNull<AtomicU64>,
    len: usize,
    lanes: usize,
    bucket_count: usize,
    /// Whether a query prefetches rows ahead, and where to ([`crate::memory::row_prefetch`] of
    /// the consumer table, every lane group of it).
    row_prefetch: Option<PrefetchLevel>,
    /// Whether a query reads a position's alternate row only for the lanes its primary row
    /// missed ([`crate::memory::alternate_on_demand`] of the consumer table).
    alternate_on_demand: bool,
}

// SAFETY: the table owns its allocation and only hands out shared references to `AtomicU64`s,
// which are themselves `Sync`.
unsafe impl Send for TransposedTable {}
// SAFETY: as above; all mutation goes through atomics.
unsafe impl Sync for TransposedTable {}

/// Errors creating a [`TransposedTable`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    /// Lane count of one table (a lane group) outside 1..=16.
    #[error("lane count {0} is outside 1..={GROUP_LANES}")]
    LaneCount(usize),
    /// Lane count of a consumer ([`groups::LaneGroups`]) outside 1..=64.
    #[error("lane count {0} is outside 1..={MAX_LANES}")]
    ConsumerLanes(usize),
    /// `bucket_count * lanes * 8` does not fit the address space or the allocator refused it.
    #[error(
        "cannot allocate a table of {buckets} buckets x {lanes} lanes ({} bytes)",
        u128::from(*buckets) * *lanes as u128 * 8
    )]
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
        if !(1..=GROUP_LANES).contains(&lanes) {
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
            row_prefetch: row_prefetch(bytes),
            alternate_on_demand: alternate_on_demand(bytes),
        })
    }

    /// Prefetches rows as a lane group of a consumer table of `table_bytes` (every group's: a
    /// query reads them all; [`crate::memory::row_prefetch`]).
    pub(crate) fn prefetch_as_part_of(&mut self, table_bytes: usize) {
        self.row_prefetch = row_prefetch(table_bytes);
        self.alternate_on_demand = alternate_on_demand(table_bytes);
    }

    /// Whether a query prefetches this table's rows ahead of its probe (a consumer table of at
    /// least 1 MiB, every lane group counted).
    #[inline]
    pub(crate) fn prefetches_rows(&self) -> bool {
        self.row_prefetch.is_some()
    }

    /// Whether a query reads a position's alternate row only for the lanes its primary row
    /// missed, prefetching primary rows alone (a consumer table larger than the last-level
    /// cache, every lane group counted: [`crate::memory::alternate_on_demand`]).
    #[inline]
    pub(crate) fn reads_alternate_on_demand(&self) -> bool {
        self.alternate_on_demand
    }

    /// Lane count (1..=16, one lane group).
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

    /// Loads the image of (`bucket`, `lane`) with `Acquire` ordering: it pairs with
    /// [`TransposedTable::store`]'s `Release`, so a reader that sees an image also sees every
    /// image the writer stored before it (the order a delta's images are installed in).
    ///
    /// # Panics
    /// When `bucket` or `lane` is out of range.
    #[inline]
    pub fn load(&self, bucket: usize, lane: usize) -> u64 {
        assert!(lane < self.lanes, "lane {lane} out of range");
        self.row(bucket)[lane].load(Ordering::Acquire)
    }

    /// Installs one bucket image with a single `Release` store (docs/design.md, "Global
    /// transposed consumer": each consumer bucket image is installed with one atomic u64 store). `Release` keeps the order of a
    /// delta's stores visible to an `Acquire` reader, which the relocation ordering of
    /// `docs/design.md`, "Cuckoo filter cases", case 12 relies on.
    ///
    /// # Panics
    /// When `bucket` or `lane` is out of range.
    #[inline]
    pub fn store(&self, bucket: usize, lane: usize, image: u64) {
        assert!(lane < self.lanes, "lane {lane} out of range");
        self.row(bucket)[lane].store(image, Ordering::Release);
    }

    /// Bit `l` set for each lane `l` in `active` (bit `l` = lane `l`) whose word in row `first`
    /// or row `second` holds the fingerprint repeated in `pattern` ([`broadcast`]). Per lane the
    /// `first` row's word is loaded before the `second` row's word, both with `Acquire`: the
    /// read order the search's relocation argument relies on (`crate::search`, module docs).
    /// This is the portable search's check of both rows of a position (on a table whose
    /// alternate rows are read on demand, [`TransposedTable::row_hits`] checks one).
    ///
    /// Two shapes, same answer: when every lane of the row is active, all lanes are tested in
    /// one fixed-count loop (unrolled for the common lane counts, see `row_pair_hits_all`; no
    /// branch per lane), and the two words of a lane share one has-zero-slot test
    /// ([`holds_either`]); otherwise only the active lanes are loaded.
    ///
    /// # Panics
    /// When `first` or `second` is out of range, or `active` selects a lane `>= lanes()`.
    #[inline(always)]
    pub(crate) fn row_pair_hits(
        &self,
        first: usize,
        second: usize,
        pattern: u64,
        active: u32,
    ) -> u32 {
        let ra = self.row(first);
        let rb = self.row(second);
        if active == (1u32 << self.lanes) - 1 {
            return match self.lanes {
                16 => row_pair_hits_all::<16>(ra, rb, pattern),
                8 => row_pair_hits_all::<8>(ra, rb, pattern),
                4 => row_pair_hits_all::<4>(ra, rb, pattern),
                _ => row_pair_hits_dyn(ra, rb, pattern),
            };
        }
        let mut hits = 0u32;
        let mut m = active;
        while m != 0 {
            let l = m.trailing_zeros() as usize;
            m &= m - 1;
            // Acquire: pairs with the Release stores of a delta (relocation order, see
            // `store`); the `first` row's word is loaded before the `second` row's.
            let a = ra[l].load(Ordering::Acquire);
            let b = rb[l].load(Ordering::Acquire);
            hits |= u32::from(holds_either(a, b, pattern)) << l;
        }
        hits
    }

    /// Bit `l` set for each lane `l` in `active` whose word in row `bucket` holds the fingerprint
    /// repeated in `pattern` ([`broadcast`]), each word loaded with `Acquire`: the portable
    /// search's check of one candidate row (a large table's query reads a position's primary
    /// row first and its alternate row only for the lanes the primary one missed).
    ///
    /// # Panics
    /// When `bucket` is out of range, or `active` selects a lane `>= lanes()`.
    #[inline(always)]
    pub(crate) fn row_hits(&self, bucket: usize, pattern: u64, active: u32) -> u32 {
        let row = self.row(bucket);
        let mut hits = 0u32;
        let mut m = active;
        while m != 0 {
            let l = m.trailing_zeros() as usize;
            m &= m - 1;
            hits |= u32::from(holds_broadcast(row[l].load(Ordering::Acquire), pattern)) << l;
        }
        hits
    }

    /// The raw row view the search kernels address rows through (see [`Rows`]).
    #[inline]
    pub(crate) fn rows(&self) -> Rows<'_> {
        Rows {
            base: self.ptr.as_ptr().cast_const().cast::<u64>(),
            lanes: self.lanes,
            // `min(bucket, last_bucket)` is the identity on valid buckets and keeps any other
            // value inside the table, for any bucket count (format v2 counts are any even
            // number, so a mask would not do).
            last_bucket: self.bucket_count - 1,
            // Rows of a table a query does not prefetch ahead (a lazy query's or a later group's
            // warm-up may still) go to the L1.
            level: self.row_prefetch.unwrap_or(PrefetchLevel::L1),
            _table: PhantomData,
        }
    }

    /// Copies one lane out as plain words (`bucket_count` long), for tests and convergence
    /// checks. Each word is loaded atomically; the copy as a whole is not a snapshot.
    pub fn lane_words(&self, lane: usize) -> Vec<u64> {
        (0..self.bucket_count).map(|b| self.load(b, lane)).collect()
    }
}

/// Every lane of two rows of `N` lanes (see [`TransposedTable::row_pair_hits`]); `N` known at
/// compile time so the loop is unrolled and the row lengths checked once.
#[inline(always)]
fn row_pair_hits_all<const N: usize>(ra: &[AtomicU64], rb: &[AtomicU64], pattern: u64) -> u32 {
    let (ra, rb): (&[AtomicU64; N], &[AtomicU64; N]) = (
        ra.try_into().expect("row of N lanes"),
        rb.try_into().expect("row of N lanes"),
    );
    let mut hits = 0u32;
    for l in 0..N {
        // Acquire, `ra` before `rb` per lane: see `row_pair_hits`.
        let a = ra[l].load(Ordering::Acquire);
        let b = rb[l].load(Ordering::Acquire);
        hits |= u32::from(holds_either(a, b, pattern)) << l;
    }
    hits
}

/// [`row_pair_hits_all`] for any lane count.
#[inline(always)]
fn row_pair_hits_dyn(ra: &[AtomicU64], rb: &[AtomicU64], pattern: u64) -> u32 {
    let mut hits = 0u32;
    for (l, (a, b)) in ra.iter().zip(rb).enumerate() {
        // Acquire, `ra` before `rb` per lane: see `row_pair_hits`.
        let a = a.load(Ordering::Acquire);
        let b = b.load(Ordering::Acquire);
        hits |= u32::from(holds_either(a, b, pattern)) << l;
    }
    hits
}

/// Raw row addressing for the search hot loops: the table's base pointer, the row stride and
/// the last bucket, so a row address costs a clamp (a conditional move), a multiply and an add,
/// with no bounds-check branch. Borrowed from one [`TransposedTable`]; every address it gives is inside that table.
///
/// The pointers are to `AtomicU64` words: read them only with atomic loads or with the
/// single-access vector loads `search/avx512.rs`, `search/avx2.rs` and `search/neon.rs`
/// document, never with plain loads.
#[derive(Clone, Copy)]
pub(crate) struct Rows<'t> {
    base: *const u64,
    lanes: usize,
    last_bucket: usize,
    level: PrefetchLevel,
    _table: PhantomData<&'t TransposedTable>,
}

impl Rows<'_> {
    /// Word offset of `bucket`'s row (`min(bucket, bucket_count - 1) * lanes`); always inside
    /// the table.
    #[inline(always)]
    pub(crate) fn offset(&self, bucket: usize) -> usize {
        bucket.min(self.last_bucket) * self.lanes
    }

    /// Address of the word at `offset` (a row offset from [`Rows::offset`] or computed the same
    /// way, `bucket * lanes` with `bucket < bucket_count`).
    #[inline(always)]
    pub(crate) fn at(&self, offset: usize) -> *const u64 {
        self.base.wrapping_add(offset)
    }

    /// Hints the CPU to fetch `bucket`'s row (the cache lines of its first and last word) into
    /// the table's [`PrefetchLevel`]. Never faults: the bucket is clamped into range.
    #[inline(always)]
    pub(crate) fn prefetch(&self, bucket: usize) {
        self.prefetch_offset(self.offset(bucket));
    }

    /// As [`Rows::prefetch`] for a row given by its word offset (`bucket * lanes`). A no-op on
    /// targets without a prefetch instruction.
    #[inline(always)]
    pub(crate) fn prefetch_offset(&self, offset: usize) {
        let first = self.at(offset);
        prefetch_to(first, self.level);
        prefetch_to(first.wrapping_add(self.lanes - 1), self.level);
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

pub mod groups;

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
        // Relaxed: single-threaded test, nothing to order against.
        assert_eq!(t.row(5)[2].load(Ordering::Relaxed), 42);
        assert_eq!(t.load(5, 1), 0);
    }

    #[test]
    fn rows_address_the_table_and_clamp_out_of_range_buckets() {
        // 22 buckets: not a power of two, so a mask would alias valid buckets.
        let t = TransposedTable::new(22, 3).unwrap();
        let rows = t.rows();
        for b in 0..22 {
            assert_eq!(rows.at(rows.offset(b)), t.row(b).as_ptr().cast::<u64>());
        }
        // Out of range: clamped to the last row, and the prefetch does not fault.
        assert_eq!(rows.offset(22 + 5), 21 * 3);
        assert_eq!(rows.offset(usize::MAX / 8), 21 * 3);
        rows.prefetch(1 << 40);
        rows.prefetch_offset(rows.offset(15));
    }

    /// Slot-by-slot model of "some slot holds `fp`".
    fn model_contains(word: u64, fp: u16) -> bool {
        slots(word).contains(&fp)
    }

    #[test]
    fn broadcast_test_is_exact_next_to_tricky_neighbours() {
        // Borrows of the has-zero test run from low slots to high ones: put near-matches
        // (fp +- 1, 0, 0x8000, 0xFFFF) on both sides of a match and of a miss.
        let fps = [1u16, 2, 0x7FFF, 0x8000, 0x8001, 0xFFFE, 0xFFFF];
        for &fp in &fps {
            let near = [
                0,
                1,
                fp.wrapping_sub(1),
                fp,
                fp.wrapping_add(1),
                0x8000,
                0xFFFF,
            ];
            for &a in &near {
                for &b in &near {
                    for &c in &near {
                        for &d in &near {
                            let w = with_slot(with_slot(with_slot(u64::from(a), 1, b), 2, c), 3, d);
                            let expect = model_contains(w, fp);
                            assert_eq!(holds_broadcast(w, broadcast(fp)), expect, "{w:#x} {fp:#x}");
                            assert_eq!(contains(w, fp), expect);
                            assert_eq!(find(w, fp).is_some(), expect);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn slot_hit_fold_gives_one_bit_per_word() {
        assert_eq!(FIRST_SLOT_BITS, 0x1111_1111_1111_1111);
        for word in 0..16 {
            for s in 0..SLOTS {
                let folded = fold_slot_hits(1 << (SLOTS * word + s));
                let gathered: Vec<usize> = (0..16)
                    .filter(|&w| folded & FIRST_SLOT_BITS & (1 << (SLOTS * w)) != 0)
                    .collect();
                assert_eq!(gathered, vec![word], "slot {s} of word {word}");
            }
        }
        assert_eq!(fold_slot_hits(0) & FIRST_SLOT_BITS, 0);
    }

    /// Slot-by-slot model of [`replaced_slots`]: the slots whose old fingerprint is not in the
    /// same slot of `new`, in order.
    fn model_replaced(old: u64, new: u64) -> Vec<usize> {
        (0..SLOTS)
            .filter(|&s| slot(old, s) != EMPTY_SLOT && slot(new, s) != slot(old, s))
            .collect()
    }

    /// The slots of a [`replaced_slots`] mask, lowest first, as the dirty tracker walks them.
    fn mask_slots(mut mask: u64) -> Vec<usize> {
        let mut out = Vec::new();
        while mask != 0 {
            out.push(mask_slot(mask));
            mask &= mask - 1;
        }
        out
    }

    #[test]
    fn replaced_slots_and_copies_are_exact_next_to_tricky_neighbours() {
        // Pairs of words built from values around a fingerprint, the empty marker and the slot
        // borders (a carry or borrow across slots would show up here).
        let fp = 0x8000u16;
        let near = [0u16, 1, 0x7FFF, fp, 0x8001, 0xFFFF];
        let words: Vec<u64> = (0..near.len().pow(4))
            .map(|mut i| {
                let mut w = 0u64;
                for s in 0..SLOTS {
                    w = with_slot(w, s, near[i % near.len()]);
                    i /= near.len();
                }
                w
            })
            .collect();
        for &old in &words {
            for &f in &near[1..] {
                let want = slots(old).iter().filter(|&&x| x == f).count() as u32;
                assert_eq!(copies(old, f), want, "{old:#x} {f:#x}");
            }
            for &new in words.iter().step_by(7) {
                assert_eq!(
                    mask_slots(replaced_slots(old, new)),
                    model_replaced(old, new),
                    "{old:#x} -> {new:#x}"
                );
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn replaced_slots_and_copies_match_the_slot_model(old: u64, new: u64, fp in 1u16.., keep in 0u8..16) {
            // `keep` copies some of `old`'s slots into `new`, so unchanged slots are common.
            let mut new = new;
            for s in (0..SLOTS).filter(|&s| keep & (1 << s) != 0) {
                new = with_slot(new, s, slot(old, s));
            }
            proptest::prop_assert_eq!(mask_slots(replaced_slots(old, new)), model_replaced(old, new));
            let planted = with_slot(old, usize::from(keep) % SLOTS, fp);
            proptest::prop_assert_eq!(
                copies(planted, fp),
                slots(planted).iter().filter(|&&x| x == fp).count() as u32
            );
        }

        #[test]
        fn word_ops_match_the_slot_model(word: u64, fp in 1u16.., pick in 0usize..5, s in 0usize..4) {
            // `pick < 4` plants `fp` in slot `pick` so hits are as common as misses.
            let w = if pick < SLOTS { with_slot(word, pick, fp) } else { word };
            let expect = model_contains(w, fp);
            proptest::prop_assert_eq!(holds_broadcast(w, broadcast(fp)), expect);
            proptest::prop_assert_eq!(contains(w, fp), expect);
            let other = word.rotate_left(17);
            proptest::prop_assert_eq!(
                holds_either(w, other, broadcast(fp)),
                expect || model_contains(other, fp)
            );
            proptest::prop_assert_eq!(
                holds_either(other, w, broadcast(fp)),
                expect || model_contains(other, fp)
            );
            proptest::prop_assert_eq!(find(w, fp), slots(w).iter().position(|&x| x == fp));
            proptest::prop_assert_eq!(find_empty(w), slots(w).iter().position(|&x| x == EMPTY_SLOT));
            proptest::prop_assert_eq!(occupied(w), slots(w).iter().filter(|&&x| x != 0).count() as u32);
            let written = with_slot(w, s, fp);
            for o in 0..SLOTS {
                proptest::prop_assert_eq!(slot(written, o), if o == s { fp } else { slot(w, o) });
            }
        }
    }
}
