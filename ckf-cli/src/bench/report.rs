//! The replay report: what routing buys, how accurate and fast the index is, what it costs.
//! Rendered as text (default) or JSON (`--json`, the same fields).

use std::fmt::{self, Write as _};

use serde::Serialize;

use crate::bench::accuracy::Accuracy;
use crate::bench::fleet::FleetShape;
use crate::bench::policy::Policy;
use crate::bench::sim::{HitRate, PolicyServing, ServingModel, offered_tokens_per_s, serve};
use crate::bench::stats::Summary;
use crate::bench::trace::Request;

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// What was replayed.
    pub workload: WorkloadInfo,
    /// The simulated fleet.
    pub fleet: FleetShape,
    /// How events reached the producers: `zmq` (built-in vLLM publishers, token queries) or
    /// `grpc` (`Ingest/PublishBatch`, hash queries).
    pub feed: &'static str,
    /// With the `grpc` feed: the prefix of the run's Ingest source ids, `<prefix>/<dc>/w<worker>`
    /// (what `ckf source-sequence --source` takes).
    pub source_prefix: Option<String>,
    /// The live run's routing policy.
    pub policy: Policy,
    /// Seed of the random policy (and of the synthetic workload).
    pub seed: u64,
    /// Ingest and query rates of the live run.
    pub throughput: Throughput,
    /// Client-side round trip of the live run's queries (`FindMatches`, or `Route` for
    /// expected-ttft), microseconds.
    pub query_latency_us: Summary,
    /// Time from a store sent to its producer until a query sees it, milliseconds.
    pub visibility_lag_ms: Summary,
    /// Visibility probes that gave up (the block was usually evicted again first).
    pub visibility_probe_timeouts: u64,
    /// Answers during the replay against the oracle at that moment.
    pub accuracy: Accuracy,
    /// Every distinct request re-queried after the final drain (nothing in flight).
    pub final_check: FinalCheck,
    /// Prefix-cache hit rate per policy on the same workload and fleet: the live run's, then
    /// every policy's on the serving model.
    pub routing: Vec<HitRate>,
    /// Every policy on the serving model: hit rate, time to first token, shares, peak queues.
    pub serving: ServingComparison,
    /// The live run's choices on the same serving model.
    pub live_serving: LiveServing,
    /// Memory and wire cost.
    pub cost: Cost,
}

/// Every policy on one serving model, same workload and fleet.
#[derive(Debug, Clone, Serialize)]
pub struct ServingComparison {
    /// The model.
    pub model: ServingModel,
    /// Prompt tokens/s the workload offers at the model's speed (before any cache hit).
    pub offered_tokens_per_s: f64,
    /// One per policy, in [`Policy::ALL`] order.
    pub policies: Vec<PolicyServing>,
}

impl ServingComparison {
    /// Serves `requests` (with their block hashes) with every policy.
    pub fn run(
        requests: &[Request],
        hashes: &[Vec<u64>],
        shape: FleetShape,
        model: &ServingModel,
        seed: u64,
    ) -> Self {
        Self {
            model: model.clone(),
            offered_tokens_per_s: offered_tokens_per_s(requests, model.speed),
            policies: Policy::ALL
                .iter()
                .map(|&policy| serve(requests, hashes, shape, model, policy, seed))
                .collect(),
        }
    }

    /// One policy's result.
    pub fn of(&self, policy: Policy) -> Option<&PolicyServing> {
        self.policies.iter().find(|p| p.policy == policy)
    }

    /// Expected-TTFT against the bars it is held to, each with whether it is met: its p99 TTFT
    /// at most half deepest-prefix's and at most least-loaded's, its mean TTFT the lowest, its
    /// hit rate within 2 points of deepest-prefix's. Empty without those three policies.
    pub fn targets(&self) -> Vec<(String, bool)> {
        let (Some(ttft), Some(deepest), Some(least)) = (
            self.of(Policy::ExpectedTtft),
            self.of(Policy::DeepestPrefix),
            self.of(Policy::LeastLoaded),
        ) else {
            return Vec::new();
        };
        let p99 = ttft.ttft_ms.p99;
        let lowest_other = self
            .policies
            .iter()
            .filter(|p| p.policy != Policy::ExpectedTtft)
            .map(|p| p.ttft_ms.mean)
            .fold(f64::INFINITY, f64::min);
        let points = (deepest.hit_rate.hit_rate - ttft.hit_rate.hit_rate) * 100.0;
        vec![
            (
                format!(
                    "p99 {:.2}x deepest-prefix's (<= 0.5x)",
                    p99 / deepest.ttft_ms.p99
                ),
                p99 <= 0.5 * deepest.ttft_ms.p99,
            ),
            (
                format!("p99 {:.2}x least-loaded's (<= 1x)", p99 / least.ttft_ms.p99),
                p99 <= least.ttft_ms.p99,
            ),
            (
                format!(
                    "mean {:.0} ms, the others' lowest {lowest_other:.0} ms",
                    ttft.ttft_ms.mean
                ),
                ttft.ttft_ms.mean < lowest_other,
            ),
            (
                format!("hit rate {points:.2} points below deepest-prefix's (<= 2)"),
                points <= 2.0,
            ),
        ]
    }

    /// The comparison as text: the model, then one line per policy.
    ///
    /// # Errors
    /// Never (writes to a `String`).
    pub fn write_text(&self, out: &mut String) -> fmt::Result {
        let m = &self.model;
        let dcs: Vec<String> = m
            .dcs
            .iter()
            .map(|d| format!("{:.0} tok/s {:.0} ms", d.prefill_tokens_per_s, d.rtt_ms))
            .collect();
        writeln!(
            out,
            "serving model: per DC (prefill, round trip) {}; speed {}x; load every {} ms",
            dcs.join(", "),
            m.speed,
            m.load_interval_ms
        )?;
        let capacity: f64 = m.dcs.iter().map(|d| d.prefill_tokens_per_s).sum();
        if self.offered_tokens_per_s > 0.0 {
            writeln!(
                out,
                "  offered {:.0} prompt tokens/s, {:.0}% of the fleet's prefill capacity before cache hits",
                self.offered_tokens_per_s,
                100.0 * self.offered_tokens_per_s / capacity
            )?;
        } else {
            writeln!(out, "  offered: every request at once (no time span)")?;
        }
        writeln!(
            out,
            "  {:<LABEL$} {:>8} {:>9} {:>9} {:>9} {:>9}  share / peak queue per DC",
            "policy", "hit rate", "TTFT mean", "p50", "p90", "p99"
        )?;
        for p in &self.policies {
            write_serving_row(out, p.policy.name(), p)?;
        }
        let targets = self.targets();
        if !targets.is_empty() {
            let marks: Vec<String> = targets
                .iter()
                .map(|(what, met)| format!("{what} {}", if *met { "met" } else { "MISSED" }))
                .collect();
            writeln!(out, "  expected-ttft: {}", marks.join("; "))?;
        }
        Ok(())
    }
}

/// Width of the serving table's first column: the longest label, `deepest-prefix (live)`.
const LABEL: usize = 21;

/// One policy's line of the serving table.
fn write_serving_row(out: &mut String, label: &str, p: &PolicyServing) -> fmt::Result {
    let t = &p.ttft_ms;
    let dcs: Vec<String> = p
        .dcs
        .iter()
        .map(|d| format!("{:.0}%/{}", d.share * 100.0, d.peak_queue))
        .collect();
    writeln!(
        out,
        "  {:<LABEL$} {:>8} {:>7.0}ms {:>7.0}ms {:>7.0}ms {:>7.0}ms  {}",
        label,
        pct(p.hit_rate.hit_rate),
        t.mean,
        t.p50,
        t.p90,
        t.p99,
        dcs.join(" ")
    )
}

/// The live run's choices served on the serving model.
#[derive(Debug, Clone, Serialize)]
pub struct LiveServing {
    /// Hit rate (the live run's), TTFT, shares and peak queues of the live run's choices.
    pub serving: PolicyServing,
    /// Whether requests were sent on the workload's clock (timestamps / speed) rather than as
    /// fast as the services answer: so when the live run reads the indexer's load.
    pub paced: bool,
    /// `Query/Route` answers the live run routed by (expected-ttft; 0 otherwise).
    pub route_answers: u64,
    /// Those whose chosen DC's load was known (a report within the indexer's staleness
    /// bound, scraped from the simulated engines by the DC's producer).
    pub load_known: u64,
    /// Paced requests sent later than their time on the workload's clock by more than the
    /// load interval (the services or this machine could not keep up).
    pub late: u64,
}

impl LiveServing {
    /// The live run's line under the serving table, and what it routed on.
    ///
    /// # Errors
    /// Never (writes to a `String`).
    pub fn write_text(&self, out: &mut String) -> fmt::Result {
        let label = format!("{} (live)", self.serving.policy.name());
        write_serving_row(out, &label, &self.serving)?;
        if self.route_answers > 0 {
            writeln!(
                out,
                "  live: {} requests routed by the indexer's Route on the workload's clock, the chosen DC's load known in {} ({}); {} sent late",
                self.route_answers,
                self.load_known,
                pct(self.load_known as f64 / self.route_answers as f64),
                self.late
            )?;
        }
        Ok(())
    }
}

/// The replayed workload.
#[derive(Debug, Clone, Serialize)]
pub struct WorkloadInfo {
    /// `"synthetic"` or the trace path.
    pub source: String,
    /// Requests replayed.
    pub requests: u64,
    /// Blocks in all requests.
    pub blocks: u64,
    /// Distinct block hashes in all requests.
    pub distinct_blocks: u64,
}

/// Rates of the live run (wall time of the request loop).
#[derive(Debug, Clone, Serialize)]
pub struct Throughput {
    /// Wall time of the request loop, seconds.
    pub seconds: f64,
    /// Queries made for routing (`FindMatches`, or `Route` for expected-ttft).
    pub queries: u64,
    /// KV events sent to producers.
    pub events: u64,
    /// Block hashes in those events.
    pub blocks: u64,
    /// `events / seconds`.
    pub events_per_s: f64,
    /// `blocks / seconds`.
    pub blocks_per_s: f64,
    /// `queries / seconds`.
    pub queries_per_s: f64,
}

/// The post-drain check.
#[derive(Debug, Clone, Serialize)]
pub struct FinalCheck {
    /// Every DC's last batch was seen visible before the check (the drain completed).
    pub settled: bool,
    /// Accuracy with nothing in flight.
    pub accuracy: Accuracy,
}

/// Memory and wire cost.
#[derive(Debug, Clone, Serialize)]
pub struct Cost {
    /// Per DC.
    pub dcs: Vec<DcCost>,
    /// Mean over DCs of producer exact-state bytes per tracked block.
    pub producer_exact_state_bytes_per_block: f64,
    /// Mean over DCs of consumer table bytes per tracked block per lane.
    pub consumer_table_bytes_per_block_per_lane: f64,
    /// Ingest bytes sent to producers: msgpack payloads (`zmq` feed) or encoded
    /// `KvEventBatch` bytes (`grpc` feed).
    pub ingest_wire_bytes: u64,
    /// `ingest_wire_bytes / events`.
    pub wire_bytes_per_event: f64,
    /// Relay bytes (snapshots, deltas, heartbeats, drain markers) producers sent to the indexer
    /// during the replay, from their `ckf_producer_sent_bytes_total`; absent without metrics
    /// endpoints.
    pub relay_wire_bytes: Option<u64>,
    /// `relay_wire_bytes / events`: the cross-DC (WAN) bytes per KV event.
    pub relay_wire_bytes_per_event: Option<f64>,
}

/// One DC's cost, from the producer's `GetStats` at the end of the run.
#[derive(Debug, Clone, Serialize)]
pub struct DcCost {
    /// DC id.
    pub dc: String,
    /// Distinct blocks the producer tracks.
    pub tracked_blocks: u64,
    /// Distinct blocks the DC holds according to the oracle.
    pub oracle_blocks: u64,
    /// Blocks omitted for capacity since the producer started.
    pub omissions: u64,
    /// Filter rank_id load, 0..1.
    pub load_factor: f64,
    /// Buckets per table (8 bytes each, per lane on the indexer).
    pub bucket_count: u64,
    /// The producer's estimate of its exact state plus filter, bytes.
    pub producer_bytes: u64,
    /// `(producer_bytes - bucket_count * 8) / tracked_blocks`.
    pub exact_state_bytes_per_block: f64,
    /// `bucket_count * 8 / tracked_blocks`: the consumer's bytes for this lane per block.
    pub consumer_table_bytes_per_block: f64,
}

impl DcCost {
    /// Derives the per-block figures from the producer's statistics.
    pub fn new(
        dc: String,
        tracked_blocks: u64,
        oracle_blocks: u64,
        omissions: u64,
        load_factor: f64,
        bucket_count: u64,
        producer_bytes: u64,
    ) -> Self {
        let per_block = |bytes: u64| bytes as f64 / tracked_blocks.max(1) as f64;
        let table = bucket_count * 8;
        Self {
            dc,
            tracked_blocks,
            oracle_blocks,
            omissions,
            load_factor,
            bucket_count,
            producer_bytes,
            exact_state_bytes_per_block: per_block(producer_bytes.saturating_sub(table)),
            consumer_table_bytes_per_block: per_block(table),
        }
    }
}

impl Cost {
    /// Aggregates per-DC costs and wire totals.
    pub fn new(dcs: Vec<DcCost>, ingest_wire_bytes: u64, relay: Option<u64>, events: u64) -> Self {
        let mean = |f: fn(&DcCost) -> f64| {
            if dcs.is_empty() {
                0.0
            } else {
                dcs.iter().map(f).sum::<f64>() / dcs.len() as f64
            }
        };
        Self {
            producer_exact_state_bytes_per_block: mean(|d| d.exact_state_bytes_per_block),
            consumer_table_bytes_per_block_per_lane: mean(|d| d.consumer_table_bytes_per_block),
            wire_bytes_per_event: ingest_wire_bytes as f64 / events.max(1) as f64,
            ingest_wire_bytes,
            relay_wire_bytes: relay,
            relay_wire_bytes_per_event: relay.map(|r| r as f64 / events.max(1) as f64),
            dcs,
        }
    }
}

impl Report {
    /// Whether every derived count adds up (used by tests and printed nowhere).
    pub fn consistent(&self) -> bool {
        let dcs = self.fleet.dcs as u64;
        let t = &self.throughput;
        self.accuracy.consistent(dcs)
            && self.final_check.accuracy.consistent(dcs)
            && self.accuracy.queries == t.queries
            && t.queries == self.workload.requests
            && self.routing.iter().all(|r| {
                r.blocks_requested == self.workload.blocks && r.blocks_reused <= r.blocks_requested
            })
            && self.query_latency_us.count as u64 == t.queries
            && self.cost.dcs.len() == self.fleet.dcs
    }

    /// The report as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("report serializes")
    }
}

fn pct(x: f64) -> String {
    format!("{:.2}%", x * 100.0)
}

fn accuracy_lines(out: &mut String, a: &Accuracy) -> fmt::Result {
    let u = a.under_estimates;
    let o = a.over_estimates;
    writeln!(
        out,
        "  best-DC agreement     {} ({} of {} queries)",
        pct(a.best_dc_agreement),
        a.best_dc_agreements,
        a.queries
    )?;
    writeln!(
        out,
        "  lane answers          {} exact, {} over, {} under ({} lanes not ready)",
        a.exact, o.total, u.total, a.lanes_not_ready
    )?;
    writeln!(
        out,
        "  under-estimates       {} omission, {} in flight, {} unexplained",
        u.omission, u.in_flight, u.unexplained
    )?;
    writeln!(
        out,
        "  over-estimates        {} in-flight removal, {} false positive",
        o.in_flight_removal, o.false_positive
    )
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::new();
        let w = &self.workload;
        let s = &self.fleet;
        let t = &self.throughput;
        writeln!(
            out,
            "ckf replay report: {} ({} requests, {} blocks, {} distinct)",
            w.source, w.requests, w.blocks, w.distinct_blocks
        )?;
        writeln!(
            out,
            "fleet: {} DCs x {} workers x {} ranks, {} blocks per rank (LRU); feed {}; policy {}, seed {}",
            s.dcs,
            s.workers_per_dc,
            s.ranks_per_worker,
            s.capacity_blocks,
            self.feed,
            self.policy.name(),
            self.seed
        )?;
        if let Some(prefix) = &self.source_prefix {
            writeln!(
                out,
                "ingest sources: {prefix}/<dc>/w<worker> (what `ckf source-sequence --source` takes)"
            )?;
        }
        let paced = if self.live_serving.paced {
            ", paced on the workload's clock: rates are its arrival rates"
        } else {
            ""
        };
        writeln!(out, "\nthroughput ({:.2} s{paced})", t.seconds)?;
        writeln!(
            out,
            "  ingest                {:.0} events/s, {:.0} blocks/s ({} events, {} blocks)",
            t.events_per_s, t.blocks_per_s, t.events, t.blocks
        )?;
        writeln!(
            out,
            "  queries               {:.0} queries/s ({})",
            t.queries_per_s, t.queries
        )?;
        let q = &self.query_latency_us;
        writeln!(
            out,
            "  query latency         p50 {:.0} us, p99 {:.0} us, max {:.0} us",
            q.p50, q.p99, q.max
        )?;
        let l = &self.visibility_lag_ms;
        writeln!(
            out,
            "  event-to-visible lag  p50 {:.2} ms, p99 {:.2} ms ({} samples, {} probe timeouts)",
            l.p50, l.p99, l.count, self.visibility_probe_timeouts
        )?;
        writeln!(out, "\naccuracy during replay (vs exact oracle)")?;
        accuracy_lines(&mut out, &self.accuracy)?;
        writeln!(
            out,
            "\naccuracy after final drain ({})",
            if self.final_check.settled {
                "settled"
            } else {
                "NOT settled"
            }
        )?;
        accuracy_lines(&mut out, &self.final_check.accuracy)?;
        writeln!(
            out,
            "\nrouting: prefix-cache hit rate (blocks reused / requested)"
        )?;
        for r in &self.routing {
            writeln!(
                out,
                "  {:<15} {:>8}  ({} / {}, index: {})",
                r.policy.name(),
                pct(r.hit_rate),
                r.blocks_reused,
                r.blocks_requested,
                r.index
            )?;
        }
        writeln!(out)?;
        self.serving.write_text(&mut out)?;
        self.live_serving.write_text(&mut out)?;
        let c = &self.cost;
        writeln!(out, "\ncost")?;
        writeln!(
            out,
            "  producer exact state  {:.1} bytes per tracked block (mean over DCs)",
            c.producer_exact_state_bytes_per_block
        )?;
        writeln!(
            out,
            "  consumer table        {:.2} bytes per tracked block per lane ({:.1} bits)",
            c.consumer_table_bytes_per_block_per_lane,
            c.consumer_table_bytes_per_block_per_lane * 8.0
        )?;
        writeln!(
            out,
            "  ingest wire           {:.1} bytes per event ({} bytes)",
            c.wire_bytes_per_event, c.ingest_wire_bytes
        )?;
        if let (Some(bytes), Some(per_event)) = (c.relay_wire_bytes, c.relay_wire_bytes_per_event) {
            writeln!(
                out,
                "  relay wire (WAN)      {per_event:.1} bytes per event ({bytes} bytes: snapshots, deltas, heartbeats)"
            )?;
        }
        for d in &c.dcs {
            writeln!(
                out,
                "  {:<8} {} tracked (oracle {}), {} omissions, load {:.1}%, {} buckets, {} producer bytes",
                d.dc,
                d.tracked_blocks,
                d.oracle_blocks,
                d.omissions,
                d.load_factor * 100.0,
                d.bucket_count,
                d.producer_bytes
            )?;
        }
        f.write_str(&out)
    }
}
