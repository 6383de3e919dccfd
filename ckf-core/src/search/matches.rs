//! [`PrefixMatches`]: the answer of one prefix query.

use crate::bucket::MAX_LANES;
use crate::identity::LaneIndex;

/// The result of one prefix query: the lanes that were ready when the query captured the mask,
/// and the prefix depth of each. A fixed-size stack value (no heap).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixMatches {
    pub(super) ready: u64,
    pub(super) depths: [u32; MAX_LANES],
}

impl Default for PrefixMatches {
    /// No lane ready.
    fn default() -> Self {
        Self {
            ready: 0,
            depths: [0; MAX_LANES],
        }
    }
}

impl PrefixMatches {
    /// Adds the lanes of `other` (a search of lanes this answer does not hold) to this answer.
    pub(crate) fn join(&mut self, other: &PrefixMatches) {
        debug_assert_eq!(self.ready & other.ready, 0, "disjoint lane sets");
        let mut lanes = other.ready;
        while lanes != 0 {
            let lane = lanes.trailing_zeros() as usize;
            lanes &= lanes - 1;
            self.depths[lane] = other.depths[lane];
        }
        self.ready |= other.ready;
    }

    /// Lanes that were ready at capture (bit `i` = lane `i`). Every reported lane is in it.
    #[inline]
    pub fn ready_mask(&self) -> u64 {
        self.ready
    }

    /// Prefix depth of `lane` (leading blocks present), or `None` when it was not ready.
    #[inline]
    pub fn depth(&self, lane: LaneIndex) -> Option<u32> {
        (usize::from(lane) < MAX_LANES && self.ready & (1 << lane) != 0)
            .then(|| self.depths[usize::from(lane)])
    }

    /// `(lane, depth)` for every ready lane, in lane order (depth may be 0).
    pub fn iter(&self) -> impl Iterator<Item = (LaneIndex, u32)> + '_ {
        let mut mask = self.ready;
        std::iter::from_fn(move || {
            if mask == 0 {
                return None;
            }
            let lane = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            Some((lane as LaneIndex, self.depths[lane]))
        })
    }

    /// `(lane, depth)` for ready lanes with depth > 0.
    pub fn matching(&self) -> impl Iterator<Item = (LaneIndex, u32)> + '_ {
        self.iter().filter(|&(_, d)| d > 0)
    }

    /// The deepest ready lane (lowest lane index on ties), if any lane is ready.
    pub fn best(&self) -> Option<(LaneIndex, u32)> {
        self.iter().fold(None, |best, (l, d)| match best {
            Some((_, bd)) if bd >= d => best,
            _ => Some((l, d)),
        })
    }

    /// Number of ready lanes.
    pub fn ready_count(&self) -> u32 {
        self.ready.count_ones()
    }
}
