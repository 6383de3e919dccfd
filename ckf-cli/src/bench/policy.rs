//! Global routing policies: which DC serves a request.
//!
//! Only the DC is chosen here; inside the DC every policy uses the same local placement
//! ([`Fleet::pick_rank`](crate::bench::fleet::Fleet::pick_rank)), so hit-rate and time to first
//! token differences measure what the global choice buys.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A routing policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// The DC with the deepest prefix according to the index, among DCs not overloaded by
    /// requests served; ties go to the DC that served the fewest requests, then the lowest
    /// index (`best_dc`). Blind to capacity, queues and distance.
    #[value(alias = "ckf")]
    DeepestPrefix,
    /// A uniformly random DC (seeded, reproducible).
    Random,
    /// DCs in turn: request k goes to DC k mod D.
    RoundRobin,
    /// The DC with the fewest requests in flight (sent, first token not back yet), as the
    /// router counts them; ties go to the DC that served the fewest, then the lowest index.
    /// Blind to the cache. Counted on the serving model (live too: the live run serves its
    /// choices on it).
    LeastLoaded,
    /// The lowest expected time to first token of `ckf_core::route` (the indexer's
    /// `Query/Route`): prefix depth, the pools' reported load, their bookings and the round
    /// trips. Live only in `ckf demo` with the zmq feed (the producers scrape its simulated
    /// engines' load); offline everywhere.
    ExpectedTtft,
}

impl Policy {
    /// Every policy, in report order.
    pub const ALL: [Policy; 5] = [
        Policy::Random,
        Policy::RoundRobin,
        Policy::LeastLoaded,
        Policy::DeepestPrefix,
        Policy::ExpectedTtft,
    ];

    /// The policy's command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Policy::DeepestPrefix => "deepest-prefix",
            Policy::Random => "random",
            Policy::RoundRobin => "round-robin",
            Policy::LeastLoaded => "least-loaded",
            Policy::ExpectedTtft => "expected-ttft",
        }
    }

    /// Whether a live replay can run it: every policy but expected-ttft, which needs
    /// `load_path` (producers scraping the live run's simulated engines, so the indexer's
    /// `Route` has the load it routes by).
    pub fn runs_live(self, load_path: bool) -> bool {
        self != Policy::ExpectedTtft || load_path
    }
}

/// What a policy may look at to choose a DC; one entry per DC in each slice.
#[derive(Debug, Clone, Copy)]
pub struct Signals<'a> {
    /// The index's prefix depth; `None` when the DC's lane is not ready.
    pub depths: &'a [Option<usize>],
    /// Requests each DC served so far.
    pub served: &'a [u64],
    /// Requests in flight at each DC on the serving model (empty where there is none).
    pub in_flight: &'a [u64],
    /// The route model's choice: offline `ckf_core::route`'s, live the indexer's `Route`
    /// (expected-ttft only).
    pub fastest: Option<usize>,
}

/// A policy with its state (random generator, round-robin cursor).
#[derive(Debug)]
pub struct Router {
    policy: Policy,
    rng: StdRng,
    next: usize,
}

impl Router {
    /// A router; `seed` fixes the random policy's choices.
    pub fn new(policy: Policy, seed: u64) -> Self {
        Self {
            policy,
            rng: StdRng::seed_from_u64(seed),
            next: 0,
        }
    }

    /// The policy.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Chooses a DC.
    ///
    /// # Panics
    /// `least-loaded` without in-flight counts, `expected-ttft` without the route model's choice
    /// (a caller without the serving model runs only [`Policy::runs_live`] policies).
    pub fn choose(&mut self, signals: &Signals<'_>) -> usize {
        let dcs = signals.served.len();
        match self.policy {
            Policy::DeepestPrefix => best_dc(signals.depths, signals.served),
            Policy::Random => self.rng.random_range(0..dcs),
            Policy::RoundRobin => {
                let dc = self.next % dcs;
                self.next = self.next.wrapping_add(1);
                dc
            }
            Policy::LeastLoaded => {
                assert_eq!(
                    signals.in_flight.len(),
                    dcs,
                    "least-loaded needs in-flight counts"
                );
                (0..dcs)
                    .min_by_key(|&dc| (signals.in_flight[dc], signals.served[dc]))
                    .expect("at least one DC")
            }
            Policy::ExpectedTtft => signals
                .fastest
                .expect("expected-ttft needs the route model's choice"),
        }
    }
}

/// How far above the mean load a target may be and still win on prefix depth (0.25 = 25%).
///
/// Why a bound and not a pure tie-break: every Mooncake request starts with the same block
/// (id 0), so after the first request one DC (and one rank in it) has depth 1 while the others
/// have 0. Pure "deepest, then least loaded" then sends *every* request to that one rank, which
/// thrashes its LRU: on the first 2,000 Mooncake requests (3 DCs x 4 ranks x 4096 blocks) the
/// hit rate fell to 9.3% against random's 11.7%. Bounding the load (as in consistent hashing
/// with bounded loads) keeps prefix affinity and spreads the rest.
pub const LOAD_SLACK: f64 = 0.25;

/// The `ckf` rule, used for DCs (global) and for ranks inside a DC (local): among the targets
/// whose load is at most `max(min load + 1, (1 + LOAD_SLACK) x mean load)`, the one with the
/// deepest known depth; ties go to the least loaded, then the lowest index. Targets with unknown
/// depth (`None`: lane not ready) rank below every known one.
pub fn best_dc(depths: &[Option<usize>], load: &[u64]) -> usize {
    let n = load.len();
    assert!(n > 0, "at least one target");
    let min = *load.iter().min().expect("non-empty");
    let mean = load.iter().sum::<u64>() as f64 / n as f64;
    let bound = ((1.0 + LOAD_SLACK) * mean).max((min + 1) as f64);
    (0..n)
        .filter(|&i| load[i] as f64 <= bound)
        .min_by_key(|&i| {
            let depth = depths.get(i).copied().flatten();
            (std::cmp::Reverse(depth.map_or(0, |d| d + 1)), load[i])
        })
        .expect("the least loaded target is always eligible")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth(depths: &[Option<usize>], served: &[u64]) -> usize {
        Router::new(Policy::DeepestPrefix, 1).choose(&Signals {
            depths,
            served,
            in_flight: &[],
            fastest: None,
        })
    }

    fn blind(r: &mut Router, dcs: usize) -> usize {
        r.choose(&Signals {
            depths: &[],
            served: &vec![0; dcs],
            in_flight: &[],
            fastest: None,
        })
    }

    #[test]
    fn deepest_prefix_picks_deepest_then_least_loaded_then_lowest() {
        assert_eq!(depth(&[Some(1), Some(5), Some(3)], &[4, 5, 4]), 1);
        assert_eq!(depth(&[Some(2), Some(2), Some(1)], &[4, 3, 3]), 1);
        assert_eq!(depth(&[Some(0), Some(0)], &[2, 2]), 0);
        // A lane that is not ready is never preferred over a ready one, even at depth 0.
        assert_eq!(depth(&[None, Some(0)], &[0, 1]), 1);
        // No ready lane at all: least loaded.
        assert_eq!(depth(&[None, None, None], &[3, 1, 2]), 1);
    }

    #[test]
    fn least_loaded_reads_in_flight_then_served_and_expected_ttft_the_route_model() {
        let mut r = Router::new(Policy::LeastLoaded, 1);
        let pick = |r: &mut Router, in_flight: &[u64], served: &[u64]| {
            r.choose(&Signals {
                depths: &[Some(9), Some(0), Some(0)],
                served,
                in_flight,
                fastest: Some(0),
            })
        };
        assert_eq!(pick(&mut r, &[3, 1, 2], &[0, 9, 0]), 1);
        assert_eq!(pick(&mut r, &[1, 1, 1], &[5, 4, 6]), 1);
        assert_eq!(pick(&mut r, &[0, 0, 0], &[0, 0, 0]), 0);
        let mut r = Router::new(Policy::ExpectedTtft, 1);
        let signals = Signals {
            depths: &[Some(9), Some(0)],
            served: &[0, 0],
            in_flight: &[0, 0],
            fastest: Some(1),
        };
        assert_eq!(r.choose(&signals), 1);
        assert!(Policy::LeastLoaded.runs_live(false) && Policy::ExpectedTtft.runs_live(true));
        assert!(!Policy::ExpectedTtft.runs_live(false));
    }

    #[test]
    fn an_overloaded_dc_loses_its_prefix_advantage() {
        // Mean load 4, bound 5: DC 1 (load 8) is not eligible although deepest.
        assert_eq!(best_dc(&[Some(1), Some(9), Some(3)], &[2, 8, 2]), 2);
        // Within the bound the deepest still wins.
        assert_eq!(best_dc(&[Some(1), Some(9), Some(3)], &[4, 5, 4]), 1);
        // At the start (all loads 0 or 1) the least loaded plus one is always eligible.
        assert_eq!(best_dc(&[Some(1), Some(0)], &[1, 0]), 0);
        assert_eq!(best_dc(&[Some(1), Some(0)], &[2, 0]), 1);
    }

    #[test]
    fn round_robin_cycles_every_dc() {
        let mut r = Router::new(Policy::RoundRobin, 0);
        let picks: Vec<_> = (0..7).map(|_| blind(&mut r, 3)).collect();
        assert_eq!(picks, vec![0, 1, 2, 0, 1, 2, 0]);
    }

    #[test]
    fn random_is_seeded_in_range_and_uses_every_dc() {
        let run = |seed| {
            let mut r = Router::new(Policy::Random, seed);
            (0..300).map(|_| blind(&mut r, 4)).collect::<Vec<_>>()
        };
        let a = run(7);
        assert_eq!(a, run(7));
        assert_ne!(a, run(8));
        for dc in 0..4 {
            assert!(a.contains(&dc));
        }
        assert!(a.iter().all(|&dc| dc < 4));
    }
}
