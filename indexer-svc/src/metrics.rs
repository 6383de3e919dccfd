//! The indexer's Prometheus metrics (prefix `ckf_indexer_`), registered in one
//! [`prometheus::Registry`] served by `ckf_svc_kit::metrics` on the metrics address.
//!
//! Counters end in `_total`, durations are `_seconds` histograms, sizes `_bytes`. Lane metrics
//! carry `domain`, `lane` (index) and `dc` labels, DC metrics `domain` and `dc`, the query
//! counters `domain` and `method`; see the crate README for the full reference.

use std::collections::HashMap;

use ckf_core::global::GlobalCkfIndexer;
use ckf_core::lane::{ContentionKind, LaneState, LaneStatus, RetireReason};
use ckf_core::route::{LoadRefused, PoolLoad};
use ckf_core::search::SearchKernel;
use ckf_svc_kit::metrics::{
    counter, counter_vec, gauge_vec, histogram, histogram_vec, int_gauge, int_gauge_vec,
    lag_buckets_seconds, latency_buckets_seconds,
};
use prometheus::core::{Collector, MetricVec, MetricVecBuilder};
use prometheus::{
    GaugeVec, Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry,
};

/// Removes every series of `vec` whose `domain` label `gone` accepts (whatever its other
/// labels).
fn remove_series<T: MetricVecBuilder>(vec: &MetricVec<T>, gone: impl Fn(&str) -> bool) {
    for family in vec.collect() {
        for metric in family.get_metric() {
            let labels: HashMap<&str, &str> = metric
                .get_label()
                .iter()
                .map(|l| (l.name(), l.value()))
                .collect();
            if labels.get("domain").is_some_and(|d| gone(d)) {
                let _ = vec.remove(&labels);
            }
        }
    }
}

/// The query RPCs, the `method` label of the query metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueryMethod {
    /// `FindMatches` (block hashes).
    FindMatches,
    /// `FindMatchesByTokens` (token ids).
    FindMatchesByTokens,
    /// `FindMatchesBatch` (counted per query of the batch).
    FindMatchesBatch,
    /// `FindMatchesStream` (counted per query of each stream message).
    FindMatchesStream,
    /// `Route` (block hashes or token ids).
    Route,
    /// `RouteBatch` (counted per request of the batch).
    RouteBatch,
}

impl QueryMethod {
    /// Every method, in label order (the index of [`QueryCounters::method`]).
    pub const ALL: [QueryMethod; 6] = [
        QueryMethod::FindMatches,
        QueryMethod::FindMatchesByTokens,
        QueryMethod::FindMatchesBatch,
        QueryMethod::FindMatchesStream,
        QueryMethod::Route,
        QueryMethod::RouteBatch,
    ];

    /// The `method` label value.
    pub fn label(self) -> &'static str {
        match self {
            QueryMethod::FindMatches => "find_matches",
            QueryMethod::FindMatchesByTokens => "find_matches_by_tokens",
            QueryMethod::FindMatchesBatch => "find_matches_batch",
            QueryMethod::FindMatchesStream => "find_matches_stream",
            QueryMethod::Route => "route",
            QueryMethod::RouteBatch => "route_batch",
        }
    }
}

/// One query method's counters (`method` label already applied): see
/// [`IndexerMetrics::query_methods`].
#[derive(Debug, Clone)]
pub struct MethodMetrics {
    /// Queries answered.
    pub answered: IntCounter,
    /// Queries refused.
    pub refused: IntCounter,
    /// Blocks of the queries answered (hashes sent; for token queries, their full blocks).
    pub blocks: IntCounter,
}

/// Every lane state, for the one-hot `ckf_indexer_lane_state` gauge.
const STATES: [LaneState; 4] = [
    LaneState::Unassigned,
    LaneState::AwaitingSnapshot,
    LaneState::Active,
    LaneState::Retired,
];

/// Handles to every indexer metric.
#[derive(Debug, Clone)]
pub struct IndexerMetrics {
    registry: Registry,
    /// Relay frames received, by kind (`attach`, `snapshot_chunk`, `delta`, `heartbeat`,
    /// `drain_marker`).
    pub frames_received: IntCounterVec,
    /// Encoded bytes of relay frames received.
    pub bytes_received: IntCounter,
    /// Snapshots completed (lane activated), by lane.
    pub snapshots_installed: IntCounterVec,
    /// Deltas applied, by lane.
    pub deltas_applied: IntCounterVec,
    /// Bucket images applied from deltas, by lane.
    pub images_applied: IntCounterVec,
    /// Exact drain markers accepted, by lane.
    pub drains: IntCounterVec,
    /// Lane retirements, by lane and reason label.
    pub retirements: IntCounterVec,
    /// Attachments refused, by gRPC code name.
    pub attach_refused: IntCounterVec,
    /// Leases granted, by lane.
    pub leases_granted: IntCounterVec,
    /// Lane contention (another incarnation attaching while the lane had a live attachment),
    /// by `dc` and `kind` (`if_vacant_refused`, `takeover`).
    pub lane_contention: IntCounterVec,
    /// Relay streams open now.
    pub relay_streams: IntGauge,
    /// Bytes of each domain's consumer table (every lane group), set when the domain starts.
    pub table_bytes: IntGaugeVec,
    /// Domains served now.
    pub domains: IntGauge,
    /// Catalog reloads by `result` (`applied`, `unchanged`, `refused`, `dry_run`).
    pub catalog_reloads: IntCounterVec,
    /// `FindMatchesStream` calls open now.
    pub query_streams: IntGauge,
    /// Queries answered, by `method` ([`QueryMethod::label`]).
    pub queries: IntCounterVec,
    /// Queries refused (too long, bad token query; every query of a refused batch or stream
    /// message), by `method`. All are `INVALID_ARGUMENT`; refusals for credentials are
    /// `ckf_indexer_auth_refused_total`.
    pub queries_refused: IntCounterVec,
    /// Query calls refused for the domain their `ckf-domain` metadata names (another domain:
    /// `NOT_FOUND`; not a domain name: `INVALID_ARGUMENT`).
    pub query_domain_refused: IntCounter,
    /// Blocks of the queries answered, by `method`: the hashes sent, or for token queries the
    /// full blocks of the tokens (counted whole even when the search stopped hashing early).
    pub query_blocks: IntCounterVec,
    /// Time of the prefix search itself, any method (seconds; for a token query, the search with
    /// the token hashing it does).
    pub query_duration: Histogram,
    /// Dirty-to-applied lag of applied deltas: the producer's `oldest_change_age_ms` plus the
    /// time from receipt to applied here (seconds).
    pub event_to_applied_lag: HistogramVec,
    /// One-hot search kernel in use (`kernel`: `portable`, `avx2`, `avx512`, `neon`); see
    /// [`IndexerMetrics::observe_search_kernel`].
    pub search_kernel: IntGaugeVec,
    /// Load reports received, by `dc` and `outcome` (kept, older, invalid).
    pub load_reports: IntCounterVec,
    /// `Route` choices, by the chosen `dc` and `reason` (fastest, deepest_of_equal).
    pub route_decisions: IntCounterVec,
    /// The kept load report of each lane: requests by `state` (running, waiting).
    pub lane_load_requests: IntGaugeVec,
    /// The kept load report of each lane: engines reporting.
    pub lane_load_engines_reporting: IntGaugeVec,
    /// The kept load report of each lane: mean KV-cache usage, 0..1.
    pub lane_load_kv_usage: GaugeVec,
    /// The kept load report of each lane: prefill capacity, tokens per second.
    pub lane_load_prefill_tokens_per_second: GaugeVec,
    /// Unix time of the kept report's observation (its age: `time() - this`).
    pub lane_load_observed_timestamp: GaugeVec,
}

impl IndexerMetrics {
    /// Registers every metric in a fresh registry.
    pub fn new() -> Self {
        let r = Registry::new();
        let query_duration = histogram(
            &r,
            "ckf_indexer_query_duration_seconds",
            "Duration of the multi-lane prefix search of one query, any method (for a token \
             query, the search with its token hashing; one observation per query of a batch or \
             stream message), in seconds.",
            latency_buckets_seconds(),
        );
        let event_to_applied_lag = histogram_vec(
            &r,
            "ckf_indexer_event_to_applied_lag_seconds",
            "Age of a delta's oldest change when applied (producer age at send + time at \
             the indexer), in seconds.",
            &["domain", "lane", "dc"],
            lag_buckets_seconds(),
        );
        let relay_streams = int_gauge(
            &r,
            "ckf_indexer_relay_streams",
            "Relay (producer) streams open now.",
        );
        let query_streams = int_gauge(
            &r,
            "ckf_indexer_query_streams",
            "FindMatchesStream calls open now (at most limits.max_query_streams).",
        );
        let table_bytes = int_gauge_vec(
            &r,
            "ckf_indexer_table_bytes",
            "Bytes of a domain's consumer table: buckets x lanes x 8, every lane group.",
            &["domain"],
        );
        Self {
            frames_received: counter_vec(
                &r,
                "ckf_indexer_relay_frames_received_total",
                "Relay frames received, by kind.",
                &["kind"],
            ),
            bytes_received: counter(
                &r,
                "ckf_indexer_relay_received_bytes_total",
                "Encoded bytes of relay frames received.",
            ),
            snapshots_installed: counter_vec(
                &r,
                "ckf_indexer_snapshots_installed_total",
                "Barrier snapshots completed (lane activated).",
                &["domain", "lane", "dc"],
            ),
            deltas_applied: counter_vec(
                &r,
                "ckf_indexer_deltas_applied_total",
                "Deltas applied.",
                &["domain", "lane", "dc"],
            ),
            images_applied: counter_vec(
                &r,
                "ckf_indexer_images_applied_total",
                "Bucket images applied from deltas.",
                &["domain", "lane", "dc"],
            ),
            drains: counter_vec(
                &r,
                "ckf_indexer_drain_markers_accepted_total",
                "Exact drain markers accepted.",
                &["domain", "lane", "dc"],
            ),
            retirements: counter_vec(
                &r,
                "ckf_indexer_lane_retirements_total",
                "Lane retirements, by reason.",
                &["domain", "lane", "dc", "reason"],
            ),
            attach_refused: counter_vec(
                &r,
                "ckf_indexer_attach_refused_total",
                "Relay attachments refused, by gRPC status code.",
                &["code"],
            ),
            leases_granted: counter_vec(
                &r,
                "ckf_indexer_leases_granted_total",
                "Lane leases granted.",
                &["domain", "lane", "dc"],
            ),
            lane_contention: counter_vec(
                &r,
                "ckf_indexer_lane_contention_total",
                "Attaches by another producer incarnation while the lane had a live attachment, by kind (if_vacant_refused, takeover).",
                &["domain", "dc", "kind"],
            ),
            relay_streams,
            table_bytes,
            domains: int_gauge(&r, "ckf_indexer_domains", "Domains (models) served now."),
            catalog_reloads: {
                let reloads = counter_vec(
                    &r,
                    "ckf_indexer_catalog_reloads_total",
                    "Catalog reloads (SIGHUP, configuration file change, Admin/ReloadCatalog) by \
                     result: applied, unchanged, refused (nothing changed), dry_run.",
                    &["result"],
                );
                for result in ["applied", "unchanged", "refused", "dry_run"] {
                    reloads.with_label_values(&[result]);
                }
                reloads
            },
            query_streams,
            queries: counter_vec(
                &r,
                "ckf_indexer_queries_total",
                "Prefix-match queries answered, by domain and RPC method.",
                &["domain", "method"],
            ),
            queries_refused: counter_vec(
                &r,
                "ckf_indexer_queries_refused_total",
                "Prefix-match queries refused (INVALID_ARGUMENT), by domain and RPC method.",
                &["domain", "method"],
            ),
            query_domain_refused: counter(
                &r,
                "ckf_indexer_query_domain_refused_total",
                "Query calls refused for the domain their ckf-domain metadata names (not this \
                 indexer's: NOT_FOUND; not a domain name: INVALID_ARGUMENT).",
            ),
            query_blocks: counter_vec(
                &r,
                "ckf_indexer_query_blocks_total",
                "Blocks of the queries answered, by RPC method (hashes sent; for token queries, \
                 every full block of the tokens), by domain and RPC method.",
                &["domain", "method"],
            ),
            query_duration,
            event_to_applied_lag,
            search_kernel: int_gauge_vec(
                &r,
                "ckf_indexer_search_kernel",
                "1 for the prefix-search kernel in use (portable, avx2, avx512, neon; config search.kernel).",
                &["kernel"],
            ),
            route_decisions: counter_vec(
                &r,
                "ckf_indexer_route_decisions_total",
                "Route choices, by the chosen DC and the reason (fastest, deepest_of_equal).",
                &["domain", "dc", "reason"],
            ),
            load_reports: counter_vec(
                &r,
                "ckf_indexer_load_reports_total",
                "Load reports received from producers, by outcome (kept; older: a newer one is kept; invalid: a value out of range).",
                &["domain", "dc", "outcome"],
            ),
            lane_load_requests: int_gauge_vec(
                &r,
                "ckf_indexer_lane_load_requests",
                "Requests at the DC's reporting engines in its kept load report, by state (running, waiting).",
                &["domain", "dc", "state"],
            ),
            lane_load_engines_reporting: int_gauge_vec(
                &r,
                "ckf_indexer_lane_load_engines_reporting",
                "Engines in the DC's kept load report.",
                &["domain", "dc"],
            ),
            lane_load_kv_usage: gauge_vec(
                &r,
                "ckf_indexer_lane_load_kv_usage",
                "Mean KV-cache usage of the DC's reporting engines in its kept load report, 0..1.",
                &["domain", "dc"],
            ),
            lane_load_prefill_tokens_per_second: gauge_vec(
                &r,
                "ckf_indexer_lane_load_prefill_tokens_per_second",
                "Prefill capacity of the DC's reporting engines in its kept load report, tokens per second.",
                &["domain", "dc"],
            ),
            lane_load_observed_timestamp: gauge_vec(
                &r,
                "ckf_indexer_lane_load_observed_timestamp_seconds",
                "Unix time of the observation in the DC's kept load report (its age: time() - this).",
                &["domain", "dc"],
            ),
            registry: r,
        }
    }

    /// The query counters of `domain`, one [`MethodMetrics`] per method in
    /// [`QueryMethod::ALL`] order, resolved once (so every method is exported from the start,
    /// at 0).
    pub fn query_methods(&self, domain: &str) -> QueryCounters {
        QueryCounters(
            QueryMethod::ALL
                .iter()
                .map(|method| {
                    let labels = [domain, method.label()];
                    MethodMetrics {
                        answered: self.queries.with_label_values(&labels),
                        refused: self.queries_refused.with_label_values(&labels),
                        blocks: self.query_blocks.with_label_values(&labels),
                    }
                })
                .collect(),
        )
    }

    /// The registry to serve.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The per-lane children of `lane`'s relay metrics, resolved once (a relay session holds
    /// them for its whole life instead of looking labels up per frame).
    pub fn lane(&self, lane: &LaneLabels) -> LaneMetrics {
        let values = lane.values();
        LaneMetrics {
            leases_granted: self.leases_granted.with_label_values(&values),
            snapshots_installed: self.snapshots_installed.with_label_values(&values),
            deltas_applied: self.deltas_applied.with_label_values(&values),
            images_applied: self.images_applied.with_label_values(&values),
            drains: self.drains.with_label_values(&values),
            event_to_applied_lag: self.event_to_applied_lag.with_label_values(&values),
        }
    }

    /// Sets the one-hot `ckf_indexer_search_kernel` gauge: 1 for `kernel` (a resolved kernel),
    /// 0 for every other concrete kernel, so a dashboard sees every label.
    pub fn observe_search_kernel(&self, kernel: SearchKernel) {
        for k in [
            SearchKernel::Portable,
            SearchKernel::Avx2,
            SearchKernel::Avx512,
            SearchKernel::Neon,
        ] {
            self.search_kernel
                .with_label_values(&[k.name()])
                .set(i64::from(k == kernel));
        }
    }

    /// Counts one load report of `lane` and, when kept, exports it, observed `age` ago.
    pub fn load_report(
        &self,
        lane: &LaneLabels,
        kept: Result<(), LoadRefused>,
        load: &PoolLoad,
        age: std::time::Duration,
    ) {
        let (domain, dc) = (lane.domain.as_str(), lane.dc.as_str());
        let outcome = kept.map_or_else(LoadRefused::label, |()| "kept");
        self.load_reports
            .with_label_values(&[domain, dc, outcome])
            .inc();
        if kept.is_err() {
            return;
        }
        for (state, n) in [("running", load.running), ("waiting", load.waiting)] {
            self.lane_load_requests
                .with_label_values(&[domain, dc, state])
                .set(i64::from(n));
        }
        self.lane_load_engines_reporting
            .with_label_values(&[domain, dc])
            .set(i64::from(load.engines_reporting));
        self.lane_load_kv_usage
            .with_label_values(&[domain, dc])
            .set(load.kv_usage);
        self.lane_load_prefill_tokens_per_second
            .with_label_values(&[domain, dc])
            .set(load.prefill_tokens_per_s);
        let observed = std::time::SystemTime::now()
            .checked_sub(age)
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0.0, |d| d.as_secs_f64());
        self.lane_load_observed_timestamp
            .with_label_values(&[domain, dc])
            .set(observed);
    }

    /// Counts one retirement of `lane`.
    pub fn retired(&self, lane: &LaneLabels, reason: &RetireReason) {
        self.retirements
            .with_label_values(&[&lane.domain, &lane.lane, &lane.dc, reason.label()])
            .inc();
    }

    /// Counts one contention on `lane`.
    pub fn contended(&self, lane: &LaneLabels, kind: ContentionKind) {
        self.lane_contention
            .with_label_values(&[&lane.domain, &lane.dc, kind.as_str()])
            .inc();
    }

    /// Removes every series, counters and histograms included, whose `domain` is not one that
    /// `served` accepts, so a catalog that adds and removes domains over time does not grow the
    /// exposition without bound. A domain added again starts its counters from 0 (a counter
    /// reset, which `rate()` and `increase()` allow for). Call it with the catalog held, so a
    /// domain added meanwhile cannot lose its series.
    pub fn forget_unserved_domains(&self, served: impl Fn(&str) -> bool) {
        let gone = |domain: &str| !served(domain);
        for counters in [
            &self.snapshots_installed,
            &self.deltas_applied,
            &self.images_applied,
            &self.drains,
            &self.retirements,
            &self.leases_granted,
            &self.lane_contention,
            &self.queries,
            &self.queries_refused,
            &self.query_blocks,
            &self.load_reports,
            &self.route_decisions,
        ] {
            remove_series(counters, gone);
        }
        for gauges in [
            &self.table_bytes,
            &self.lane_load_requests,
            &self.lane_load_engines_reporting,
        ] {
            remove_series(gauges, gone);
        }
        for gauges in [
            &self.lane_load_kv_usage,
            &self.lane_load_prefill_tokens_per_second,
            &self.lane_load_observed_timestamp,
        ] {
            remove_series(gauges, gone);
        }
        remove_series(&self.event_to_applied_lag, gone);
    }

    /// Withdraws the gauges of removed lanes. Their counters stay.
    pub fn forget_lanes(&self, lanes: &[LaneLabels]) {
        for lane in lanes {
            let dc = [lane.domain.as_str(), lane.dc.as_str()];
            for state in ["running", "waiting"] {
                let _ = self
                    .lane_load_requests
                    .remove_label_values(&[dc[0], dc[1], state]);
            }
            let _ = self.lane_load_engines_reporting.remove_label_values(&dc);
            let _ = self.lane_load_kv_usage.remove_label_values(&dc);
            let _ = self
                .lane_load_prefill_tokens_per_second
                .remove_label_values(&dc);
            let _ = self.lane_load_observed_timestamp.remove_label_values(&dc);
        }
    }

    /// Registers the lane gauges (`ckf_indexer_lane_state`, `_ready`, `_installed_sequence`),
    /// read at each scrape from the lanes `lanes` gives: exact when scraped, nothing to refresh
    /// between scrapes, nothing to withdraw when a lane or a domain is removed.
    ///
    /// # Panics
    /// When called twice on one registry.
    pub fn register_lane_gauges(
        &self,
        lanes: impl Fn() -> Vec<(LaneLabels, LaneStatus)> + Send + Sync + 'static,
    ) {
        let gauges = LaneGauges {
            templates: LaneGauges::vecs(),
            lanes: Box::new(lanes),
        };
        self.registry()
            .register(Box::new(gauges))
            .expect("the lane gauges are registered once");
    }
}

impl Default for IndexerMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// One lane's relay metrics (`domain`, `lane`, `dc` labels already applied): see [`IndexerMetrics::lane`].
#[derive(Debug, Clone)]
pub struct LaneMetrics {
    /// Leases granted.
    pub leases_granted: IntCounter,
    /// Barrier snapshots completed.
    pub snapshots_installed: IntCounter,
    /// Deltas applied.
    pub deltas_applied: IntCounter,
    /// Bucket images applied from deltas.
    pub images_applied: IntCounter,
    /// Exact drain markers accepted.
    pub drains: IntCounter,
    /// Dirty-to-applied lag of applied deltas (seconds).
    pub event_to_applied_lag: Histogram,
}

/// One domain's query counters, by method: see [`IndexerMetrics::query_methods`].
#[derive(Debug, Clone)]
pub struct QueryCounters(Vec<MethodMetrics>);

impl QueryCounters {
    /// The counters of one query method.
    pub fn method(&self, method: QueryMethod) -> &MethodMetrics {
        &self.0[method as usize]
    }
}

/// The lane gauges: `ckf_indexer_lane_state` (one-hot), `ckf_indexer_lane_ready` and
/// `ckf_indexer_lane_installed_sequence`, read from the lanes at each scrape. They are exact when
/// scraped, cost nothing between scrapes (a refresh every 250 ms per lane cost an idle indexer
/// of 2,000 lanes about 4% of a core), and have nothing to withdraw when a lane or a domain is
/// removed: the next scrape does not find it. Reading a lane's status takes its lock, so a
/// scrape waits for an apply in progress on it (as `ListLanes` does).
struct LaneGauges {
    /// Unfilled, for [`Collector::desc`]; each scrape fills fresh ones.
    templates: [IntGaugeVec; 3],
    /// The lanes to export now, with their labels.
    lanes: Box<dyn Fn() -> Vec<(LaneLabels, LaneStatus)> + Send + Sync>,
}

impl LaneGauges {
    /// The state, ready and installed-sequence gauges, empty.
    fn vecs() -> [IntGaugeVec; 3] {
        let vec = |name: &str, help: &str, labels: &[&str]| {
            IntGaugeVec::new(prometheus::Opts::new(name, help), labels)
                .expect("valid lane gauge names")
        };
        [
            vec(
                "ckf_indexer_lane_state",
                "1 for the lane's current state (unassigned, awaiting_snapshot, active, retired).",
                &["domain", "lane", "dc", "state"],
            ),
            vec(
                "ckf_indexer_lane_ready",
                "1 when the lane answers queries.",
                &["domain", "lane", "dc"],
            ),
            vec(
                "ckf_indexer_lane_installed_sequence",
                "Last sequence installed in the lane.",
                &["domain", "lane", "dc"],
            ),
        ]
    }
}

impl Collector for LaneGauges {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.templates.iter().flat_map(Collector::desc).collect()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        let [state, ready, installed] = Self::vecs();
        for (lane, status) in (self.lanes)() {
            for s in STATES {
                state
                    .with_label_values(&[&lane.domain, &lane.lane, &lane.dc, s.as_str()])
                    .set(i64::from(s == status.state));
            }
            ready
                .with_label_values(&lane.values())
                .set(i64::from(status.ready));
            installed
                .with_label_values(&lane.values())
                .set(status.installed_sequence.map_or(0, |s| s as i64));
        }
        [state, ready, installed]
            .iter()
            .flat_map(Collector::collect)
            .collect()
    }
}

/// Pre-rendered `domain`, `lane` and `dc` label values of one lane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneLabels {
    /// The lane's domain.
    pub domain: String,
    /// Lane index as text.
    pub lane: String,
    /// The lane's DC id.
    pub dc: String,
}

impl LaneLabels {
    /// Labels of `lane` of `indexer`; `None` for a spare slot that never served a pool.
    pub fn of(indexer: &GlobalCkfIndexer, lane: u8) -> Option<LaneLabels> {
        indexer.slot(lane).map(|pool| LaneLabels {
            domain: pool.domain.to_string(),
            lane: lane.to_string(),
            dc: pool.dc.to_string(),
        })
    }

    /// The `domain`, `lane`, `dc` values, in that order.
    pub fn values(&self) -> [&str; 3] {
        [&self.domain, &self.lane, &self.dc]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lane(domain: &str) -> LaneLabels {
        LaneLabels {
            domain: domain.into(),
            lane: "0".into(),
            dc: "dc-a".into(),
        }
    }

    /// The series of every metric family whose `domain` label is `domain`.
    fn series_of(metrics: &IndexerMetrics, domain: &str) -> Vec<String> {
        metrics
            .registry()
            .gather()
            .iter()
            .flat_map(|family| {
                family
                    .get_metric()
                    .iter()
                    .filter(move |m| {
                        m.get_label()
                            .iter()
                            .any(|l| l.name() == "domain" && l.value() == domain)
                    })
                    .map(move |_| family.name().to_owned())
            })
            .collect()
    }

    #[test]
    fn the_sweep_removes_every_series_of_the_unserved_domains_and_only_theirs() {
        let metrics = IndexerMetrics::new();
        let load = PoolLoad {
            running: 1,
            waiting: 2,
            engines_reporting: 1,
            engines_configured: 1,
            kv_usage: 0.5,
            prefill_tokens_per_s: 10.0,
        };
        for domain in ["kept", "gone"] {
            let labels = lane(domain);
            let relay = metrics.lane(&labels);
            relay.deltas_applied.inc();
            relay.event_to_applied_lag.observe(0.001);
            metrics.retired(&labels, &RetireReason::Removed);
            metrics.contended(&labels, ContentionKind::Takeover);
            metrics.load_report(&labels, Ok(()), &load, std::time::Duration::ZERO);
            metrics.table_bytes.with_label_values(&[domain]).set(8);
            metrics
                .query_methods(domain)
                .method(QueryMethod::FindMatches)
                .answered
                .inc();
        }
        let before = series_of(&metrics, "kept");
        assert!(before.len() >= 15, "{before:?}");
        assert_eq!(series_of(&metrics, "gone").len(), before.len());

        metrics.forget_unserved_domains(|domain| domain == "kept");
        assert_eq!(series_of(&metrics, "gone"), Vec::<String>::new());
        assert_eq!(
            series_of(&metrics, "kept"),
            before,
            "a served domain's series stay"
        );
    }
}
