//! Starting and stopping one indexer: [`serve`] validates the configuration, builds every
//! domain (its consumer, ingestion workers and router, `crate::state::Domain`), binds the gRPC and metrics listeners (port 0 allowed; the
//! bound addresses are reported in [`RunningIndexer`]), marks health `SERVING`, and runs until
//! the shutdown future resolves or [`RunningIndexer::stop`] is called.
//!
//! Shutdown: health turns `NOT_SERVING`, the listener stops accepting, every relay stream ends
//! with `Retired(SHUTDOWN)` + `UNAVAILABLE`, the metrics endpoint stops, and the lane workers
//! finish the frames already queued. The same code path serves `ckf-indexer`, the `ckf demo`
//! command and the tests.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ckf_core::catalog::Catalog;
use ckf_core::global::GlobalCkfIndexer;
use ckf_core::ingestion::{DeadlineKeeper, IngestionWorkersConfig};
use ckf_proto::v1::{
    admin_server::AdminServer, query_server::QueryServer, relay_server::RelayServer,
};
use ckf_svc_kit::Shutdown;
use ckf_svc_kit::Transport;
use ckf_svc_kit::config::{Invalid, Validate};
use ckf_svc_kit::serve::{BindError, Listeners, front};
use ckf_svc_kit::tls::{ServerTls, TlsError};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tonic::service::interceptor::InterceptedService;

use crate::admin::AdminService;
use crate::config::{IndexerConfig, LimitsConfig};
use crate::embedded::EmbeddedQuery;
use crate::lane_watch;
use crate::metrics::IndexerMetrics;
use crate::query::QueryService;
use crate::relay::RelayService;
use crate::state::{Domain, DomainSettings, IndexerState};

/// gRPC services reported by the health service.
pub const SERVICES: [&str; 3] = ["ckf.v1.Relay", "ckf.v1.Query", "ckf.v1.Admin"];
/// Health services of `listen` when `query_listen` serves Query apart.
const RELAY_ONLY: [&str; 2] = ["ckf.v1.Relay", "ckf.v1.Admin"];
/// Health services of `query_listen`.
const QUERY_ONLY: [&str; 1] = ["ckf.v1.Query"];
/// How long in-flight connections may take to close after shutdown starts.
const DRAIN_GRACE: Duration = Duration::from_secs(5);
/// HTTP/2 keepalive ping interval; a peer that does not answer within the timeout is dropped
/// (which ends its relay stream as lost).
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Why an indexer could not start or stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A configuration value breaks a rule.
    #[error("invalid configuration: {0}")]
    Config(#[from] Invalid),
    /// The configuration could not be loaded from its source ([`serve_from`]).
    #[error("{0}")]
    Load(#[from] ckf_svc_kit::config::ConfigError),
    /// A domain could not be built (its manifest, its table, its lane threads).
    #[error("{0}")]
    Domain(#[from] crate::state::DomainBuildError),
    /// The deadline keeper's thread could not start (a thread or memory limit).
    #[error("cannot start the deadline keeper: {0}")]
    Keeper(std::io::Error),
    /// A TLS certificate, key or CA file cannot be used (names the key and the file).
    #[error("TLS: {0}")]
    Tls(#[from] TlsError),
    /// A listener could not be bound (`what`: `"gRPC"` or `"metrics"`).
    #[error("cannot bind {} address {}: {}", .0.what, .0.addr, .0.source)]
    Bind(#[from] BindError),
    /// The reflection descriptors could not be loaded.
    #[error("reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The gRPC server failed.
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The server task panicked or was cancelled.
    #[error("server task: {0}")]
    Join(#[from] tokio::task::JoinError),
}

/// A running indexer.
#[derive(Debug)]
pub struct RunningIndexer {
    /// Bound gRPC address (Relay, Query unless `query_listen` is set, health, reflection).
    pub grpc_addr: SocketAddr,
    /// Bound Query address: `query_listen`'s, or `grpc_addr` when Query is not served apart.
    pub query_addr: SocketAddr,
    /// Bound Prometheus `/metrics` address.
    pub metrics_addr: SocketAddr,
    /// The primary domain's consumer instance (carried in every lease it grants; each domain
    /// has its own, drawn when it is built).
    pub consumer_instance: u64,
    /// The primary domain's router (never removed).
    primary: crate::router::Router,
    /// The handlers' state, for the domains a reload adds (weak: the server owns it).
    state: std::sync::Weak<IndexerState>,
    shutdown: Shutdown,
    task: JoinHandle<Result<(), ServeError>>,
}

impl RunningIndexer {
    /// The primary domain's in-process consumer (tests and the demo compare its lanes with
    /// producers' tables).
    pub fn indexer(&self) -> &Arc<GlobalCkfIndexer> {
        self.primary.indexer()
    }

    /// The in-process consumer of `domain`, if served now (`None` after the indexer stopped).
    pub fn domain_indexer(&self, domain: &str) -> Option<Arc<GlobalCkfIndexer>> {
        let state = self.state.upgrade()?;
        let domains = state.domains();
        domains.get(domain).map(|d| Arc::clone(&d.indexer))
    }

    /// An in-process query handle on the primary domain (embedded mode, [`crate::embedded`]):
    /// the same answers as the Query service's, without an RPC.
    pub fn query_handle(&self) -> EmbeddedQuery {
        // The primary's router as the catalog has it now (a reload may have changed its
        // lanes); the one it started with once the indexer has stopped.
        let router = self.state.upgrade().map_or_else(
            || self.primary.clone(),
            |state| state.domains().primary().router.clone(),
        );
        EmbeddedQuery::new(router)
    }

    /// An in-process query handle on `domain`, if served now (`None` after the indexer
    /// stopped). A handle on a domain a reload removes keeps answering from its last tables;
    /// its Route choices are no longer counted in `ckf_indexer_route_decisions_total`.
    pub fn domain_query_handle(&self, domain: &str) -> Option<EmbeddedQuery> {
        let state = self.state.upgrade()?;
        let domains = state.domains();
        domains
            .get(domain)
            .map(|d| EmbeddedQuery::new(d.router.clone()))
    }

    /// Applies the catalog of `config` now, as a reload does ([`crate::catalog`]); `dry_run`
    /// plans only. For an indexer started with [`serve`], whose configuration has no source.
    ///
    /// # Errors
    /// [`crate::catalog::ReloadError`]; nothing changed.
    pub fn apply_catalog(
        &self,
        config: IndexerConfig,
        dry_run: bool,
    ) -> Result<crate::catalog::Reloaded, crate::catalog::ReloadError> {
        let state = self
            .state
            .upgrade()
            .ok_or(crate::catalog::ReloadError::Task(
                "the indexer has stopped".into(),
            ))?;
        crate::catalog::apply(&state, config, dry_run)
    }

    /// Starts a graceful shutdown (idempotent).
    pub fn shutdown(&self) {
        self.shutdown.trigger();
    }

    /// Waits until the indexer has stopped.
    ///
    /// # Errors
    /// [`ServeError`] when the server failed.
    pub async fn wait(self) -> Result<(), ServeError> {
        self.task.await?
    }

    /// Shuts down and waits.
    ///
    /// # Errors
    /// As [`RunningIndexer::wait`].
    pub async fn stop(self) -> Result<(), ServeError> {
        self.shutdown();
        self.wait().await
    }
}

/// Starts an indexer; returns once both listeners are bound and health says `SERVING`. It has
/// no configuration source: its catalog of domains is fixed ([`serve_from`] reloads).
///
/// # Errors
/// [`ServeError::Config`] / [`ServeError::Domain`] for a bad configuration,
/// [`ServeError::Bind`] when an address is taken.
pub async fn serve(
    config: IndexerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<RunningIndexer, ServeError> {
    start(config, None, shutdown).await
}

/// Starts an indexer from `source` (its configuration file, environment and flags), which
/// catalog reloads re-read ([`crate::catalog`]: SIGHUP, the file watch, `Admin/ReloadCatalog`).
///
/// # Errors
/// [`ServeError::Load`] when the configuration cannot be loaded; as [`serve`].
pub async fn serve_from(
    source: crate::config::Cli,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<RunningIndexer, ServeError> {
    let config = source.load()?;
    serve_loaded(source, config, shutdown).await
}

/// As [`serve_from`], with `config` already loaded from `source` (the binary loads it once,
/// for its process settings too).
///
/// # Errors
/// As [`serve`].
pub async fn serve_loaded(
    source: crate::config::Cli,
    config: IndexerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<RunningIndexer, ServeError> {
    start(config, Some(source), shutdown).await
}

async fn start(
    config: IndexerConfig,
    source: Option<crate::config::Cli>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<RunningIndexer, ServeError> {
    config.validate()?;
    let specs = config.domain_specs()?;
    let tls = ServerTls::load(&config.tls, "tls")?;
    // `validate` resolved it already: resolving again on the same CPU gives the same kernel.
    let search_kernel = config.search_kernel()?;
    // The deadline keeper's tick: a tenth of the heartbeat deadline, at most 100 ms.
    let tick = match config.lag.heartbeat_deadline_ms {
        0 => Duration::from_millis(100),
        ms => Duration::from_millis((ms / 10).clamp(1, 100)),
    };
    let stop = Shutdown::new();
    stop.trigger_on(shutdown);

    let metrics = IndexerMetrics::new();
    metrics.observe_search_kernel(search_kernel);
    let limits = LimitsConfig {
        max_images_per_delta: config.effective_max_images_per_delta(),
        ..config.limits.clone()
    };
    let settings = DomainSettings {
        lag: config.lag_policy(),
        kernel: search_kernel,
        workers: IngestionWorkersConfig {
            queue_capacity: config.limits.lane_queue_capacity as usize,
            ..IngestionWorkersConfig::default()
        },
        // One keeper times every domain's lanes: one wake-up per tick in all.
        keeper: DeadlineKeeper::start(tick).map_err(ServeError::Keeper)?,
        route: config.route.clone(),
        limits: limits.clone(),
    };
    let mut specs = specs.into_iter();
    let primary = specs.next().expect("the primary domain");
    let primary_id = primary.manifest.domain.clone();
    let mut domains = Catalog::new(
        primary_id,
        Arc::new(Domain::build(primary, &settings, &metrics)?),
    );
    for spec in specs {
        let id = spec.manifest.domain.clone();
        let domain = Arc::new(Domain::build(spec, &settings, &metrics)?);
        domains
            .insert(id, domain)
            .map_err(|e| Invalid::new("domains", e.0.as_str(), e.to_string()))?;
    }
    let access = Arc::new(crate::access::IndexerAccess::new(
        &config.auth,
        &config.domain_lanes(),
        metrics.registry(),
    )?);
    let primary_router = domains.primary().router.clone();
    let consumer_instance = domains.primary().indexer.consumer_instance();
    metrics
        .domains
        .set(i64::try_from(domains.len()).unwrap_or(i64::MAX));
    let shared = Arc::new(IndexerState {
        access: Arc::clone(&access),
        catalog: std::sync::RwLock::new(Arc::new(domains)),
        settings,
        config: std::sync::Mutex::new(config.clone()),
        source,
        watchers: std::sync::Mutex::default(),
        reloading: std::sync::Mutex::default(),
        sweep_queued: std::sync::atomic::AtomicBool::new(false),
        metrics: metrics.clone(),
        limits,
        heartbeat_deadline_ms: config.lag.heartbeat_deadline_ms,
        query_streams: Arc::new(Semaphore::new(config.limits.max_query_streams as usize)),
        shutdown: stop.clone(),
    });
    let lanes = Arc::downgrade(&shared);
    metrics.register_lane_gauges(move || {
        lanes
            .upgrade()
            .map_or_else(Vec::new, |shared| shared.lane_statuses())
    });

    let Listeners {
        grpc: listener,
        metrics: metrics_server,
    } = Listeners::bind(
        "gRPC",
        config.listen,
        config.metrics_listen,
        metrics.registry().clone(),
        stop.wait(),
    )
    .await?;
    let grpc_addr = listener.addr;
    let query_listener = match config.query_listen {
        Some(addr) => Some(
            ckf_svc_kit::grpc::bind(addr)
                .await
                .map_err(|source| BindError {
                    what: "query",
                    addr,
                    source,
                })?,
        ),
        None => None,
    };
    let query_addr = query_listener.as_ref().map_or(grpc_addr, |l| l.addr);
    let reload = Arc::clone(&access);
    ckf_svc_kit::access::reload_on_sighup("auth token files", stop.clone(), move || {
        reload.reload()
    })
    .map_err(|e| Invalid::new("auth", "SIGHUP handler", e.to_string()))?;
    config.tls.log_transport("gRPC", grpc_addr);
    if let Some(query) = &query_listener {
        config.tls.log_transport("query", query.addr);
    }
    // `validate` applied the rule already; this is its outcome: the gauge, and the WARN at
    // start and every hour while insecure.
    config
        .exposure()?
        .export(metrics.registry(), "ckf_indexer_insecure", stop.clone());
    if let Some(tls) = &tls {
        let reloads = ckf_svc_kit::metrics::counter_vec(
            metrics.registry(),
            "ckf_indexer_tls_reload_total",
            "TLS certificate reloads (SIGHUP or file change) by result: ok, error (the \
             previous certificate stays served)",
            &["result"],
        );
        tls.spawn_reloader(Some(reloads), stop.clone());
    }

    let max_message = usize::try_from(config.limits.max_message_bytes).unwrap_or(usize::MAX);
    // `[transport]`: connection limits (max_connections, max_connections_per_peer) and the
    // handshake and idle deadlines on every listener, each listener with permits of its own
    // (`Transport::incoming` per listener: idle Query clients cannot lock producers off
    // `listen`), per-service shedding and unary timeout, HTTP/2 limits
    // (ckf_svc_kit::transport).
    let transport = Transport::new(
        &config.transport,
        metrics.registry(),
        "ckf_indexer",
        &[ckf_proto::FILE_DESCRIPTOR_SET],
    )
    .expect("ckf-proto's own descriptor set decodes");
    let relay = transport.limit(
        RelayServer::new(RelayService::new(Arc::clone(&shared)))
            .max_decoding_message_size(max_message)
            .max_encoding_message_size(max_message),
    );
    let query = InterceptedService::new(
        transport.limit(
            QueryServer::new(QueryService::new(Arc::clone(&shared)))
                .max_decoding_message_size(max_message)
                .max_encoding_message_size(max_message),
        ),
        // Credentials first: an unauthenticated caller learns nothing about the domains (the
        // handlers pick the call's domain, `IndexerState::domain_of`).
        access.query_interceptor(),
    );
    let builder = || {
        transport.server(
            tonic::transport::Server::builder()
                .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
                .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT)),
        )
    };
    let descriptors = [ckf_proto::FILE_DESCRIPTOR_SET];
    let services: &'static [&'static str] = match query_listener {
        Some(_) => &RELAY_ONLY,
        None => &SERVICES,
    };
    let (health, router) = front(builder(), services, &descriptors).await?;
    // Admin beside Relay, on `listen` only (an operator's service, not a router's).
    let admin = InterceptedService::new(
        transport.limit(AdminServer::new(AdminService::new(Arc::clone(&shared)))),
        access.admin_interceptor(),
    );
    let router = router.add_service(relay).add_service(admin);
    // Query on `listen`, or alone on `query_listen` (with its own health and reflection).
    let (router, query_server) = match query_listener {
        None => (router.add_service(query), None),
        Some(query_listener) => {
            let (query_health, query_router) = front(builder(), &QUERY_ONLY, &descriptors).await?;
            let query_router = query_router.add_service(query);
            (router, Some((query_health, query_router, query_listener)))
        }
    };
    health.serving().await;
    if let Some((query_health, ..)) = &query_server {
        query_health.serving().await;
    }
    *shared.watchers.lock().expect("watchers lock") = lane_watch::spawn_all(&shared);
    crate::catalog::spawn_triggers(&shared)
        .map_err(|e| Invalid::new("manifest", "SIGHUP handler", e.to_string()))?;

    tracing::info!(
        %grpc_addr,
        %query_addr,
        metrics_addr = %metrics_server.addr,
        auth = %access.summary(config.tls.requires_client_certificates()),
        consumer_instance = format_args!("{consumer_instance:#x}"),
        domains = shared.domains().len(),
        primary_domain = %shared.domains().primary_id(),
        catalog_reloads = if shared.source.is_some() { "SIGHUP, file watch, Admin/ReloadCatalog" } else { "off (in-process configuration value)" },
        search_kernel = %search_kernel,
        search_kernel_config = %config.search.kernel,
        "ckf-indexer serving"
    );
    for (name, domain) in shared.domains().iter() {
        let indexer = &domain.indexer;
        tracing::info!(
            domain = %name,
            lanes = indexer.lane_count(),
            lane_groups = indexer.table().groups().len(),
            table_bytes = indexer.table().bytes(),
            format = %indexer.manifest().format,
            block_sizes = ?domain.router.block_sizes().distinct(),
            "domain served"
        );
    }

    let metrics_addr = metrics_server.addr;
    let handle = stop.clone();
    let shared_handle = Arc::clone(&shared);
    let serve_stop = stop.clone();
    let query_tls = tls.clone();
    let query_transport = transport.clone();
    let task = tokio::spawn(async move {
        let query_stop = serve_stop.clone();
        let on_shutdown = async move {
            serve_stop.wait().await;
            tracing::info!("shutting down: refusing new streams, retiring open ones");
            health.not_serving().await;
        };
        let relay_server = ckf_svc_kit::tls::serve_router(
            router,
            transport.incoming(listener.incoming),
            tls.as_ref(),
            on_shutdown,
        );
        let query_server = async move {
            let Some((query_health, query_router, query_listener)) = query_server else {
                return Ok(());
            };
            let on_shutdown = async move {
                query_stop.wait().await;
                query_health.not_serving().await;
            };
            ckf_svc_kit::tls::serve_router(
                query_router,
                query_transport.incoming(query_listener.incoming),
                query_tls.as_ref(),
                on_shutdown,
            )
            .await
        };
        let server = async { tokio::try_join!(relay_server, query_server).map(|_| ()) };
        // Streams end themselves on shutdown; a peer that keeps its connection open past the
        // grace period does not hold the process.
        let grace_stop = stop.clone();
        let result = tokio::select! {
            result = server => result.map_err(ServeError::from),
            () = async move { grace_stop.wait().await; tokio::time::sleep(DRAIN_GRACE).await } => Ok(()),
        };
        stop.trigger();
        let watchers = std::mem::take(&mut *shared.watchers.lock().expect("watchers lock"));
        for watcher in watchers {
            let _ = watcher.await;
        }
        let _ = metrics_server.task.await;
        // The last handle joins the lane worker threads: do it off the async workers. (Handler
        // clones held by the stopped server are gone by now.)
        tokio::task::spawn_blocking(move || drop(shared)).await?;
        tracing::info!("ckf-indexer stopped");
        result
    });

    Ok(RunningIndexer {
        grpc_addr,
        query_addr,
        metrics_addr,
        consumer_instance,
        primary: primary_router,
        state: Arc::downgrade(&shared_handle),
        shutdown: handle,
        task,
    })
}
