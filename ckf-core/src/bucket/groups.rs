//! [`LaneGroups`]: the consumer's table of up to [`MAX_LANES`] lanes, kept as one
//! [`TransposedTable`] per group of [`GROUP_LANES`] lanes.
//!
//! Lane `l` is column `l % 16` of group `l / 16`; every group has the consumer's bucket count and
//! is as wide as its lanes (the last group holds the remainder), so memory per lane is the same
//! as in a single table: `bucket_count * lanes * 8` bytes in all. A query searches each group
//! holding a ready lane with the same kernels as a 16-lane table (`crate::search`), and since it
//! reads every group, whether and where the groups' rows are prefetched is decided on the
//! whole table's bytes.
//!
//! Why groups rather than one row of up to 64 words: the search kernels, their read order and
//! their measured prefetch schedule stay those of a 16-lane row, a domain of at most 16 lanes
//! is exactly one group (today's table and figures), and the cost of more lanes is measured in
//! `cargo bench -p ckf-core --bench search -- lanes` (docs/performance.md, "More than 16
//! lanes").

use super::{GROUP_LANES, MAX_LANES, TableError, TransposedTable};

/// The consumer's lanes (1..=[`MAX_LANES`]), in groups of [`GROUP_LANES`] sharing one
/// [`TransposedTable`] each. Every word is an independent atomic, as in a single table.
#[derive(Debug)]
pub struct LaneGroups {
    groups: Vec<TransposedTable>,
    lanes: usize,
}

impl LaneGroups {
    /// All-empty groups for `lanes` lanes (1..=64) of `bucket_count` buckets each.
    ///
    /// # Errors
    /// [`TableError::ConsumerLanes`] or [`TableError::Allocation`].
    pub fn new(bucket_count: u64, lanes: usize) -> Result<Self, TableError> {
        if !(1..=MAX_LANES).contains(&lanes) {
            return Err(TableError::ConsumerLanes(lanes));
        }
        let mut groups = (0..lanes.div_ceil(GROUP_LANES))
            .map(|g| TransposedTable::new(bucket_count, (lanes - g * GROUP_LANES).min(GROUP_LANES)))
            .collect::<Result<Vec<_>, _>>()
            // One group's failure is the whole table's: named with every lane.
            .map_err(|_| TableError::Allocation {
                buckets: bucket_count,
                lanes,
            })?;
        // A query reads every group: the rows prefetch as the whole table's.
        let bytes = groups.iter().map(TransposedTable::bytes).sum();
        for group in &mut groups {
            group.prefetch_as_part_of(bytes);
        }
        Ok(Self { groups, lanes })
    }

    /// The groups, group `g` holding lanes `16 g ..`.
    #[inline]
    pub fn groups(&self) -> &[TransposedTable] {
        &self.groups
    }

    /// The group of `lane` and its column there.
    ///
    /// # Panics
    /// When `lane >= lanes()`.
    #[inline]
    pub fn group_of(&self, lane: usize) -> (&TransposedTable, usize) {
        assert!(lane < self.lanes, "lane {lane} out of range");
        (&self.groups[lane / GROUP_LANES], lane % GROUP_LANES)
    }

    /// Lane count (1..=64).
    #[inline]
    pub fn lanes(&self) -> usize {
        self.lanes
    }

    /// Buckets per lane.
    #[inline]
    pub fn bucket_count(&self) -> usize {
        self.groups[0].bucket_count()
    }

    /// Whether a query prefetches the rows ahead (the same for every group: decided on the
    /// whole table).
    #[inline]
    pub(crate) fn prefetches_rows(&self) -> bool {
        self.groups[0].prefetches_rows()
    }

    /// Bytes held by the bucket words of every group (`bucket_count * lanes * 8`).
    pub fn bytes(&self) -> usize {
        self.groups.iter().map(TransposedTable::bytes).sum()
    }

    /// [`TransposedTable::load`] of (`bucket`, `lane`).
    ///
    /// # Panics
    /// When `bucket` or `lane` is out of range.
    #[inline]
    pub fn load(&self, bucket: usize, lane: usize) -> u64 {
        let (table, column) = self.group_of(lane);
        table.load(bucket, column)
    }

    /// [`TransposedTable::store`] of (`bucket`, `lane`): one `Release` store.
    ///
    /// # Panics
    /// When `bucket` or `lane` is out of range.
    #[inline]
    pub fn store(&self, bucket: usize, lane: usize, image: u64) {
        let (table, column) = self.group_of(lane);
        table.store(bucket, column, image);
    }

    /// Every bucket image of `lane`, in bucket order (tests, convergence checks).
    pub fn lane_words(&self, lane: usize) -> Vec<u64> {
        let (table, column) = self.group_of(lane);
        table.lane_words(column)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::PrefetchLevel;

    #[test]
    fn lanes_map_to_groups_and_columns_with_the_memory_of_one_table() {
        let g = LaneGroups::new(8, 37).unwrap();
        let widths: Vec<usize> = g.groups().iter().map(TransposedTable::lanes).collect();
        assert_eq!(widths, [16, 16, 5]);
        assert_eq!(g.bytes(), 8 * 37 * 8);
        for lane in 0..37 {
            g.store(3, lane, 1000 + lane as u64);
        }
        for lane in 0..37 {
            assert_eq!(g.load(3, lane), 1000 + lane as u64);
            let (table, column) = g.group_of(lane);
            assert_eq!(table.load(3, column), 1000 + lane as u64);
            assert_eq!(column, lane % 16);
            let words = g.lane_words(lane);
            assert_eq!(words.iter().filter(|&&w| w != 0).count(), 1);
        }
        assert_eq!(LaneGroups::new(8, 16).unwrap().groups().len(), 1);
    }

    /// A query reads every group, so the groups prefetch as the whole table does: groups of
    /// the L2's size each, larger than it together, prefetch into the L2.
    #[test]
    fn every_group_prefetches_at_the_whole_tables_level() {
        let buckets = (crate::memory::l2_cache_bytes() / (GROUP_LANES * 8)) as u64;
        let one = TransposedTable::new(buckets, GROUP_LANES).unwrap();
        assert_ne!(one.row_prefetch, Some(PrefetchLevel::L2));
        let four = LaneGroups::new(buckets, 64).unwrap();
        assert!(
            four.groups()
                .iter()
                .all(|g| g.row_prefetch == Some(PrefetchLevel::L2))
        );
        assert!(four.prefetches_rows());
        let small = LaneGroups::new(8, 64).unwrap();
        assert!(small.groups().iter().all(|g| g.row_prefetch.is_none()));
        // 1 MiB in four groups of 256 KiB: prefetched ahead, as a 1 MiB 16-lane table is.
        let quarter = LaneGroups::new((1 << 20) / (64 * 8), 64).unwrap();
        assert!(
            quarter
                .groups()
                .iter()
                .all(TransposedTable::prefetches_rows)
        );
        assert!(
            TransposedTable::new((1 << 20) / (16 * 8), 16)
                .unwrap()
                .prefetches_rows()
        );
        assert!(
            !TransposedTable::new((1 << 20) / (64 * 8), 16)
                .unwrap()
                .prefetches_rows()
        );
    }

    #[test]
    fn lane_counts_outside_one_to_sixty_four_are_refused() {
        assert_eq!(
            LaneGroups::new(8, 0).unwrap_err(),
            TableError::ConsumerLanes(0)
        );
        assert_eq!(
            LaneGroups::new(8, 65).unwrap_err(),
            TableError::ConsumerLanes(65)
        );
        assert_eq!(LaneGroups::new(8, 64).unwrap().groups().len(), 4);
    }

    #[test]
    #[should_panic(expected = "lane 5 out of range")]
    fn a_lane_past_the_count_panics() {
        LaneGroups::new(8, 5).unwrap().load(0, 5);
    }
}
