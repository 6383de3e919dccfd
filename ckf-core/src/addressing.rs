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
//! lease is granted (design source, "Producer storage and relocation": "A full hash
//! deterministically produces one nonzero fingerprint and an unordered pair of candidate
//! buckets").
//!
//! # Format version 1
//! ```text
//! h           = fmix64(block_hash ^ seed)                  (MurmurHash3 64-bit finalizer, a bijection)
//! fingerprint = max(h >> 48, 1)                             (bits 48..63; 0 is the empty-slot marker)
//! bucket_a    = h & (bucket_count - 1)                      (bits 0..31 at most: disjoint from the fingerprint bits)
//! offset(fp)  = o if o != 0 else 1, o = fmix64(fp) & (bucket_count - 1)
//! bucket_b    = bucket_a ^ offset(fingerprint)
//! ```
//! * Fingerprint and bucket bits come from disjoint bit ranges of one well-mixed word, so they are
//!   independent (`../shared/cases/cuckoo-cases.md` case 1).
//! * `alternate(b, fp) = b ^ offset(fp)` is computable from (bucket, fingerprint) alone, stays in
//!   range because `bucket_count` is a power of two, is an involution, and never returns `b`
//!   because the offset is forced nonzero (cases 2, 3 and 7). The insert path and the kick path
//!   both call [`Addressing::alternate`], so they cannot disagree (case 3).
//! * A raw fingerprint of 0 is mapped to 1, so fingerprint 1 is about twice as likely as any other
//!   value; the effect on the false-positive rate is below 2^-16 relative (case 4).

use std::fmt;

use thiserror::Error;

use crate::bucket;

/// Version of the addressing rules and bucket layout described in this module.
pub const FORMAT_VERSION: u16 = 1;
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
/// Largest bucket count (2^32): bucket indices travel as `u32`, and 2^32 buckets is 32 GiB per
/// lane, far beyond any single pool.
pub const MAX_BUCKETS: u64 = 1 << 32;
/// Designed maximum slot load at the expected number of unique blocks.
///
/// Cuckoo filters with 4-slot buckets fill to about 95% before bounded-kick insertion starts to
/// fail (Fan et al., "Cuckoo Filter: Practically Better Than Bloom", CoNEXT 2014, table 2).
/// Sizing for 90% keeps a margin below that cliff so `max_kicks` stays cheap; power-of-two
/// rounding then puts the load at the expected count between 45% and 90%.
pub const TARGET_LOAD: f64 = 0.90;

/// Errors building a [`TableFormat`] or sizing a table.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FormatError {
    /// The bucket count is not a power of two (the alternate-bucket XOR needs one).
    #[error("bucket count {0} is not a power of two")]
    NotPowerOfTwo(u64),
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
/// bucket image is exchanged (issue "ckf-core", item 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TableFormat {
    /// Addressing and layout version; only [`FORMAT_VERSION`] is supported.
    pub version: u16,
    /// Seed XORed into the block hash before mixing.
    pub seed: u64,
    /// Number of buckets: a power of two in `MIN_BUCKETS..=MAX_BUCKETS`.
    pub bucket_count: u64,
    /// Fingerprint width in bits; always [`FINGERPRINT_BITS`].
    pub fingerprint_bits: u8,
    /// Slots per bucket; always [`SLOTS_PER_BUCKET`].
    pub slots_per_bucket: u8,
}

impl TableFormat {
    /// A version-1 format with `bucket_count` buckets and the given seed.
    ///
    /// # Errors
    /// [`FormatError::NotPowerOfTwo`] or [`FormatError::BucketCountOutOfRange`].
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

    /// A version-1 format sized by [`buckets_for_blocks`] for `expected_blocks` unique blocks.
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
        if !self.bucket_count.is_power_of_two() {
            return Err(FormatError::NotPowerOfTwo(self.bucket_count));
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
/// `next_power_of_two(ceil(expected_blocks / (4 * 0.90)))`, at least [`MIN_BUCKETS`].
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
    let buckets = (needed as u64).max(MIN_BUCKETS).next_power_of_two();
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
    mask: u64,
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
            mask: format.bucket_count - 1,
        })
    }

    /// Number of buckets.
    #[inline]
    pub fn bucket_count(&self) -> u64 {
        self.mask + 1
    }

    /// The fingerprint and candidate buckets of a 64-bit block hash.
    #[inline(always)]
    pub fn locate(&self, block_hash: u64) -> Location {
        let h = fmix64(block_hash ^ self.seed);
        let fingerprint = ((h >> FINGERPRINT_SHIFT) as u16).max(1);
        let bucket_a = (h & self.mask) as u32;
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

    /// The other candidate bucket of a fingerprint stored in `bucket`: an involution that never
    /// returns `bucket` and always stays below `bucket_count`.
    #[inline(always)]
    pub fn alternate(&self, bucket: u32, fingerprint: u16) -> u32 {
        let o = fmix64(u64::from(fingerprint)) & self.mask;
        let o = o | u64::from(o == 0);
        (u64::from(bucket) ^ o) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizing_targets_ninety_percent() {
        assert_eq!(buckets_for_blocks(0).unwrap(), 2);
        assert_eq!(buckets_for_blocks(1).unwrap(), 2);
        assert_eq!(buckets_for_blocks(3).unwrap(), 2);
        // 500_000 / 3.6 = 138_889 -> 262_144
        assert_eq!(buckets_for_blocks(500_000).unwrap(), 262_144);
        assert!(matches!(
            buckets_for_blocks(u64::MAX),
            Err(FormatError::TooManyBlocks(_))
        ));
        for n in [1u64, 10, 1000, 123_456, 1 << 20, 3_000_000] {
            let b = buckets_for_blocks(n).unwrap();
            assert!(b.is_power_of_two());
            assert!(n as f64 <= b as f64 * 4.0 * TARGET_LOAD + 1.0);
        }
    }

    #[test]
    fn format_rejects_bad_bucket_counts() {
        assert_eq!(TableFormat::new(3, 0), Err(FormatError::NotPowerOfTwo(3)));
        assert_eq!(
            TableFormat::new(1, 0),
            Err(FormatError::BucketCountOutOfRange(1))
        );
        assert_eq!(
            TableFormat::new(0, 0),
            Err(FormatError::BucketCountOutOfRange(0))
        );
        assert!(TableFormat::new(1 << 33, 0).is_err());
        let mut f = TableFormat::new(16, 0).unwrap();
        f.fingerprint_bits = 8;
        assert!(matches!(f.validate(), Err(FormatError::Unsupported(_))));
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
    /// Explicit bucket count (a power of two in `MIN_BUCKETS..=MAX_BUCKETS`); 0 = derive it.
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
    /// The version-1 format these inputs describe (rules in the type's doc).
    ///
    /// # Errors
    /// [`SizingError::BucketCount`] for an explicit count that is not a power of two in range;
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
        assert_eq!(sized(1_000_000, 0).unwrap().bucket_count, 1 << 19);
        assert_eq!(sized(0, 0), Err(SizingError::NoExpectedBlocks));
        assert_eq!(
            sized(0, 1000),
            Err(SizingError::BucketCount(FormatError::NotPowerOfTwo(1000)))
        );
        assert_eq!(
            sized(u64::MAX, 0),
            Err(SizingError::ExpectedBlocks(FormatError::TooManyBlocks(
                u64::MAX
            )))
        );
    }
}
