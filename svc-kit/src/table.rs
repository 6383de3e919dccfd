//! The `[table]` configuration both services read: how the table format is chosen (an explicit
//! bucket count, or one derived from the expected blocks per lane) and its seed; and two
//! producer-only keys, `max_kicks` and `reserve_blocks`, which the indexer refuses.
//!
//! The derivation rule is `ckf_core::addressing::TableSizing`; this module only gives it its
//! configuration keys (`table.expected_blocks`, `table.bucket_count`, `table.seed`) and turns
//! its typed errors into [`Invalid`] values naming the key. A producer and an indexer given the
//! same three values therefore always agree on the format.

use ckf_core::addressing::{SizingError, TableFormat, TableSizing};
use serde::{Deserialize, Serialize};

use crate::config::{Invalid, KeyAlias};

/// Default `table.expected_blocks`: one million unique blocks per lane (2^19 buckets, 4 MiB).
pub const DEFAULT_EXPECTED_BLOCKS: u64 = 1_000_000;

/// `table.expected_blocks_per_lane`, the indexer's old spelling of `table.expected_blocks`,
/// still accepted in its TOML file, environment and flags.
pub const EXPECTED_BLOCKS_PER_LANE_ALIAS: KeyAlias = KeyAlias {
    old: "table.expected_blocks_per_lane",
    key: "table.expected_blocks",
};

/// The `[table]` section. Producer and indexer must use equal `expected_blocks` (or
/// `bucket_count`) and `seed`; the indexer refuses an attachment whose format differs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TableConfig {
    /// Expected unique blocks per lane (blocks); sizes the table at 92% target load
    /// ([`ckf_core::addressing::buckets_for_blocks`]: the bucket count rounded up to even only).
    /// Ignored when `bucket_count` is nonzero.
    pub expected_blocks: u64,
    /// Explicit bucket count, even, in 2..=2^32 - 2; 0 = derive from `expected_blocks`.
    pub bucket_count: u64,
    /// Addressing seed (part of the table format).
    pub seed: u64,
    /// Producer only: relocation bound of one cuckoo insertion (kicks); reaching it is a
    /// capacity omission. Absent in the indexer's configuration (the indexer never inserts).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_kicks: Option<u32>,
    /// Producer only: tracked blocks the exact block map is sized for from the start (0 or
    /// absent: none, it grows as blocks arrive), at most the table's slots. See
    /// [`ckf_core::dc::DcCkfConfig::reserve_blocks`]. Absent in the indexer's configuration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserve_blocks: Option<u64>,
}

impl Default for TableConfig {
    /// 1,000,000 expected blocks, derived bucket count, seed 0, no kick bound (the producer's
    /// default sets [`ckf_core::dc::DEFAULT_MAX_KICKS`]).
    fn default() -> Self {
        Self {
            expected_blocks: DEFAULT_EXPECTED_BLOCKS,
            bucket_count: 0,
            seed: 0,
            max_kicks: None,
            reserve_blocks: None,
        }
    }
}

impl TableConfig {
    /// The sizing inputs of this section.
    pub fn sizing(&self) -> TableSizing {
        TableSizing {
            expected_blocks: self.expected_blocks,
            bucket_count: self.bucket_count,
            seed: self.seed,
        }
    }

    /// The table format (`TableSizing::format`).
    ///
    /// # Errors
    /// [`Invalid`] naming `table.bucket_count` (odd or out of range) or
    /// `table.expected_blocks` (0 with no bucket count, or more than 2^32 - 2 buckets needed).
    pub fn format(&self) -> Result<TableFormat, Invalid> {
        self.sizing().format().map_err(|error| match error {
            SizingError::BucketCount(e) => {
                Invalid::new("table.bucket_count", self.bucket_count, e.to_string())
            }
            SizingError::NoExpectedBlocks => Invalid::new(
                "table.expected_blocks",
                self.expected_blocks,
                "must be at least 1 (or set table.bucket_count)",
            ),
            SizingError::ExpectedBlocks(e) => {
                Invalid::new("table.expected_blocks", self.expected_blocks, e.to_string())
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_key_at_fault() {
        let table = |expected_blocks, bucket_count| TableConfig {
            expected_blocks,
            bucket_count,
            ..TableConfig::default()
        };
        let text = table(0, 0).format().unwrap_err().to_string();
        assert_eq!(
            text,
            "table.expected_blocks = 0: must be at least 1 (or set table.bucket_count)"
        );
        let text = table(0, 1001).format().unwrap_err().to_string();
        assert!(text.starts_with("table.bucket_count = 1001: "), "{text}");
        assert!(text.contains("odd (it must be even)"), "{text}");
        assert_eq!(table(0, 1000).format().unwrap().bucket_count, 1000);
        let text = table(u64::MAX, 0).format().unwrap_err().to_string();
        assert!(
            text.starts_with("table.expected_blocks = 18446744073709551615: "),
            "{text}"
        );
        assert_eq!(table(0, 1024).format().unwrap().bucket_count, 1024);
    }

    #[test]
    fn default_is_the_core_derivation_of_a_million_blocks() {
        assert_eq!(
            TableConfig::default().format().unwrap(),
            TableFormat::for_expected_blocks(1_000_000, 0).unwrap()
        );
    }
}
