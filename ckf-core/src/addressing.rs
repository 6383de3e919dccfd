//! Addressing: 64-bit block hash -> (nonzero 16-bit fingerprint, unordered pair of distinct
//! candidate buckets).
//!
//! Owns: the format-v1 derivation below ([`Addressing::locate`], [`Addressing::alternate`]),
//! [`fmix64`] and its named constants (which `search/avx512.rs` and `search/avx2.rs` reuse for
//! their vector forms),
//! [`TableFormat`] and its validation, and table sizing. The slot layout itself (16-bit slots,
//! 4 per bucket) is [`crate::bucket`]'s; the format's `fingerprint_bits` and `slots_per_bucket`
//! are derived from it.
//!
//! This module *is* part of the table format: a producer and a consumer can only share bucket
//! images if they derive the same fingerprint and buckets from the same block hash. Everything
//! that influences the result is carried in [`TableFormat`], which both sides compare before a
//! lease is granted (docs/design.md, "Producer storage and relocation": "A full hash
//! deterministically produces one nonzero fingerprint and an unordered pair of candidate
//! buckets").
//!
//! # Format version 2
//! ```text
//! n           = bucket_count                                (even, 2..=2^32 - 2)
//! h           = fmix64(block_hash ^ seed)                   (MurmurHash3 64-bit finalizer, a bijection)
//! fingerprint = max(h >> 48, 1)                              (bits 48..63; 0 is the empty-slot marker)
//! range(x)    = ((x & 0xFFFF_FFFF) * n) >> 32                (Lemire's fast range: a 32-bit value onto 0..n)
//! bucket_a    = range(h)                                     (bits 0..31: disjoint from the fingerprint bits)
//! offset(fp)  = range(fmix64(fp)) | 1                        (odd, and < n because n is even)
//! bucket_b    = alternate(bucket_a, fp)
//! alternate(b, fp) = (offset(fp) - b) mod n
//! ```
//! * Fingerprint and bucket bits come from disjoint bit ranges of one well-mixed word, so they are
//!   independent (`docs/design.md`, "Cuckoo filter cases", case 1).
//! * `alternate(b, fp) = (offset(fp) - b) mod n` is computable from (bucket, fingerprint) alone
//!   and stays in range for *any* `n`, so a table can have exactly the bucket count its expected
//!   size needs instead of the next power of two (a power of two would waste up to half the table's
//!   memory). It is an involution:
//!   `offset - (offset - b) = b (mod n)`. It never returns `b`: that would need
//!   `2b = offset (mod n)`, and with `n` even the left side is even modulo `n` while the offset
//!   is odd. This is why the bucket count must be even and the offset is forced odd: with an odd
//!   `n` every fingerprint would have one self-alternate bucket (cases 2, 3 and 7). The insert
//!   path and the kick path both call [`Addressing::alternate`], so they cannot disagree
//!   (case 3).
//! * The largest bucket count is `2^32 - 2`, the largest even count below `2^32`: `n` then fits
//!   32 bits, so the vector kernels compute `range` with one 32x32->64-bit multiply.
//! * A raw fingerprint of 0 is mapped to 1, so fingerprint 1 is about twice as likely as any other
//!   value; the effect on the false-positive rate is below 2^-16 relative (case 4).
//!
//! Version 1 (before 2026-12) used `bucket_a = h & (n - 1)` and `bucket_b = bucket_a ^ offset`,
//! which needs a power-of-two `n`; up to 2x the memory the format needs. A v1 peer or a v1
//! journal is refused as another format, never mixed with v2 tables.

use std::fmt;

use thiserror::Error;

use crate::bucket;

/// Version of the addressing rules and bucket layout described in this module (see "Format
/// version 2" above; version 1 was the power-of-two XOR rule).
pub const FORMAT_VERSION: u16 = 2;
/// Fingerprint width in bits: one slot of the packed bucket ([`bucket::SLOT_BITS`]).
pub const FINGERPRINT_BITS: u8 = bucket::SLOT_BITS as u8;
/// Slots (fingerprints) per bucket: the packed bucket's [`bucket::SLOTS`].
pub const SLOTS_PER_BUCKET: u8 = bucket::SLOTS as u8;
/// The fingerprint is the top [`FINGERPRINT_BITS`] of the mixed hash: `h >> FINGERPRINT_SHIFT`.
pub(crate) const FINGERPRINT_SHIFT: u32 = 64 - bucket::SLOT_BITS;
/// `fmix64`'s first multiplier (MurmurHash3). Shared with the vector kernels in
/// `search/avx512.rs` and `search/avx2.rs`.
pub(crate) const FMIX_C1: u64 = 0xff51_afd7_ed55_8ccd;
/// `fmix64`'s second multiplier (MurmurHash3).
pub(crate) const FMIX_C2: u64 = 0xc4ce_b9fe_1a85_ec53;
/// `fmix64`'s xor-shift distance, applied before, between and after the two multiplies.
pub(crate) const FMIX_SHIFT: u32 = 33;
/// Smallest bucket count: two buckets are needed for two distinct candidates.
pub const MIN_BUCKETS: u64 = 2;
/// Largest bucket count, `2^32 - 2`: the largest even count whose value fits 32 bits (bucket
/// indices travel as `u32` and the vector kernels multiply by the count in 32 bits). That is
/// 32 GiB per lane, far beyond any single pool.
pub const MAX_BUCKETS: u64 = (1 << 32) - 2;
/// Designed slot load at the expected number of unique blocks.
///
/// Cuckoo filters with 4-slot buckets fill to about 95% before bounded-kick insertion starts to
/// fail (Fan et al., "Cuckoo Filter: Practically Better Than Bloom", CoNEXT 2014, table 2).
/// Sizing for 92% keeps a margin below that cliff, so a pool that outgrows its estimate by a
/// few percent still stores every block, while the table costs `64 / (4 * 0.92)` = 17.4 bits
/// per tracked block per lane (the budget is <= 17.5). Format v2 takes any even
/// bucket count, so the load at the expected count is within two buckets of this target for
/// every expected size (v1's power-of-two rounding put it anywhere between 45% and 90%).
pub const TARGET_LOAD: f64 = 0.92;

/// Errors building a [`TableFormat`] or sizing a table.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FormatError {
    /// The bucket count is odd (the alternate-bucket rule needs an even count to never map a
    /// bucket onto itself; see the module docs).
    #[error("bucket count {0} is odd (it must be even)")]
    Odd(u64),
    /// The bucket count is below [`MIN_BUCKETS`] or above [`MAX_BUCKETS`].
    #[error("bucket count {0} is outside {MIN_BUCKETS}..={MAX_BUCKETS}")]
    BucketCountOutOfRange(u64),
    /// The expected number of blocks needs more than [`MAX_BUCKETS`] buckets.
    #[error("{0} expected blocks need more than {MAX_BUCKETS} buckets")]
    TooManyBlocks(u64),
    /// A format field other than the bucket count and seed differs from what this build supports.
    #[error("unsupported table format: {0}")]
    Unsupported(String),
}

/// The identity of a table layout. Producer and consumer must agree on every field before any
/// bucket image is exchanged (`docs/design.md`, "Table format").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TableFormat {
    /// Addressing and layout version; only [`FORMAT_VERSION`] is supported.
    pub version: u16,
    /// Seed XORed into the block hash before mixing.
    pub seed: u64,
    /// Number of buckets: even, in `MIN_BUCKETS..=MAX_BUCKETS`.
    pub bucket_count: u64,
    /// Fingerprint width in bits; always [`FINGERPRINT_BITS`].
    pub fingerprint_bits: u8,
    /// Slots per bucket; always [`SLOTS_PER_BUCKET`].
    pub slots_per_bucket: u8,
}

impl TableFormat {
    /// A [`FORMAT_VERSION`] format with `bucket_count` buckets and the given seed.
    ///
    /// # Errors
    /// [`FormatError::Odd`] or [`FormatError::BucketCountOutOfRange`].
    pub fn new(bucket_count: u64, seed: u64) -> Result<Self, FormatError> {
        let format = Self {
            version: FORMAT_VERSION,
            seed,
            bucket_count,
            fingerprint_bits: FINGERPRINT_BITS,
            slots_per_bucket: SLOTS_PER_BUCKET,
        };
        format.validate()?;
        Ok(format)
    }

    /// A [`FORMAT_VERSION`] format sized by [`buckets_for_blocks`] for `expected_blocks` unique blocks.
    ///
    /// # Errors
    /// [`FormatError::TooManyBlocks`] when more than [`MAX_BUCKETS`] buckets would be needed.
    pub fn for_expected_blocks(expected_blocks: u64, seed: u64) -> Result<Self, FormatError> {
        Self::new(buckets_for_blocks(expected_blocks)?, seed)
    }

    /// Checks every field (used on formats received from a peer or a config file).
    ///
    /// # Errors
    /// [`FormatError::Unsupported`] for a version, fingerprint width or slot count other than
    /// this build's; the bucket-count errors of [`TableFormat::new`].
    pub fn validate(&self) -> Result<(), FormatError> {
        if self.version != FORMAT_VERSION {
            return Err(FormatError::Unsupported(format!(
                "version {} (this build supports {FORMAT_VERSION})",
                self.version
            )));
        }
        if self.fingerprint_bits != FINGERPRINT_BITS {
            return Err(FormatError::Unsupported(format!(
                "{}-bit fingerprints (this build supports {FINGERPRINT_BITS})",
                self.fingerprint_bits
            )));
        }
        if self.slots_per_bucket != SLOTS_PER_BUCKET {
            return Err(FormatError::Unsupported(format!(
                "{} slots per bucket (this build supports {SLOTS_PER_BUCKET})",
                self.slots_per_bucket
            )));
        }
        if !(MIN_BUCKETS..=MAX_BUCKETS).contains(&self.bucket_count) {
            return Err(FormatError::BucketCountOutOfRange(self.bucket_count));
        }
        if !self.bucket_count.is_multiple_of(2) {
            return Err(FormatError::Odd(self.bucket_count));
        }
        Ok(())
    }

    /// Total slots (`bucket_count * 4`).
    pub fn slot_count(&self) -> u64 {
        self.bucket_count * u64::from(self.slots_per_bucket)
    }

    /// Bytes of one lane's table (`bucket_count * 8`).
    pub fn table_bytes(&self) -> u64 {
        self.bucket_count * 8
    }
}

impl fmt::Display for TableFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "v{} seed={:#x} buckets={} fp_bits={} slots={}",
            self.version,
            self.seed,
            self.bucket_count,
            self.fingerprint_bits,
            self.slots_per_bucket
        )
    }
}

/// Bucket count for `expected_blocks` unique blocks at [`TARGET_LOAD`]:
/// `ceil(expected_blocks / (4 * 0.92))` rounded up to even, at least [`MIN_BUCKETS`].
///
/// The table then costs at most `64 * (expected / 3.68 + 2) / expected` bits per expected block
/// per lane: 17.4 + 128 / expected (17.5 from about 1,300 expected blocks up).
///
/// `0` is clamped to [`MIN_BUCKETS`] (a documented clamp, case 11).
///
/// # Errors
/// [`FormatError::TooManyBlocks`] when the result would exceed [`MAX_BUCKETS`] (for example
/// `u64::MAX`); no arithmetic overflows.
pub fn buckets_for_blocks(expected_blocks: u64) -> Result<u64, FormatError> {
    let per_bucket = f64::from(SLOTS_PER_BUCKET) * TARGET_LOAD;
    let needed = (expected_blocks as f64 / per_bucket).ceil();
    if needed > MAX_BUCKETS as f64 {
        return Err(FormatError::TooManyBlocks(expected_blocks));
    }
    let buckets = (needed as u64).max(MIN_BUCKETS).next_multiple_of(2);
    if buckets > MAX_BUCKETS {
        return Err(FormatError::TooManyBlocks(expected_blocks));
    }
    Ok(buckets)
}

/// A block's fingerprint and its two candidate buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    /// Nonzero 16-bit fingerprint.
    pub fingerprint: u16,
    /// Primary candidate bucket (from the hash bits).
    pub bucket_a: u32,
    /// Alternate candidate bucket, `alternate(bucket_a, fingerprint)`; never equal to `bucket_a`.
    pub bucket_b: u32,
}

/// Derives [`Location`]s for one [`TableFormat`]. Cheap to copy; no allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addressing {
    seed: u64,
    buckets: u64,
}

/// Lemire's fast range: the low 32 bits of `x` scaled onto `0..n` (`n <= 2^32`), by one
/// multiply instead of a division ("A fast alternative to the modulo reduction", 2016). The
/// vector kernels compute the same with a 32x32->64-bit multiply.
#[inline(always)]
pub(crate) fn fast_range(x: u64, n: u64) -> u64 {
    ((x & 0xFFFF_FFFF) * n) >> 32
}

/// MurmurHash3's 64-bit finalizer: a bijection on `u64` with full avalanche. Its constants are
/// named once in this module (`FMIX_C1`, `FMIX_C2`, `FMIX_SHIFT`); `search/avx512.rs` computes
/// the same function on eight words at a time from them.
#[inline(always)]
pub fn fmix64(mut k: u64) -> u64 {
    k ^= k >> FMIX_SHIFT;
    k = k.wrapping_mul(FMIX_C1);
    k ^= k >> FMIX_SHIFT;
    k = k.wrapping_mul(FMIX_C2);
    k ^= k >> FMIX_SHIFT;
    k
}

impl Addressing {
    /// Addressing for a validated format.
    ///
    /// # Errors
    /// Any [`TableFormat::validate`] error.
    pub fn new(format: &TableFormat) -> Result<Self, FormatError> {
        format.validate()?;
        Ok(Self {
            seed: format.seed,
            buckets: format.bucket_count,
        })
    }

    /// Number of buckets.
    #[inline]
    pub fn bucket_count(&self) -> u64 {
        self.buckets
    }

    /// The fingerprint and candidate buckets of a 64-bit block hash.
    #[inline(always)]
    pub fn locate(&self, block_hash: u64) -> Location {
        self.locate_mixed(self.mix(block_hash))
    }

    /// The mixed hash every [`Location`] field derives from: `fmix64(block_hash ^ seed)`.
    /// Exposed so a caller that needs more bits of the same block (the producer's block map)
    /// mixes once; [`locate_mixed`](Self::locate_mixed) of it is `locate(block_hash)`.
    #[inline(always)]
    pub fn mix(&self, block_hash: u64) -> u64 {
        fmix64(block_hash ^ self.seed)
    }

    /// [`locate`](Self::locate) from the mixed hash `h = mix(block_hash)`: the fingerprint is
    /// its top [`FINGERPRINT_BITS`] (bits 48-63), `bucket_a` the fast range of its low 32 bits;
    /// bits 32-47 are unused.
    #[inline(always)]
    pub fn locate_mixed(&self, h: u64) -> Location {
        let fingerprint = ((h >> FINGERPRINT_SHIFT) as u16).max(1);
        let bucket_a = fast_range(h, self.buckets) as u32;
        Location {
            fingerprint,
            bucket_a,
            bucket_b: self.alternate(bucket_a, fingerprint),
        }
    }

    /// The fingerprint `locate` would produce before the zero remap, exposed so tests can find
    /// block hashes whose raw fingerprint is the empty marker (case 4).
    #[inline]
    pub fn raw_fingerprint(&self, block_hash: u64) -> u16 {
        (fmix64(block_hash ^ self.seed) >> FINGERPRINT_SHIFT) as u16
    }

    /// The other candidate bucket of a fingerprint stored in `bucket`:
    /// `(offset(fingerprint) - bucket) mod bucket_count`, an involution that never returns
    /// `bucket` and always stays below `bucket_count` (module docs, "Format version 2").
    /// `bucket` must be below `bucket_count` (every bucket the table holds is).
    #[inline(always)]
    pub fn alternate(&self, bucket: u32, fingerprint: u16) -> u32 {
        let o = self.offset(fingerprint);
        let b = u64::from(bucket);
        // Branch-free `(o - b) mod n` for `o, b < n`: add `n` back when the difference wrapped.
        let (d, wrapped) = o.overflowing_sub(b);
        d.wrapping_add(self.buckets & 0u64.wrapping_sub(u64::from(wrapped))) as u32
    }

    /// `offset(fp) = range(fmix64(fp)) | 1`: odd and below the (even) bucket count.
    #[inline(always)]
    fn offset(&self, fingerprint: u16) -> u64 {
        fast_range(fmix64(u64::from(fingerprint)), self.buckets) | 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizing_targets_the_load_with_even_counts() {
        assert_eq!(buckets_for_blocks(0).unwrap(), 2);
        assert_eq!(buckets_for_blocks(1).unwrap(), 2);
        assert_eq!(buckets_for_blocks(3).unwrap(), 2);
        // 500_000 / 3.68 = 135_869.6 -> 135_870 (already even)
        assert_eq!(buckets_for_blocks(500_000).unwrap(), 135_870);
        // 2_013_265 / 3.68 = 547_082.9 -> 547_083 -> 547_084 (v1 gave 1_048_576: 48% load)
        assert_eq!(buckets_for_blocks(2_013_265).unwrap(), 547_084);
        assert!(matches!(
            buckets_for_blocks(u64::MAX),
            Err(FormatError::TooManyBlocks(_))
        ));
        // The largest count that is still accepted, and the first expected size past it.
        let most = (MAX_BUCKETS as f64 * 4.0 * TARGET_LOAD) as u64 - 1_000;
        assert!(buckets_for_blocks(most).unwrap() <= MAX_BUCKETS);
        assert!(buckets_for_blocks(most + 10_000).is_err());
    }

    /// The sizing budget: <= 17.5 bits per expected block per lane for every expected size from
    /// ~1,300 blocks up (two spare buckets cost 128 bits, which small tables cannot amortise),
    /// and never below the target load's slot count (the sizing never undersizes).
    #[test]
    fn bits_per_block_stay_under_17_5_for_any_size() {
        let mut n = 1_300u64;
        let mut checked = 0;
        while n < 8_000_000_000 {
            for expected in [n, n + 1, n + 7, n * 3 / 2 + 11] {
                let buckets = buckets_for_blocks(expected).unwrap();
                assert!(buckets.is_multiple_of(2), "{expected}: {buckets}");
                let bits = buckets as f64 * 64.0 / expected as f64;
                assert!(
                    bits <= 17.5,
                    "{expected} blocks: {buckets} buckets, {bits:.3} bits"
                );
                let load = expected as f64 / (buckets as f64 * 4.0);
                assert!(load <= TARGET_LOAD + 1e-9, "{expected}: load {load}");
                checked += 1;
            }
            n = n * 9 / 7 + 13;
        }
        assert!(checked > 100);
    }

    #[test]
    fn format_rejects_bad_bucket_counts() {
        assert_eq!(TableFormat::new(3, 0), Err(FormatError::Odd(3)));
        assert_eq!(TableFormat::new(1001, 0), Err(FormatError::Odd(1001)));
        assert!(TableFormat::new(1000, 0).is_ok());
        assert!(TableFormat::new(6, 0).is_ok());
        assert!(TableFormat::new(MAX_BUCKETS, 0).is_ok());
        assert_eq!(
            TableFormat::new(1, 0),
            Err(FormatError::BucketCountOutOfRange(1))
        );
        assert_eq!(
            TableFormat::new(0, 0),
            Err(FormatError::BucketCountOutOfRange(0))
        );
        assert_eq!(
            TableFormat::new(1 << 32, 0),
            Err(FormatError::BucketCountOutOfRange(1 << 32))
        );
        assert!(TableFormat::new(1 << 33, 0).is_err());
        let mut f = TableFormat::new(16, 0).unwrap();
        f.fingerprint_bits = 8;
        assert!(matches!(f.validate(), Err(FormatError::Unsupported(_))));
        let mut f = TableFormat::new(16, 0).unwrap();
        f.version = 1;
        assert!(
            matches!(f.validate(), Err(FormatError::Unsupported(ref m)) if m.contains("version 1")),
            "{:?}",
            f.validate()
        );
    }

    /// Cases 2 and 7 for every fingerprint on small tables of every even size, powers of two or
    /// not: the alternate is in range, differs from the bucket, and is an involution.
    #[test]
    fn alternate_is_an_in_range_involution_without_fixed_points() {
        for n in (2..=40).step_by(2).chain([64, 96, 1000, 65_534]) {
            let addressing = Addressing::new(&TableFormat::new(n, 9).unwrap()).unwrap();
            for fp in 1..=u16::MAX {
                // Every bucket of the small tables; a sample of the larger ones.
                let step = if n <= 40 { 1 } else { (n / 7) as usize | 1 };
                for b in (0..n as u32).step_by(step) {
                    let alt = addressing.alternate(b, fp);
                    assert!(u64::from(alt) < n, "n={n} fp={fp} b={b}: {alt}");
                    assert_ne!(alt, b, "n={n} fp={fp}: self-alternate");
                    assert_eq!(addressing.alternate(alt, fp), b, "n={n} fp={fp} b={b}");
                }
            }
        }
    }

    /// `locate` keeps both buckets in range on the extreme sizes, and `bucket_b` is the
    /// alternate of `bucket_a` (the rule the kick path uses).
    #[test]
    fn locate_is_in_range_at_the_extremes() {
        for n in [2, 4, 6, 1_000_002, MAX_BUCKETS] {
            let addressing = Addressing::new(&TableFormat::new(n, 0x5eed).unwrap()).unwrap();
            let mut seen_high = false;
            for i in 0..200_000u64 {
                let h = fmix64(i) ^ i.rotate_left(17);
                let loc = addressing.locate(h);
                assert!(u64::from(loc.bucket_a) < n && u64::from(loc.bucket_b) < n);
                assert_ne!(loc.bucket_a, loc.bucket_b);
                assert_ne!(loc.fingerprint, 0);
                assert_eq!(
                    addressing.alternate(loc.bucket_a, loc.fingerprint),
                    loc.bucket_b
                );
                seen_high |= u64::from(loc.bucket_a) >= n - n.div_ceil(8);
            }
            // The fast range reaches the top of the table, not only a power-of-two prefix.
            assert!(seen_high, "n={n}: no bucket in the top eighth");
        }
    }

    /// Buckets stay uniform on a table whose size is not a power of two: each of 10 equal
    /// ranges of a 3,000,000-bucket table gets 10% +- 0.3% of 10^6 located blocks, for both
    /// candidates.
    #[test]
    fn buckets_are_uniform_on_any_size() {
        let n = 3_000_000u64;
        let addressing = Addressing::new(&TableFormat::new(n, 1).unwrap()).unwrap();
        let mut counts = [[0u32; 10]; 2];
        for i in 0..1_000_000u64 {
            let loc = addressing.locate(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            counts[0][(u64::from(loc.bucket_a) * 10 / n) as usize] += 1;
            counts[1][(u64::from(loc.bucket_b) * 10 / n) as usize] += 1;
        }
        for (which, row) in counts.iter().enumerate() {
            for &c in row {
                assert!(
                    (97_000..=103_000).contains(&c),
                    "candidate {which}: {row:?}"
                );
            }
        }
    }
}

/// How a deployment chooses its table format: an explicit bucket count, or a count derived from
/// the expected number of unique blocks per lane at [`TARGET_LOAD`], plus the seed.
///
/// This is the one derivation both services use (their `[table]` configuration is this type's
/// three fields), so a producer and an indexer given the same numbers always agree on the
/// format:
///
/// * `bucket_count != 0`: exactly that many buckets ([`TableFormat::new`]); `expected_blocks`
///   is ignored;
/// * `bucket_count == 0`: [`buckets_for_blocks`]`(expected_blocks)`, where `expected_blocks`
///   must be at least 1 (0 would silently give a 2-bucket table, so it is refused here even
///   though [`buckets_for_blocks`] clamps it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TableSizing {
    /// Expected unique blocks per lane (blocks); used only when `bucket_count` is 0.
    pub expected_blocks: u64,
    /// Explicit bucket count (even, in `MIN_BUCKETS..=MAX_BUCKETS`); 0 = derive it.
    pub bucket_count: u64,
    /// Addressing seed (part of the format).
    pub seed: u64,
}

/// Why a [`TableSizing`] gives no format. Each variant names which input is at fault, so a
/// caller can report the right configuration key.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SizingError {
    /// `bucket_count` is 0 and so is `expected_blocks`: nothing to size the table from.
    #[error("must be at least 1 (or set an explicit bucket count)")]
    NoExpectedBlocks,
    /// The explicit `bucket_count` is not a valid bucket count.
    #[error("{0}")]
    BucketCount(FormatError),
    /// `expected_blocks` needs more than [`MAX_BUCKETS`] buckets.
    #[error("{0}")]
    ExpectedBlocks(FormatError),
}

impl TableSizing {
    /// The [`FORMAT_VERSION`] format these inputs describe (rules in the type's doc).
    ///
    /// # Errors
    /// [`SizingError::BucketCount`] for an explicit count that is odd or out of range;
    /// [`SizingError::NoExpectedBlocks`] or [`SizingError::ExpectedBlocks`] when deriving.
    pub fn format(&self) -> Result<TableFormat, SizingError> {
        if self.bucket_count != 0 {
            return TableFormat::new(self.bucket_count, self.seed)
                .map_err(SizingError::BucketCount);
        }
        if self.expected_blocks == 0 {
            return Err(SizingError::NoExpectedBlocks);
        }
        TableFormat::for_expected_blocks(self.expected_blocks, self.seed)
            .map_err(SizingError::ExpectedBlocks)
    }
}

#[cfg(test)]
mod sizing_tests {
    use super::*;

    #[test]
    fn explicit_count_wins_and_derivation_uses_the_target_load() {
        let sized = |expected_blocks, bucket_count| {
            TableSizing {
                expected_blocks,
                bucket_count,
                seed: 7,
            }
            .format()
        };
        let explicit = TableFormat::new(1024, 7).unwrap();
        assert_eq!(sized(0, 1024), Ok(explicit));
        assert_eq!(sized(u64::MAX, 1024), Ok(explicit));
        assert_eq!(
            sized(1_000_000, 0).unwrap(),
            TableFormat::new(buckets_for_blocks(1_000_000).unwrap(), 7).unwrap()
        );
        // 1_000_000 / 3.68 = 271_739.1 -> 271_740
        assert_eq!(sized(1_000_000, 0).unwrap().bucket_count, 271_740);
        assert_eq!(sized(0, 0), Err(SizingError::NoExpectedBlocks));
        assert_eq!(sized(0, 1000).unwrap().bucket_count, 1000);
        assert_eq!(
            sized(0, 1001),
            Err(SizingError::BucketCount(FormatError::Odd(1001)))
        );
        assert_eq!(
            sized(u64::MAX, 0),
            Err(SizingError::ExpectedBlocks(FormatError::TooManyBlocks(
                u64::MAX
            )))
        );
    }
}
