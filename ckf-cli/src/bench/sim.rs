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

use ckf_core::route::{Bookings, DcInput, PoolLoad, route};

use crate::bench::fleet::{Fleet, FleetShape};
use crate::bench::policy::{Policy, Router, Signals};
use crate::bench::trace::{Request, TOKENS_PER_BLOCK};

mod model;
mod pools;
pub use model::{
    DEFAULT_DC_PREFILL_TOKENS_PER_S, DEFAULT_QUEUED_REQUEST_TOKENS, DEFAULT_RTT_MS, DcServed,
    DcServing, HitRate, ModelClock, PolicyServing, ServingModel, offered_tokens_per_s,
};
pub use pools::Pools;

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
    let mut clock = ModelClock::new(model.speed);
    let mut next_observation = interval;
    let (mut requested, mut reused) = (0u64, 0u64);
    for (request, hashes) in requests.iter().zip(hashes) {
        let now = clock.time_of(request);
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
