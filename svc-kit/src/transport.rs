//! Transport limits of a gRPC server: the `[transport]` configuration section both services
//! read, and what enforces it.
//!
//! | key | default | what |
//! | --- | --- | --- |
//! | `request_timeout_ms` | 30000 | a unary RPC still unanswered after it gets `DEADLINE_EXCEEDED`; streaming RPCs (Relay `Publish`, Ingest `Publish`) are exempt |
//! | `max_concurrent_requests` | 1024 | per gRPC service: requests in flight at once; one more is shed at once with `UNAVAILABLE` (tower `LoadShed` over `ConcurrencyLimit`) |
//! | `max_connections` | 4096 | per listener: accepted TCP connections held at once; one more is closed at accept |
//! | `max_connections_per_peer` | 256 | per listener and remote IP address: connections held at once; one more is closed at accept (0: unlimited) |
//! | `handshake_timeout_ms` | 10000 | a connection that has not sent the whole HTTP/2 client preface (magic + first `SETTINGS` frame; after the TLS handshake when TLS is on) by then is closed |
//! | `idle_timeout_ms` | 300000 | a connection with no open HTTP/2 stream for this long is closed (0: never) |
//! | `max_concurrent_streams` | 256 | per connection: HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS` |
//! | `max_header_list_bytes` | 16384 | per request: HTTP/2 `SETTINGS_MAX_HEADER_LIST_SIZE` |
//! | `stream_window_kib` | 128 | per stream a server receives: HTTP/2 stream window; the connection window is 128 times it ([`http2`]) |
//!
//! Pieces, each usable alone:
//! * [`ConnectionLimits`] + [`GuardedIncoming`]: wraps the accepted TCP connections of one
//!   listener (e.g. [`crate::grpc::BoundListener::incoming`]) so each holds a permit of that
//!   listener's `max_connections` and of its peer's `max_connections_per_peer`, a handshake
//!   deadline and an idle deadline. A TLS acceptor wraps the [`Guarded`] stream (so the deadline
//!   also bounds the TLS handshake) and then calls [`Guarded::watch_above`] and wraps the
//!   decrypted stream in [`PrefaceWatch`], which sees the plaintext preface and frames.
//! * [`RequestLimits::limit`]: wraps one tonic service (`QueryServer<..>`) in tower's
//!   `LoadShed` and `ConcurrencyLimit` and a per-method timeout for unary methods (which
//!   methods stream is read from the services' encoded descriptor sets).
//! * [`TransportConfig::server`]: the HTTP/2 settings on tonic's `Server` builder, the
//!   flow-control windows of [`http2`] included ([`http2::endpoint`] sets the same windows on
//!   every client endpoint).
//! * [`Transport`]: all of the above from one configuration and one set of metrics.
//!
//! Metrics (`PREFIX` is the service's, e.g. `ckf_indexer`):
//! `PREFIX_connections{state="handshake"|"established"}` (gauge),
//! `PREFIX_connections_refused_total{reason="max_connections"|"max_connections_per_peer"|
//! "handshake_timeout"|"idle_timeout"}`, `PREFIX_requests_shed_total{service}`,
//! `PREFIX_requests_timed_out_total{service}`. The connection metrics sum over the service's
//! listeners (the indexer's `listen` and `query_listen`), whose limits are separate.
//!
//! Idle: a connection is idle while it has no open HTTP/2 stream (the wrappers read the frame
//! headers going both ways: a client `HEADERS` opens a stream, the server's `END_STREAM` or a
//! `RST_STREAM` either way ends it). PINGs, `SETTINGS` and `WINDOW_UPDATE`s are not activity,
//! so a peer that only answers keepalive pings is still closed; an open stream, however quiet
//! (a Relay stream between heartbeats, a health `Watch`), keeps its connection. The close is
//! abrupt (no `GOAWAY`): no RPC is in flight at that moment, and a gRPC client reconnects on
//! its next call; one sent at the very instant of the close fails with `UNAVAILABLE`.
//!
//! | file | owns |
//! | --- | --- |
//! | `transport/config.rs` | the `[transport]` section: keys, defaults, validation, the HTTP/2 server settings, the flags |
//! | `transport/metrics.rs` | [`TransportMetrics`] and the `reason` labels |
//! | `transport/http2.rs` | the flow-control windows of every server and client, HTTP/2 failure words ([`http2`]) |
//! | `transport/sniff.rs` | the HTTP/2 preface and frame-header sniffer (and why it is home-made) |
//! | `transport/peers.rs` | [`PeerAddr`] and the per-peer connection counts |
//! | `transport/admission.rs` | [`ConnectionLimits`] and [`GuardedIncoming`]: admission at accept |
//! | `transport/watched.rs` | [`Watched`]: the one I/O wrapper, forwarding to its stream and showing a [`Watcher`] the bytes |
//! | `transport/connection.rs` | one connection's state and deadlines: [`Guarded`], [`PrefaceWatch`], [`WatchAbove`], [`PrefaceMarker`] |
//! | `transport/requests.rs` | [`RequestLimits`] / [`Limited`]: load shedding, concurrency limit, unary timeout |
//! | `transport.rs` | [`Transport`]: all of the above from one configuration |

use prometheus::Registry;
use tonic::server::NamedService;
use tonic::transport::Server;

mod admission;
mod config;
mod connection;
pub mod http2;
mod metrics;
mod peers;
mod requests;
mod sniff;
mod watched;

#[cfg(test)]
mod tests;

pub use admission::{ConnectionLimits, GuardedIncoming};
pub use config::{
    DEFAULT_HANDSHAKE_TIMEOUT_MS, DEFAULT_IDLE_TIMEOUT_MS, DEFAULT_MAX_CONCURRENT_REQUESTS,
    DEFAULT_MAX_CONCURRENT_STREAMS, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS_PER_PEER,
    DEFAULT_MAX_HEADER_LIST_BYTES, DEFAULT_REQUEST_TIMEOUT_MS, TransportConfig, TransportFlags,
};
pub use connection::{Deadlines, Decrypted, Guarded, PrefaceMarker, PrefaceWatch, WatchAbove};
pub use metrics::{
    REFUSED_HANDSHAKE_TIMEOUT, REFUSED_IDLE_TIMEOUT, REFUSED_MAX_CONNECTIONS,
    REFUSED_MAX_CONNECTIONS_PER_PEER, TransportMetrics,
};
pub use peers::PeerAddr;
pub use requests::{
    DescriptorError, Limited, RequestLimits, RequestTimedOut, UnaryTimeout, streaming_methods,
};
pub use watched::{Watched, Watcher};

/// A service's transport limits from one `[transport]` section: connection limits for each of
/// its listeners, request limits for its gRPC services, HTTP/2 settings for its server builder.
#[derive(Debug, Clone)]
pub struct Transport {
    config: TransportConfig,
    /// The metrics (registered under the service's prefix).
    pub metrics: TransportMetrics,
    /// Request limits.
    pub requests: RequestLimits,
}

impl Transport {
    /// Registers the metrics `{prefix}_...` in `registry`; `descriptor_sets` name the services'
    /// streaming methods (exempt from the timeout).
    ///
    /// # Errors
    /// [`DescriptorError`] for a set that does not decode.
    ///
    /// # Panics
    /// When the metric names are already registered in `registry`.
    pub fn new(
        config: &TransportConfig,
        registry: &Registry,
        prefix: &str,
        descriptor_sets: &[&[u8]],
    ) -> Result<Self, DescriptorError> {
        let metrics = TransportMetrics::new(registry, prefix);
        Ok(Self {
            config: config.clone(),
            requests: RequestLimits::new(config, &metrics, descriptor_sets)?,
            metrics,
        })
    }

    /// `builder` with the HTTP/2 limits ([`TransportConfig::server`]).
    pub fn server(&self, builder: Server) -> Server {
        self.config.server(builder)
    }

    /// `incoming` (one listener's accepted connections) with connection limits of its own
    /// ([`ConnectionLimits::guard`] over a fresh [`ConnectionLimits`]): call it once per
    /// listener, and no listener's clients can hold another's `max_connections`.
    pub fn incoming<S>(&self, incoming: S) -> GuardedIncoming<S> {
        ConnectionLimits::new(&self.config, &self.metrics).guard(incoming)
    }

    /// `service` with the request limits ([`RequestLimits::limit`]).
    pub fn limit<S: NamedService>(&self, service: S) -> Limited<S> {
        self.requests.limit(service)
    }
}
