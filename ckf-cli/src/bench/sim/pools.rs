//! The serving model's DC pools: first-come-first-served engines, one per rank, and what a
//! policy's choices cost in time to first token. The offline comparison
//! ([`serve`](super::serve)) and the live run ([`crate::bench::live`]) both serve through it;
//! the live run's simulated engines also export [`Pools::engine_load`] on their Prometheus
//! endpoints ([`crate::bench::live::engines`]).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use ckf_core::route::{EngineLoad, EngineShare, PoolLoad};

use super::model::{DcServed, DcServing, HitRate, PolicyServing, ServingModel};
use crate::bench::fleet::{FleetShape, RankId};
use crate::bench::policy::Policy;
use crate::bench::stats::Summary;
use crate::bench::trace::TOKENS_PER_BLOCK;

/// One engine: first come first served, one request at a time.
#[derive(Debug, Clone, Default)]
struct Engine {
    busy_until: f64,
    /// Requests not known to be finished at the last forget: (arrival, start, finish), s.
    jobs: VecDeque<(f64, f64, f64)>,
    /// Its rank's cached blocks / capacity after the last request it served.
    kv_usage: f64,
}

impl Engine {
    /// Queues a request arriving at `arrival` with `work` seconds of prefill; its finish time.
    fn admit(&mut self, arrival: f64, work: f64) -> f64 {
        let start = arrival.max(self.busy_until);
        let finish = start + work;
        self.busy_until = finish;
        self.jobs.push_back((arrival, start, finish));
        finish
    }

    /// Requests running and waiting at `t`.
    fn load_at(&self, t: f64) -> (u32, u32) {
        let (mut running, mut waiting) = (0, 0);
        for &(arrival, start, finish) in &self.jobs {
            if start <= t && t < finish {
                running += 1;
            } else if arrival <= t && t < start {
                waiting += 1;
            }
        }
        (running, waiting)
    }

    /// Forgets the requests finished by `t`.
    fn forget_until(&mut self, t: f64) {
        while self.jobs.front().is_some_and(|&(_, _, finish)| finish <= t) {
            self.jobs.pop_front();
        }
    }
}

/// Every DC's engines, and what the requests served so far cost. Times are seconds on the
/// model's clock (a request's trace timestamp / `speed`).
#[derive(Debug, Clone)]
pub struct Pools {
    shape: FleetShape,
    dcs: Vec<DcServing>,
    /// DC `dc`'s engine for rank `i` (`worker * ranks_per_worker + rank`) at
    /// `dc * ranks_per_dc + i`.
    engines: Vec<Engine>,
    /// First tokens not back yet at the router, per DC (ns, earliest first).
    returns: Vec<BinaryHeap<Reverse<u64>>>,
    served: Vec<DcServed>,
    ttfts_ms: Vec<f64>,
}

impl Pools {
    /// Idle pools for `shape` with `model`'s capacities and round trips.
    ///
    /// # Panics
    /// When `model` does not validate against the shape.
    pub fn new(shape: FleetShape, model: &ServingModel) -> Self {
        model.validate(shape.dcs).expect("valid serving model");
        Self {
            shape,
            dcs: model.dcs.clone(),
            engines: vec![Engine::default(); shape.dcs * shape.ranks_per_dc()],
            returns: vec![BinaryHeap::new(); shape.dcs],
            served: vec![DcServed::default(); shape.dcs],
            ttfts_ms: Vec::new(),
        }
    }

    fn engine_index(&self, rank_id: RankId) -> usize {
        rank_id.dc * self.shape.ranks_per_dc()
            + rank_id.worker * self.shape.ranks_per_worker
            + rank_id.rank
    }

    fn pool_mut(&mut self, dc: usize) -> &mut [Engine] {
        let per_dc = self.shape.ranks_per_dc();
        &mut self.engines[dc * per_dc..(dc + 1) * per_dc]
    }

    /// Per DC, the requests whose first token is not back at the router by `now`.
    pub fn in_flight(&mut self, now: f64) -> Vec<u64> {
        self.returns
            .iter_mut()
            .map(|heap| {
                while heap.peek().is_some_and(|&Reverse(t)| t as f64 <= now * 1e9) {
                    heap.pop();
                }
                heap.len() as u64
            })
            .collect()
    }

    /// Serves a request the router sent at `now` to `rank_id`'s engine: it travels half the
    /// DC's round trip, waits, prefills its `input_length` tokens less the `reused_blocks` its
    /// rank held, and its first token travels back. `kv_usage` is the rank's cache fill after
    /// the request. Returns its time to first token, ms.
    pub fn admit(
        &mut self,
        now: f64,
        rank_id: RankId,
        input_length: u64,
        reused_blocks: usize,
        kv_usage: f64,
    ) -> f64 {
        let dc = rank_id.dc;
        let cached = (reused_blocks as u64 * TOKENS_PER_BLOCK).min(input_length);
        let uncached = (input_length - cached) as f64;
        let DcServing {
            prefill_tokens_per_s,
            rtt_ms,
        } = self.dcs[dc];
        let engine_rate = prefill_tokens_per_s / self.shape.ranks_per_dc() as f64;
        let half_trip = rtt_ms / 2_000.0;
        let arrival = now + half_trip;
        let index = self.engine_index(rank_id);
        let engine = &mut self.engines[index];
        engine.kv_usage = kv_usage;
        let first_token = engine.admit(arrival, uncached / engine_rate);
        let back = first_token + half_trip;
        let ttft_ms = (back - now) * 1e3;
        self.ttfts_ms.push(ttft_ms);
        self.returns[dc].push(Reverse((back * 1e9) as u64));
        let waiting: u32 = self.pool_mut(dc).iter().map(|e| e.load_at(arrival).1).sum();
        let entry = &mut self.served[dc];
        entry.requests += 1;
        entry.peak_queue = entry.peak_queue.max(u64::from(waiting));
        ttft_ms
    }

    /// Forgets every request finished by `t` (no later question may ask about an earlier time).
    pub fn forget_until(&mut self, t: f64) {
        for engine in &mut self.engines {
            engine.forget_until(t);
        }
    }

    /// `rank_id`'s engine at `t`: running and waiting requests and KV-cache usage.
    pub fn engine_load(&self, rank_id: RankId, t: f64) -> EngineLoad {
        let engine = &self.engines[self.engine_index(rank_id)];
        let (running, waiting) = engine.load_at(t);
        EngineLoad {
            running,
            waiting,
            kv_usage: engine.kv_usage,
        }
    }

    /// DC `dc`'s pool at `at` as its producer would report it: every engine's load at its
    /// share of the capacity. Forgets the pool's requests finished by `at`.
    pub fn observe(&mut self, dc: usize, at: f64) -> Option<PoolLoad> {
        let rate = self.dcs[dc].prefill_tokens_per_s / self.shape.ranks_per_dc() as f64;
        let shares: Vec<EngineShare> = self
            .pool_mut(dc)
            .iter_mut()
            .map(|engine| {
                engine.forget_until(at);
                let (running, waiting) = engine.load_at(at);
                EngineShare {
                    load: Some(EngineLoad {
                        running,
                        waiting,
                        kv_usage: engine.kv_usage,
                    }),
                    prefill_tokens_per_s: rate,
                    ranks: 1,
                }
            })
            .collect();
        PoolLoad::from_engines(&shares)
    }

    /// What `policy` did: its hit rate, every request's TTFT, and each DC's share and peak
    /// queue.
    pub fn finish(self, policy: Policy, hit_rate: HitRate) -> PolicyServing {
        let total = self.ttfts_ms.len().max(1) as f64;
        let mut dcs = self.served;
        for entry in &mut dcs {
            entry.share = entry.requests as f64 / total;
        }
        PolicyServing {
            policy,
            hit_rate,
            ttft_ms: Summary::of(&self.ttfts_ms),
            dcs,
        }
    }
}
