//! The live run's simulated engines: the serving model's pools ([`Pools`]) on a clock that
//! runs with the wall clock, each worker exporting its load on a Prometheus endpoint under
//! vLLM's metric names, for its DC's producer to scrape (`[[engines]] metrics_url`).
//!
//! A worker's endpoint is `http://ADDR/dc/{dc}/worker/{worker}/metrics` (DC and worker
//! indices); it shows one sample per data-parallel rank (label `engine`, as a vLLM engine with
//! several engine cores does) of `vllm:num_requests_running`, `vllm:num_requests_waiting` and
//! `vllm:kv_cache_usage_perc`, as the model has them at the moment of the scrape.
//!
//! **Clock.** The model's time of request `k` is its timestamp / `speed` (see
//! [`crate::bench::sim`]). [`EngineBoard::start`] pins the model time of the first request to
//! the wall clock's now; from then on a scrape at wall time `w` sees the model at
//! `t0 + (w - start)`, and a paced run sends each request when the wall clock reaches its model
//! time, so what the producers scrape, relay and the indexer routes on is the model's load
//! as it is when the request arrives (or a little before: a request is never sent early).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::get;

use crate::bench::fleet::{FleetShape, RankId};
use crate::bench::sim::{Pools, ServingModel};

/// The pools of a live run, on the run's clock.
#[derive(Debug)]
pub struct EngineBoard {
    shape: FleetShape,
    /// The `model_name` label of every sample.
    model_name: String,
    pools: Mutex<Pools>,
    /// `(wall instant, model time at it, s)`, set once by [`EngineBoard::start`].
    clock: OnceLock<(Instant, f64)>,
}

impl EngineBoard {
    /// Idle pools of `shape` on `model`, their clock not started; `model_name` labels their
    /// samples (vLLM's served model name).
    ///
    /// # Panics
    /// When `model` does not validate against the shape.
    pub fn new(shape: FleetShape, model: &ServingModel, model_name: &str) -> Arc<Self> {
        Arc::new(Self {
            shape,
            model_name: model_name.to_owned(),
            pools: Mutex::new(Pools::new(shape, model)),
            clock: OnceLock::new(),
        })
    }

    /// The pools (a poisoned lock is taken over: the pools hold no invariant a panic elsewhere
    /// could break half-way).
    pub fn pools(&self) -> MutexGuard<'_, Pools> {
        self.pools.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the clock: model time `t0` is now. Later calls change nothing.
    pub fn start(&self, t0: f64) {
        let _ = self.clock.set((Instant::now(), t0));
    }

    /// The model's time now (its start time before [`EngineBoard::start`]: 0).
    pub fn now(&self) -> f64 {
        self.clock
            .get()
            .map_or(0.0, |&(wall, t0)| t0 + wall.elapsed().as_secs_f64())
    }

    /// Sleeps until the model's time is `t` (returns at once when it is past, or the clock has
    /// not started).
    pub async fn wait_until(&self, t: f64) {
        if let Some(&(wall, t0)) = self.clock.get()
            && let Ok(after) = Duration::try_from_secs_f64(t - t0)
        {
            match wall.checked_add(after) {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                // Beyond what the clock can count: never.
                None => std::future::pending().await,
            }
        }
    }

    /// Worker `worker` of DC `dc` as vLLM's Prometheus endpoint shows it now; `None` for a DC
    /// or worker the fleet does not have.
    pub fn metrics_text(&self, dc: usize, worker: usize) -> Option<String> {
        if dc >= self.shape.dcs || worker >= self.shape.workers_per_dc {
            return None;
        }
        let registry = prometheus::Registry::new();
        let labels = &["engine", "model_name"];
        let gauge =
            |name: &str, help: &str| ckf_svc_kit::metrics::gauge_vec(&registry, name, help, labels);
        let running = gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
        );
        let waiting = gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
        );
        let usage = gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
        );
        let t = self.now();
        let pools = self.pools();
        for rank in 0..self.shape.ranks_per_worker {
            let load = pools.engine_load(RankId { dc, worker, rank }, t);
            let values = [rank.to_string(), self.model_name.clone()];
            let values: Vec<&str> = values.iter().map(String::as_str).collect();
            running
                .with_label_values(&values)
                .set(f64::from(load.running));
            waiting
                .with_label_values(&values)
                .set(f64::from(load.waiting));
            usage.with_label_values(&values).set(load.kv_usage);
        }
        drop(pools);
        Some(ckf_svc_kit::metrics::render_text(&registry))
    }
}

/// The endpoints of a board's workers, bound on loopback.
#[derive(Debug)]
pub struct EngineEndpoints {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl EngineEndpoints {
    /// Serves `board`'s workers on an ephemeral loopback port until dropped.
    ///
    /// # Errors
    /// No free loopback port.
    pub async fn bind(board: Arc<EngineBoard>) -> Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the simulated engines' metrics endpoint")?;
        let addr = listener.local_addr()?;
        let app = axum::Router::new()
            .route("/dc/{dc}/worker/{worker}/metrics", get(worker_metrics))
            .with_state(board);
        let task = tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, app).await {
                crate::errln!("the simulated engines' metrics endpoint failed: {error}");
            }
        });
        Ok(Self { addr, task })
    }

    /// Worker `worker` of DC `dc`'s `metrics_url`.
    pub fn url(&self, dc: usize, worker: usize) -> String {
        format!("http://{}/dc/{dc}/worker/{worker}/metrics", self.addr)
    }
}

impl Drop for EngineEndpoints {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn worker_metrics(
    State(board): State<Arc<EngineBoard>>,
    Path((dc, worker)): Path<(usize, usize)>,
) -> Result<String, StatusCode> {
    board.metrics_text(dc, worker).ok_or(StatusCode::NOT_FOUND)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::sim::ServingModel;

    const SHAPE: FleetShape = FleetShape {
        dcs: 2,
        workers_per_dc: 1,
        ranks_per_worker: 2,
        capacity_blocks: 4,
    };

    #[test]
    fn a_worker_shows_each_rank_under_vllm_names_and_the_producer_reads_its_sum() {
        let board = EngineBoard::new(SHAPE, &ServingModel::unequal(2), "ckf-demo");
        // Two requests sent at 0 to rank 1 of DC 1 (280 ms away: they arrive at 0.14 s), the
        // second behind the first (32,000 tokens at 16,000 tokens/s per engine: 2 s each);
        // scraped at about 0.2 s.
        let rank = RankId {
            dc: 1,
            worker: 0,
            rank: 1,
        };
        {
            let mut pools = board.pools();
            pools.admit(0.0, rank, 32_000, 0, 0.5);
            pools.admit(0.0, rank, 32_000, 0, 0.75);
        }
        board.start(0.2);
        let text = board.metrics_text(1, 0).expect("a worker of the fleet");
        assert!(
            text.contains(r#"vllm:num_requests_running{engine="1",model_name="ckf-demo"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"vllm:num_requests_waiting{engine="1",model_name="ckf-demo"} 1"#),
            "{text}"
        );
        // What the producer reads from it: requests summed over the ranks, usage averaged.
        let load = ckf_engine::load::read_load(ckf_engine::load::EngineFamily::Vllm, &text)
            .expect("the producer's reader accepts it");
        assert_eq!((load.running, load.waiting), (1, 1));
        assert!((load.kv_usage - 0.375).abs() < 1e-9, "{load:?}");
        // DC 0 is idle; DCs and workers outside the fleet have no endpoint.
        let idle = board.metrics_text(0, 0).expect("a worker of the fleet");
        let load = ckf_engine::load::read_load(ckf_engine::load::EngineFamily::Vllm, &idle)
            .expect("the producer's reader accepts it");
        assert_eq!((load.running, load.waiting), (0, 0));
        assert!(board.metrics_text(2, 0).is_none() && board.metrics_text(0, 1).is_none());
    }

    #[tokio::test]
    async fn the_clock_runs_from_the_first_request_and_waits_never_return_early() {
        let board = EngineBoard::new(SHAPE, &ServingModel::unequal(2), "ckf-demo");
        assert_eq!(board.now(), 0.0);
        board.start(100.0);
        let before = Instant::now();
        board.wait_until(100.05).await;
        assert!(before.elapsed() >= Duration::from_millis(49));
        assert!(board.now() >= 100.05);
        // A time already past returns at once (no panic on a negative wait).
        board.wait_until(99.0).await;
    }
}
