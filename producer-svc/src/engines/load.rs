//! The pool's load, scraped from each engine's Prometheus endpoint (`[[engines]] metrics_url`,
//! every `engine.load_interval_ms`, bounded by `engine.load_timeout_ms`). The rules are
//! `ckf-engine`'s (which metrics, [`ckf_engine::load::read_load`]) and `ckf-core`'s (the pool's
//! sum, [`PoolLoad::from_engines`]); this module fetches, keeps the latest share per engine in
//! a [`LoadBoard`] and exports it. A failed scrape or a down engine makes its share unknown,
//! never zero; failures are counted by reason and logged at most once a minute per engine.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ckf_core::route::{EngineShare, PoolLoad};
use ckf_engine::load::{EngineFamily, read_load};
use ckf_svc_kit::Shutdown;
use ckf_svc_kit::throttle::LogThrottle;
use tokio::time::MissedTickBehavior;

use super::config::EngineSpec;
use super::metrics::EngineMetrics;

/// At most one scrape-failure log line per engine per interval.
const LOG_INTERVAL: Duration = Duration::from_secs(60);

/// The latest share of every configured engine (an engine without `metrics_url` stays unknown).
#[derive(Debug)]
pub struct LoadBoard {
    /// Per engine: its share and when its load was read (`None`: unknown).
    shares: Mutex<Vec<(EngineShare, Option<Instant>)>>,
}

impl LoadBoard {
    /// Every engine of `specs` unknown, with its configured capacity.
    pub fn new(specs: &[EngineSpec]) -> Arc<Self> {
        let shares = specs
            .iter()
            .map(|s| {
                let share = EngineShare {
                    load: None,
                    prefill_tokens_per_s: s.prefill_tokens_per_s as f64,
                };
                (share, None)
            })
            .collect();
        Arc::new(Self {
            shares: Mutex::new(shares),
        })
    }

    /// The pool's load now and the age of its oldest engine reading; `None` when no engine's
    /// load is known.
    pub fn pool(&self) -> Option<(PoolLoad, Duration)> {
        let shares = self.shares.lock().expect("load board");
        let only: Vec<EngineShare> = shares.iter().map(|(share, _)| *share).collect();
        let pool = PoolLoad::from_engines(&only)?;
        let oldest = shares.iter().filter_map(|(_, read)| *read).min()?;
        Some((pool, oldest.elapsed()))
    }

    fn set(&self, engine: usize, load: Option<ckf_core::route::EngineLoad>) {
        let mut shares = self.shares.lock().expect("load board");
        let (share, read) = &mut shares[engine];
        share.load = load;
        *read = load.is_some().then(Instant::now);
    }
}

/// Starts one scrape task per engine with a `metrics_url`; they stop with `stop`.
pub fn spawn_scrapers(
    specs: &[EngineSpec],
    interval: Duration,
    timeout: Duration,
    board: &Arc<LoadBoard>,
    metrics: &EngineMetrics,
    stop: &Shutdown,
) {
    metrics.pool_engines_configured.set(specs.len() as i64);
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
            self.export();
        }
    }

    /// One scrape: the engine's load, or `None` (counted and logged) when it cannot be read.
    async fn scrape(&self) -> Option<ckf_core::route::EngineLoad> {
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

    /// The pool gauges after a scrape.
    fn export(&self) {
        let m = &self.metrics;
        let pool = self.board.pool().map(|(pool, _)| pool);
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
}
