//! Offline replays: the fleet simulator alone, with the exact oracle standing in for the
//! indexer. `random` and `round-robin` never read the index, so their hit rates here are exactly
//! what a live replay would measure; `ckf` here is the exact-index upper bound of the live run.

use serde::Serialize;

use crate::bench::fleet::{Fleet, FleetShape};
use crate::bench::policy::{Policy, Router};

/// Prefix-cache hit rate of one policy on one workload and fleet.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct HitRate {
    /// The routing policy.
    pub policy: Policy,
    /// Where the DC depths came from: `"indexer"` (live) or `"exact oracle"` (offline).
    pub index: &'static str,
    /// Blocks in all requests.
    pub blocks_requested: u64,
    /// Leading blocks the serving rank already held.
    pub blocks_reused: u64,
    /// `blocks_reused / blocks_requested` (0 when nothing was requested).
    pub hit_rate: f64,
}

impl HitRate {
    /// Builds the record from counts.
    pub fn new(policy: Policy, index: &'static str, requested: u64, reused: u64) -> Self {
        Self {
            policy,
            index,
            blocks_requested: requested,
            blocks_reused: reused,
            hit_rate: if requested == 0 {
                0.0
            } else {
                reused as f64 / requested as f64
            },
        }
    }
}

/// Replays `requests` (block-hash sequences) through a fresh fleet with `policy`, using exact
/// oracle depths for `ckf`.
pub fn simulate(requests: &[Vec<u64>], shape: FleetShape, policy: Policy, seed: u64) -> HitRate {
    let mut fleet = Fleet::new(shape);
    let mut router = Router::new(policy, seed);
    let (mut requested, mut reused) = (0u64, 0u64);
    for hashes in requests {
        let depths: Vec<Option<usize>> = fleet
            .oracle()
            .depths(hashes)
            .into_iter()
            .map(Some)
            .collect();
        let dc = router.choose(&depths, fleet.dc_load());
        let served = fleet.serve(dc, hashes);
        requested += served.requested as u64;
        reused += served.reused as u64;
    }
    HitRate::new(policy, "exact oracle", requested, reused)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::synth::synthetic_workload;
    use crate::hashing::block_hashes;

    #[test]
    fn ckf_beats_cache_blind_policies_on_shared_prefixes() {
        let requests: Vec<Vec<u64>> = synthetic_workload(1500, 3)
            .iter()
            .map(|r| block_hashes(&r.hash_ids))
            .collect();
        let shape = FleetShape {
            dcs: 3,
            workers_per_dc: 2,
            ranks_per_worker: 2,
            capacity_blocks: 256,
        };
        let ckf = simulate(&requests, shape, Policy::Ckf, 1);
        let random = simulate(&requests, shape, Policy::Random, 1);
        let rr = simulate(&requests, shape, Policy::RoundRobin, 1);
        assert_eq!(ckf.blocks_requested, random.blocks_requested);
        assert!(ckf.hit_rate > random.hit_rate, "{ckf:?} vs {random:?}");
        assert!(ckf.hit_rate > rr.hit_rate, "{ckf:?} vs {rr:?}");
        assert!(ckf.blocks_reused <= ckf.blocks_requested);
    }
}
