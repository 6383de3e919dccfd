//! Offline replays: the fleet simulator with the exact oracle standing in for the indexer, and a
//! serving model that turns each policy's choices into times to first token (TTFT).
//!
//! `random`, `round-robin` and `least-loaded` never read the index, so their hit rates here are
//! exactly what a live replay would measure; `deepest-prefix` here is the exact-index upper
//! bound of the live run.
//!
//! ## The serving model
//!
//! - **Time**: request `k` reaches the router at its trace timestamp / `speed`.
//! - **Engines**: every rank of the fleet is one engine. A DC's pool has
//!   [`DcServing::prefill_tokens_per_s`], shared equally by its engines; an engine prefills one
//!   request at a time, first come first served. The local placement
//!   ([`Fleet::serve`](crate::bench::fleet::Fleet::serve)) picks the engine, as it picks the rank
//!   whose cached prefix is reused.
//! - **A request**: travels half the DC's round trip, waits for its engine, prefills its
//!   uncached tokens (prompt tokens minus the reused blocks x 512) at the engine's rate, and its
//!   first token travels the other half back: TTFT = round trip + wait + prefill. Decoding is
//!   not modelled: the engine is free once the first token is out.
//! - **What the router sees**: `least-loaded` counts its requests whose first token is not
//!   back; `expected-ttft` sees what the indexer sees: each pool's load (running and waiting
//!   requests per engine, summed by [`PoolLoad::from_engines`]) observed every
//!   `load_interval_ms`, with its age, the choices booked since ([`Bookings`]), the DC's round
//!   trip, and the exact prefix depth, and asks [`ckf_core::route::route`]. Before the first
//!   observation every pool's load is unknown.
//! - **Peak queue**: the most requests waiting (arrived, not started) at a DC's engines at once,
//!   seen when a request arrives there.

use std::time::Duration;

use ckf_core::route::{Bookings, DcInput, PoolLoad, RouteModel, route};
use serde::Serialize;

use crate::bench::fleet::{Fleet, FleetShape};
use crate::bench::policy::{Policy, Router, Signals};
use crate::bench::stats::Summary;
use crate::bench::trace::{Request, TOKENS_PER_BLOCK};

mod pools;
pub use pools::Pools;

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

/// One DC's serving parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct DcServing {
    /// Prefill tokens/s of the DC's pool, shared equally by its engines.
    pub prefill_tokens_per_s: f64,
    /// Round trip between the router and the DC, milliseconds.
    pub rtt_ms: f64,
}

/// The serving model's parameters (module docs).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServingModel {
    /// One per DC, in DC order.
    pub dcs: Vec<DcServing>,
    /// Arrivals at trace time / `speed`.
    pub speed: f64,
    /// How often each pool's load is observed (the producers' scrape and report interval), ms.
    pub load_interval_ms: f64,
    /// The route model's prefill work of one queued request, tokens.
    pub queued_request_tokens: f64,
}

/// Prefill tokens/s of a full-size DC pool by default: four engines of 16,000 tokens/s.
pub const DEFAULT_DC_PREFILL_TOKENS_PER_S: f64 = 64_000.0;
/// The default round trips: the first DC local, the last one in another region, the rest in
/// neighbouring regions (milliseconds).
pub const DEFAULT_RTT_MS: (f64, f64, f64) = (2.0, 40.0, 280.0);
/// The default prefill work one queued request stands for, tokens.
pub const DEFAULT_QUEUED_REQUEST_TOKENS: f64 = 4_096.0;

/// Prompt tokens per second the workload offers at `speed` (all its prompt tokens over the
/// span of its timestamps); 0 for a workload without a time span (every request at once).
pub fn offered_tokens_per_s(requests: &[Request], speed: f64) -> f64 {
    let (Some(first), Some(last)) = (requests.first(), requests.last()) else {
        return 0.0;
    };
    let span_s = last.timestamp_ms.saturating_sub(first.timestamp_ms) as f64 / 1_000.0 / speed;
    if span_s <= 0.0 {
        return 0.0;
    }
    requests.iter().map(|r| r.input_length as f64).sum::<f64>() / span_s
}

impl ServingModel {
    /// The default case for `dcs` DCs: every other DC (the 2nd, 4th, ...) has half the
    /// prefill capacity; the first is 2 ms away, the last 280 ms, the others 40 ms; load observed
    /// every second; arrivals at trace speed.
    pub fn unequal(dcs: usize) -> Self {
        let (near, mid, far) = DEFAULT_RTT_MS;
        Self {
            dcs: (0..dcs)
                .map(|i| DcServing {
                    prefill_tokens_per_s: if i % 2 == 1 {
                        DEFAULT_DC_PREFILL_TOKENS_PER_S / 2.0
                    } else {
                        DEFAULT_DC_PREFILL_TOKENS_PER_S
                    },
                    rtt_ms: match i {
                        0 => near,
                        i if i + 1 == dcs => far,
                        _ => mid,
                    },
                })
                .collect(),
            speed: 1.0,
            load_interval_ms: 1_000.0,
            queued_request_tokens: DEFAULT_QUEUED_REQUEST_TOKENS,
        }
    }

    /// Checks the parameters against a fleet of `dcs` DCs.
    ///
    /// # Errors
    /// A message naming the parameter and the rule.
    pub fn validate(&self, dcs: usize) -> Result<(), String> {
        if self.dcs.len() != dcs {
            return Err(format!(
                "{} DC serving entries for {dcs} DCs: give one capacity and one round trip per DC",
                self.dcs.len()
            ));
        }
        let within = |name: &str, v: f64, min: f64, max: f64| {
            if v.is_finite() && (min..=max).contains(&v) {
                Ok(())
            } else {
                Err(format!("{name} = {v}: must be a number in {min}..={max}"))
            }
        };
        for dc in &self.dcs {
            within("prefill tokens/s", dc.prefill_tokens_per_s, 1.0, 1e12)?;
            within("round trip (ms)", dc.rtt_ms, 0.0, 3.6e6)?;
        }
        within("speed", self.speed, 1e-3, 1e6)?;
        within("load interval (ms)", self.load_interval_ms, 1.0, 3.6e6)?;
        within(
            "queued request tokens",
            self.queued_request_tokens,
            1.0,
            1e9,
        )
    }

    /// The route model the offline expected-ttft asks: the indexer's defaults, this model's
    /// queued-request tokens, and a staleness bound of at least three load intervals (as the
    /// demo configures its indexer: a report is never stale between two observations).
    fn route_model(&self) -> RouteModel {
        let defaults = RouteModel::default();
        RouteModel {
            queued_request_tokens: self.queued_request_tokens,
            stale_after: defaults
                .stale_after
                .max(Duration::from_secs_f64(3.0 * self.load_interval_ms / 1e3)),
            ..defaults
        }
    }
}

/// What one policy did on the serving model.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PolicyServing {
    /// The policy.
    pub policy: Policy,
    /// Its prefix-cache hit rate (exact oracle as index).
    pub hit_rate: HitRate,
    /// Time to first token, milliseconds.
    pub ttft_ms: Summary,
    /// Per DC, in DC order.
    pub dcs: Vec<DcServed>,
}

/// One DC under one policy.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct DcServed {
    /// Requests it served.
    pub requests: u64,
    /// Its share of all requests.
    pub share: f64,
    /// The most requests waiting at its engines at once.
    pub peak_queue: u64,
}

/// Replays `requests` (with their block hashes `hashes`, one entry each) through a fresh fleet
/// with `policy` on the serving model `model`, exact oracle depths as the index.
///
/// # Panics
/// When `model` does not validate against the shape or the slices differ in length.
pub fn serve(
    requests: &[Request],
    hashes: &[Vec<u64>],
    shape: FleetShape,
    model: &ServingModel,
    policy: Policy,
    seed: u64,
) -> PolicyServing {
    assert_eq!(requests.len(), hashes.len(), "one hash list per request");
    let mut pools = Pools::new(shape, model);
    let dcs = shape.dcs;
    let route_model = model.route_model();
    let interval = model.load_interval_ms / 1_000.0;
    let mut fleet = Fleet::new(shape);
    let mut router = Router::new(policy, seed);
    let mut observed: Vec<Option<(PoolLoad, f64)>> = vec![None; dcs];
    let mut bookings = Bookings::default();
    // The route model's clock: sim time t is `origin + t`.
    let origin = std::time::Instant::now();
    let instant = |t: f64| {
        Duration::try_from_secs_f64(t.max(0.0))
            .ok()
            .and_then(|d| origin.checked_add(d))
            .unwrap_or(origin)
    };
    let mut now = 0.0_f64;
    let mut next_observation = interval;
    let (mut requested, mut reused) = (0u64, 0u64);
    for (request, hashes) in requests.iter().zip(hashes) {
        // Arrivals in trace order: a timestamp before the previous one counts as the previous.
        now = now.max(request.timestamp_ms as f64 / 1_000.0 / model.speed);
        if now >= next_observation {
            // The last observation time at or before now (never after it, whatever the rounding).
            let at = ((now / interval).floor() * interval).min(now);
            for (dc, seen) in observed.iter_mut().enumerate() {
                *seen = pools.observe(dc, at).map(|load| (load, at));
                bookings.reported(lane(dc), instant(at));
            }
            next_observation = at + interval;
        }
        let in_flight = pools.in_flight(now);
        let depths: Vec<usize> = fleet.oracle().depths(hashes);
        let fastest = (policy == Policy::ExpectedTtft).then(|| {
            let inputs: Vec<DcInput> = (0..dcs)
                .map(|dc| DcInput {
                    lane: lane(dc),
                    depth: u32::try_from(depths[dc]).unwrap_or(u32::MAX),
                    block_size: TOKENS_PER_BLOCK as u32,
                    rtt: None,
                    // Validated: 0..=3,600,000 ms.
                    configured_rtt: Some(Duration::from_secs_f64(model.dcs[dc].rtt_ms / 1e3)),
                    load: observed[dc].map(|(load, at)| {
                        let age = Duration::try_from_secs_f64((now - at).max(0.0));
                        (load, age.unwrap_or(Duration::MAX))
                    }),
                    booked: bookings.booked(lane(dc)),
                })
                .collect();
            let choice = route(&route_model, request.input_length, &inputs).choice;
            usize::from(choice.expect("at least one DC").0)
        });
        let known: Vec<Option<usize>> = depths.into_iter().map(Some).collect();
        let dc = router.choose(&Signals {
            depths: &known,
            served: fleet.dc_load(),
            in_flight: &in_flight,
            fastest,
        });
        bookings.book(lane(dc), instant(now));
        let result = fleet.serve(dc, hashes);
        requested += result.requested as u64;
        reused += result.reused as u64;
        pools.admit(
            now,
            result.rank_id,
            request.input_length,
            result.reused,
            fleet.kv_usage(result.rank_id),
        );
    }
    pools.finish(
        policy,
        HitRate::new(policy, "exact oracle", requested, reused),
    )
}

/// DC `dc`'s lane in the route model (the DC index: at most 16 DCs).
fn lane(dc: usize) -> ckf_core::identity::LaneIndex {
    ckf_core::identity::LaneIndex::try_from(dc).expect("at most 16 DCs")
}

#[cfg(test)]
mod tests;
