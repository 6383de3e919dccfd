//! Choosing the DC that answers a request first: the expected time to first token (TTFT) of
//! every ready DC from its cached prefix, its pool's load and the round trip to it; the DCs
//! ranked, and the choice with its reason. Pure: the caller gives the prefix depths of a search,
//! each DC's latest load report with its age, and the round trips; [`Bookings`] adds the choices
//! made since a DC's last report to its load.
//!
//! ## The model
//!
//! For a request of `T` tokens, of which `C_d` are cached in DC `d` (prefix depth x block size):
//!
//! ```text
//! ttft_d  = rtt_d + queue_d + (T - C_d) / (capacity_d / engines_d)
//! queue_d = (waiting_d + booked_d) * queued_request_tokens / capacity_d
//! ```
//!
//! - `rtt_d`: the router's round trip to `d`: the request's own when it gives one, else the
//!   configured one for `d`, else [`RouteModel::default_rtt`].
//! - `capacity_d`: the prefill tokens/s of `d`'s pool, from its load report; without a usable
//!   report, [`RouteModel::default_prefill_tokens_per_s`].
//! - `engines_d`: the engines whose load is in that report (1 without one, or when it has no
//!   capacity: then one engine of the default). The pool's queue
//!   drains at the whole pool's rate, but one request is prefilled by one engine, at its share
//!   of the capacity: in a pool of four engines a request's uncached tokens take four times
//!   what the pool's capacity alone would say.
//! - `waiting_d`: requests queued at the pool's engines, from its load report.
//! - `booked_d`: requests this indexer sent to `d` after that report's observation
//!   ([`Bookings`]): a burst of one hot prefix spreads as the model says instead of all landing
//!   on the deepest DC.
//! - `queued_request_tokens`: the prefill work one queued request stands for
//!   ([`RouteModel::queued_request_tokens`]).
//!
//! A DC whose load is unknown (no report, or one older than [`RouteModel::stale_after`]) is
//! estimated with no queue and the default capacity, and says so ([`LoadState`]): it is ranked
//! by its cached prefix and round trip only.
//!
//! The load itself: [`EngineLoad`] (one engine's, as read from its metrics), [`PoolLoad`]
//! (a pool's, [`PoolLoad::from_engines`] over the engines that reported), and at the indexer
//! [`LaneLoads`] (each lane's newest report and its age).
//!
//! DCs are ranked by expected TTFT; equal estimates go to the deeper prefix, then the lower
//! lane. The choice is the first ([`Reason::Fastest`]), unless a DC whose estimate is within
//! [`RouteModel::prefer_deeper_within`] of the first's holds a deeper prefix: then the deepest of
//! those, the first of them in rank order among equals ([`Reason::DeepestOfEqual`], as when a
//! tie was broken by depth). The estimate is of this request alone; keeping a conversation
//! where its prefix is cached when the difference is small is what keeps the next turn's hit:
//! on the serving model (`ckf simulate`) a band of 0.25 kept expected-TTFT's hit rate within a
//! point of the deepest-prefix policy's, where 0 lost three.

use std::time::{Duration, Instant};

use crate::identity::LaneIndex;

/// The model's parameters (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RouteModel {
    /// Round trip to a DC when the request gives none for it.
    pub default_rtt: Duration,
    /// Prefill tokens/s of a pool without a usable load report.
    pub default_prefill_tokens_per_s: f64,
    /// The prefill work one queued request stands for, tokens.
    pub queued_request_tokens: f64,
    /// A load report older than this is unknown.
    pub stale_after: Duration,
    /// Estimates within this fraction of the fastest count as equal: the deepest cached
    /// prefix among them is chosen (0: only exactly equal ones).
    pub prefer_deeper_within: f64,
}

impl Default for RouteModel {
    /// 1 ms round trip, 10,000 prefill tokens/s, 1,024 tokens per queued request, reports
    /// stale after 5 s, a deeper prefix preferred within 25% of the fastest estimate.
    fn default() -> Self {
        Self {
            default_rtt: Duration::from_millis(1),
            default_prefill_tokens_per_s: 10_000.0,
            queued_request_tokens: 1_024.0,
            stale_after: Duration::from_secs(5),
            prefer_deeper_within: 0.25,
        }
    }
}

/// One DC pool's load, as its producer reports it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PoolLoad {
    /// Engines whose load is in this report.
    pub engines_reporting: u32,
    /// Engines configured in the pool.
    pub engines_configured: u32,
    /// Requests running at the reporting engines.
    pub running: u32,
    /// Requests waiting at the reporting engines.
    pub waiting: u32,
    /// KV-cache usage of the reporting engines, 0.0..=1.0.
    pub kv_usage: f64,
    /// Prefill tokens/s of the reporting engines (configured per engine).
    pub prefill_tokens_per_s: f64,
}

/// One engine's load, as read from its metrics.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct EngineLoad {
    /// Requests running.
    pub running: u32,
    /// Requests waiting.
    pub waiting: u32,
    /// KV-cache usage, 0.0..=1.0.
    pub kv_usage: f64,
}

/// One configured engine's share of its pool's load.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineShare {
    /// Its last load; `None` when unknown (its scrape failed, or it is down).
    pub load: Option<EngineLoad>,
    /// Its configured prefill capacity, tokens/s, all its ranks together (0: not configured).
    pub prefill_tokens_per_s: f64,
    /// Its data-parallel ranks (at least 1): each prefills its own requests, so the engine
    /// counts as that many in [`PoolLoad::engines_reporting`] and [`PoolLoad::engines_configured`].
    pub ranks: u32,
}

impl PoolLoad {
    /// A pool's load from its engines' shares: requests summed and KV-cache usage averaged
    /// over the engines that reported, the capacity theirs, engines counted by their
    /// data-parallel ranks; an engine without a load counts among the configured only (its
    /// share is unknown, never zero). A reporting engine without a configured capacity counts
    /// at the mean capacity per rank of those with one (so capacity / engines stays one rank's
    /// share); when none has one the pool's capacity is 0 (not known). `None` when none
    /// reported.
    pub fn from_engines(shares: &[EngineShare]) -> Option<PoolLoad> {
        let ranks = |s: &EngineShare| u64::from(s.ranks.max(1));
        let reporting: Vec<(EngineLoad, &EngineShare)> = shares
            .iter()
            .filter_map(|s| s.load.map(|l| (l, s)))
            .collect();
        if reporting.is_empty() {
            return None;
        }
        let n = reporting.len();
        let engines: u64 = reporting.iter().map(|(_, s)| ranks(s)).sum();
        let count = |x: u64| u32::try_from(x).unwrap_or(u32::MAX);
        // Capacity per rank of the engines that have one; the others count at its mean.
        let known = reporting
            .iter()
            .filter(|(_, s)| s.prefill_tokens_per_s.is_finite() && s.prefill_tokens_per_s > 0.0);
        let (known_capacity, known_ranks) = known.fold((0.0, 0_u64), |(c, r), (_, s)| {
            (c + s.prefill_tokens_per_s, r + ranks(s))
        });
        Some(PoolLoad {
            engines_reporting: count(engines),
            engines_configured: count(shares.iter().map(ranks).sum()),
            running: reporting
                .iter()
                .fold(0_u32, |sum, (l, _)| sum.saturating_add(l.running)),
            waiting: reporting
                .iter()
                .fold(0_u32, |sum, (l, _)| sum.saturating_add(l.waiting)),
            kv_usage: reporting.iter().map(|(l, _)| l.kv_usage).sum::<f64>() / n as f64,
            prefill_tokens_per_s: if known_ranks == 0 {
                0.0
            } else {
                known_capacity * engines as f64 / known_ranks as f64
            },
        })
    }
}

/// What the model knows of one ready DC.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DcInput {
    /// Its lane.
    pub lane: LaneIndex,
    /// Leading blocks of the request it holds.
    pub depth: u32,
    /// Tokens per block of its pool.
    pub block_size: u32,
    /// The router's own round trip to it, if the request gives one.
    pub rtt: Option<Duration>,
    /// The configured round trip to it, if any (else [`RouteModel::default_rtt`]).
    pub configured_rtt: Option<Duration>,
    /// Its latest load report and how old it is.
    pub load: Option<(PoolLoad, Duration)>,
    /// Requests sent to it since that report ([`Bookings::booked`]).
    pub booked: u32,
}

/// Whether a DC's load entered its estimate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LoadState {
    /// A report within [`RouteModel::stale_after`], this old.
    Known(Duration),
    /// A report older than [`RouteModel::stale_after`]: not used.
    Stale(Duration),
    /// No report.
    Unknown,
}

/// One DC's estimate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DcEstimate {
    /// Its lane.
    pub lane: LaneIndex,
    /// Tokens of the request it holds (depth x block size, at most the request's).
    pub cached_tokens: u64,
    /// Tokens it would prefill.
    pub uncached_tokens: u64,
    /// The round trip used.
    pub rtt: Duration,
    /// Whether the round trip came from the request.
    pub rtt_from_request: bool,
    /// Whether its load entered the estimate.
    pub load: LoadState,
    /// The capacity used, prefill tokens/s.
    pub capacity: f64,
    /// Expected wait behind the queued and booked requests.
    pub queue: Duration,
    /// Expected prefill of the uncached tokens, on one engine of the pool.
    pub prefill: Duration,
    /// Expected time to first token: `rtt + queue + prefill`.
    pub ttft: Duration,
}

/// Why the first DC was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The lowest expected TTFT.
    Fastest,
    /// Estimates equal to the lowest, or within [`RouteModel::prefer_deeper_within`] of it;
    /// the deepest cached prefix among them.
    DeepestOfEqual,
}

impl Reason {
    /// A short stable label for metrics: `"fastest"`, `"deepest_of_equal"`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Fastest => "fastest",
            Self::DeepestOfEqual => "deepest_of_equal",
        }
    }
}

/// The answer: every DC ranked, fastest first, and the choice.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    /// The DCs' estimates, in rank order.
    pub ranked: Vec<DcEstimate>,
    /// The first DC's lane and why; `None` with no DC.
    pub choice: Option<(LaneIndex, Reason)>,
}

/// Estimates each DC in `dcs` for a request of `request_tokens` tokens and ranks them.
pub fn route(model: &RouteModel, request_tokens: u64, dcs: &[DcInput]) -> Route {
    let mut ranked: Vec<DcEstimate> = dcs
        .iter()
        .map(|dc| estimate(model, request_tokens, dc))
        .collect();
    ranked.sort_by(|a, b| {
        a.ttft
            .cmp(&b.ttft)
            .then(b.cached_tokens.cmp(&a.cached_tokens))
            .then(a.lane.cmp(&b.lane))
    });
    let choice = ranked.first().map(|first| {
        let bound = seconds(first.ttft.as_secs_f64() * (1.0 + model.prefer_deeper_within.max(0.0)))
            .max(first.ttft);
        let equal = ranked.iter().take_while(|e| e.ttft <= bound);
        let chosen = equal.fold(first, |best, e| {
            if e.cached_tokens > best.cached_tokens {
                e
            } else {
                best
            }
        });
        // An exact tie with the first broken by depth also counts as depth's choice.
        let tie_broken_by_depth = ranked.get(1).is_some_and(|second| {
            second.ttft == first.ttft && second.cached_tokens != first.cached_tokens
        });
        let reason = if chosen.lane != first.lane || tie_broken_by_depth {
            Reason::DeepestOfEqual
        } else {
            Reason::Fastest
        };
        (chosen.lane, reason)
    });
    Route { ranked, choice }
}

fn estimate(model: &RouteModel, request_tokens: u64, dc: &DcInput) -> DcEstimate {
    let cached_tokens = (u64::from(dc.depth) * u64::from(dc.block_size)).min(request_tokens);
    let uncached_tokens = request_tokens - cached_tokens;
    let load = match dc.load {
        Some((_, age)) if age > model.stale_after => LoadState::Stale(age),
        Some((_, age)) => LoadState::Known(age),
        None => LoadState::Unknown,
    };
    let report = match load {
        LoadState::Known(_) => dc.load.map(|(report, _)| report),
        _ => None,
    };
    // The report's capacity over its engines; without a usable one, one engine of the default.
    let (capacity, engines) = report
        .filter(|r| r.prefill_tokens_per_s.is_finite() && r.prefill_tokens_per_s > 0.0)
        .map_or((model.default_prefill_tokens_per_s, 1.0), |r| {
            (
                r.prefill_tokens_per_s,
                f64::from(r.engines_reporting.max(1)),
            )
        });
    let queued = report.map_or(0.0, |r| f64::from(r.waiting) + f64::from(dc.booked));
    let queue = seconds(queued * model.queued_request_tokens / capacity);
    let prefill = seconds(uncached_tokens as f64 * engines / capacity);
    let rtt = dc.rtt.or(dc.configured_rtt).unwrap_or(model.default_rtt);
    DcEstimate {
        lane: dc.lane,
        cached_tokens,
        uncached_tokens,
        rtt,
        rtt_from_request: dc.rtt.is_some(),
        load,
        capacity,
        queue,
        prefill,
        ttft: rtt.saturating_add(queue).saturating_add(prefill),
    }
}

/// `s` seconds, rounded to the nanosecond (estimates are compared as [`Duration`]s, so equal
/// inputs give equal estimates); NaN or at most 0 as 0, infinite or huge as [`Duration::MAX`]
/// (an overflowing queue is the longest, never the shortest).
fn seconds(s: f64) -> Duration {
    if s.is_nan() || s <= 0.0 {
        Duration::ZERO
    } else {
        Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX)
    }
}

/// Requests sent to each lane that its latest load report cannot count yet: made after that
/// report's observation. Added to the lane's queue until a report observed after them arrives
/// (a report re-sending an older observation covers only the choices made before it). Per
/// indexer replica (each books its own choices). At most [`Bookings::MAX_PER_LANE`] are kept per
/// lane; beyond, the oldest are forgotten.
#[derive(Debug, Clone, Default)]
pub struct Bookings {
    booked: Vec<std::collections::VecDeque<Instant>>,
}

impl Bookings {
    /// Most bookings kept per lane.
    pub const MAX_PER_LANE: usize = 1 << 16;

    /// Requests booked on `lane` that no report has counted.
    pub fn booked(&self, lane: LaneIndex) -> u32 {
        self.booked
            .get(usize::from(lane))
            .map_or(0, |b| u32::try_from(b.len()).unwrap_or(u32::MAX))
    }

    /// A request was sent to `lane` at `at`.
    pub fn book(&mut self, lane: LaneIndex, at: Instant) {
        let i = usize::from(lane);
        if self.booked.len() <= i {
            self.booked.resize_with(i + 1, Default::default);
        }
        let lane = &mut self.booked[i];
        if lane.len() == Self::MAX_PER_LANE {
            lane.pop_front();
        }
        lane.push_back(at);
    }

    /// A load report of `lane` observed at `observed_at` was kept: it counts the requests
    /// booked at or before then.
    pub fn reported(&mut self, lane: LaneIndex, observed_at: Instant) {
        if let Some(b) = self.booked.get_mut(usize::from(lane)) {
            while b.front().is_some_and(|&at| at <= observed_at) {
                b.pop_front();
            }
        }
    }
}

/// Why a lane's load report was not kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LoadRefused {
    /// An older report than the one kept (a lower sequence under the same lease, or an older
    /// lease).
    #[error("an older report than the one kept")]
    Older,
    /// A value out of range (usage outside 0..=1, a capacity neither 0 nor a finite number
    /// >= 1, no engine reporting, more engines reporting than configured).
    #[error("invalid load report: {0}")]
    Invalid(&'static str),
}

impl LoadRefused {
    /// A short stable label for metrics: `"older"`, `"invalid"`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Older => "older",
            Self::Invalid(_) => "invalid",
        }
    }
}

/// One lane's kept report.
#[derive(Debug, Clone, Copy)]
struct Kept {
    epoch: u64,
    sequence: u64,
    load: PoolLoad,
    /// When it was observed, on this process's clock (received minus the age it was sent
    /// with): its age never depends on the two hosts' clocks agreeing.
    observed: Instant,
}

/// The newest load report of each lane, with its age (the indexer's side of `LoadReport`).
#[derive(Debug, Default)]
pub struct LaneLoads {
    lanes: Vec<Option<Kept>>,
    /// Per lane, the lease epoch below which reports are refused (a newer lease took the lane).
    floors: Vec<u64>,
}

impl LaneLoads {
    /// Keeps `load`, sent under lease `epoch` as report `sequence`, `age` old when sent and
    /// received `now`, unless an older report than the lane's kept one or out of range.
    ///
    /// # Errors
    /// [`LoadRefused`]; the kept report is unchanged.
    pub fn report(
        &mut self,
        lane: LaneIndex,
        epoch: u64,
        sequence: u64,
        load: PoolLoad,
        age: Duration,
        now: Instant,
    ) -> Result<(), LoadRefused> {
        if !(0.0..=1.0).contains(&load.kv_usage) {
            return Err(LoadRefused::Invalid("kv_usage outside 0..=1"));
        }
        let capacity = load.prefill_tokens_per_s;
        if !capacity.is_finite() || !(capacity == 0.0 || capacity >= 1.0) {
            return Err(LoadRefused::Invalid(
                "prefill_tokens_per_s neither 0 (not configured) nor a finite number >= 1",
            ));
        }
        if load.engines_reporting > load.engines_configured {
            return Err(LoadRefused::Invalid(
                "more engines reporting than configured",
            ));
        }
        if load.engines_reporting == 0 {
            return Err(LoadRefused::Invalid("a report of no engine"));
        }
        let i = usize::from(lane);
        if self.lanes.len() <= i {
            self.lanes.resize(i + 1, None);
        }
        let older_lease = self.floors.get(i).is_some_and(|&floor| epoch < floor);
        if older_lease
            || self.lanes[i].is_some_and(|kept| (epoch, sequence) <= (kept.epoch, kept.sequence))
        {
            return Err(LoadRefused::Older);
        }
        self.lanes[i] = Some(Kept {
            epoch,
            sequence,
            load,
            observed: now.checked_sub(age).unwrap_or(now),
        });
        Ok(())
    }

    /// A lease of `epoch` took `lane`: the report of the lease before it no longer describes the
    /// pool (its producer is gone or restarted), so the lane has none until the new lease
    /// reports, and a report of an older lease is refused from now on.
    pub fn lease_started(&mut self, lane: LaneIndex, epoch: u64) {
        let i = usize::from(lane);
        if self.floors.len() <= i {
            self.floors.resize(i + 1, 0);
        }
        self.floors[i] = self.floors[i].max(epoch);
        if let Some(kept) = self.lanes.get_mut(i)
            && kept.is_some_and(|k| k.epoch < epoch)
        {
            *kept = None;
        }
    }

    /// `lane`'s newest report and its age at `now`, if it has one.
    pub fn latest(&self, lane: LaneIndex, now: Instant) -> Option<(PoolLoad, Duration)> {
        let kept = self.lanes.get(usize::from(lane)).copied().flatten()?;
        Some((kept.load, now.saturating_duration_since(kept.observed)))
    }
}

#[cfg(test)]
mod tests;
