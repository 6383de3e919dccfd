//! A producer's pool load from its engines' shares: the configured engines (`[[engines]]`,
//! scraped from their metrics or pushed) and the workers that push their load
//! (`Ingest/ReportLoad`) without being configured. Pure: the caller passes the clock; the
//! pool's sum is [`PoolLoad::from_engines`]'s.
//!
//! Rules of a pushed report ([`PoolShares::push`]):
//! * **Valid values.** KV-cache usage a finite number in 0..=1; a prefill capacity, when given,
//!   0 (not known) or 1..=1e9 tokens/s ([`MIN_CAPACITY`], [`MAX_CAPACITY`]); an observation
//!   age below the share's time to live (an older one would be unknown on arrival). Requests
//!   running and waiting are unsigned. A refused report changes nothing.
//! * **A configured engine.** A push naming the `worker_id` of an `[[engines]]` entry is that
//!   engine's share, unless the engine's load is scraped (`metrics_url`): one source per
//!   engine, so that push is refused. Its configured `prefill_tokens_per_s` wins when not 0;
//!   else the pushed one.
//! * **Any other worker** gets a pushed share of its own, with the pushed capacity (absent: 0,
//!   not known: it counts at the mean capacity per engine of those with one, like an engine
//!   configured without one; [`PoolLoad::from_engines`]).
//!   It counts among the pool's configured engines from its first accepted push until it is
//!   forgotten ([`FORGET_AFTER_TTLS`] times the time to live after its last observation).
//! * **Expiry.** A pushed share is known for its time to live (`engine.pushed_load_ttl_ms`)
//!   after its observation (received minus the age it was sent with), then unknown: it still
//!   counts as configured, not reporting, never as zero load.
//! * **Bounded.** At most [`PushLimits::max_pushed`] workers not configured hold a pushed share
//!   at once (forgotten ones make room first, swept at most once per time to live); a push for
//!   another one is refused ([`PushRefused::Full`]) until one is forgotten. Configured engines need no room.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::route::{EngineLoad, EngineShare, PoolLoad};

/// The smallest pushed prefill capacity, tokens/s (the Relay's `LoadReport` rule).
pub const MIN_CAPACITY: f64 = 1.0;
/// The largest pushed prefill capacity, tokens/s: a pool of the most workers at this rate still
/// sums to a finite capacity the indexer accepts.
pub const MAX_CAPACITY: f64 = 1e9;

/// A pushed share not renewed is forgotten this many times its time to live after its last
/// observation (it then no longer counts as configured and frees its room).
pub const FORGET_AFTER_TTLS: u32 = 10;

/// How long pushed shares live and how many workers not configured may hold one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PushLimits {
    /// A pushed share is known this long after its observation, then unknown.
    pub ttl: Duration,
    /// Workers not configured that may hold a pushed share at once (0: only configured
    /// engines may push).
    pub max_pushed: usize,
}

/// One configured engine (`[[engines]]` entry).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConfiguredEngine {
    /// Its worker id.
    pub worker_id: u64,
    /// Its configured prefill capacity, tokens/s, all its ranks together (0: not configured).
    pub prefill_tokens_per_s: f64,
    /// Its data-parallel ranks (`dp_size`, at least 1).
    pub ranks: u32,
    /// Whether its load is scraped from its metrics (then it cannot be pushed).
    pub scraped: bool,
}

/// One worker's load as pushed (`Ingest/ReportLoad`), decoded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PushedLoad {
    /// The worker whose load it is.
    pub worker_id: u64,
    /// Its requests and KV-cache usage.
    pub load: EngineLoad,
    /// Its prefill capacity, tokens/s, if the pusher gives one.
    pub prefill_tokens_per_s: Option<f64>,
    /// How old the observation was when sent.
    pub age: Duration,
}

/// What an accepted push holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PushAccepted {
    /// The capacity the share counts with, tokens/s (the configured one when it wins).
    pub prefill_tokens_per_s: f64,
    /// How long the share stays known unless pushed again.
    pub expires_in: Duration,
}

/// Why a pushed report was refused (nothing changed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PushRefused {
    /// A value out of range: the field and the rule.
    #[error("{field}: {rule}")]
    Invalid {
        /// The field (its wire name).
        field: &'static str,
        /// The rule it breaks, with its value.
        rule: String,
    },
    /// The worker is a configured engine whose load is scraped.
    #[error(
        "worker_id: worker {0}'s load is scraped from its configured metrics_url and cannot be pushed as well"
    )]
    Scraped(u64),
    /// No room for another worker not configured.
    #[error(
        "worker_id: {limit} workers not configured already push their load (engine.max_pushed_workers); worker {worker_id} is refused until one is forgotten"
    )]
    Full {
        /// The refused worker.
        worker_id: u64,
        /// The limit.
        limit: usize,
    },
}

impl PushRefused {
    /// A short stable label for metrics: `"invalid"` (a value, or a scraped engine),
    /// `"full"`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Invalid { .. } | Self::Scraped(_) => "invalid",
            Self::Full { .. } => "full",
        }
    }
}

/// A share's latest reading: the load and when it was observed.
#[derive(Debug, Clone, Copy)]
struct Reading {
    load: EngineLoad,
    observed: Instant,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    engine: ConfiguredEngine,
    reading: Option<Reading>,
    /// The capacity of its last accepted push (0: none given, or never pushed).
    pushed_capacity: f64,
}

impl Slot {
    /// Its capacity: the configured one when not 0, else the pushed one.
    fn capacity(&self) -> f64 {
        if self.engine.prefill_tokens_per_s > 0.0 {
            self.engine.prefill_tokens_per_s
        } else {
            self.pushed_capacity
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Pushed {
    reading: Reading,
    prefill_tokens_per_s: f64,
}

/// Every share of one pool: the configured engines (in configuration order) and the pushed
/// workers not configured (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct PoolShares {
    configured: Vec<Slot>,
    pushed: BTreeMap<u64, Pushed>,
    limits: PushLimits,
    /// When the pushed workers may next be swept for forgotten ones (at most once per time to
    /// live, so a flood of new ids against a full board costs no sweep each).
    next_sweep: Option<Instant>,
}

impl PoolShares {
    /// Every configured engine unknown, no pushed worker.
    pub fn new(engines: &[ConfiguredEngine], limits: PushLimits) -> Self {
        Self {
            configured: engines
                .iter()
                .map(|&engine| Slot {
                    engine,
                    reading: None,
                    pushed_capacity: 0.0,
                })
                .collect(),
            pushed: BTreeMap::new(),
            limits,
            next_sweep: None,
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> PushLimits {
        self.limits
    }

    /// Configured engine `index` (configuration order) was scraped at `now`: its load, or
    /// `None` when it could not be read (unknown until the next scrape). An index past the
    /// configured engines is ignored.
    pub fn scraped(&mut self, index: usize, load: Option<EngineLoad>, now: Instant) {
        if let Some(slot) = self.configured.get_mut(index) {
            slot.reading = load.map(|load| Reading {
                load,
                observed: now,
            });
        }
    }

    /// Keeps `report`, received at `now`, as its worker's share (the rules are in the
    /// [module docs](self)).
    ///
    /// # Errors
    /// [`PushRefused`]; nothing changed.
    pub fn push(&mut self, report: &PushedLoad, now: Instant) -> Result<PushAccepted, PushRefused> {
        validate(report, self.limits.ttl)?;
        let reading = Reading {
            load: report.load,
            observed: now.checked_sub(report.age).unwrap_or(now),
        };
        let expires_in = self.limits.ttl.saturating_sub(report.age);
        let pushed_capacity = report.prefill_tokens_per_s.unwrap_or(0.0);
        if let Some(slot) = self
            .configured
            .iter_mut()
            .find(|s| s.engine.worker_id == report.worker_id)
        {
            if slot.engine.scraped {
                return Err(PushRefused::Scraped(report.worker_id));
            }
            slot.reading = Some(reading);
            slot.pushed_capacity = pushed_capacity;
            return Ok(PushAccepted {
                prefill_tokens_per_s: slot.capacity(),
                expires_in,
            });
        }
        if !self.pushed.contains_key(&report.worker_id) {
            if self.pushed.len() >= self.limits.max_pushed
                && self.next_sweep.is_none_or(|at| now >= at)
            {
                let forget = self.forget_after();
                self.pushed
                    .retain(|_, p| now.saturating_duration_since(p.reading.observed) < forget);
                self.next_sweep = now.checked_add(self.limits.ttl);
            }
            if self.pushed.len() >= self.limits.max_pushed {
                return Err(PushRefused::Full {
                    worker_id: report.worker_id,
                    limit: self.limits.max_pushed,
                });
            }
        }
        self.pushed.insert(
            report.worker_id,
            Pushed {
                reading,
                prefill_tokens_per_s: pushed_capacity,
            },
        );
        Ok(PushAccepted {
            prefill_tokens_per_s: pushed_capacity,
            expires_in,
        })
    }

    /// The pool's load at `now` and the age of its oldest known reading; `None` when no
    /// share is known.
    pub fn pool(&self, now: Instant) -> Option<(PoolLoad, Duration)> {
        let shares = self.shares(now);
        let pool = PoolLoad::from_engines(&shares.iter().map(|(s, _)| *s).collect::<Vec<_>>())?;
        let oldest = shares.iter().filter_map(|(_, observed)| *observed).min()?;
        Some((pool, now.saturating_duration_since(oldest)))
    }

    /// Engines counted as configured at `now`: the configured ones and the pushed workers not
    /// yet forgotten.
    pub fn configured(&self, now: Instant) -> u32 {
        u32::try_from(self.shares(now).len()).unwrap_or(u32::MAX)
    }

    /// Pushed workers not configured held now (forgotten ones included until a push for a
    /// new worker makes room).
    pub fn pushed_workers(&self) -> usize {
        self.pushed.len()
    }

    fn forget_after(&self) -> Duration {
        self.limits.ttl.saturating_mul(FORGET_AFTER_TTLS)
    }

    /// Every share counted at `now`, with the observation of a known one.
    fn shares(&self, now: Instant) -> Vec<(EngineShare, Option<Instant>)> {
        let ttl = self.limits.ttl;
        let forget = self.forget_after();
        let age = |r: &Reading| now.saturating_duration_since(r.observed);
        let configured = self.configured.iter().map(|slot| {
            // A scraped reading holds until the next scrape; a pushed one for its time to live.
            let known = slot.reading.filter(|r| slot.engine.scraped || age(r) < ttl);
            let share = EngineShare {
                load: known.map(|r| r.load),
                prefill_tokens_per_s: slot.capacity(),
                ranks: slot.engine.ranks.max(1),
            };
            (share, known.map(|r| r.observed))
        });
        let pushed = self
            .pushed
            .values()
            .filter(|p| age(&p.reading) < forget)
            .map(|p| {
                let known = (age(&p.reading) < ttl).then_some(p.reading);
                let share = EngineShare {
                    load: known.map(|r| r.load),
                    prefill_tokens_per_s: p.prefill_tokens_per_s,
                    ranks: 1,
                };
                (share, known.map(|r| r.observed))
            });
        configured.chain(pushed).collect()
    }
}

/// Whether `report`'s values are in range for a share living `ttl`.
fn validate(report: &PushedLoad, ttl: Duration) -> Result<(), PushRefused> {
    let usage = report.load.kv_usage;
    if !(0.0..=1.0).contains(&usage) {
        return Err(PushRefused::Invalid {
            field: "kv_usage",
            rule: format!("{usage} is not a number in 0..=1"),
        });
    }
    if let Some(capacity) = report.prefill_tokens_per_s
        && !(capacity == 0.0 || (MIN_CAPACITY..=MAX_CAPACITY).contains(&capacity))
    {
        return Err(PushRefused::Invalid {
            field: "prefill_tokens_per_s",
            rule: format!(
                "{capacity} is neither 0 (not known) nor a number of tokens/s in {MIN_CAPACITY}..={MAX_CAPACITY}"
            ),
        });
    }
    if report.age >= ttl {
        return Err(PushRefused::Invalid {
            field: "age_ms",
            rule: format!(
                "{} ms is not below the pushed load's time to live ({} ms): the share would be unknown on arrival",
                report.age.as_millis(),
                ttl.as_millis()
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
