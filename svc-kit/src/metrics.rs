//! Prometheus text exposition on its own HTTP address (`GET /metrics`), separate from the gRPC
//! port so scraping never competes with relay streams.
//!
//! Each service owns a [`prometheus::Registry`] with its metrics (names with the service prefix
//! and the `_total` / `_seconds` / `_bytes` suffixes); this module only serves it.

use std::{future::Future, io, net::SocketAddr};

use axum::{Router, extract::State, http::header, response::IntoResponse, routing::get};
use prometheus::{Encoder, Registry, TextEncoder};
use tokio::{net::TcpListener, task::JoinHandle};

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

/// Binds `addr` and serves `registry` at `GET /metrics` until `shutdown` resolves.
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
    tracing::info!(%addr, "metrics endpoint listening");
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
    fn latency_buckets_start_at_100ns_and_increase() {
        let buckets = latency_buckets_seconds();
        assert!((buckets[0] - 1e-7).abs() < 1e-12);
        assert!(buckets.windows(2).all(|w| w[0] < w[1]));
        assert!(*buckets.last().unwrap() > 1.0);
    }
}
