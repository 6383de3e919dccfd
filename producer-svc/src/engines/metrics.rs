//! Metrics of the engine publishers (prefix `ckf_producer_engine_`), labelled by `publisher`
//! (`"worker/rank"`, e.g. `7/0`) and `endpoint` (the rank's PUB endpoint); the load scrapes by
//! `worker`, the pushed loads by `outcome`; the pool's load (prefix `ckf_producer_pool_`)
//! unlabelled or by `state`.

use ckf_svc_kit::metrics::{counter_vec, gauge, int_gauge, int_gauge_vec};
use prometheus::{Gauge, IntCounterVec, IntGauge, IntGaugeVec, Registry};

/// The `outcome` values of `ckf_producer_load_pushes_total`.
pub const LOAD_PUSH_OUTCOMES: [&str; 4] = ["accepted", "invalid", "denied", "full"];

/// Every engine-ingest metric.
#[derive(Debug, Clone)]
pub struct EngineMetrics {
    /// 1 while the SUB socket has a peer, by `publisher`, `endpoint`.
    pub connected: IntGaugeVec,
    /// Batches received live (decodable or not), by `publisher`, `endpoint`.
    pub batches: IntCounterVec,
    /// Decoded events, by `publisher`, `endpoint`, `type` (stored, removed, all_cleared,
    /// unknown).
    pub events: IntCounterVec,
    /// Frames or payloads refused, by `publisher`, `endpoint`, `kind` (oversize, parts,
    /// sequence, truncated, syntax, trailing, type, limit, dp_rank, malformed_event, the ZMTP
    /// guard's `zmtp_*` kinds, zmtp_peer_error).
    pub decode_errors: IntCounterVec,
    /// Engine connections a guard proxy closed without a ZMTP violation, by `publisher`,
    /// `endpoint`, `reason` (`connection_limit`: over the proxy's limit, closed at accept;
    /// `handshake_timeout`: no greeting and first command in time). See
    /// [`super::guard::Dropped`].
    pub connections_dropped: IntCounterVec,
    /// Blocks (1 per event without blocks) not applied, by `publisher`, `endpoint`, `reason`
    /// (medium, group, sliding_window, block_size, orphan, unknown_removal, conflict,
    /// unknown_event).
    pub skipped_events: IntCounterVec,
    /// Sequence gaps, by `publisher`, `endpoint`.
    pub gaps: IntCounterVec,
    /// Live batches dropped because the replay that verified the publisher did not hold them
    /// (another publisher on the endpoint), by `publisher`, `endpoint`.
    pub foreign_batches: IntCounterVec,
    /// Replays by `publisher`, `endpoint`, `outcome` (requested; verified: the replay showed
    /// the last applied batch unchanged; filled: done; failed).
    pub replays: IntCounterVec,
    /// Episodes of uncertainty, by `publisher`, `endpoint`, `cause` (first_contact, restored,
    /// reconnect, backwards, repeat, idle): each is checked against the engine's replay buffer.
    pub uncertain: IntCounterVec,
    /// Batches applied by a re-read of the engine's replay buffer (first contact, restart,
    /// failed verification), by `publisher`, `endpoint`: what a late or restarted producer, or
    /// a restarted engine, recovered.
    pub reread_batches: IntCounterVec,
    /// Batches applied from the replay socket (decodable or not), by `publisher`,
    /// `endpoint`: what a gap, or a producer restart, was filled with.
    pub replayed_batches: IntCounterVec,
    /// Members cleared, by `publisher`, `endpoint`, `reason` (gap, restart, unverified).
    pub members_cleared: IntCounterVec,
    /// Unix time (seconds) of the last batch received, by `publisher`, `endpoint`; the age is
    /// `time() - this`.
    pub last_batch_timestamp: IntGaugeVec,
    /// Estimated bytes of the engine-hash lineage (every member).
    pub lineage_bytes: IntGauge,
    /// Scrapes of engines' metrics for their load, per engine (`worker`).
    pub load_scrapes: IntCounterVec,
    /// Scrapes that left an engine's load unknown, by reason (fetch, parse, missing, value).
    pub load_scrape_errors: IntCounterVec,
    /// Loads pushed through `Ingest/ReportLoad`, by outcome (accepted; invalid: a value out of
    /// range, a bad source id or a scraped engine; denied: outside the caller's grant; full:
    /// `engine.max_pushed_workers` reached).
    pub load_pushes: IntCounterVec,
    /// Engines configured in the pool, and the pushing workers not configured until they are
    /// forgotten.
    pub pool_engines_configured: IntGauge,
    /// Engines whose load is known (0: the pool's load is unknown and the gauges below are 0).
    pub pool_engines_reporting: IntGauge,
    /// Requests at the reporting engines, by state (running, waiting).
    pub pool_requests: IntGaugeVec,
    /// Mean KV-cache usage of the reporting engines, 0..=1.
    pub pool_kv_usage: Gauge,
    /// Configured prefill capacity of the reporting engines, tokens/s.
    pub pool_prefill_tokens_per_second: Gauge,
}

impl EngineMetrics {
    /// Registers every engine metric in `r`.
    pub fn new(r: &Registry) -> Self {
        let pe = &["publisher", "endpoint"];
        Self {
            connected: int_gauge_vec(
                r,
                "ckf_producer_engine_connected",
                "1 while the engine publisher's SUB socket has a peer.",
                pe,
            ),
            batches: counter_vec(
                r,
                "ckf_producer_engine_batches_total",
                "Engine batches received live (decodable or not).",
                pe,
            ),
            events: counter_vec(
                r,
                "ckf_producer_engine_events_total",
                "Engine events decoded, by type.",
                &["publisher", "endpoint", "type"],
            ),
            decode_errors: counter_vec(
                r,
                "ckf_producer_engine_decode_errors_total",
                "Engine frames, payloads or events refused as malformed, by kind.",
                &["publisher", "endpoint", "kind"],
            ),
            connections_dropped: counter_vec(
                r,
                "ckf_producer_engine_connections_dropped_total",
                "Engine connections closed by the ZMTP guard proxy without a protocol violation, by reason (connection_limit, handshake_timeout).",
                &["publisher", "endpoint", "reason"],
            ),
            skipped_events: counter_vec(
                r,
                "ckf_producer_engine_skipped_events_total",
                "Engine blocks (1 per event without blocks) not applied, by reason.",
                &["publisher", "endpoint", "reason"],
            ),
            gaps: counter_vec(
                r,
                "ckf_producer_engine_gaps_total",
                "Engine batch sequence gaps.",
                pe,
            ),
            foreign_batches: counter_vec(
                r,
                "ckf_producer_engine_foreign_batches_total",
                "Live engine batches dropped because the replay that verified the publisher does not hold them (another publisher on the endpoint).",
                pe,
            ),
            replays: counter_vec(
                r,
                "ckf_producer_engine_replays_total",
                "Engine replays, by outcome (requested, verified, filled, failed).",
                &["publisher", "endpoint", "outcome"],
            ),
            uncertain: counter_vec(
                r,
                "ckf_producer_engine_uncertain_total",
                "Times an engine publisher's state became uncertain and was checked against its replay buffer, by cause (first_contact, restored, reconnect, backwards, repeat, idle).",
                &["publisher", "endpoint", "cause"],
            ),
            reread_batches: counter_vec(
                r,
                "ckf_producer_engine_reread_batches_total",
                "Engine batches applied by a re-read of the engine's replay buffer (first contact, engine restart, failed verification).",
                pe,
            ),
            replayed_batches: counter_vec(
                r,
                "ckf_producer_engine_replayed_batches_total",
                "Engine batches applied from the replay socket (filling a gap or a downtime, or re-reading the buffer).",
                pe,
            ),
            members_cleared: counter_vec(
                r,
                "ckf_producer_engine_members_cleared_total",
                "Members cleared because their publisher's state became uncertain, by reason (gap, restart, unverified).",
                &["publisher", "endpoint", "reason"],
            ),
            last_batch_timestamp: int_gauge_vec(
                r,
                "ckf_producer_engine_last_batch_timestamp_seconds",
                "Unix time of the last engine batch received (age = time() - this).",
                pe,
            ),
            lineage_bytes: int_gauge(
                r,
                "ckf_producer_engine_lineage_bytes",
                "Estimated bytes of the engine-hash to canonical-hash lineage.",
            ),
            load_scrapes: counter_vec(
                r,
                "ckf_producer_engine_load_scrapes_total",
                "Scrapes of an engine's metrics_url for its load.",
                &["worker"],
            ),
            load_scrape_errors: counter_vec(
                r,
                "ckf_producer_engine_load_scrape_errors_total",
                "Scrapes that left an engine's load unknown, by reason (fetch, parse, missing, value).",
                &["worker", "reason"],
            ),
            load_pushes: {
                let c = counter_vec(
                    r,
                    "ckf_producer_load_pushes_total",
                    "Loads pushed through Ingest/ReportLoad, by outcome (accepted, invalid, denied, full).",
                    &["outcome"],
                );
                for outcome in LOAD_PUSH_OUTCOMES {
                    c.with_label_values(&[outcome]);
                }
                c
            },
            pool_engines_configured: int_gauge(
                r,
                "ckf_producer_pool_engines_configured",
                "Engines configured in this producer's pool, and workers not configured that pushed their load until they are forgotten.",
            ),
            pool_engines_reporting: int_gauge(
                r,
                "ckf_producer_pool_engines_reporting",
                "Engines whose load is known (0: the pool's load is unknown and the other ckf_producer_pool_ gauges read 0).",
            ),
            pool_requests: int_gauge_vec(
                r,
                "ckf_producer_pool_requests",
                "Requests at the reporting engines, by state (running, waiting).",
                &["state"],
            ),
            pool_kv_usage: gauge(
                r,
                "ckf_producer_pool_kv_usage",
                "Mean KV-cache usage of the reporting engines, 0..1.",
            ),
            pool_prefill_tokens_per_second: gauge(
                r,
                "ckf_producer_pool_prefill_tokens_per_second",
                "Configured prefill capacity of the reporting engines, tokens per second.",
            ),
        }
    }
}
