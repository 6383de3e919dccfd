//! # producer-svc (`ckf-producer`)
//!
//! One DC pool's cuckoo-filter producer as a service: it ingests KV events over gRPC
//! (`ckf.v1.Ingest`), keeps the exact ownership state and the packed filter in `ckf-core`'s
//! `DcCkfState`, and publishes lease-tagged barrier snapshots, deltas, heartbeats and drain
//! markers to one or more indexers (`ckf.v1.Relay`). Every semantic rule is `ckf-core`'s; this
//! crate adds transport, configuration, metrics and lifecycle.
//!
//! Following one KV event: [`ingest`] decodes the batch -> [`actor`] checks the source sequence
//! (`ckf_core::sources`) and applies it to the state -> on the cadence, the actor's fan-out
//! (`ckf_core::fanout`, over [`fanout`]'s queues) cuts a batch and queues a delta per
//! attachment -> [`relay_client`] sends it to its indexer.
//!
//! | module | owns |
//! | --- | --- |
//! | [`access`] | `[ingest_auth]` (which sources may publish, touching which workers) and the indexer bearer token |
//! | [`cli`] | the command line and the layers it loads (defaults < file < environment < flags) |
//! | [`config`] | configuration only: sections, defaults, validation |
//! | [`engines`] | ZMQ ingest: one task per engine publisher socket (SUB + replay DEALER), engine config and metrics |
//! | [`ingest`] | the `Ingest` service, one file per RPC, wire conversion |
//! | [`events`] | decoded batches and per-event reports (handler <-> actor) |
//! | [`actor`] | the one task owning `DcCkfState`, source sequences and the fan-out; cadence; shutdown drain; `ActorHandle::ask` |
//! | [`fanout`] | each attachment's bounded frame queue as `ckf_core::fanout::FrameSink` |
//! | [`durability`] | `[durability]`: the journal (`ckf-journal`) opened and recovered at start, unusable state refused or set aside, journal metrics (the records are `actor`'s) |
//! | [`relay_client`] | one task per indexer: attach, stream, heartbeat, reconnect |
//! | [`metrics`] | `ckf_producer_*` Prometheus metrics |
//! | [`error`], [`status`] | ingest errors and their one mapping to gRPC statuses |
//!
//! [`serve`] starts everything in-process (the binary, `ckf demo` and the tests all use it);
//! [`ServeError`] says why it could not start or stopped abnormally.

pub mod access;
pub mod actor;
pub mod cli;
pub mod config;
pub mod durability;
pub mod engines;
pub mod error;
pub mod events;
pub mod fanout;
pub mod ingest;
pub mod metrics;
pub mod relay_client;
pub mod status;
pub mod trim;

use std::future::Future;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::time::Duration;

use ckf_core::dc::{DcCkfConfig, DcCkfError, DcCkfState, DcCkfStats};
use ckf_core::identity::{ProducerIdentity, ProducerIncarnation};
use ckf_core::sources::SourceSequences;
use ckf_proto::v1::ingest_server::{IngestServer, SERVICE_NAME as INGEST_SERVICE};
use ckf_svc_kit::Shutdown;
use ckf_svc_kit::config::Invalid;
use ckf_svc_kit::serve::{BindError, Listeners, front};
use ckf_svc_kit::tls::{ServerTls, TlsError};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

pub use ckf_svc_kit::config::ConfigError;
pub use cli::Cli;
pub use config::ProducerConfig;
pub use error::ActorGone;
pub use relay_client::DrainOutcome;

use actor::{Actor, ActorHandle, ActorReport, Command};
use ckf_core::cadence::Cadence;
use ingest::IngestService;
use metrics::Metrics;
use relay_client::{IndexerAttachment, RelaySettings};

/// HTTP/2 keepalive of the Relay client connections.
const KEEPALIVE: Duration = Duration::from_secs(10);
/// gRPC services reported by the health service.
const SERVICES: [&str; 1] = [INGEST_SERVICE];

/// Why a producer could not start or stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A configuration value breaks a rule (key, value, rule).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A TLS certificate, key or CA file cannot be used (names the key and the file).
    #[error("TLS: {0}")]
    Tls(#[from] TlsError),
    /// A listener could not be bound (`what`: `"ingest"` or `"metrics"`).
    #[error("binding the {} listener on {}: {}", .0.what, .0.addr, .0.source)]
    Bind(#[from] BindError),
    /// The state directory (`[durability]`) could not be used: I/O, a second producer on it,
    /// or damaged or foreign state (names the file and the fault).
    #[error(transparent)]
    Durability(#[from] durability::DurabilityError),
    /// The reflection descriptors could not be loaded.
    #[error("building the reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The ingest gRPC server failed.
    #[error("ingest server: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// A task of the producer (state actor, publisher, server) panicked or was cancelled.
    #[error("{what} task: {source}")]
    Join {
        /// Which task.
        what: &'static str,
        /// How it ended.
        source: tokio::task::JoinError,
    },
}

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
    actor: ActorHandle,
    done: JoinHandle<Result<ShutdownReport, ServeError>>,
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
    /// [`ServeError::Transport`] when the ingest server stopped with an error,
    /// [`ServeError::Join`] when a task panicked.
    pub async fn wait(self) -> Result<ShutdownReport, ServeError> {
        self.done.await.map_err(|source| ServeError::Join {
            what: "producer supervisor",
            source,
        })?
    }

    /// Current statistics of the state.
    ///
    /// # Errors
    /// [`ActorGone`] when the state actor has stopped.
    pub async fn stats(&self) -> Result<DcCkfStats, ActorGone> {
        let (stats, _) = self.actor.ask(|reply| Command::Stats { reply }).await?;
        Ok(stats)
    }

    /// A copy of the packed filter table (`bucket_count` words, index = bucket).
    ///
    /// # Errors
    /// [`ActorGone`] when the state actor has stopped.
    pub async fn table(&self) -> Result<Vec<u64>, ActorGone> {
        self.actor.ask(|reply| Command::Table { reply }).await
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
/// [`ServeError::Config`] for an invalid configuration, [`ServeError::Bind`] for a listener
/// that cannot be bound, [`ServeError::Reflection`] when the descriptors do not load.
pub async fn serve(
    config: ProducerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<RunningProducer, ServeError> {
    let invalid = |invalid: Invalid| ConfigError::Invalid {
        invalid,
        source_name: None,
    };
    let (pool, format) = config.pool_and_format().map_err(invalid)?;
    let publishers = config.publishers().map_err(invalid)?;
    let identity = ProducerIdentity {
        pool,
        incarnation: new_incarnation(),
        format,
    };
    let mut dc_config = DcCkfConfig {
        slice_lines: ckf_core::dc::SLICE_LINES,
        ..DcCkfConfig::new(format)
    };
    dc_config.max_kicks = config.max_kicks();
    dc_config.reserve_blocks = config.reserve_blocks();
    let mut state = DcCkfState::new(dc_config).map_err(|e| {
        // Name the knob to change: the reservation's own errors are about its key.
        let reservation = matches!(
            e,
            DcCkfError::ReserveTooLarge { .. } | DcCkfError::ReserveAllocation { .. }
        );
        invalid(if reservation {
            Invalid::new(
                "table.reserve_blocks",
                dc_config.reserve_blocks,
                e.to_string(),
            )
        } else {
            Invalid::new("table", format, e.to_string())
        })
    })?;
    // The reservation, when there is one, is held from now on: say what it costs.
    let reserved_bytes = state.stats().exact_bytes;
    let quotas = config.quotas.to_core();
    state.set_quotas(quotas);

    let tracked_sources = NonZeroUsize::new(config.limits.max_tracked_sources as usize)
        .ok_or_else(|| {
            invalid(Invalid::new(
                "limits.max_tracked_sources",
                0,
                "must be at least 1",
            ))
        })?;

    let ingest_tls = ServerTls::load(&config.tls, "tls")?;
    let indexer_tls = config.indexer_tls.load("indexer_tls")?;
    for endpoint in &config.indexers {
        ckf_svc_kit::tls::warn_if_plaintext_remote(endpoint);
    }

    let stop = Shutdown::new();
    let metrics = Metrics::new();
    // `[transport]`: connection limit + handshake deadline on the listener, shedding and unary
    // timeout for Ingest, HTTP/2 limits (ckf_svc_kit::transport).
    let transport = ckf_svc_kit::Transport::new(
        &config.transport,
        metrics.registry(),
        "ckf_producer",
        &[ckf_proto::FILE_DESCRIPTOR_SET],
    )
    .expect("ckf-proto's own descriptor set decodes");
    let (health, router) = front(
        transport
            .server(tonic::transport::Server::builder().http2_keepalive_interval(Some(KEEPALIVE))),
        &SERVICES,
        &[ckf_proto::FILE_DESCRIPTOR_SET],
    )
    .await?;
    // Validated to at most 256 MiB, which fits every `usize` this crate builds for.
    let max_message_bytes = usize::try_from(config.limits.max_message_bytes).unwrap_or(usize::MAX);

    // The state actor's state: empty, or (durability on) rebuilt from the journal before any
    // listener binds, so nothing is served or attached from a half-recovered state.
    let build_actor = {
        let mut first = Some(state);
        let (identity, indexers, metrics) =
            (identity.clone(), config.indexers.clone(), metrics.clone());
        let cadence = Cadence {
            batch_threshold: config.publication.batch_threshold as usize,
            max_delay: config.max_delay(),
            cut_when_idle: config.publication.cut_when_idle,
            backed_up_interval: ckf_core::cadence::BACKED_UP_INTERVAL,
        };
        let filters = ckf_engine::filters::EngineFilters {
            block_size: config.block_size,
            media: config.engine.media.clone(),
            main_group: config.engine.main_group,
        };
        move || {
            let state = first.take().unwrap_or_else(|| {
                // Only after unusable state was set aside; the first state was dropped.
                let mut s = DcCkfState::new(dc_config).expect("the same table was built above");
                s.set_quotas(quotas);
                s
            });
            Actor::new(
                state,
                &identity,
                indexers.clone(),
                SourceSequences::new(tracked_sources),
                metrics.clone(),
                cadence,
                filters.clone(),
            )
        }
    };
    let actor = match config.durability.data_dir.clone() {
        None => {
            let mut build_actor = build_actor;
            build_actor()
        }
        Some(dir) => {
            let (durability, id, journal_metrics) = (
                config.durability.clone(),
                identity.clone(),
                metrics.journal.clone(),
            );
            tokio::task::spawn_blocking(move || {
                durability::recover(&dir, &durability, &id, &journal_metrics, build_actor)
            })
            .await
            .map_err(|source| ServeError::Join {
                what: "state recovery",
                source,
            })??
        }
    };

    let Listeners {
        grpc: listener,
        metrics: metrics_server,
    } = Listeners::bind(
        "ingest",
        config.listen,
        config.metrics_listen,
        metrics.registry().clone(),
        stop.wait(),
    )
    .await?;

    // Where each engine publisher socket's sequence resumes (empty without a journal); read
    // before the actor moves into its thread.
    let resumed = actor.engine_sequences();

    // The state actor.
    let (commands, actor_rx) = mpsc::channel(config.limits.ingest_channel_capacity as usize);
    let handle = ActorHandle::new(commands);
    // The actor does CPU-bound filter work (cuckoo kicks, omissions at 500 kicks each, clears of
    // large members): it gets a thread of its own so a long command can never starve the relay
    // sessions' heartbeats on the runtime's worker threads.
    let actor_stop = stop.clone();
    let runtime = tokio::runtime::Handle::current();
    let actor_task: JoinHandle<ActorReport> =
        tokio::task::spawn_blocking(move || runtime.block_on(actor.run(actor_rx, actor_stop)));

    // One task per engine publisher socket (engine x dp rank); they stop with `stop`.
    let engine_settings = engines::EngineSettings {
        intake: ckf_engine::intake::IntakeLimits {
            decode: ckf_engine::wire::DecodeLimits::default(),
            max_message_bytes: usize::try_from(config.engine.max_frame_bytes).unwrap_or(usize::MAX),
            max_dp_rank: engines::config::MAX_DP_SIZE,
        },
        replay_timeout: Duration::from_millis(config.engine.replay_timeout_ms),
        verify_idle: (config.engine.verify_idle_ms > 0)
            .then(|| Duration::from_millis(config.engine.verify_idle_ms)),
        max_buffered_batches: config.engine.max_buffered_batches as usize,
    };
    for spec in publishers {
        let socket = (spec.worker_id, spec.rank);
        let mut task = engines::publisher::PublisherTask::new(
            spec,
            engine_settings.clone(),
            handle.clone(),
            metrics.engine.clone(),
            stop.clone(),
        );
        if let Some(&(last, identity)) = resumed.get(&socket) {
            task = task.resume_after(last, identity);
        }
        tokio::spawn(task.run());
    }

    // The pool's load: one scrape task per engine with a `metrics_url`; pushes through Ingest.
    let load_board = engines::load::LoadBoard::new(
        &config.engines,
        ckf_core::pool_load::PushLimits {
            ttl: Duration::from_millis(config.engine.pushed_load_ttl_ms),
            max_pushed: config.engine.max_pushed_workers as usize,
        },
        &metrics.engine,
    );
    engines::load::spawn_scrapers(
        &config.engines,
        Duration::from_millis(config.engine.load_interval_ms),
        Duration::from_millis(config.engine.load_timeout_ms),
        &load_board,
        &metrics.engine,
        &stop,
    );

    // Credentials: the token sent to the indexers and who may use Ingest; token files are
    // re-read on SIGHUP.
    let indexer_token = std::sync::Arc::new(
        access::IndexerToken::load(config.indexer_token_file.clone()).map_err(invalid)?,
    );
    let ingest_access = std::sync::Arc::new(
        access::IngestAccess::new(&config.ingest_auth, metrics.registry()).map_err(invalid)?,
    );
    let (token, ingest) = (indexer_token.clone(), ingest_access.clone());
    ckf_svc_kit::access::reload_on_sighup("auth token files", stop.clone(), move || {
        Ok(format!("{}; {}", token.reload()?, ingest.reload()?))
    })
    .map_err(|e| invalid(Invalid::new("ingest_auth", "SIGHUP handler", e.to_string())))?;

    // One publisher task per indexer endpoint.
    let settings = RelaySettings {
        indexer_token,
        heartbeat_interval: config.heartbeat_interval(),
        initial_backoff: Duration::from_millis(config.reconnect.initial_backoff_ms),
        max_backoff: Duration::from_millis(config.reconnect.max_backoff_ms),
        connect_timeout: Duration::from_millis(config.reconnect.connect_timeout_ms),
        drain_timeout: config.drain_timeout(),
        keepalive: KEEPALIVE,
        max_message_bytes,
        attachment_queue: config.publication.attachment_queue as usize,
        tls: indexer_tls,
        start_mode: config.publication.start_mode,
        load: load_board.clone(),
        load_interval: Duration::from_millis(config.engine.load_interval_ms),
    };
    let relays: Vec<(String, JoinHandle<DrainOutcome>)> = config
        .indexers
        .iter()
        .enumerate()
        .map(|(i, endpoint)| {
            let client = IndexerAttachment::new(
                i,
                endpoint.clone(),
                identity.clone(),
                handle.clone(),
                metrics.clone(),
                settings.clone(),
                stop.clone(),
            );
            (endpoint.clone(), tokio::spawn(client.run()))
        })
        .collect();

    // The gRPC server.
    let ingest = transport.limit(
        IngestServer::new(
            IngestService::new(
                handle.clone(),
                identity.clone(),
                stop.clone(),
                config.limits.max_events_per_batch as usize,
                quotas,
                metrics.clone(),
                load_board,
            )
            .with_access(ingest_access),
        )
        .max_decoding_message_size(max_message_bytes)
        .max_encoding_message_size(max_message_bytes),
    );
    let ingest_addr = listener.addr;
    config.tls.log_transport("ingest", ingest_addr);
    // `pool_and_format` applied the rule already; this is its outcome: the gauge, and the WARN
    // at start and every hour while insecure.
    config.exposure().map_err(invalid)?.export(
        metrics.registry(),
        "ckf_producer_insecure",
        stop.clone(),
    );
    if let Some(tls) = &ingest_tls {
        let reloads = ckf_svc_kit::metrics::counter_vec(
            metrics.registry(),
            "ckf_producer_tls_reload_total",
            "TLS certificate reloads of the Ingest listener (SIGHUP or file change) by result: \
             ok, error (the previous certificate stays served)",
            &["result"],
        );
        tls.spawn_reloader(Some(reloads), stop.clone());
    }
    let router = router.add_service(ingest);
    let server_stop = stop.wait();
    let server = tokio::spawn(async move {
        ckf_svc_kit::tls::serve_router(
            router,
            transport.incoming(listener.incoming),
            ingest_tls.as_ref(),
            server_stop,
        )
        .await
    });
    health.serving().await;
    tracing::info!(
        pool = %identity.pool,
        incarnation = %identity.incarnation,
        format = %identity.format,
        %ingest_addr,
        metrics_addr = %metrics_server.addr,
        indexers = ?config.indexers,
        reserve_blocks = dc_config.reserve_blocks,
        exact_state_bytes = reserved_bytes,
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
        health.not_serving().await;
        let join = |what| move |source| ServeError::Join { what, source };
        let report = actor_task.await.map_err(join("state actor"))?;
        let mut drains = Vec::with_capacity(relays.len());
        for (endpoint, task) in relays {
            drains.push((endpoint, task.await.map_err(join("publisher"))?));
        }
        server.await.map_err(join("ingest server"))??;
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
        actor: handle,
        done,
    })
}
