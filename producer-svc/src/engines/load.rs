//! The pool's load: scraped from each engine's Prometheus endpoint (`[[engines]] metrics_url`,
//! every `engine.load_interval_ms`, bounded by `engine.load_timeout_ms`), or pushed through
//! `Ingest/ReportLoad` ([`crate::ingest::report_load`]). The rules are `ckf-engine`'s (which
//! metrics, [`ckf_engine::load::read_load`]) and `ckf-core`'s (the shares, their expiry and
//! bound and the pool's sum, [`PoolShares`]); this module fetches, keeps the shares in a
//! [`LoadBoard`] and exports them. A failed scrape, a down engine or a push not renewed makes
//! that share unknown, never zero; scrape failures are counted by reason and logged at most
//! once a minute per engine.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ckf_core::pool_load::{
    ConfiguredEngine, PoolShares, PushAccepted, PushLimits, PushRefused, PushedLoad,
};
use ckf_core::route::{EngineLoad, PoolLoad};
use ckf_engine::load::{EngineFamily, read_load};
use ckf_svc_kit::Shutdown;
use ckf_svc_kit::throttle::LogThrottle;
use tokio::time::MissedTickBehavior;

use super::config::EngineSpec;
use super::metrics::EngineMetrics;

/// At most one scrape-failure log line per engine per interval.
const LOG_INTERVAL: Duration = Duration::from_secs(60);

/// Every share of the pool (configured engines, pushed workers), and the gauges it exports.
#[derive(Debug)]
pub struct LoadBoard {
    shares: Mutex<PoolShares>,
    metrics: EngineMetrics,
}

impl LoadBoard {
    /// Every engine of `specs` unknown, with its configured capacity; pushes held to `limits`.
    /// The gauges are exported at once.
    pub fn new(specs: &[EngineSpec], limits: PushLimits, metrics: &EngineMetrics) -> Arc<Self> {
        let engines: Vec<ConfiguredEngine> = specs
            .iter()
            .map(|s| ConfiguredEngine {
                worker_id: s.worker_id,
                prefill_tokens_per_s: s.prefill_tokens_per_s as f64,
                ranks: s.dp_size.max(1),
                scraped: s.metrics_url.is_some(),
            })
            .collect();
        let board = Arc::new(Self {
            shares: Mutex::new(PoolShares::new(&engines, limits)),
            metrics: metrics.clone(),
        });
        board.export();
        board
    }

    /// The pool's load now and the age of its oldest known reading; `None` when no share is
    /// known.
    pub fn pool(&self) -> Option<(PoolLoad, Duration)> {
        self.lock().pool(Instant::now())
    }

    /// Keeps a pushed load as its worker's share (the gauges follow at the next interval: a
    /// push costs no walk over every share).
    ///
    /// # Errors
    /// [`PushRefused`]; nothing changed.
    pub fn push(&self, report: &PushedLoad) -> Result<PushAccepted, PushRefused> {
        self.lock().push(report, Instant::now())
    }

    /// The pool gauges now (after a scrape, and every interval: pushed shares arrive and
    /// expire between scrapes).
    pub fn export(&self) {
        let now = Instant::now();
        let (pool, configured) = {
            let shares = self.lock();
            (
                shares.pool(now).map(|(pool, _)| pool),
                shares.configured(now),
            )
        };
        let m = &self.metrics;
        m.pool_engines_configured.set(i64::from(configured));
        let reporting = pool.map_or(0, |p| i64::from(p.engines_reporting));
        m.pool_engines_reporting.set(reporting);
        let p = pool.unwrap_or_default();
        m.pool_requests
            .with_label_values(&["running"])
            .set(i64::from(p.running));
        m.pool_requests
            .with_label_values(&["waiting"])
            .set(i64::from(p.waiting));
        m.pool_kv_usage.set(p.kv_usage);
        m.pool_prefill_tokens_per_second.set(p.prefill_tokens_per_s);
    }

    fn set(&self, engine: usize, load: Option<EngineLoad>) {
        self.lock().scraped(engine, load, Instant::now());
        self.export();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolShares> {
        self.shares.lock().expect("load board")
    }
}

/// Starts one scrape task per engine with a `metrics_url`, and one that exports the pool
/// gauges every `interval` (a pushed share expires without a scrape or a push); they stop
/// with `stop`.
pub fn spawn_scrapers(
    specs: &[EngineSpec],
    interval: Duration,
    timeout: Duration,
    board: &Arc<LoadBoard>,
    metrics: &EngineMetrics,
    stop: &Shutdown,
) {
    let exported = Arc::clone(board);
    let until = stop.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        tokio::select! {
            () = until.wait() => {}
            () = async { loop { tick.tick().await; exported.export(); } } => {}
        }
    });
    for (index, spec) in specs.iter().enumerate() {
        let Some(url) = spec.metrics_url.clone() else {
            continue;
        };
        let scraper = Scraper {
            index,
            worker: spec.worker_id.to_string(),
            url,
            family: spec.family,
            timeout,
            board: Arc::clone(board),
            metrics: metrics.clone(),
            log: LogThrottle::new(LOG_INTERVAL),
        };
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = stop.wait() => {}
                () = scraper.run(interval) => {}
            }
        });
    }
}

struct Scraper {
    index: usize,
    worker: String,
    url: String,
    family: EngineFamily,
    timeout: Duration,
    board: Arc<LoadBoard>,
    metrics: EngineMetrics,
    log: LogThrottle,
}

impl Scraper {
    async fn run(self, interval: Duration) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let load = self.scrape().await;
            self.board.set(self.index, load);
        }
    }

    /// One scrape: the engine's load, or `None` (counted and logged) when it cannot be read.
    async fn scrape(&self) -> Option<EngineLoad> {
        let (url, timeout, family) = (self.url.clone(), self.timeout, self.family);
        // `ureq` blocks: off the runtime's workers.
        let read = tokio::task::spawn_blocking(move || {
            let text = ckf_svc_kit::scrape::fetch_url(&url, timeout)
                .map_err(|e| ("fetch", e.to_string()))?;
            read_load(family, &text).map_err(|e| (e.label(), e.to_string()))
        })
        .await
        .unwrap_or_else(|e| Err(("fetch", e.to_string())));
        self.metrics
            .load_scrapes
            .with_label_values(&[&self.worker])
            .inc();
        match read {
            Ok(load) => Some(load),
            Err((reason, detail)) => {
                self.metrics
                    .load_scrape_errors
                    .with_label_values(&[&self.worker, reason])
                    .inc();
                if let Some(suppressed) = self.log.admit() {
                    tracing::warn!(worker = %self.worker, url = %self.url, reason, %detail, suppressed,
                        "engine load unknown: its metrics could not be read");
                }
                None
            }
        }
    }
}
