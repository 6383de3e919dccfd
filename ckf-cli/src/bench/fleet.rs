//! The simulated serving fleet: D DCs x W workers x R dp ranks, each rank an LRU prefix cache
//! of `capacity_blocks` KV blocks.
//!
//! Serving a request on a rank (see [`Fleet::serve`]) reuses the rank's cached prefix, stores
//! the blocks the rank lacks, and evicts least-recently-used blocks to make room. The KV events
//! this produces are exactly what a real worker would publish to its DC's producer, and every
//! change is mirrored in the exact [`Oracle`].
//!
//! Recency rule: a served request's blocks are touched from last to first, so its first block is
//! the most recently used. Eviction therefore drops a cached sequence's tail before its head, as
//! prefix caches free blocks, and never leaves a cached block without its cached parent because
//! of a single request.

use std::num::NonZeroUsize;

use lru::LruCache;

use crate::bench::oracle::Oracle;
use crate::bench::policy::best_dc;

/// Most workers per DC a simulated fleet has.
pub const MAX_WORKERS_PER_DC: usize = 4_096;
/// Most data-parallel ranks per worker.
pub const MAX_RANKS_PER_WORKER: usize = 1_024;
/// Most KV blocks per rank: 2^22 (2^31 tokens of 512; each rank's LRU cache reserves its
/// capacity up front, ~200 MB at this size).
pub const MAX_CAPACITY_BLOCKS: usize = 1 << 22;

/// The fleet's shape (shared by `ckf replay` and `ckf demo`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct FleetShape {
    /// Data centers (1..=16, `dc-a`..`dc-p`: one indexer lane each; the indexer takes up to
    /// 64).
    pub dcs: usize,
    /// Workers per DC.
    pub workers_per_dc: usize,
    /// Data-parallel ranks per worker.
    pub ranks_per_worker: usize,
    /// KV capacity of one rank, in blocks.
    pub capacity_blocks: usize,
}

impl FleetShape {
    /// Ranks in one DC.
    pub fn ranks_per_dc(&self) -> usize {
        self.workers_per_dc * self.ranks_per_worker
    }

    /// The most distinct blocks one DC can hold (every rank full, no sharing).
    pub fn max_blocks_per_dc(&self) -> u64 {
        (self.ranks_per_dc() * self.capacity_blocks) as u64
    }

    /// Checks the shape.
    ///
    /// # Errors
    /// A message naming the field and the rule when a field is out of range.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=16).contains(&self.dcs) {
            return Err(format!(
                "dcs = {}: must be 1..=16 (the simulated fleet's DCs are dc-a..dc-p; an indexer \
                 of up to 64 lanes is fed by running producers: ckf replay --producer DC=URL)",
                self.dcs
            ));
        }
        for (name, value, most) in [
            ("workers per DC", self.workers_per_dc, MAX_WORKERS_PER_DC),
            (
                "ranks per worker",
                self.ranks_per_worker,
                MAX_RANKS_PER_WORKER,
            ),
            (
                "capacity (blocks per rank)",
                self.capacity_blocks,
                MAX_CAPACITY_BLOCKS,
            ),
        ] {
            if !(1..=most).contains(&value) {
                return Err(format!("{name} = {value}: must be 1..={most}"));
            }
        }
        Ok(())
    }
}

/// One rank of the fleet. Its producer member is `(worker_id = worker, dp_rank = rank)` in the
/// DC's pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RankId {
    /// DC index.
    pub dc: usize,
    /// Worker index within the DC (the member's `worker_id`).
    pub worker: usize,
    /// Data-parallel rank (the member's `dp_rank`).
    pub rank: usize,
}

/// A contiguous run of newly stored blocks, in prefix order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRun {
    /// Hash of the block before the run; `None` when the run starts at the request's first block.
    pub parent: Option<u64>,
    /// The stored block hashes.
    pub hashes: Vec<u64>,
}

/// What serving one request did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// The rank that served it.
    pub rank_id: RankId,
    /// The DC's batch sequence for this request's events (1, 2, ... per DC).
    pub dc_seq: u64,
    /// Blocks in the request.
    pub requested: usize,
    /// Leading blocks the rank already held (prefix-cache hits).
    pub reused: usize,
    /// Blocks the rank evicted to make room (one Removed event).
    pub evicted: Vec<u64>,
    /// Blocks the rank newly stored (one Stored event per run).
    pub stored: Vec<StoredRun>,
}

/// The fleet: every rank's LRU cache, loads, and the exact oracle.
#[derive(Debug)]
pub struct Fleet {
    shape: FleetShape,
    caches: Vec<LruCache<u64, ()>>,
    rank_load: Vec<u64>,
    dc_load: Vec<u64>,
    dc_seq: Vec<u64>,
    oracle: Oracle,
}

impl Fleet {
    /// An empty fleet.
    ///
    /// # Panics
    /// When the shape is invalid (see [`FleetShape::validate`]).
    pub fn new(shape: FleetShape) -> Self {
        shape.validate().expect("invalid fleet shape");
        let capacity = NonZeroUsize::new(shape.capacity_blocks).expect("validated");
        let ranks = shape.dcs * shape.ranks_per_dc();
        Self {
            shape,
            caches: (0..ranks).map(|_| LruCache::new(capacity)).collect(),
            rank_load: vec![0; ranks],
            dc_load: vec![0; shape.dcs],
            dc_seq: vec![0; shape.dcs],
            oracle: Oracle::new(shape.dcs),
        }
    }

    /// The fleet's shape.
    pub fn shape(&self) -> FleetShape {
        self.shape
    }

    /// The exact oracle.
    pub fn oracle(&self) -> &Oracle {
        &self.oracle
    }

    /// The exact oracle, for recording producer results.
    pub fn oracle_mut(&mut self) -> &mut Oracle {
        &mut self.oracle
    }

    /// Requests routed to each DC so far (the load used for tie-breaks).
    pub fn dc_load(&self) -> &[u64] {
        &self.dc_load
    }

    /// The last batch sequence of every DC.
    pub fn dc_seq(&self) -> &[u64] {
        &self.dc_seq
    }

    /// Every rank of a DC, worker-major.
    pub fn rank_ids(&self, dc: usize) -> impl Iterator<Item = RankId> + '_ {
        let ranks = self.shape.ranks_per_worker;
        (0..self.shape.ranks_per_dc()).map(move |i| RankId {
            dc,
            worker: i / ranks,
            rank: i % ranks,
        })
    }

    fn index(&self, rank_id: RankId) -> usize {
        (rank_id.dc * self.shape.workers_per_dc + rank_id.worker) * self.shape.ranks_per_worker
            + rank_id.rank
    }

    /// Leading blocks of `hashes` the rank holds (does not change recency).
    pub fn rank_depth(&self, rank_id: RankId, hashes: &[u64]) -> usize {
        let cache = &self.caches[self.index(rank_id)];
        hashes.iter().take_while(|h| cache.contains(h)).count()
    }

    /// Blocks the rank holds.
    pub fn rank_len(&self, rank_id: RankId) -> usize {
        self.caches[self.index(rank_id)].len()
    }

    /// The share of `rank_id`'s capacity its cache fills (its KV-cache usage, 0..=1).
    pub fn kv_usage(&self, rank_id: RankId) -> f64 {
        self.rank_len(rank_id) as f64 / self.shape.capacity_blocks as f64
    }

    /// The DC-local placement rule, the same for every routing policy: the deepest-prefix rule
    /// ([`best_dc`]) over the DC's ranks with their exact cached depths and served-request
    /// counts. (Inside a DC the local router knows its ranks exactly; the global index decides
    /// only the DC.)
    pub fn pick_rank(&self, dc: usize, hashes: &[u64]) -> RankId {
        let rank_ids: Vec<RankId> = self.rank_ids(dc).collect();
        let depths: Vec<Option<usize>> = rank_ids
            .iter()
            .map(|&rank_id| Some(self.rank_depth(rank_id, hashes)))
            .collect();
        let loads: Vec<u64> = rank_ids
            .iter()
            .map(|&rank_id| self.rank_load[self.index(rank_id)])
            .collect();
        rank_ids[best_dc(&depths, &loads)]
    }

    /// Serves a request with block hashes `hashes` in DC `dc` on the rank [`Fleet::pick_rank`]
    /// chooses.
    ///
    /// The rank keeps the request's first `min(len, capacity)` blocks: it evicts exactly as many
    /// least-recently-used blocks of *other* requests as it needs, stores the blocks it lacks, and
    /// touches the kept blocks last-to-first (module docs). Oracle and loads are updated.
    pub fn serve(&mut self, dc: usize, hashes: &[u64]) -> Served {
        let rank_id = self.pick_rank(dc, hashes);
        let reused = self.rank_depth(rank_id, hashes);
        let index = self.index(rank_id);
        self.dc_seq[dc] += 1;
        let seq = self.dc_seq[dc];
        self.rank_load[index] += 1;
        self.dc_load[dc] += 1;

        let capacity = self.shape.capacity_blocks;
        let kept = &hashes[..hashes.len().min(capacity)];
        let cache = &mut self.caches[index];
        // Protect the kept blocks the rank already holds, so eviction cannot pick them.
        let mut missing = 0;
        for hash in kept.iter().rev() {
            if cache.get(hash).is_none() {
                missing += 1;
            }
        }
        let need = (cache.len() + missing).saturating_sub(capacity);
        let mut evicted = Vec::with_capacity(need);
        for _ in 0..need {
            let (hash, ()) = cache.pop_lru().expect("need <= other requests' blocks");
            evicted.push(hash);
        }
        let mut newly = vec![false; kept.len()];
        for (i, hash) in kept.iter().enumerate().rev() {
            if cache.get(hash).is_none() {
                cache.put(*hash, ());
                newly[i] = true;
            }
        }
        for &hash in &evicted {
            self.oracle.on_drop(dc, hash, seq);
        }
        let mut stored: Vec<StoredRun> = Vec::new();
        for (i, &hash) in kept.iter().enumerate() {
            if !newly[i] {
                continue;
            }
            self.oracle.on_store(dc, hash, seq);
            match stored.last_mut() {
                Some(run) if i > 0 && newly[i - 1] => run.hashes.push(hash),
                _ => stored.push(StoredRun {
                    parent: i.checked_sub(1).map(|p| kept[p]),
                    hashes: vec![hash],
                }),
            }
        }
        Served {
            rank_id,
            dc_seq: seq,
            requested: hashes.len(),
            reused,
            evicted,
            stored,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(dcs: usize, workers: usize, ranks: usize, capacity: usize) -> FleetShape {
        FleetShape {
            dcs,
            workers_per_dc: workers,
            ranks_per_worker: ranks,
            capacity_blocks: capacity,
        }
    }

    const ONE_RANK: RankId = RankId {
        dc: 0,
        worker: 0,
        rank: 0,
    };

    #[test]
    fn first_serve_stores_everything_second_reuses_it() {
        let mut fleet = Fleet::new(shape(1, 1, 1, 10));
        let a = fleet.serve(0, &[1, 2, 3]);
        assert_eq!((a.reused, a.requested, a.dc_seq), (0, 3, 1));
        assert_eq!(
            a.stored,
            vec![StoredRun {
                parent: None,
                hashes: vec![1, 2, 3]
            }]
        );
        let b = fleet.serve(0, &[1, 2, 4]);
        assert_eq!(b.reused, 2);
        assert_eq!(
            b.stored,
            vec![StoredRun {
                parent: Some(2),
                hashes: vec![4]
            }]
        );
        assert!(b.evicted.is_empty());
        assert_eq!(fleet.oracle().depths(&[1, 2, 4]), vec![3]);
    }

    #[test]
    fn lru_evicts_least_recent_tail_first_and_never_the_request() {
        let mut fleet = Fleet::new(shape(1, 1, 1, 4));
        fleet.serve(0, &[1, 2]); // recency (MRU first): 1 2
        fleet.serve(0, &[3, 4]); // 3 4 1 2
        let c = fleet.serve(0, &[1, 5]); // needs one rank_id; LRU is 2, then 4
        assert_eq!(c.reused, 1);
        assert_eq!(c.evicted, vec![2]);
        assert_eq!(fleet.rank_len(ONE_RANK), 4);
        let d = fleet.serve(0, &[6, 7, 8]);
        // Recency before: 1 5 3 4 -> evicts 4, 3, 5 (tails before heads, LRU order).
        assert_eq!(d.evicted, vec![4, 3, 5]);
        assert!(fleet.oracle().holds(0, 1));
        assert!(!fleet.oracle().holds(0, 3));
    }

    #[test]
    fn a_request_longer_than_capacity_keeps_its_head() {
        let mut fleet = Fleet::new(shape(1, 1, 1, 3));
        fleet.serve(0, &[9]);
        let s = fleet.serve(0, &[1, 2, 3, 4, 5]);
        assert_eq!(s.evicted, vec![9]);
        assert_eq!(s.stored[0].hashes, vec![1, 2, 3]);
        assert_eq!(fleet.rank_depth(ONE_RANK, &[1, 2, 3, 4]), 3);
    }

    #[test]
    fn non_contiguous_missing_blocks_form_runs_with_parents() {
        let mut fleet = Fleet::new(shape(1, 1, 1, 10));
        fleet.serve(0, &[1, 2, 3]);
        fleet.serve(0, &[7, 8]);
        // 1 present, 5 missing, 3 present (not a prefix hit past 5), 6 missing.
        let s = fleet.serve(0, &[1, 5, 3, 6]);
        assert_eq!(s.reused, 1);
        assert_eq!(
            s.stored,
            vec![
                StoredRun {
                    parent: Some(1),
                    hashes: vec![5]
                },
                StoredRun {
                    parent: Some(3),
                    hashes: vec![6]
                }
            ]
        );
    }

    #[test]
    fn local_placement_prefers_deepest_rank_then_least_loaded() {
        let mut fleet = Fleet::new(shape(1, 2, 1, 10));
        let a = fleet.serve(0, &[1, 2]);
        let b = fleet.serve(0, &[3]);
        assert_ne!(a.rank_id, b.rank_id, "second request goes to the idle rank");
        let c = fleet.serve(0, &[1, 2, 3]);
        assert_eq!(c.rank_id, a.rank_id);
        assert_eq!(c.reused, 2);
    }

    #[test]
    fn oracle_counts_holders_across_ranks_of_one_dc() {
        let mut fleet = Fleet::new(shape(2, 1, 2, 2));
        fleet.serve(0, &[1]);
        fleet.serve(0, &[2]); // other rank (load tie-break)
        fleet.serve(0, &[1, 3]); // rank 0 (depth 1)
        assert_eq!(fleet.oracle().truth(0, 1).holders, 1);
        fleet.serve(0, &[4, 5]); // rank 1 evicts 2
        assert!(!fleet.oracle().holds(0, 2));
        assert_eq!(fleet.oracle().depths(&[1, 3]), vec![2, 0]);
        assert_eq!(fleet.dc_seq(), &[4, 0]);
    }
}
