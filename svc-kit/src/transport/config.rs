//! The `[transport]` configuration section: its keys and defaults, their validation, the HTTP/2
//! settings they put on tonic's server builder, and the command-line flags that override them.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tonic::transport::Server;

use crate::config::{Invalid, Validate, in_range};
use crate::transport::http2;

/// Default `transport.request_timeout_ms`.
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 30_000;
/// Default `transport.max_concurrent_requests` (per gRPC service).
pub const DEFAULT_MAX_CONCURRENT_REQUESTS: u32 = 1_024;
/// Default `transport.max_connections` (per listener).
pub const DEFAULT_MAX_CONNECTIONS: u32 = 4_096;
/// Default `transport.max_connections_per_peer` (per listener and remote IP address).
pub const DEFAULT_MAX_CONNECTIONS_PER_PEER: u32 = 256;
/// Default `transport.handshake_timeout_ms`.
pub const DEFAULT_HANDSHAKE_TIMEOUT_MS: u64 = 10_000;
/// Default `transport.idle_timeout_ms` (5 minutes).
pub const DEFAULT_IDLE_TIMEOUT_MS: u64 = 300_000;
/// Default `transport.max_concurrent_streams` (per connection).
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 256;
/// Default `transport.max_header_list_bytes` (hyper's own default).
pub const DEFAULT_MAX_HEADER_LIST_BYTES: u32 = 16 << 10;
/// Streams a peer may open and reset before the server reads them (HTTP/2 rapid-reset bound).
const MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 32;

/// The `[transport]` section (milliseconds, counts, bytes; every key validated).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TransportConfig {
    /// A unary RPC unanswered after this many milliseconds gets `DEADLINE_EXCEEDED`
    /// (`100..=3600000`). Streaming RPCs are never cut by it.
    pub request_timeout_ms: u64,
    /// Requests in flight at once per gRPC service (`1..=1000000`); the next is refused at once
    /// with `UNAVAILABLE` (retry with backoff), never queued. A streaming RPC counts until its
    /// response starts (its stream is bounded by the service's own limit, e.g. the indexer's
    /// `limits.max_relay_streams`).
    pub max_concurrent_requests: u32,
    /// TCP connections held at once per listener (`1..=1000000`); one more is closed as soon
    /// as it is accepted. Each listener has its own (the indexer's `listen` and `query_listen`
    /// do not share), so clients of one cannot lock the other's out.
    pub max_connections: u32,
    /// TCP connections held at once per listener by one remote IP address (`0..=1000000`, 0:
    /// unlimited); one more is closed as soon as it is accepted. Behind a proxy or sidecar
    /// every connection has the proxy's address: raise it or set 0 there.
    pub max_connections_per_peer: u32,
    /// Milliseconds a new connection has to send the HTTP/2 client preface (and finish its TLS
    /// handshake first, when TLS is on) before it is closed (`100..=600000`).
    pub handshake_timeout_ms: u64,
    /// Milliseconds a connection may go without an open HTTP/2 stream before it is closed
    /// (`0` never, else `100..=86400000`). Keepalive pings do not count as activity; an open
    /// stream does however quiet it is.
    pub idle_timeout_ms: u64,
    /// HTTP/2 streams (concurrent RPCs) one connection may open (`1..=65536`).
    pub max_concurrent_streams: u32,
    /// Largest header list (decoded, bytes) of one request (`1024..=1048576`).
    pub max_header_list_bytes: u32,
    /// HTTP/2 stream window of the servers, KiB (`64..=8192`): what a peer may send on one
    /// stream before it is read, so one stream's throughput is at most this per round trip.
    /// The connection window is [`http2::CONNECTION_WINDOWS_PER_STREAM`] times it, which keeps
    /// one stream of any gRPC frames under h2's data frame budget ([`http2`]).
    pub stream_window_kib: u32,
}

impl Default for TransportConfig {
    fn default() -> Self {
        Self {
            request_timeout_ms: DEFAULT_REQUEST_TIMEOUT_MS,
            max_concurrent_requests: DEFAULT_MAX_CONCURRENT_REQUESTS,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_peer: DEFAULT_MAX_CONNECTIONS_PER_PEER,
            handshake_timeout_ms: DEFAULT_HANDSHAKE_TIMEOUT_MS,
            idle_timeout_ms: DEFAULT_IDLE_TIMEOUT_MS,
            max_concurrent_streams: DEFAULT_MAX_CONCURRENT_STREAMS,
            max_header_list_bytes: DEFAULT_MAX_HEADER_LIST_BYTES,
            stream_window_kib: http2::STREAM_WINDOW_BYTES >> 10,
        }
    }
}

impl Validate for TransportConfig {
    fn validate(&self) -> Result<(), Invalid> {
        let ms = "milliseconds";
        in_range(
            "transport.request_timeout_ms",
            self.request_timeout_ms,
            100..=3_600_000,
            ms,
        )?;
        in_range(
            "transport.handshake_timeout_ms",
            self.handshake_timeout_ms,
            100..=600_000,
            ms,
        )?;
        if self.idle_timeout_ms != 0 {
            in_range(
                "transport.idle_timeout_ms",
                self.idle_timeout_ms,
                100..=86_400_000,
                "milliseconds (0: never)",
            )?;
        }
        in_range(
            "transport.max_concurrent_requests",
            self.max_concurrent_requests,
            1..=1_000_000,
            "requests",
        )?;
        in_range(
            "transport.max_connections",
            self.max_connections,
            1..=1_000_000,
            "connections",
        )?;
        in_range(
            "transport.max_connections_per_peer",
            self.max_connections_per_peer,
            0..=1_000_000,
            "connections (0: unlimited)",
        )?;
        in_range(
            "transport.max_concurrent_streams",
            self.max_concurrent_streams,
            1..=65_536,
            "streams",
        )?;
        in_range(
            "transport.max_header_list_bytes",
            self.max_header_list_bytes,
            1024..=1 << 20,
            "bytes",
        )?;
        in_range(
            "transport.stream_window_kib",
            self.stream_window_kib,
            64..=8_192,
            "KiB",
        )
    }
}

impl TransportConfig {
    /// `builder` with the per-connection HTTP/2 limits: `max_concurrent_streams`,
    /// `max_header_list_bytes`, a bound on streams reset before they are accepted (tonic's
    /// default leaves concurrent streams unbounded), and the flow-control windows of
    /// [`http2::server`].
    pub fn server(&self, builder: Server) -> Server {
        http2::server_with(builder, self.stream_window_kib << 10)
            .max_concurrent_streams(self.max_concurrent_streams)
            .http2_max_header_list_size(self.max_header_list_bytes)
            .http2_max_pending_accept_reset_streams(Some(MAX_PENDING_ACCEPT_RESET_STREAMS))
    }

    /// `request_timeout_ms` as a duration.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }

    /// `handshake_timeout_ms` as a duration.
    pub fn handshake_timeout(&self) -> Duration {
        Duration::from_millis(self.handshake_timeout_ms)
    }

    /// `idle_timeout_ms` as a duration; `None` when it is 0 (never).
    pub fn idle_timeout(&self) -> Option<Duration> {
        (self.idle_timeout_ms != 0).then(|| Duration::from_millis(self.idle_timeout_ms))
    }
}

/// The `[transport]` flags, for a service's `clap` command line (`#[command(flatten)]`); each
/// given flag overrides the file and the environment ([`TransportFlags::overrides`]).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TransportFlags {
    /// transport.request_timeout_ms: unary RPC deadline (streaming RPCs exempt), ms, 100..=3600000 [default: 30000].
    #[arg(long, value_name = "MS")]
    pub request_timeout_ms: Option<u64>,
    /// transport.max_concurrent_requests: requests in flight per gRPC service; more are shed with UNAVAILABLE [default: 1024].
    #[arg(long, value_name = "REQUESTS")]
    pub max_concurrent_requests: Option<u32>,
    /// transport.max_connections: TCP connections held at once per listener; more are closed at accept [default: 4096].
    #[arg(long, value_name = "CONNECTIONS")]
    pub max_connections: Option<u32>,
    /// transport.max_connections_per_peer: TCP connections held at once per listener by one remote IP; more are closed at accept, 0 = unlimited [default: 256].
    #[arg(long, value_name = "CONNECTIONS")]
    pub max_connections_per_peer: Option<u32>,
    /// transport.handshake_timeout_ms: time to send the HTTP/2 preface (after TLS) before the connection is closed, ms [default: 10000].
    #[arg(long, value_name = "MS")]
    pub handshake_timeout_ms: Option<u64>,
    /// transport.idle_timeout_ms: a connection with no open HTTP/2 stream this long is closed (pings do not count), ms, 0 = never [default: 300000].
    #[arg(long, value_name = "MS")]
    pub idle_timeout_ms: Option<u64>,
    /// transport.max_concurrent_streams: HTTP/2 streams per connection [default: 256].
    #[arg(long, value_name = "STREAMS")]
    pub max_concurrent_streams: Option<u32>,
    /// transport.max_header_list_bytes: largest request header list, bytes [default: 16384].
    #[arg(long, value_name = "BYTES")]
    pub max_header_list_bytes: Option<u32>,
    /// transport.stream_window_kib: HTTP/2 stream window of the servers (connection window 128x), KiB, 64..=8192 [default: 128].
    #[arg(long, value_name = "KIB")]
    pub stream_window_kib: Option<u32>,
}

impl TransportFlags {
    /// `overrides` plus the flags that were given, under their `transport.*` keys.
    pub fn overrides(&self, overrides: crate::config::Overrides) -> crate::config::Overrides {
        overrides
            .set("transport.request_timeout_ms", self.request_timeout_ms)
            .set(
                "transport.max_concurrent_requests",
                self.max_concurrent_requests,
            )
            .set("transport.max_connections", self.max_connections)
            .set(
                "transport.max_connections_per_peer",
                self.max_connections_per_peer,
            )
            .set("transport.handshake_timeout_ms", self.handshake_timeout_ms)
            .set("transport.idle_timeout_ms", self.idle_timeout_ms)
            .set(
                "transport.max_concurrent_streams",
                self.max_concurrent_streams,
            )
            .set(
                "transport.max_header_list_bytes",
                self.max_header_list_bytes,
            )
            .set("transport.stream_window_kib", self.stream_window_kib)
    }
}
