//! The serving model's parameters (per DC capacity and round trip, speed, load interval,
//! queued-request tokens) and what a policy did on it (hit rate, TTFT, per-DC shares and
//! queues). The rules are [`crate::bench::sim`]'s module docs.

use std::time::Duration;

use ckf_core::route::RouteModel;
use serde::Serialize;

use crate::bench::policy::Policy;
use crate::bench::stats::Summary;
use crate::bench::trace::Request;

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
    pub(super) fn route_model(&self) -> RouteModel {
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

/// The model's time of each request in replay order: its timestamp / speed, never before the
/// previous request's (an out-of-order timestamp counts as the previous one), seconds.
#[derive(Debug, Clone)]
pub struct ModelClock {
    speed: f64,
    last: f64,
}

impl ModelClock {
    /// A clock for arrivals at `speed` times the timestamps' pace.
    pub fn new(speed: f64) -> Self {
        Self { speed, last: 0.0 }
    }

    /// `request`'s time (requests asked in replay order).
    pub fn time_of(&mut self, request: &Request) -> f64 {
        self.last = self
            .last
            .max(request.timestamp_ms as f64 / 1_000.0 / self.speed);
        self.last
    }
}
