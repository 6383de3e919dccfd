//! Prometheus text exposition on its own HTTP address (`GET /metrics`), separate from the gRPC
//! port so scraping never competes with relay streams.
//!
//! Each service owns a [`prometheus::Registry`] with its metrics (names with the service prefix
//! and the `_total` / `_seconds` / `_bytes` suffixes), built with the registration helpers
//! here ([`counter`], [`counter_vec`], [`gauge`], [`int_gauge`], [`int_gauge_vec`],
//! [`histogram`], [`histogram_vec`]); this module also serves the registry.
//!
//! The helpers panic on an invalid name or a name registered twice: both are programming
//! errors in a service's fixed metric list, caught by its first test.

use std::{future::Future, io, net::SocketAddr};

use axum::{Router, extract::State, http::header, response::IntoResponse, routing::get};
use prometheus::core::Collector;
use prometheus::{
    Counter, Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter,
    IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};
use tokio::{net::TcpListener, task::JoinHandle};

/// Registers `metric` in `registry` and returns it (metrics are cheap shared handles).
///
/// # Panics
/// When a metric of the same name is already registered.
pub fn register<M: Collector + Clone + 'static>(registry: &Registry, metric: M) -> M {
    registry
        .register(Box::new(metric.clone()))
        .expect("metric names are unique within a service");
    metric
}

/// A registered counter `name` (should end in `_total`).
///
/// # Panics
/// On an invalid or already registered name.
pub fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    register(
        registry,
        IntCounter::new(name, help).expect("valid metric name"),
    )
}

/// A registered floating-point counter `name` (should end in `_total`; e.g. seconds).
///
/// # Panics
/// On an invalid or already registered name.
pub fn float_counter(registry: &Registry, name: &str, help: &str) -> Counter {
    register(
        registry,
        Counter::new(name, help).expect("valid metric name"),
    )
}

/// A registered counter family `name` with the given label names.
///
/// # Panics
/// On an invalid or already registered name or invalid label names.
pub fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    register(
        registry,
        IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric name"),
    )
}

/// A registered floating-point gauge `name`.
///
/// # Panics
/// On an invalid or already registered name.
pub fn gauge(registry: &Registry, name: &str, help: &str) -> Gauge {
    register(registry, Gauge::new(name, help).expect("valid metric name"))
}

/// A registered floating-point gauge family `name` with the given label names.
///
/// # Panics
/// On an invalid or already registered name or invalid label names.
pub fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    register(
        registry,
        GaugeVec::new(Opts::new(name, help), labels).expect("valid metric name"),
    )
}

/// A registered integer gauge `name`.
///
/// # Panics
/// On an invalid or already registered name.
pub fn int_gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    register(
        registry,
        IntGauge::new(name, help).expect("valid metric name"),
    )
}

/// A registered integer gauge family `name` with the given label names.
///
/// # Panics
/// On an invalid or already registered name or invalid label names.
pub fn int_gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    register(
        registry,
        IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric name"),
    )
}

/// A registered histogram `name` with upper bucket bounds `buckets` (increasing).
///
/// # Panics
/// On an invalid or already registered name or non-increasing buckets.
pub fn histogram(registry: &Registry, name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
    register(
        registry,
        Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))
            .expect("valid histogram"),
    )
}

/// A registered histogram family `name` with the given label names and bucket bounds.
///
/// # Panics
/// On an invalid or already registered name, invalid label names or non-increasing buckets.
pub fn histogram_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: Vec<f64>,
) -> HistogramVec {
    register(
        registry,
        HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels)
            .expect("valid histogram"),
    )
}

/// Histogram buckets for latencies in seconds: 100 ns doubling 26 times (up to ~3.4 s), fine
/// enough for sub-microsecond in-memory work and wide enough for network-bound operations.
pub fn latency_buckets_seconds() -> Vec<f64> {
    prometheus::exponential_buckets(1e-7, 2.0, 26).expect("static bucket parameters are valid")
}

/// Histogram buckets for lags in seconds: 1 ms doubling 16 times (up to ~65 s).
pub fn lag_buckets_seconds() -> Vec<f64> {
    prometheus::exponential_buckets(1e-3, 2.0, 17).expect("static bucket parameters are valid")
}

/// A running metrics endpoint.
#[derive(Debug)]
pub struct MetricsServer {
    /// The address actually bound (useful when port 0 was requested).
    pub addr: SocketAddr,
    /// The server task; ends after the shutdown future resolves.
    pub task: JoinHandle<io::Result<()>>,
}

/// Binds `addr` and serves `registry` at `GET /metrics` until `shutdown` resolves. A
/// non-loopback `addr` is logged at WARN: the endpoint is plaintext and unauthenticated.
///
/// # Errors
/// The bind error (address in use, permission denied, ...).
pub async fn serve_metrics(
    addr: SocketAddr,
    registry: Registry,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<MetricsServer> {
    let listener = TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let app = Router::new()
        .route("/metrics", get(render))
        .with_state(registry);
    let task = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
    });
    if addr.ip().to_canonical().is_loopback() {
        tracing::info!(%addr, "metrics endpoint listening");
    } else {
        // The endpoint has no TLS and no authentication (Prometheus' usual setup): what it
        // shows (pools, lanes, peers' refusal counts) is for the scraper's network only.
        tracing::warn!(
            %addr,
            "metrics endpoint listening on a non-loopback address over plaintext HTTP without authentication: keep it on a network only the scraper reaches (network policy, firewall)"
        );
    }
    Ok(MetricsServer { addr, task })
}

/// Renders `registry` in the Prometheus text format.
pub fn render_text(registry: &Registry) -> String {
    let mut buffer = Vec::new();
    // Encoding into a Vec only fails on metric families with inconsistent contents, which the
    // prometheus crate's typed metrics cannot produce.
    if let Err(error) = TextEncoder::new().encode(&registry.gather(), &mut buffer) {
        tracing::warn!(%error, "metrics encoding failed");
    }
    String::from_utf8(buffer).unwrap_or_default()
}

async fn render(State(registry): State<Registry>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)],
        render_text(&registry),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn serves_registered_metrics_over_http() {
        let registry = Registry::new();
        let counter = prometheus::IntCounter::new("ckf_test_things_total", "Things.").unwrap();
        registry.register(Box::new(counter.clone())).unwrap();
        counter.inc_by(7);

        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = serve_metrics("127.0.0.1:0".parse().unwrap(), registry, async {
            let _ = stopped.await;
        })
        .await
        .unwrap();

        let mut stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(response.contains("ckf_test_things_total 7"), "{response}");

        stop.send(()).unwrap();
        server.task.await.unwrap().unwrap();
    }

    #[test]
    fn helpers_register_what_they_return() {
        let registry = Registry::new();
        counter(&registry, "ckf_t_a_total", "A.").inc_by(2);
        counter_vec(&registry, "ckf_t_b_total", "B.", &["kind"])
            .with_label_values(&["x"])
            .inc();
        gauge(&registry, "ckf_t_c", "C.").set(0.5);
        int_gauge(&registry, "ckf_t_d", "D.").set(-3);
        int_gauge_vec(&registry, "ckf_t_e", "E.", &["lane"])
            .with_label_values(&["1"])
            .set(4);
        histogram(&registry, "ckf_t_f_seconds", "F.", vec![1.0, 2.0]).observe(1.5);
        histogram_vec(&registry, "ckf_t_g_seconds", "G.", &["dc"], vec![1.0])
            .with_label_values(&["a"])
            .observe(0.5);
        let text = render_text(&registry);
        for line in [
            "ckf_t_a_total 2",
            "ckf_t_b_total{kind=\"x\"} 1",
            "ckf_t_c 0.5",
            "ckf_t_d -3",
            "ckf_t_e{lane=\"1\"} 4",
            "ckf_t_f_seconds_bucket{le=\"2\"} 1",
            "ckf_t_g_seconds_count{dc=\"a\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
    }

    #[test]
    #[should_panic(expected = "unique")]
    fn a_name_registered_twice_is_a_programming_error() {
        let registry = Registry::new();
        counter(&registry, "ckf_t_twice_total", "Once.");
        counter(&registry, "ckf_t_twice_total", "Twice.");
    }

    #[test]
    fn latency_buckets_start_at_100ns_and_increase() {
        let buckets = latency_buckets_seconds();
        assert!((buckets[0] - 1e-7).abs() < 1e-12);
        assert!(buckets.windows(2).all(|w| w[0] < w[1]));
        assert!(*buckets.last().unwrap() > 1.0);
    }
}
