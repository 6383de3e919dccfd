//! [`LaneBlockSizes`]: the tokens per block of each lane of a domain whose pools do not all
//! use one block size, and the rule a query by token ids follows there: the request is hashed
//! once per distinct block size, and each lane is answered in its own blocks
//! ([`GlobalCkfIndexer::find_prefix_matches_by_token_query`](crate::global::GlobalCkfIndexer::find_prefix_matches_by_token_query)).

use crate::bucket::MAX_LANES;

use super::{MAX_BLOCK_SIZE, TokenQuery, TokenQueryError, TokenQueryRules};

/// Tokens per KV block of every lane (lane `i` = entry `i`), 1..=64 lanes of
/// 1..=[`MAX_BLOCK_SIZE`] tokens each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneBlockSizes {
    per_lane: Vec<u32>,
    /// Each distinct block size with the mask of its lanes, smallest size first.
    distinct: Vec<(u32, u64)>,
}

/// Why a [`LaneBlockSizes`] is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LaneBlockSizesError {
    /// No lane, or more than 64.
    #[error("{0} lanes (need 1..={MAX_LANES})")]
    LaneCount(usize),
    /// A lane's block size is 0 or above [`MAX_BLOCK_SIZE`].
    #[error("lane {lane}: block size {size} is outside 1..={MAX_BLOCK_SIZE}")]
    BlockSize {
        /// The lane.
        lane: usize,
        /// Its block size.
        size: u32,
    },
}

impl LaneBlockSizes {
    /// The block size of each lane, in lane order.
    ///
    /// # Errors
    /// [`LaneBlockSizesError`].
    pub fn new(per_lane: Vec<u32>) -> Result<Self, LaneBlockSizesError> {
        if !(1..=MAX_LANES).contains(&per_lane.len()) {
            return Err(LaneBlockSizesError::LaneCount(per_lane.len()));
        }
        let mut distinct: Vec<(u32, u64)> = Vec::new();
        for (lane, &size) in per_lane.iter().enumerate() {
            if !(1..=MAX_BLOCK_SIZE).contains(&size) {
                return Err(LaneBlockSizesError::BlockSize { lane, size });
            }
            match distinct.iter_mut().find(|(s, _)| *s == size) {
                Some((_, lanes)) => *lanes |= 1 << lane,
                None => distinct.push((size, 1 << lane)),
            }
        }
        distinct.sort_unstable();
        Ok(Self { per_lane, distinct })
    }

    /// `lanes` lanes of `block_size` tokens each.
    ///
    /// # Errors
    /// As [`LaneBlockSizes::new`].
    pub fn uniform(block_size: u32, lanes: usize) -> Result<Self, LaneBlockSizesError> {
        Self::new(vec![block_size; lanes])
    }

    /// The block size of `lane`.
    ///
    /// # Panics
    /// When `lane` is not a lane.
    pub fn of(&self, lane: usize) -> u32 {
        self.per_lane[lane]
    }

    /// Each distinct block size with the mask of its lanes (bit `i` = lane `i`), smallest first.
    pub fn distinct(&self) -> &[(u32, u64)] {
        &self.distinct
    }

    /// Whether every lane uses one block size.
    pub fn is_uniform(&self) -> bool {
        self.distinct.len() == 1
    }

    /// Whether some lane uses `block_size`.
    pub fn serves(&self, block_size: u32) -> bool {
        self.distinct.iter().any(|&(s, _)| s == block_size)
    }

    /// Lane count.
    pub fn lanes(&self) -> usize {
        self.per_lane.len()
    }

    /// The rules of a query by token ids under `block_size` with at most `max_blocks` blocks.
    pub fn rules(block_size: u32, max_blocks: u32) -> TokenQueryRules {
        TokenQueryRules {
            block_size,
            max_blocks,
        }
    }

    /// Checks `query` for these lanes (at most `max_blocks` blocks in any size) and returns its
    /// full blocks in the smallest block size (the most any size probes). With one block size,
    /// [`TokenQuery::lazy_sequence_hashes`]'s checks; with several, the query's own
    /// `block_size` must be one of them, then the token limit and the multimodal items are
    /// checked under each.
    ///
    /// # Errors
    /// [`TokenQueryError`]: the first rule broken.
    pub fn check(&self, query: &TokenQuery, max_blocks: u32) -> Result<usize, TokenQueryError> {
        if let [(size, _)] = self.distinct[..] {
            return Ok(query
                .lazy_sequence_hashes(&Self::rules(size, max_blocks))?
                .len());
        }
        if let Some(requested) = query.block_size
            && !self.serves(requested)
        {
            return Err(TokenQueryError::BlockSizeNotServed {
                requested,
                served: self.distinct.iter().map(|&(size, _)| size).collect(),
            });
        }
        let mut most = 0;
        for &(size, _) in &self.distinct {
            most = most.max(query.hashes_in(&Self::rules(size, max_blocks))?.len());
        }
        Ok(most)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_sizes_carry_their_lanes_smallest_first() {
        let s = LaneBlockSizes::new(vec![32, 16, 32, 64, 16]).unwrap();
        assert_eq!(s.distinct(), &[(16, 0b10010), (32, 0b00101), (64, 0b01000)]);
        assert!(!s.is_uniform());
        assert!(s.serves(64) && !s.serves(8));
        assert_eq!((s.of(3), s.lanes()), (64, 5));
        let u = LaneBlockSizes::uniform(16, 64).unwrap();
        assert_eq!(u.distinct(), &[(16, u64::MAX)]);
        assert!(u.is_uniform());
    }

    #[test]
    fn bad_counts_and_sizes_are_refused_naming_the_lane() {
        assert_eq!(
            LaneBlockSizes::new(vec![]).unwrap_err(),
            LaneBlockSizesError::LaneCount(0)
        );
        assert_eq!(
            LaneBlockSizes::uniform(16, 65).unwrap_err(),
            LaneBlockSizesError::LaneCount(65)
        );
        assert_eq!(
            LaneBlockSizes::new(vec![16, 0]).unwrap_err(),
            LaneBlockSizesError::BlockSize { lane: 1, size: 0 }
        );
        let too_big = MAX_BLOCK_SIZE + 1;
        let e = LaneBlockSizes::new(vec![too_big]).unwrap_err();
        assert!(e.to_string().contains("lane 0"), "{e}");
    }
}
