//! `ckf demo`: one indexer and one producer per DC, started in-process on loopback ephemeral
//! ports through the same `serve` functions the `ckf-indexer` and `ckf-producer` binaries use,
//! then a live replay, the report, and a graceful shutdown (producers drain first).
//!
//! With `--feed zmq` (the default) each rank of the simulated fleet is a built-in vLLM engine
//! publisher ([`crate::bench::publisher`]) bound on loopback, and each DC's producer is configured
//! with one `[[engines]]` entry per worker (`worker_id` = worker, `dp_size` = ranks, rank r on
//! port + r), exactly as it would subscribe to real vLLM engines. With `--feed grpc` the
//! replay sends `PublishBatch` calls instead.
//!
//! With `--policy expected-ttft` (zmq feed) the live run routes by the indexer's `Route` on the
//! real load path: each worker of the fleet also exports the serving model's load on a
//! Prometheus endpoint under vLLM's names ([`crate::bench::live::engines`]), its producer
//! scrapes it (`metrics_url`, `engine.load_interval_ms` = `--load-interval-ms`) with the
//! worker's prefill capacity configured, and the requests are sent on the workload's clock
//! (timestamps / `--speed`). The demo's KV blocks are 16 tokens where the workload's are 512
//! (one trace block each): `Route` is asked, and the capacities and
//! `route.queued_request_tokens` are configured, in the demo's tokens (the workload's x 16 /
//! 512), so every expected time to first token is the workload's.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use crate::bench::args::{DEFAULT_DCS, FeedKind, FleetArgs, TimeoutArgs};
use crate::bench::feed::TokenFeed;
use crate::bench::fleet::FleetShape;
use crate::bench::live::engines::{EngineBoard, EngineEndpoints};
use crate::bench::live::{self, DcTarget, Feed, LiveEngines, ZmqFeed};
use crate::bench::policy::Policy;
use crate::bench::publisher::{DEFAULT_BUFFER_STEPS, EnginePublisher, bind_ranks};
use crate::bench::replay::{live_config, load_workload, print_report};
use crate::bench::sim::ServingModel;
use crate::bench::trace::TOKENS_PER_BLOCK;
use crate::connect::connect;
use ckf_engine::encode::Layout;
use ckf_svc_kit::access::authed;
use producer_svc::engines::config::EngineSpec;

/// `ckf demo`.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// How the producers get KV events.
    #[arg(long, value_enum, default_value_t = FeedKind::Zmq)]
    pub feed: FeedKind,
    /// A Mooncake JSONL trace to replay instead of the built-in synthetic workload.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Data centers (one producer and one indexer lane each), 1..=16.
    #[arg(long, default_value_t = DEFAULT_DCS)]
    pub dcs: usize,
    /// Fleet, policy and output.
    #[command(flatten)]
    pub fleet: FleetArgs,
    /// Timeouts.
    #[command(flatten)]
    pub timeouts: TimeoutArgs,
}

/// The indexer domain of the demo services.
pub const DOMAIN: &str = "ckf-demo";

/// Tokens per KV block in the demo (the services' default `block_size`).
pub const BLOCK_SIZE: u32 = 16;

/// DC ids of the demo: `dc-a`, `dc-b`, ... (one per DC, at most 16).
pub fn dc_names(dcs: usize) -> Vec<String> {
    (0..dcs)
        .map(|i| format!("dc-{}", char::from(b'a' + i as u8)))
        .collect()
}

/// The demo's tokens per workload token (see the module docs).
pub const TOKEN_SCALE: f64 = BLOCK_SIZE as f64 / TOKENS_PER_BLOCK as f64;

/// The load path of a live expected-ttft run: the simulated engines' endpoints and the
/// serving model they follow.
pub struct LoadPath<'a> {
    /// Where each worker's metrics are.
    pub endpoints: &'a EngineEndpoints,
    /// Capacities, load interval and queued-request tokens (in the workload's tokens).
    pub model: &'a ServingModel,
}

impl LoadPath<'_> {
    /// The producers' scrape interval, ms (checked by [`run`]: 100..=60,000, as a producer's
    /// `engine.load_interval_ms`).
    fn interval_ms(&self) -> u64 {
        self.model.load_interval_ms.round() as u64
    }
}

/// Running in-process services.
pub struct Services {
    /// The indexer's gRPC URL.
    pub indexer_url: String,
    /// `(DC id, producer gRPC URL, producer metrics host:port)`, in DC order.
    pub producers: Vec<(String, String, String)>,
    indexer: indexer_svc::RunningIndexer,
    running: Vec<producer_svc::RunningProducer>,
}

impl Services {
    /// Starts one indexer with a lane per DC and one producer per DC, tables sized so a DC can
    /// hold its every rank full of distinct blocks below the 90% target load (no capacity
    /// omissions by construction).
    ///
    /// # Errors
    /// A service that fails to start.
    pub async fn start(shape: FleetShape) -> Result<Self> {
        Self::start_with(shape, &[], None).await
    }

    /// As [`Services::start`], with DC `i`'s producer subscribing to the engine publishers
    /// `engines[i]` (per rank `worker * ranks + rank`; none when `engines` is empty) and, with
    /// `load`, scraping their workers' load.
    ///
    /// # Errors
    /// A service that fails to start.
    pub async fn start_with(
        shape: FleetShape,
        engines: &[Vec<EnginePublisher>],
        load: Option<LoadPath<'_>>,
    ) -> Result<Self> {
        let names = dc_names(shape.dcs);
        let lanes: Vec<&str> = names.iter().map(String::as_str).collect();
        let expected = shape.max_blocks_per_dc().max(1024);
        let mut config = indexer_svc::IndexerConfig::for_lanes(DOMAIN, &lanes);
        config.table.expected_blocks = expected;
        config.block_size = BLOCK_SIZE;
        if let Some(load) = &load {
            config.route.queued_request_tokens =
                (load.model.queued_request_tokens * TOKEN_SCALE).max(1.0);
            // The serving model's round trips, as `ckf route` shows them (the live run also
            // sends them with every request).
            config.route.rtt_ms = names
                .iter()
                .zip(&load.model.dcs)
                .map(|(dc, serving)| (dc.clone(), serving.rtt_ms))
                .collect();
            // The capacity a DC without a known load counts at, in the demo's tokens like
            // every capacity here (the serving model's offline runs use the same default).
            config.route.default_prefill_tokens_per_s *= TOKEN_SCALE;
            // A report is never stale between two scrapes (as the serving model assumes).
            config.route.stale_after_ms = config.route.stale_after_ms.max(3 * load.interval_ms());
        }
        let indexer = indexer_svc::serve(config, std::future::pending())
            .await
            .context("starting the indexer")?;
        let indexer_url = format!("http://{}", indexer.grpc_addr);
        let mut running = Vec::new();
        let mut producers = Vec::new();
        for (i, dc) in names.iter().enumerate() {
            let mut config =
                producer_svc::ProducerConfig::for_pool(DOMAIN, dc, vec![indexer_url.clone()]);
            config.table.expected_blocks = expected;
            config.block_size = BLOCK_SIZE;
            if let Some(publishers) = engines.get(i) {
                config.engines = engine_specs(publishers, shape.ranks_per_worker)?;
                if let Some(load) = &load {
                    let interval = load.interval_ms();
                    config.engine.load_interval_ms = interval;
                    config.engine.load_timeout_ms = config.engine.load_timeout_ms.min(interval);
                    config.engine.pushed_load_ttl_ms =
                        config.engine.pushed_load_ttl_ms.max(interval);
                    let per_worker = load.model.dcs[i].prefill_tokens_per_s * TOKEN_SCALE
                        / shape.workers_per_dc as f64;
                    for (worker, spec) in config.engines.iter_mut().enumerate() {
                        spec.metrics_url = Some(load.endpoints.url(i, worker));
                        spec.prefill_tokens_per_s = per_worker.round().max(1.0) as u64;
                    }
                }
            }
            let producer = producer_svc::serve(config, std::future::pending())
                .await
                .with_context(|| format!("starting the {dc} producer"))?;
            producers.push((
                dc.clone(),
                format!("http://{}", producer.ingest_addr),
                producer.metrics_addr.to_string(),
            ));
            running.push(producer);
        }
        Ok(Self {
            indexer_url,
            producers,
            indexer,
            running,
        })
    }

    /// Connections for a live replay.
    ///
    /// # Errors
    /// A connection failure.
    pub async fn targets(&self) -> Result<Vec<DcTarget>> {
        let mut targets = Vec::new();
        for (dc, url, metrics) in &self.producers {
            targets.push(DcTarget {
                dc: dc.clone(),
                producer: authed(connect(url).await?, None),
                metrics: Some(metrics.clone()),
            });
        }
        Ok(targets)
    }

    /// Graceful shutdown: producers publish their tail and drain, then the indexer stops.
    ///
    /// # Errors
    /// A service task that failed.
    pub async fn shutdown(self) -> Result<()> {
        for producer in &self.running {
            producer.shutdown();
        }
        for producer in self.running {
            producer.wait().await.context("producer shutdown")?;
        }
        self.indexer.shutdown();
        self.indexer.wait().await.context("indexer shutdown")?;
        Ok(())
    }
}

/// One `[[engines]]` entry per worker: rank 0's endpoints, `dp_size` ranks on the next ports.
fn engine_specs(publishers: &[EnginePublisher], ranks: usize) -> Result<Vec<EngineSpec>> {
    publishers
        .chunks(ranks.max(1))
        .enumerate()
        .map(|(worker, ranks)| {
            let first = &ranks[0];
            Ok(EngineSpec {
                worker_id: worker as u64,
                endpoint: first.endpoint().to_string(),
                replay_endpoint: first.replay_endpoint().map(String::from),
                dp_size: u32::try_from(ranks.len()).context("too many ranks")?,
                topic: String::new(),
                format: "auto".into(),
                mode: Default::default(),
                metrics_url: None,
                family: Default::default(),
                prefill_tokens_per_s: 0,
            })
        })
        .collect()
}

/// Binds one publisher per rank of every DC (each worker's ranks on consecutive ports).
///
/// # Errors
/// No free loopback ports.
pub async fn bind_publishers(shape: FleetShape) -> Result<Vec<Vec<EnginePublisher>>> {
    let mut all = Vec::with_capacity(shape.dcs);
    for _ in 0..shape.dcs {
        let mut dc = Vec::with_capacity(shape.ranks_per_dc());
        for _ in 0..shape.workers_per_dc {
            dc.extend(
                bind_ranks(
                    "127.0.0.1",
                    shape.ranks_per_worker,
                    "",
                    DEFAULT_BUFFER_STEPS,
                    Layout::Tagged,
                )
                .await?,
            );
        }
        all.push(dc);
    }
    Ok(all)
}

/// The demo services and the feed of `kind`: for ZMQ, the engine publishers are bound first
/// and every producer starts subscribed to its DC's.
///
/// # Errors
/// No free loopback ports, or a service that fails to start.
pub async fn start_feed(
    shape: FleetShape,
    kind: FeedKind,
    load: Option<LoadPath<'_>>,
) -> Result<(Services, Feed)> {
    Ok(match kind {
        FeedKind::Grpc => (Services::start(shape).await?, Feed::Grpc),
        FeedKind::Zmq => {
            let publishers = bind_publishers(shape).await?;
            let services = Services::start_with(shape, &publishers, load).await?;
            let feed = Feed::Zmq(ZmqFeed::new(TokenFeed::new(BLOCK_SIZE)?, publishers));
            (services, feed)
        }
    })
}

/// Runs `ckf demo`. The workload (and a given trace) is validated before any service starts.
/// SIGINT, SIGTERM or SIGHUP stops the replay (once the services are up, when it comes
/// earlier), shuts the services down as at the end, and fails naming the signal; a second one
/// exits at once ([`StopSignals`]).
///
/// # Errors
/// A bad trace, a service that fails to start, a replay failure, or a stop signal.
pub async fn run(args: DemoArgs) -> Result<()> {
    let mut stopped = StopSignals::listen()?.watch();
    let workload = load_workload(args.trace.as_deref(), args.fleet.limit, args.fleet.seed)?;
    let shape = args.fleet.shape(args.dcs);
    shape.validate().map_err(|e| anyhow::anyhow!(e))?;
    let mut config = live_config(&args.fleet, &args.timeouts, shape, &workload)?;
    // Expected-ttft routes by the indexer's Route: the producers scrape simulated engines.
    let endpoints = if config.policy == Policy::ExpectedTtft {
        Some(prepare_load_path(&args, &workload, &mut config).await?)
    } else {
        None
    };
    let load = endpoints.as_ref().map(|endpoints| LoadPath {
        endpoints,
        model: &config.serving,
    });
    let (services, mut feed) = start_feed(shape, args.feed, load).await?;
    let replay = async {
        let indexer = authed(connect(&services.indexer_url).await?, None);
        live::replay(
            &workload,
            indexer,
            services.targets().await?,
            &config,
            &mut feed,
        )
        .await
    };
    let outcome = tokio::select! {
        outcome = replay => outcome,
        Ok(signal) = &mut stopped => {
            Err(anyhow::anyhow!("stopped by {signal} before the replay finished"))
        }
    };
    services.shutdown().await?;
    print_report(&outcome?, args.fleet.json)
}

/// The signals that stop a demo: SIGINT, SIGTERM and SIGHUP, listened for from the start,
/// each unless the process started with it ignored (`nohup`, a shell's background job), which
/// is left as it was.
///
/// Why SIGHUP too: the services the demo runs in-process reload their token files on SIGHUP,
/// and listening for a signal takes away its default action of ending the process, so a demo
/// whose terminal closed would otherwise run on.
pub struct StopSignals {
    interrupt: Option<tokio::signal::unix::Signal>,
    terminate: Option<tokio::signal::unix::Signal>,
    hangup: Option<tokio::signal::unix::Signal>,
}

/// Signal numbers (Linux) of the stop signals.
const SIGHUP: u32 = 1;
const SIGINT: u32 = 2;
const SIGTERM: u32 = 15;

/// Whether signal `signo` is ignored by this process, from the `SigIgn` mask of
/// `/proc/self/status` (bit `signo - 1`); `false` when that cannot be read.
fn ignored(signo: u32) -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let mask = status.lines().find_map(|l| l.strip_prefix("SigIgn:"))?;
            u64::from_str_radix(mask.trim(), 16).ok()
        })
        .is_some_and(|mask| mask >> (signo - 1) & 1 == 1)
}

impl StopSignals {
    /// Starts listening (inside a tokio runtime, before anything else listens for them).
    ///
    /// # Errors
    /// When a signal handler cannot be installed.
    pub fn listen() -> Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        let listen = |signo, kind| -> Result<_> {
            if ignored(signo) {
                return Ok(None);
            }
            Ok(Some(signal(kind).context("listening for stop signals")?))
        };
        Ok(Self {
            interrupt: listen(SIGINT, SignalKind::interrupt())?,
            terminate: listen(SIGTERM, SignalKind::terminate())?,
            hangup: listen(SIGHUP, SignalKind::hangup())?,
        })
    }

    /// The name of the next stop signal received.
    pub async fn next(&mut self) -> &'static str {
        async fn recv(signal: &mut Option<tokio::signal::unix::Signal>) {
            match signal {
                Some(signal) => {
                    signal.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            () = recv(&mut self.interrupt) => "SIGINT",
            () = recv(&mut self.terminate) => "SIGTERM",
            () = recv(&mut self.hangup) => "SIGHUP",
        }
    }

    /// Watches from a task of its own, whatever the demo is doing: the first stop signal is
    /// announced on stderr and sent to the returned receiver; the next one ends the process
    /// at once (exit status 130), for a start-up or shutdown that takes too long. Messages
    /// never panic (stderr may be a closed terminal: that is what SIGHUP reports).
    pub fn watch(mut self) -> tokio::sync::oneshot::Receiver<&'static str> {
        let (stop, stopped) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let signal = self.next().await;
            crate::errln!("ckf demo: {signal}: stopping (send it again to exit at once)");
            let _ = stop.send(signal);
            let signal = self.next().await;
            crate::errln!("ckf demo: {signal} again: exiting");
            std::process::exit(130);
        });
        stopped
    }
}

/// The longest paced run `ckf demo` starts, seconds (its clock could not go much further).
const MAX_PACED_RUN_S: f64 = 1e7;

/// Checks what a live expected-ttft run needs, binds the simulated engines' endpoints and puts
/// their board in `config`.
///
/// # Errors
/// The grpc feed, a load interval a producer does not take, a capacity or queued-request size
/// the demo's units cannot carry, a workload too long to pace, or no free port.
async fn prepare_load_path(
    args: &DemoArgs,
    workload: &live::Workload,
    config: &mut live::LiveConfig,
) -> Result<EngineEndpoints> {
    use anyhow::bail;
    let model = &config.serving;
    if matches!(args.feed, FeedKind::Grpc) {
        bail!(
            "--policy expected-ttft needs --feed zmq: the producers scrape the load of the \
             engines they subscribe to"
        );
    }
    let interval = model.load_interval_ms;
    if !(100.0..=60_000.0).contains(&interval) {
        bail!(
            "--load-interval-ms {interval}: with --policy expected-ttft the producers scrape the \
             engines at that interval, 100..=60000 ms"
        );
    }
    // A worker's capacity is configured in whole demo tokens/s: at least 100, so rounding
    // changes it by at most 0.5%.
    let workers = config.shape.workers_per_dc as f64;
    let least = 100.0 / TOKEN_SCALE * workers;
    if let Some((dc, d)) = model
        .dcs
        .iter()
        .enumerate()
        .find(|(_, d)| d.prefill_tokens_per_s < least)
    {
        bail!(
            "--dc-prefill-tokens-per-s {} for DC {}: with --policy expected-ttft each of its {} \
             workers is configured with at least 100 of the demo's 16-token-block tokens/s, so \
             the DC needs at least {least:.0} tokens/s",
            d.prefill_tokens_per_s,
            dc + 1,
            config.shape.workers_per_dc
        );
    }
    // The indexer's route.queued_request_tokens is at most 3,600,000 of its tokens.
    let most = 3_600_000.0 / TOKEN_SCALE;
    if model.queued_request_tokens > most {
        bail!(
            "--queued-request-tokens {} (default: the workload's mean prompt): with --policy \
             expected-ttft at most {most:.0}",
            model.queued_request_tokens
        );
    }
    let first = workload.requests.first().map_or(0, |r| r.timestamp_ms);
    let last = workload.requests.iter().map(|r| r.timestamp_ms).max();
    let span_s = last.map_or(0, |l| l.saturating_sub(first)) as f64 / 1e3 / model.speed;
    if span_s > MAX_PACED_RUN_S {
        bail!(
            "the workload spans {span_s:.0} s at --speed {}: with --policy expected-ttft the \
             requests are sent on its clock; at most {MAX_PACED_RUN_S:.0} s (raise --speed)",
            model.speed
        );
    }
    crate::errln!(
        "expected-ttft: {} requests sent on the workload's clock, about {span_s:.0} s once every \
         DC's load is known (the first reports come within {interval:.0} ms)",
        workload.requests.len(),
    );
    let board = EngineBoard::new(config.shape, model, DOMAIN);
    let endpoints = EngineEndpoints::bind(board.clone()).await?;
    config.engines = Some(LiveEngines {
        board,
        token_scale: TOKEN_SCALE,
    });
    Ok(endpoints)
}
