//! What both services do to start and stop serving, once: bind the gRPC and `/metrics`
//! listeners ([`Listeners::bind`]), put `grpc.health.v1` and reflection in front of the
//! service's own handlers ([`front`]), flip health with the lifecycle ([`ServingHealth`]), and
//! run a binary's `main` ([`run_main`]: config error exit 2, logging, runtime, signals).
//!
//! The services keep what differs: which handlers they add, their keepalive settings, their
//! shutdown order and their error types (each maps [`BindError`] into its own `ServeError`).

use std::fmt::Display;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::process::ExitCode;

use prometheus::Registry;
use tonic::transport::Server;
use tonic::transport::server::Router;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::config::{Invalid, in_range};
use crate::grpc::{self, BoundListener};
use crate::logging::{LogFormat, init_tracing};
use crate::metrics::{MetricsServer, serve_metrics};
use crate::shutdown::Shutdown;

/// A listener that could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("cannot bind {what} address {addr}: {source}")]
pub struct BindError {
    /// Which listener: the gRPC listener's name given to [`Listeners::bind`], or `"metrics"`.
    pub what: &'static str,
    /// The configured address.
    pub addr: SocketAddr,
    /// The OS error.
    #[source]
    pub source: io::Error,
}

/// A service's two bound listeners.
#[derive(Debug)]
pub struct Listeners {
    /// The gRPC listener (not yet served).
    pub grpc: BoundListener,
    /// The `/metrics` endpoint, already serving until the shutdown future given to
    /// [`Listeners::bind`] resolves.
    pub metrics: MetricsServer,
}

impl Listeners {
    /// Binds the gRPC listener `grpc_addr` (named `grpc_name` in a [`BindError`]), then serves
    /// `registry` on `metrics_addr` until `shutdown` resolves. Port 0 picks a free port; the
    /// bound addresses are in the result.
    ///
    /// # Errors
    /// [`BindError`] naming the listener and address that could not be bound.
    pub async fn bind(
        grpc_name: &'static str,
        grpc_addr: SocketAddr,
        metrics_addr: SocketAddr,
        registry: Registry,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<Self, BindError> {
        let grpc = grpc::bind(grpc_addr).await.map_err(|source| BindError {
            what: grpc_name,
            addr: grpc_addr,
            source,
        })?;
        let metrics = serve_metrics(metrics_addr, registry, shutdown)
            .await
            .map_err(|source| BindError {
                what: "metrics",
                addr: metrics_addr,
                source,
            })?;
        Ok(Self { grpc, metrics })
    }
}

/// The health statuses of a service's named gRPC services (and the overall status `""`).
#[derive(Clone)]
pub struct ServingHealth {
    reporter: HealthReporter,
    services: &'static [&'static str],
}

impl ServingHealth {
    /// Marks the overall status and every service `SERVING`.
    pub async fn serving(&self) {
        grpc::set_all(&self.reporter, self.services, ServingStatus::Serving).await;
    }

    /// Marks the overall status and every service `NOT_SERVING` (shutdown has started).
    pub async fn not_serving(&self) {
        grpc::set_all(&self.reporter, self.services, ServingStatus::NotServing).await;
    }
}

/// `builder` with the health service (every name in `services` `NOT_SERVING` until
/// [`ServingHealth::serving`]) and the reflection service over `descriptor_sets` added; the
/// caller adds its own handlers to the router.
///
/// # Errors
/// A descriptor set that does not decode.
pub async fn front(
    mut builder: Server,
    services: &'static [&'static str],
    descriptor_sets: &[&'static [u8]],
) -> Result<(ServingHealth, Router), tonic_reflection::server::Error> {
    let reflection = grpc::reflection(descriptor_sets)?;
    let (reporter, health) = grpc::health(services).await;
    let router = builder.add_service(health).add_service(reflection);
    Ok((ServingHealth { reporter, services }, router))
}

/// Default `worker_threads` of both services: 0, tokio's own choice (one worker per CPU the
/// process may run on, or `TOKIO_WORKER_THREADS` when that is set).
pub const DEFAULT_WORKER_THREADS: u32 = 0;
/// Largest accepted `worker_threads`: far more than any host has CPUs; a typo such as 40000
/// would otherwise spawn that many threads.
pub const MAX_WORKER_THREADS: u32 = 1_024;

/// What [`run_main`] reads of a service's configuration before anything else runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessSettings {
    /// Log line format (the filter comes from `RUST_LOG`).
    pub log_format: LogFormat,
    /// Tokio worker threads, `0..=`[`MAX_WORKER_THREADS`]; 0 = tokio's default (one per CPU,
    /// or `TOKIO_WORKER_THREADS`). Fewer workers than CPUs suit a host shared with the
    /// clients: a request then wakes fewer threads (measured in docs/performance.md,
    /// "The query RPC end to end").
    pub worker_threads: u32,
}

/// Checks a service's `worker_threads` key.
///
/// # Errors
/// [`Invalid`] naming `worker_threads` when it is above [`MAX_WORKER_THREADS`].
pub fn validate_worker_threads(worker_threads: u32) -> Result<(), Invalid> {
    in_range(
        "worker_threads",
        worker_threads,
        0..=MAX_WORKER_THREADS,
        "threads",
    )
}

/// The multi-threaded tokio runtime of a service: `worker_threads` workers (0 = tokio's
/// default), threads named `name`, I/O and timers enabled.
///
/// # Errors
/// The OS refused to create the runtime's threads or its I/O driver.
pub fn runtime(name: &str, worker_threads: u32) -> io::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all().thread_name(name);
    if worker_threads > 0 {
        builder.worker_threads(worker_threads as usize);
    }
    builder.build()
}

/// A service binary's `main`: `config` (the parsed and validated configuration) or its error,
/// printed as `{name}: {error}` on stderr with exit status 2; then logging in the format
/// `settings` picks (default filter `info`), a multi-threaded tokio runtime with `settings`'
/// worker threads named `name` ([`runtime`]; a runtime that cannot start: exit status 1), and
/// `run` given the configuration and a [`Shutdown`] triggered by SIGTERM/SIGINT. `run`'s exit
/// status is the process's.
pub fn run_main<C, E, Fut>(
    name: &str,
    config: Result<C, E>,
    settings: impl FnOnce(&C) -> ProcessSettings,
    run: impl FnOnce(C, Shutdown) -> Fut,
) -> ExitCode
where
    E: Display,
    Fut: Future<Output = ExitCode>,
{
    let config = match config {
        Ok(config) => config,
        Err(error) => {
            eprintln!("{name}: {error}");
            return ExitCode::from(2);
        }
    };
    // Only fails when a subscriber is already installed, which cannot happen in a binary.
    // `zeromq=error`: the ZMQ library warns on every failed reconnection to an engine that is not
    // up yet (expected: a producer may start before its engines); `engine_connected` says it.
    let settings = settings(&config);
    let _ = init_tracing(settings.log_format, "info,zeromq=error");
    let runtime = match runtime(name, settings.worker_threads) {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("{name}: cannot start the tokio runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move { run(config, Shutdown::on_signals()).await })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_taken_address_names_the_listener_that_failed() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let taken_addr = taken.local_addr().unwrap();
        let free: SocketAddr = "127.0.0.1:0".parse().unwrap();

        let err = Listeners::bind("ingest", taken_addr, free, Registry::new(), async {})
            .await
            .unwrap_err();
        assert_eq!((err.what, err.addr), ("ingest", taken_addr));

        let err = Listeners::bind("ingest", free, taken_addr, Registry::new(), async {})
            .await
            .unwrap_err();
        assert_eq!((err.what, err.addr), ("metrics", taken_addr));
        assert_eq!(err.source.kind(), io::ErrorKind::AddrInUse);

        let stop = Shutdown::new();
        let bound = Listeners::bind("gRPC", free, free, Registry::new(), stop.wait())
            .await
            .unwrap();
        assert_ne!(bound.grpc.addr.port(), 0);
        assert_ne!(bound.metrics.addr.port(), 0);
        stop.trigger();
        bound.metrics.task.await.unwrap().unwrap();
    }

    #[test]
    fn a_config_error_exits_2_before_anything_starts() {
        let mut started = false;
        let code = run_main(
            "ckf-test",
            Err::<(), _>("bad key"),
            |()| HUMAN_DEFAULT_THREADS,
            |(), _| {
                started = true;
                async { ExitCode::SUCCESS }
            },
        );
        assert_eq!(code, ExitCode::from(2));
        assert!(!started);
    }

    #[test]
    fn the_run_future_decides_the_exit_status() {
        let code = run_main(
            "ckf-test",
            Ok::<_, String>(7u8),
            |_| ProcessSettings {
                log_format: LogFormat::Human,
                worker_threads: 3,
            },
            |n, shutdown| async move {
                assert!(!shutdown.is_triggered());
                // The configured worker count reached the runtime `run` runs on.
                assert_eq!(tokio::runtime::Handle::current().metrics().num_workers(), 3);
                ExitCode::from(n)
            },
        );
        assert_eq!(code, ExitCode::from(7));
    }

    const HUMAN_DEFAULT_THREADS: ProcessSettings = ProcessSettings {
        log_format: LogFormat::Human,
        worker_threads: DEFAULT_WORKER_THREADS,
    };

    #[test]
    fn worker_threads_sets_the_runtime_s_workers_and_0_keeps_tokio_s_default() {
        for workers in [1, 2, 5] {
            let rt = runtime("ckf-test", workers).unwrap();
            assert_eq!(rt.metrics().num_workers(), workers as usize);
            // The workers carry the service's name (what `top -H` and `/proc/*/task` show).
            let name = rt.block_on(async {
                tokio::spawn(async { std::thread::current().name().map(str::to_owned) })
                    .await
                    .unwrap()
            });
            assert_eq!(name.as_deref(), Some("ckf-test"));
        }
        // 0: tokio's choice, which is at least one worker (one per CPU unless
        // TOKIO_WORKER_THREADS says otherwise).
        assert!(runtime("ckf-test", 0).unwrap().metrics().num_workers() >= 1);
    }
}
