//! # producer-svc (`ckf-producer`)
//!
//! One DC pool's cuckoo-filter producer as a service: it ingests KV events over gRPC
//! (`ckf.v1.Ingest`), keeps the exact ownership state and the packed filter in `ckf-core`'s
//! `DcCkfState`, and publishes lease-tagged barrier snapshots, deltas, heartbeats and drain
//! markers to one or more indexers (`ckf.v1.Relay`). Every semantic rule is `ckf-core`'s; this
//! crate adds transport, configuration, metrics and lifecycle.
//!
//! Following one KV event: [`ingest`] decodes the batch -> [`actor`] checks the source sequence
//! ([`sources`]) and applies it to the state -> on the cadence, [`fanout`] cuts a batch and
//! queues a delta per attachment -> [`relay_client`] sends it to its indexer.
//!
//! | module | owns |
//! | --- | --- |
//! | [`config`] | configuration only: layers, flags, validation |
//! | [`ingest`] | the `Ingest` service, one file per RPC, wire conversion |
//! | [`events`] | decoded batches and per-event reports (handler <-> actor) |
//! | [`sources`] | per-source batch sequence: gaps and replays |
//! | [`actor`] | the one task owning `DcCkfState`; cadence; shutdown drain |
//! | [`fanout`] | one `DcCkfPublisher` per endpoint; barrier snapshots; batch splitting |
//! | [`relay_client`] | one task per indexer: attach, stream, heartbeat, reconnect |
//! | [`metrics`] | `ckf_producer_*` Prometheus metrics |
//! | [`error`], [`status`] | ingest errors and their one mapping to gRPC statuses |
//!
//! [`serve`] starts everything in-process (the binary, `ckf demo` and the tests all use it).

pub mod actor;
pub mod config;
pub mod error;
pub mod events;
pub mod fanout;
pub mod ingest;
pub mod metrics;
pub mod relay_client;
pub mod sources;
pub mod status;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use ckf_core::dc::{DcCkfConfig, DcCkfState, DcCkfStats};
use ckf_core::identity::{ProducerIdentity, ProducerIncarnation};
use ckf_proto::v1::ingest_server::{IngestServer, SERVICE_NAME as INGEST_SERVICE};
use ckf_svc_kit::Shutdown;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tonic_health::ServingStatus;

pub use ckf_svc_kit::config::ConfigError;
pub use config::{Cli, ProducerConfig};
pub use relay_client::DrainOutcome;

use actor::{Actor, ActorReport, Cadence, Command};
use fanout::Fanout;
use ingest::IngestService;
use metrics::Metrics;
use relay_client::{RelayClient, RelaySettings};

/// HTTP/2 keepalive of the Relay client connections.
const KEEPALIVE: Duration = Duration::from_secs(10);

/// A running producer: its bound addresses, identity, and the way to wait for its end.
pub struct RunningProducer {
    /// The bound ingest (gRPC) address.
    pub ingest_addr: SocketAddr,
    /// The bound `/metrics` address.
    pub metrics_addr: SocketAddr,
    /// Pool, incarnation and table format presented to indexers.
    pub identity: ProducerIdentity,
    /// The producer's metrics (also served on `metrics_addr`).
    pub metrics: Metrics,
    shutdown: Shutdown,
    actor: mpsc::Sender<Command>,
    done: JoinHandle<anyhow::Result<ShutdownReport>>,
}

/// What a completed shutdown did.
#[derive(Debug, Clone)]
pub struct ShutdownReport {
    /// Per endpoint (in configuration order): the endpoint and how its drain went.
    pub drains: Vec<(String, DrainOutcome)>,
    /// The state's statistics after the last batch.
    pub final_stats: DcCkfStats,
}

impl ShutdownReport {
    /// The process exit status: 0 after a graceful shutdown. Unacknowledged drains and
    /// superseded attachments are logged but are not errors (the indexer's heartbeat deadline
    /// retires such lanes; a superseded pool is served by its newer producer).
    pub fn exit_code(&self) -> i32 {
        0
    }

    /// Whether every endpoint acknowledged its drain marker.
    pub fn all_drained(&self) -> bool {
        self.drains
            .iter()
            .all(|(_, d)| matches!(d, DrainOutcome::Drained { .. }))
    }
}

impl RunningProducer {
    /// Starts the shutdown (same as the future given to [`serve`] resolving).
    pub fn shutdown(&self) {
        self.shutdown.trigger();
    }

    /// Waits until shutdown completed: ingest stopped, pending tail published, drain markers
    /// sent and acknowledged (or timed out).
    ///
    /// # Errors
    /// A task that failed (the ingest server stopped with an error, a task panicked).
    pub async fn wait(self) -> anyhow::Result<ShutdownReport> {
        self.done.await.context("producer supervisor task")?
    }

    /// Current statistics of the state.
    ///
    /// # Errors
    /// When the state actor has stopped.
    pub async fn stats(&self) -> anyhow::Result<DcCkfStats> {
        let (reply, answer) = oneshot::channel();
        self.actor
            .send(Command::Stats { reply })
            .await
            .map_err(|_| anyhow::anyhow!("state actor stopped"))?;
        Ok(answer.await?)
    }

    /// A copy of the packed filter table (`bucket_count` words, index = bucket).
    ///
    /// # Errors
    /// When the state actor has stopped.
    pub async fn table(&self) -> anyhow::Result<Vec<u64>> {
        let (reply, answer) = oneshot::channel();
        self.actor
            .send(Command::Table { reply })
            .await
            .map_err(|_| anyhow::anyhow!("state actor stopped"))?;
        Ok(answer.await?)
    }
}

/// A fresh, nonzero producer incarnation (random, so a restarted producer never reuses one).
fn new_incarnation() -> ProducerIncarnation {
    ProducerIncarnation(rand::random::<u64>() | 1)
}

/// Validates `config`, binds the ingest and metrics listeners (port 0 allowed), and starts the
/// state actor, one publisher task per indexer and the gRPC server (Ingest + health +
/// reflection). Returns once everything is listening. Shutdown starts when `shutdown`
/// resolves or [`RunningProducer::shutdown`] is called.
///
/// # Errors
/// An invalid configuration ([`ConfigError`]), or a listener that cannot be bound.
pub async fn serve(
    config: ProducerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<RunningProducer> {
    let (pool, format) = config
        .pool_and_format()
        .map_err(|invalid| ConfigError::Invalid {
            invalid,
            source_name: None,
        })?;
    let identity = ProducerIdentity {
        pool,
        incarnation: new_incarnation(),
        format,
    };
    let mut dc_config = DcCkfConfig::new(format);
    dc_config.max_kicks = config.max_kicks();
    let state = DcCkfState::new(dc_config).map_err(|e| ConfigError::Invalid {
        invalid: ckf_svc_kit::config::Invalid::new("table", format, e.to_string()),
        source_name: None,
    })?;

    let stop = Shutdown::new();
    let metrics = Metrics::new();
    let reflection = ckf_svc_kit::grpc::reflection(&[ckf_proto::FILE_DESCRIPTOR_SET])
        .context("building the reflection service")?;
    let max_message_bytes =
        usize::try_from(config.limits.max_message_bytes).context("limits.max_message_bytes")?;

    let listener = ckf_svc_kit::grpc::bind(config.listen)
        .await
        .with_context(|| format!("binding the ingest listener on {}", config.listen))?;
    let metrics_server = ckf_svc_kit::metrics::serve_metrics(
        config.metrics_listen,
        metrics.registry().clone(),
        stop.wait(),
    )
    .await
    .with_context(|| format!("binding the metrics listener on {}", config.metrics_listen))?;

    // The state actor.
    let (actor_tx, actor_rx) = mpsc::channel(config.limits.ingest_channel_capacity as usize);
    let actor = Actor::new(
        state,
        Fanout::new(&identity, &config.indexers, metrics.clone()),
        metrics.clone(),
        Cadence {
            batch_threshold: config.publication.batch_threshold as usize,
            max_delay: config.max_delay(),
        },
    );
    // The actor does CPU-bound filter work (cuckoo kicks, omissions at 500 kicks each, clears of
    // large members): it gets a thread of its own so a long command can never starve the relay
    // sessions' heartbeats on the runtime's worker threads.
    let actor_stop = stop.clone();
    let runtime = tokio::runtime::Handle::current();
    let actor_task: JoinHandle<ActorReport> =
        tokio::task::spawn_blocking(move || runtime.block_on(actor.run(actor_rx, actor_stop)));

    // One publisher task per indexer endpoint.
    let settings = RelaySettings {
        heartbeat_interval: config.heartbeat_interval(),
        initial_backoff: Duration::from_millis(config.reconnect.initial_backoff_ms),
        max_backoff: Duration::from_millis(config.reconnect.max_backoff_ms),
        connect_timeout: Duration::from_millis(config.reconnect.connect_timeout_ms),
        drain_timeout: config.drain_timeout(),
        keepalive: KEEPALIVE,
        max_message_bytes,
        attachment_queue: config.publication.attachment_queue as usize,
    };
    let relays: Vec<(String, JoinHandle<DrainOutcome>)> = config
        .indexers
        .iter()
        .enumerate()
        .map(|(i, endpoint)| {
            let client = RelayClient::new(
                i,
                endpoint.clone(),
                identity.clone(),
                actor_tx.clone(),
                metrics.clone(),
                settings.clone(),
                stop.clone(),
            );
            (endpoint.clone(), tokio::spawn(client.run()))
        })
        .collect();

    // The gRPC server.
    let (health_reporter, health) = ckf_svc_kit::grpc::health(&[INGEST_SERVICE]).await;
    let ingest = IngestServer::new(IngestService::new(
        actor_tx.clone(),
        identity.clone(),
        stop.clone(),
        config.limits.max_events_per_batch as usize,
    ))
    .max_decoding_message_size(max_message_bytes)
    .max_encoding_message_size(max_message_bytes);
    let ingest_addr = listener.addr;
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(KEEPALIVE))
            .add_service(health)
            .add_service(reflection)
            .add_service(ingest)
            .serve_with_incoming_shutdown(listener.incoming, stop.wait()),
    );
    ckf_svc_kit::grpc::set_all(&health_reporter, &[INGEST_SERVICE], ServingStatus::Serving).await;
    tracing::info!(
        pool = %identity.pool,
        incarnation = %identity.incarnation,
        format = %identity.format,
        %ingest_addr,
        metrics_addr = %metrics_server.addr,
        indexers = ?config.indexers,
        "producer started"
    );

    // Only now: an error above must not leave a task waiting on the caller's future.
    stop.trigger_on(shutdown);
    let supervisor_stop = stop.clone();
    let done = tokio::spawn(async move {
        supervisor_stop.wait().await;
        tracing::info!(
            "shutting down: ingest stops, the pending tail is published, then drain markers"
        );
        ckf_svc_kit::grpc::set_all(
            &health_reporter,
            &[INGEST_SERVICE],
            ServingStatus::NotServing,
        )
        .await;
        let report = actor_task.await.context("state actor task")?;
        let mut drains = Vec::with_capacity(relays.len());
        for (endpoint, task) in relays {
            drains.push((endpoint, task.await.context("publisher task")?));
        }
        server
            .await
            .context("ingest server task")?
            .context("ingest server")?;
        let _ = metrics_server.task.await;
        tracing::info!(drain_markers = report.drain_markers, drains = ?drains, "producer stopped");
        Ok(ShutdownReport {
            drains,
            final_stats: report.stats,
        })
    });

    Ok(RunningProducer {
        ingest_addr,
        metrics_addr: metrics_server.addr,
        identity,
        metrics,
        shutdown: stop,
        actor: actor_tx,
        done,
    })
}
