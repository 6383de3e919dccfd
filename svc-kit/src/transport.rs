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

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use prometheus::{IntCounterVec, IntGaugeVec, Registry};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_stream::Stream;
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::http;
use tonic::server::NamedService;
use tonic::transport::Server;
use tonic::transport::server::Connected;
use tower::Service;
use tower::limit::ConcurrencyLimit;
use tower::load_shed::LoadShed;
use tower::load_shed::error::Overloaded;

use crate::config::{Invalid, Validate, in_range};
use crate::metrics::{counter_vec, int_gauge_vec};

pub mod http2;

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

// ---- metrics ------------------------------------------------------------------------------

/// Connection states of the `PREFIX_connections` gauge.
const STATES: [&str; 2] = ["handshake", "established"];
/// `reason` label: refused at accept because `max_connections` are held.
pub const REFUSED_MAX_CONNECTIONS: &str = "max_connections";
/// `reason` label: refused at accept because its peer holds `max_connections_per_peer`.
pub const REFUSED_MAX_CONNECTIONS_PER_PEER: &str = "max_connections_per_peer";
/// `reason` label: closed because the preface did not arrive within `handshake_timeout_ms`.
pub const REFUSED_HANDSHAKE_TIMEOUT: &str = "handshake_timeout";
/// `reason` label: closed after `idle_timeout_ms` without an open HTTP/2 stream.
pub const REFUSED_IDLE_TIMEOUT: &str = "idle_timeout";
/// Every `reason` label, present from the start.
const REASONS: [&str; 4] = [
    REFUSED_MAX_CONNECTIONS,
    REFUSED_MAX_CONNECTIONS_PER_PEER,
    REFUSED_HANDSHAKE_TIMEOUT,
    REFUSED_IDLE_TIMEOUT,
];

/// The transport metrics of one service (cheap shared handles).
#[derive(Debug, Clone)]
pub struct TransportMetrics {
    /// `PREFIX_connections{state}`: connections held, by `handshake` / `established`.
    pub connections: IntGaugeVec,
    /// `PREFIX_connections_refused_total{reason}`: connections closed by a limit.
    pub refused: IntCounterVec,
    /// `PREFIX_requests_shed_total{service}`: requests refused by `max_concurrent_requests`.
    pub shed: IntCounterVec,
    /// `PREFIX_requests_timed_out_total{service}`: unary requests cut by `request_timeout_ms`.
    pub timed_out: IntCounterVec,
}

impl TransportMetrics {
    /// Registers the metrics named `{prefix}_...` (e.g. `prefix = "ckf_indexer"`) in
    /// `registry`, every `state` and `reason` label present from the start.
    ///
    /// # Panics
    /// When the names are already registered in `registry` (a programming error).
    pub fn new(registry: &Registry, prefix: &str) -> Self {
        let metrics = Self {
            connections: int_gauge_vec(
                registry,
                &format!("{prefix}_connections"),
                "gRPC connections held, by state (handshake: HTTP/2 preface not yet received; \
                 summed over listeners)",
                &["state"],
            ),
            refused: counter_vec(
                registry,
                &format!("{prefix}_connections_refused_total"),
                "gRPC connections closed by a transport limit, by reason (max_connections, \
                 max_connections_per_peer, handshake_timeout, idle_timeout; summed over listeners)",
                &["reason"],
            ),
            shed: counter_vec(
                registry,
                &format!("{prefix}_requests_shed_total"),
                "Requests refused with UNAVAILABLE by transport.max_concurrent_requests, by service",
                &["service"],
            ),
            timed_out: counter_vec(
                registry,
                &format!("{prefix}_requests_timed_out_total"),
                "Unary requests cut with DEADLINE_EXCEEDED by transport.request_timeout_ms, by \
                 service",
                &["service"],
            ),
        };
        for state in STATES {
            metrics.connections.with_label_values(&[state]);
        }
        for reason in REASONS {
            metrics.refused.with_label_values(&[reason]);
        }
        metrics
    }
}

// ---- connections --------------------------------------------------------------------------

/// The HTTP/2 client connection preface magic (RFC 9113 section 3.4).
const PREFACE_MAGIC: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// HTTP/2 frame header length.
const FRAME_HEADER: usize = 9;
/// HTTP/2 `SETTINGS` frame type.
const SETTINGS_FRAME: u8 = 0x4;

/// Reads a connection's first bytes: done once the magic and one whole `SETTINGS` frame went
/// by. Anything else is never done (hyper closes such a connection itself, or the deadline does).
#[derive(Debug, Default)]
struct PrefaceParser {
    seen: usize,
    header: [u8; FRAME_HEADER],
    /// Bytes up to the end of the first frame, once its header was read.
    end: Option<usize>,
    failed: bool,
}

impl PrefaceParser {
    /// Feeds newly read bytes; `true` once the preface is complete.
    fn feed(&mut self, bytes: &[u8]) -> bool {
        for &byte in bytes {
            if self.failed {
                return false;
            }
            let at = self.seen;
            if at < PREFACE_MAGIC.len() {
                self.failed = byte != PREFACE_MAGIC[at];
            } else if at < PREFACE_MAGIC.len() + FRAME_HEADER {
                self.header[at - PREFACE_MAGIC.len()] = byte;
                if at + 1 == PREFACE_MAGIC.len() + FRAME_HEADER {
                    let h = &self.header;
                    let length = u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize;
                    self.failed = h[3] != SETTINGS_FRAME;
                    self.end = Some(at + 1 + length);
                }
            }
            self.seen += 1;
            if self.end.is_some_and(|end| self.seen >= end) && !self.failed {
                return true;
            }
        }
        false
    }
}

/// HTTP/2 `DATA` frame type.
const DATA_FRAME: u8 = 0x0;
/// HTTP/2 `HEADERS` frame type.
const HEADERS_FRAME: u8 = 0x1;
/// HTTP/2 `RST_STREAM` frame type.
const RST_STREAM_FRAME: u8 = 0x3;
/// HTTP/2 `END_STREAM` flag (on `DATA` and `HEADERS`).
const END_STREAM: u8 = 0x1;

/// Walks the frame headers of one direction of an HTTP/2 connection, skipping the payloads
/// (only type, flags and stream id matter to the idle tracking; nothing is buffered).
#[derive(Debug)]
struct FrameWalker {
    /// Bytes to skip before the next frame header: the client magic first, then each payload.
    skip: usize,
    header: [u8; FRAME_HEADER],
    filled: usize,
}

impl FrameWalker {
    fn new(skip: usize) -> Self {
        Self {
            skip,
            header: [0; FRAME_HEADER],
            filled: 0,
        }
    }

    /// Feeds the next bytes of the direction; `frame(type, flags, stream id)` for each frame
    /// header completed by them.
    fn feed(&mut self, mut bytes: &[u8], mut frame: impl FnMut(u8, u8, u32)) {
        while !bytes.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (FRAME_HEADER - self.filled).min(bytes.len());
            self.header[self.filled..self.filled + n].copy_from_slice(&bytes[..n]);
            self.filled += n;
            bytes = &bytes[n..];
            if self.filled == FRAME_HEADER {
                self.filled = 0;
                let h = self.header;
                self.skip = u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize;
                let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
                frame(h[3], h[4], stream);
            }
        }
    }
}

/// The open HTTP/2 streams of one connection, read from its frame headers going both ways: a
/// client `HEADERS` on a new (higher) stream id opens one; the server's `END_STREAM` (its
/// trailers end every gRPC response) or a `RST_STREAM` either way ends it. The set is bounded
/// by the server's own stream accounting: a stream over `max_concurrent_streams` is reset by it.
#[derive(Debug)]
struct StreamTracker {
    client: FrameWalker,
    server: FrameWalker,
    open: HashSet<u32>,
    highest: u32,
    /// When the last open stream ended (the connection's accept time before the first).
    idle_since: Instant,
}

impl StreamTracker {
    fn new() -> Self {
        Self {
            client: FrameWalker::new(PREFACE_MAGIC.len()),
            server: FrameWalker::new(0),
            open: HashSet::new(),
            highest: 0,
            idle_since: Instant::now(),
        }
    }

    /// Bytes read from the client.
    fn read(&mut self, bytes: &[u8]) {
        let Self {
            client,
            open,
            highest,
            ..
        } = self;
        let mut ended = false;
        client.feed(bytes, |kind, _, stream| match kind {
            HEADERS_FRAME if stream > *highest => {
                *highest = stream;
                open.insert(stream);
            }
            RST_STREAM_FRAME => ended |= open.remove(&stream),
            _ => {}
        });
        self.ended(ended);
    }

    /// Bytes written to the client.
    fn wrote(&mut self, bytes: &[u8]) {
        let Self { server, open, .. } = self;
        let mut ended = false;
        server.feed(bytes, |kind, flags, stream| match kind {
            DATA_FRAME | HEADERS_FRAME if flags & END_STREAM != 0 => {
                ended |= open.remove(&stream);
            }
            RST_STREAM_FRAME => ended |= open.remove(&stream),
            _ => {}
        });
        self.ended(ended);
    }

    fn ended(&mut self, ended: bool) {
        if ended && self.open.is_empty() {
            self.idle_since = Instant::now();
        }
    }

    /// When the connection is due to close as idle: `idle` after its last stream ended, or
    /// `idle` from now while a stream is open (checked again then).
    fn idle_deadline(&self, idle: Duration) -> Instant {
        if self.open.is_empty() {
            self.idle_since + idle
        } else {
            Instant::now() + idle
        }
    }
}

/// What a connection's wrappers share: whether the preface arrived, the gauge to move, and
/// (when `idle_timeout_ms` is on) its open streams.
#[derive(Debug)]
struct ConnectionState {
    established: AtomicBool,
    gauge: IntGaugeVec,
    /// `None` when `idle_timeout_ms` is 0: no frame is read then.
    streams: Option<Mutex<StreamTracker>>,
}

impl ConnectionState {
    fn mark_established(&self) {
        if !self.established.swap(true, Ordering::AcqRel) {
            self.gauge.with_label_values(&["handshake"]).dec();
            self.gauge.with_label_values(&["established"]).inc();
            // idle from here: the handshake has its own deadline
            if let Some(mut tracker) = self.tracker()
                && tracker.open.is_empty()
            {
                tracker.idle_since = Instant::now();
            }
        }
    }

    fn is_established(&self) -> bool {
        self.established.load(Ordering::Acquire)
    }

    fn tracker(&self) -> Option<std::sync::MutexGuard<'_, StreamTracker>> {
        // Only this connection's task locks it; a panic while held cannot leave it half-updated
        // in a way that matters more than closing one connection early or late.
        self.streams.as_ref().map(|streams| {
            streams
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        })
    }

    /// Plaintext bytes read from the client.
    fn read(&self, bytes: &[u8]) {
        if let Some(mut tracker) = self.tracker() {
            tracker.read(bytes);
        }
    }

    /// Plaintext bytes written to the client.
    fn wrote(&self, bytes: &[u8]) {
        if let Some(mut tracker) = self.tracker() {
            tracker.wrote(bytes);
        }
    }

    /// Bytes of `bufs` that a vectored write of `n` bytes took.
    fn wrote_vectored(&self, bufs: &[io::IoSlice<'_>], mut n: usize) {
        if let Some(mut tracker) = self.tracker() {
            for buf in bufs {
                if n == 0 {
                    break;
                }
                let take = n.min(buf.len());
                tracker.wrote(&buf[..take]);
                n -= take;
            }
        }
    }

    fn idle_deadline(&self, idle: Duration) -> Instant {
        self.tracker()
            .map_or_else(|| Instant::now() + idle, |t| t.idle_deadline(idle))
    }
}

impl Drop for ConnectionState {
    fn drop(&mut self) {
        let state = if self.is_established() {
            "established"
        } else {
            "handshake"
        };
        self.gauge.with_label_values(&[state]).dec();
    }
}

/// Marks a connection's preface as received and passes it the plaintext bytes; given to a
/// [`PrefaceWatch`] above TLS.
#[derive(Debug, Clone)]
pub struct PrefaceMarker(Arc<ConnectionState>);

/// The remote IP address of an accepted connection, which `max_connections_per_peer` counts.
pub trait PeerAddr {
    /// The peer's IP address (IPv4-mapped IPv6 as IPv4); `None` when unknown (such a
    /// connection is bounded by `max_connections` only).
    fn peer_ip(&self) -> Option<IpAddr>;
}

impl PeerAddr for tokio::net::TcpStream {
    fn peer_ip(&self) -> Option<IpAddr> {
        self.peer_addr().ok().map(|addr| addr.ip().to_canonical())
    }
}

/// Connections held per remote IP address; an entry is removed when its count reaches 0, so
/// the map holds at most one entry per held connection.
type PeerCounts = Arc<Mutex<HashMap<IpAddr, u32>>>;

fn lock_peers(peers: &PeerCounts) -> std::sync::MutexGuard<'_, HashMap<IpAddr, u32>> {
    // The map is only incremented or decremented under the lock, never left half-changed.
    peers
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One connection's share of its peer's `max_connections_per_peer`; given back on drop.
#[derive(Debug)]
struct PeerSlot {
    peers: PeerCounts,
    ip: IpAddr,
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut peers = lock_peers(&self.peers);
        if let Some(count) = peers.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                peers.remove(&self.ip);
            }
        }
    }
}

/// One listener's connection limits: its own `max_connections` permits, its own
/// `max_connections_per_peer` counts, and the handshake and idle deadlines. Clones share the
/// permits; build one per listener ([`Transport::incoming`] does) so no listener's clients can
/// take another's.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    permits: Arc<Semaphore>,
    max: usize,
    per_peer: u32,
    peers: PeerCounts,
    handshake_timeout: Duration,
    idle_timeout: Option<Duration>,
    metrics: TransportMetrics,
}

impl ConnectionLimits {
    /// Fresh `max_connections` permits and per-peer counts (shared by this value's clones
    /// only), `handshake_timeout_ms` and `idle_timeout_ms`, counted in `metrics`.
    pub fn new(config: &TransportConfig, metrics: &TransportMetrics) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(config.max_connections as usize)),
            max: config.max_connections as usize,
            per_peer: config.max_connections_per_peer,
            peers: PeerCounts::default(),
            handshake_timeout: config.handshake_timeout(),
            idle_timeout: config.idle_timeout(),
            metrics: metrics.clone(),
        }
    }

    /// Wraps a stream of accepted connections: each admitted one is a [`Guarded`] stream, each
    /// over a limit is dropped (closed) at once and counted.
    pub fn guard<S>(&self, incoming: S) -> GuardedIncoming<S> {
        GuardedIncoming {
            inner: incoming,
            limits: self.clone(),
        }
    }

    /// Admits one accepted connection: `None` (and counted as refused) when `max_connections`
    /// are already held, or `max_connections_per_peer` by its peer; the caller drops `io`,
    /// which closes it.
    pub fn admit<IO: PeerAddr>(&self, io: IO) -> Option<Guarded<IO>> {
        let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned() else {
            self.refuse(REFUSED_MAX_CONNECTIONS);
            tracing::debug!(
                peer = ?io.peer_ip(),
                limit = self.max,
                "connection refused: transport.max_connections held on this listener"
            );
            return None;
        };
        let peer = match io.peer_ip() {
            Some(ip) if self.per_peer > 0 => {
                let mut peers = lock_peers(&self.peers);
                let count = peers.entry(ip).or_insert(0);
                if *count >= self.per_peer {
                    drop(peers);
                    self.refuse(REFUSED_MAX_CONNECTIONS_PER_PEER);
                    tracing::debug!(
                        peer = %ip,
                        limit = self.per_peer,
                        "connection refused: transport.max_connections_per_peer held by this peer"
                    );
                    return None;
                }
                *count += 1;
                Some(PeerSlot {
                    peers: Arc::clone(&self.peers),
                    ip,
                })
            }
            _ => None,
        };
        self.metrics
            .connections
            .with_label_values(&["handshake"])
            .inc();
        Some(Guarded {
            io,
            state: Arc::new(ConnectionState {
                established: AtomicBool::new(false),
                gauge: self.metrics.connections.clone(),
                streams: self.idle_timeout.map(|_| Mutex::new(StreamTracker::new())),
            }),
            parser: Some(PrefaceParser::default()),
            plaintext: true,
            deadline: Some(Box::pin(tokio::time::sleep(self.handshake_timeout))),
            idle_timeout: self.idle_timeout,
            idle: None,
            closed: None,
            refused: self.metrics.refused.clone(),
            _permit: permit,
            _peer: peer,
        })
    }

    fn refuse(&self, reason: &str) {
        self.metrics.refused.with_label_values(&[reason]).inc();
    }

    /// Connections currently held on this listener (admitted and not yet closed).
    pub fn held(&self) -> usize {
        self.max - self.permits.available_permits()
    }

    /// Connections currently held on this listener by `ip`.
    pub fn held_by(&self, ip: IpAddr) -> u32 {
        lock_peers(&self.peers).get(&ip).copied().unwrap_or(0)
    }

    /// Remote addresses with a connection held (entries of the per-peer map; 0 when
    /// `max_connections_per_peer` is 0, which keeps no map).
    pub fn peers(&self) -> usize {
        lock_peers(&self.peers).len()
    }
}

/// A stream of accepted connections with [`ConnectionLimits`] applied (see
/// [`ConnectionLimits::guard`]). Accept errors are passed through (tonic logs and goes on).
#[derive(Debug)]
pub struct GuardedIncoming<S> {
    inner: S,
    limits: ConnectionLimits,
}

impl<S> GuardedIncoming<S> {
    /// The limits applied (this listener's).
    pub fn limits(&self) -> &ConnectionLimits {
        &self.limits
    }
}

impl<S, IO> Stream for GuardedIncoming<S>
where
    S: Stream<Item = io::Result<IO>> + Unpin,
    IO: PeerAddr,
{
    type Item = io::Result<Guarded<IO>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            match ready!(Pin::new(&mut self.inner).poll_next(cx)) {
                None => return Poll::Ready(None),
                Some(Err(error)) => return Poll::Ready(Some(Err(error))),
                Some(Ok(io)) => {
                    if let Some(guarded) = self.limits.admit(io) {
                        return Poll::Ready(Some(Ok(guarded)));
                    }
                    // refused: `io` was dropped (closed); accept the next one
                }
            }
        }
    }
}

/// One admitted connection: holds its `max_connections` permit (and its peer's share of
/// `max_connections_per_peer`) until dropped, and fails every read and write with `TimedOut`
/// (so hyper or the TLS acceptor closes it) once
/// * the handshake deadline passes before the HTTP/2 preface was read, counted as
///   `refused{reason="handshake_timeout"}`, or
/// * the connection had no open HTTP/2 stream for `idle_timeout_ms`, counted as
///   `refused{reason="idle_timeout"}`.
///
/// On a plaintext connection it reads the preface and frame headers itself. Under TLS its
/// bytes are ciphertext: the TLS acceptor wraps this stream, calls [`Guarded::watch_above`] and
/// wraps the decrypted stream in [`PrefaceWatch`], which sees the plaintext. The deadlines
/// stay here. `ConnectInfo` is the inner stream's (`remote_addr()` works).
#[derive(Debug)]
pub struct Guarded<IO> {
    io: IO,
    state: Arc<ConnectionState>,
    parser: Option<PrefaceParser>,
    /// Whether this layer's bytes are the HTTP/2 ones (no TLS above): then it tracks streams.
    plaintext: bool,
    deadline: Option<Pin<Box<Sleep>>>,
    idle_timeout: Option<Duration>,
    /// Armed once established; fires at the idle deadline or earlier (then re-armed).
    idle: Option<Pin<Box<Sleep>>>,
    /// The deadline that closed it (`reason` label), once one did.
    closed: Option<&'static str>,
    refused: IntCounterVec,
    _permit: OwnedSemaphorePermit,
    _peer: Option<PeerSlot>,
}

impl<IO> Guarded<IO> {
    /// Stops reading the preface and frames here (the bytes here are TLS records) and returns
    /// the marker for a [`PrefaceWatch`] over the decrypted stream. The deadlines stay here,
    /// so the handshake one covers the TLS handshake too.
    pub fn watch_above(&mut self) -> PrefaceMarker {
        self.parser = None;
        self.plaintext = false;
        PrefaceMarker(Arc::clone(&self.state))
    }

    /// Whether the whole HTTP/2 client preface has been read.
    pub fn is_established(&self) -> bool {
        self.state.is_established()
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &IO {
        &self.io
    }

    /// `Err(TimedOut)` once a deadline passed (see [`Guarded`]); registers the waker so an idle
    /// connection is woken (and closed) at the deadline.
    fn check_deadline(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if let Some(reason) = self.closed {
            return Err(timed_out(reason));
        }
        if let Some(deadline) = &mut self.deadline {
            if self.state.is_established() {
                self.deadline = None;
            } else if deadline.as_mut().poll(cx).is_ready() {
                self.deadline = None;
                return Err(self.close(REFUSED_HANDSHAKE_TIMEOUT));
            }
        }
        if let Some(idle) = self.idle_timeout
            && self.state.is_established()
        {
            let sleep = self
                .idle
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
            while sleep.as_mut().poll(cx).is_ready() {
                let due = self.state.idle_deadline(idle);
                if due <= Instant::now() {
                    self.idle = None;
                    return Err(self.close(REFUSED_IDLE_TIMEOUT));
                }
                sleep.as_mut().reset(due);
            }
        }
        Ok(())
    }

    fn close(&mut self, reason: &'static str) -> io::Error {
        self.closed = Some(reason);
        self.refused.with_label_values(&[reason]).inc();
        let peer = self.state.tracker().map(|t| t.open.len());
        tracing::debug!(reason, open_streams = ?peer, "connection closed by a transport deadline");
        timed_out(reason)
    }
}

fn timed_out(reason: &'static str) -> io::Error {
    let text = if reason == REFUSED_IDLE_TIMEOUT {
        "no open HTTP/2 stream within transport.idle_timeout_ms"
    } else {
        "no HTTP/2 preface within transport.handshake_timeout_ms"
    };
    io::Error::new(io::ErrorKind::TimedOut, text)
}

impl<IO: AsyncRead + Unpin> AsyncRead for Guarded<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check_deadline(cx)?;
        let before = buf.filled().len();
        let result = Pin::new(&mut this.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &result {
            let bytes = &buf.filled()[before..];
            if this.plaintext {
                this.state.read(bytes);
            }
            if let Some(parser) = &mut this.parser
                && parser.feed(bytes)
            {
                this.parser = None;
                this.deadline = None;
                this.state.mark_established();
                // arms the idle deadline now, not at the next read (it cannot be due yet;
                // were it, the next poll would report it)
                let _ = this.check_deadline(cx);
            }
        }
        result
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Guarded<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.check_deadline(cx)?;
        let result = Pin::new(&mut this.io).poll_write(cx, buf);
        if let (Poll::Ready(Ok(n)), true) = (&result, this.plaintext) {
            this.state.wrote(&buf[..*n]);
        }
        result
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.check_deadline(cx)?;
        let result = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        if let (Poll::Ready(Ok(n)), true) = (&result, this.plaintext) {
            this.state.wrote_vectored(bufs, *n);
        }
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check_deadline(cx)?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl<IO: Connected> Connected for Guarded<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

/// A connection a TLS acceptor wraps: it hands the HTTP/2-preface watch (and with it the end of
/// the handshake deadline) and the stream tracking to the decrypted stream above, since its own
/// bytes are TLS records.
pub trait WatchAbove {
    /// Stops watching for the preface here; the marker for a [`PrefaceWatch`] over the decrypted
    /// stream, `None` when this connection has no deadline to end (not [`Guarded`]).
    fn watch_above(&mut self) -> Option<PrefaceMarker>;
}

impl WatchAbove for tokio::net::TcpStream {
    fn watch_above(&mut self) -> Option<PrefaceMarker> {
        None
    }
}

impl<IO> WatchAbove for Guarded<IO> {
    fn watch_above(&mut self) -> Option<PrefaceMarker> {
        Some(Guarded::watch_above(self))
    }
}

/// A decrypted stream (e.g. TLS over a [`Guarded`] connection) that reads the HTTP/2 preface
/// and marks its connection established (which clears the [`Guarded`] deadline below), and
/// passes the frames going both ways to the idle tracking of the connection below.
#[derive(Debug)]
pub struct PrefaceWatch<IO> {
    io: IO,
    parser: Option<PrefaceParser>,
    marker: Option<PrefaceMarker>,
}

impl<IO> PrefaceWatch<IO> {
    /// Watches `io` for the preface of the connection `marker` came from
    /// ([`Guarded::watch_above`]).
    pub fn new(io: IO, marker: PrefaceMarker) -> Self {
        Self::over(io, Some(marker))
    }

    /// As [`PrefaceWatch::new`] when the connection below handed over a marker
    /// ([`WatchAbove::watch_above`]); a plain pass-through otherwise (an unguarded listener).
    pub fn over(io: IO, marker: Option<PrefaceMarker>) -> Self {
        Self {
            io,
            parser: marker.as_ref().map(|_| PrefaceParser::default()),
            marker,
        }
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &IO {
        &self.io
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for PrefaceWatch<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let result = Pin::new(&mut this.io).poll_read(cx, buf);
        if let (Poll::Ready(Ok(())), Some(marker)) = (&result, &this.marker) {
            let bytes = &buf.filled()[before..];
            marker.0.read(bytes);
            if let Some(parser) = &mut this.parser
                && parser.feed(bytes)
            {
                this.parser = None;
                marker.0.mark_established();
            }
        }
        result
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for PrefaceWatch<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.io).poll_write(cx, buf);
        if let (Poll::Ready(Ok(n)), Some(marker)) = (&result, &this.marker) {
            marker.0.wrote(&buf[..*n]);
        }
        result
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        if let (Poll::Ready(Ok(n)), Some(marker)) = (&result, &this.marker) {
            marker.0.wrote_vectored(bufs, *n);
        }
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl<IO: Connected> Connected for PrefaceWatch<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

// ---- requests -----------------------------------------------------------------------------

/// Why a descriptor set given to [`RequestLimits::new`] could not be read.
#[derive(Debug, thiserror::Error)]
#[error("encoded file descriptor set: {0}")]
pub struct DescriptorError(#[from] prost::DecodeError);

/// Request paths (`/package.Service/Method`) of every client- or server-streaming method in
/// `descriptor_sets` (encoded `FileDescriptorSet`s, as given to reflection).
///
/// # Errors
/// [`DescriptorError`] for a set that does not decode.
pub fn streaming_methods(descriptor_sets: &[&[u8]]) -> Result<HashSet<String>, DescriptorError> {
    use prost::Message;
    let mut paths = HashSet::new();
    for set in descriptor_sets {
        let set = prost_types::FileDescriptorSet::decode(*set)?;
        for file in &set.file {
            let package = file.package();
            for service in &file.service {
                let full = match package {
                    "" => service.name().to_owned(),
                    package => format!("{package}.{}", service.name()),
                };
                for method in &service.method {
                    if method.client_streaming() || method.server_streaming() {
                        paths.insert(format!("/{full}/{}", method.name()));
                    }
                }
            }
        }
    }
    Ok(paths)
}

/// Per-service request limits: `max_concurrent_requests` and `request_timeout_ms`.
#[derive(Debug, Clone)]
pub struct RequestLimits {
    timeout: Duration,
    max_concurrent: usize,
    streaming: Arc<HashSet<String>>,
    metrics: TransportMetrics,
}

impl RequestLimits {
    /// Limits from `config`; the methods of `descriptor_sets` that stream are exempt from the
    /// timeout.
    ///
    /// # Errors
    /// [`DescriptorError`] for a set that does not decode.
    pub fn new(
        config: &TransportConfig,
        metrics: &TransportMetrics,
        descriptor_sets: &[&[u8]],
    ) -> Result<Self, DescriptorError> {
        Ok(Self {
            timeout: config.request_timeout(),
            max_concurrent: config.max_concurrent_requests as usize,
            streaming: Arc::new(streaming_methods(descriptor_sets)?),
            metrics: metrics.clone(),
        })
    }

    /// `service` behind its own `max_concurrent_requests` permits (tower `ConcurrencyLimit`),
    /// shed at once when they are all taken (tower `LoadShed`: `UNAVAILABLE`, counted), with
    /// its unary methods cut after `request_timeout_ms` (`DEADLINE_EXCEEDED`, counted).
    pub fn limit<S>(&self, service: S) -> Limited<S>
    where
        S: NamedService,
    {
        let name = S::NAME;
        Limited {
            inner: LoadShed::new(ConcurrencyLimit::new(
                UnaryTimeout {
                    inner: service,
                    timeout: self.timeout,
                    streaming: Arc::clone(&self.streaming),
                },
                self.max_concurrent,
            )),
            shed: ShedReply {
                service: name,
                limit: self.max_concurrent,
                counter: self.metrics.shed.with_label_values(&[name]),
            },
            timeout_ms: u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX),
            timed_out: self.metrics.timed_out.with_label_values(&[name]),
        }
    }
}

/// The inner service with a deadline on its unary methods.
#[derive(Debug, Clone)]
pub struct UnaryTimeout<S> {
    inner: S,
    timeout: Duration,
    streaming: Arc<HashSet<String>>,
}

/// A unary request that ran past `request_timeout_ms`.
#[derive(Debug, thiserror::Error)]
#[error("request timed out")]
pub struct RequestTimedOut;

impl<S> Service<http::Request<Body>> for UnaryTimeout<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = RequestTimedOut;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, RequestTimedOut>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        match ready!(self.inner.poll_ready(cx)) {
            Ok(()) => Poll::Ready(Ok(())),
            Err(never) => match never {},
        }
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let streaming = self.streaming.contains(request.uri().path());
        let response = self.inner.call(request);
        let timeout = self.timeout;
        Box::pin(async move {
            if streaming {
                let Ok(response) = response.await;
                return Ok(response);
            }
            match tokio::time::timeout(timeout, response).await {
                Ok(Ok(response)) => Ok(response),
                Ok(Err(never)) => match never {},
                Err(_) => Err(RequestTimedOut),
            }
        })
    }
}

#[derive(Debug, Clone)]
struct ShedReply {
    service: &'static str,
    limit: usize,
    counter: prometheus::IntCounter,
}

/// A tonic service behind [`RequestLimits`]; add it to the router like the service itself.
#[derive(Debug, Clone)]
pub struct Limited<S> {
    inner: LoadShed<ConcurrencyLimit<UnaryTimeout<S>>>,
    shed: ShedReply,
    timeout_ms: u64,
    timed_out: prometheus::IntCounter,
}

impl<S: NamedService> NamedService for Limited<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for Limited<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // `LoadShed` is always ready (it sheds in `call` instead of waiting); the layers below
        // cannot fail to get ready (the inner service's error type is `Infallible`).
        match ready!(self.inner.poll_ready(cx)) {
            Ok(()) | Err(_) => Poll::Ready(Ok(())),
        }
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let method = request.uri().path().to_owned();
        let response = self.inner.call(request);
        let shed = self.shed.clone();
        let timeout_ms = self.timeout_ms;
        let timed_out = self.timed_out.clone();
        Box::pin(async move {
            let error = match response.await {
                Ok(response) => return Ok(response),
                Err(error) => error,
            };
            let status = if error.is::<Overloaded>() {
                shed.counter.inc();
                Status::unavailable(format!(
                    "{} has transport.max_concurrent_requests = {} requests in flight: {method} \
                     shed, retry with backoff",
                    shed.service, shed.limit
                ))
            } else if error.is::<RequestTimedOut>() {
                timed_out.inc();
                Status::deadline_exceeded(format!(
                    "{method} took longer than transport.request_timeout_ms = {timeout_ms} ms"
                ))
            } else {
                Status::internal(format!("{method}: {error}"))
            };
            Ok(status.into_http())
        })
    }
}

// ---- all together -------------------------------------------------------------------------

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

    /// An empty `SETTINGS` frame: the shortest complete client preface after the magic.
    const EMPTY_SETTINGS: [u8; 9] = [0, 0, 0, SETTINGS_FRAME, 0, 0, 0, 0, 0];

    fn config(max_connections: u32, handshake_timeout_ms: u64) -> TransportConfig {
        TransportConfig {
            max_connections,
            handshake_timeout_ms,
            ..TransportConfig::default()
        }
    }

    #[test]
    fn the_parser_wants_the_magic_and_one_whole_settings_frame() {
        let mut whole = PREFACE_MAGIC.to_vec();
        whole.extend([0, 0, 6, SETTINGS_FRAME, 0, 0, 0, 0, 0]);
        whole.extend([0, 3, 0, 0, 0, 100]); // one setting: MAX_CONCURRENT_STREAMS = 100
        for split in 0..whole.len() {
            let mut parser = PrefaceParser::default();
            assert!(!parser.feed(&whole[..split]), "done after {split} bytes");
            assert!(parser.feed(&whole[split..]), "split at {split}");
        }
        let mut empty = PREFACE_MAGIC.to_vec();
        empty.extend(EMPTY_SETTINGS);
        assert!(PrefaceParser::default().feed(&empty));

        let mut wrong_magic = empty.clone();
        wrong_magic[3] = b'X';
        assert!(!PrefaceParser::default().feed(&wrong_magic));
        let mut not_settings = empty.clone();
        not_settings[PREFACE_MAGIC.len() + 3] = 0x6; // PING
        assert!(!PrefaceParser::default().feed(&not_settings));
        assert!(!PrefaceParser::default().feed(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
        // a TLS ClientHello record is never a preface
        assert!(!PrefaceParser::default().feed(&[0x16, 3, 1, 0, 200, 1, 0, 0, 196]));
    }

    #[test]
    fn every_key_is_validated_with_its_name() {
        TransportConfig::default().validate().unwrap();
        type Breaker = fn(&mut TransportConfig);
        let cases: [(&str, Breaker); 10] = [
            ("transport.stream_window_kib = 63", |c| {
                c.stream_window_kib = 63
            }),
            ("transport.stream_window_kib = 8193", |c| {
                c.stream_window_kib = 8193
            }),
            ("transport.request_timeout_ms = 0", |c| {
                c.request_timeout_ms = 0
            }),
            ("transport.idle_timeout_ms = 99", |c| c.idle_timeout_ms = 99),
            ("transport.max_connections_per_peer = 1000001", |c| {
                c.max_connections_per_peer = 1_000_001
            }),
            ("transport.handshake_timeout_ms = 10", |c| {
                c.handshake_timeout_ms = 10
            }),
            ("transport.max_concurrent_requests = 0", |c| {
                c.max_concurrent_requests = 0
            }),
            ("transport.max_connections = 0", |c| c.max_connections = 0),
            ("transport.max_concurrent_streams = 0", |c| {
                c.max_concurrent_streams = 0
            }),
            ("transport.max_header_list_bytes = 16", |c| {
                c.max_header_list_bytes = 16
            }),
        ];
        for (prefix, break_it) in cases {
            let mut config = TransportConfig::default();
            break_it(&mut config);
            let text = config.validate().unwrap_err().to_string();
            assert!(text.starts_with(prefix), "{text}");
            assert!(text.contains("must be in"), "{text}");
        }
        // 0 turns both off
        let off = TransportConfig {
            idle_timeout_ms: 0,
            max_connections_per_peer: 0,
            ..TransportConfig::default()
        };
        off.validate().unwrap();
        assert_eq!(off.idle_timeout(), None);
    }

    #[test]
    fn the_stream_tracker_opens_on_client_headers_and_ends_on_server_end_stream_or_reset() {
        fn frame(kind: u8, flags: u8, stream: u32, payload: usize) -> Vec<u8> {
            let mut bytes = (payload as u32).to_be_bytes()[1..].to_vec();
            bytes.extend([kind, flags]);
            bytes.extend(stream.to_be_bytes());
            bytes.extend(std::iter::repeat_n(0xAB, payload));
            bytes
        }
        let mut client = PREFACE_MAGIC.to_vec();
        client.extend(EMPTY_SETTINGS);
        client.extend(frame(HEADERS_FRAME, 0x4, 1, 30)); // opens 1
        client.extend(frame(DATA_FRAME, END_STREAM, 1, 5)); // request done: still open
        client.extend(frame(HEADERS_FRAME, 0x4, 3, 30)); // opens 3
        client.extend(frame(0x6, 0, 0, 8)); // PING: nothing
        let mut tracker = StreamTracker::new();
        // byte by byte: frame headers split anywhere are still read
        for byte in &client {
            tracker.read(std::slice::from_ref(byte));
        }
        assert_eq!(tracker.open, HashSet::from([1, 3]));
        // client trailers on an old id do not reopen anything
        tracker.read(&frame(HEADERS_FRAME, END_STREAM | 0x4, 1, 3));
        assert_eq!(tracker.open.len(), 2);

        let mut server = EMPTY_SETTINGS.to_vec();
        server.extend(frame(HEADERS_FRAME, 0x4, 1, 10)); // response headers
        server.extend(frame(DATA_FRAME, 0, 1, 100));
        tracker.wrote(&server);
        assert_eq!(
            tracker.open.len(),
            2,
            "a response without END_STREAM is not the end"
        );
        tracker.wrote(&frame(HEADERS_FRAME, END_STREAM | 0x4, 1, 10)); // trailers
        assert_eq!(tracker.open, HashSet::from([3]));
        let busy = tracker.idle_since;
        tracker.read(&frame(RST_STREAM_FRAME, 0, 3, 4)); // the client cancels 3
        assert!(tracker.open.is_empty());
        assert!(tracker.idle_since >= busy);
        // a server reset ends a stream too
        tracker.read(&frame(HEADERS_FRAME, 0x4, 5, 1));
        tracker.wrote(&frame(RST_STREAM_FRAME, 0, 5, 4));
        assert!(tracker.open.is_empty());
    }

    struct TestServer {
        addr: std::net::SocketAddr,
        metrics: TransportMetrics,
        limits: ConnectionLimits,
        stop: tokio::sync::oneshot::Sender<()>,
        task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    }

    impl TestServer {
        async fn start(config: TransportConfig) -> Self {
            let transport = Transport::new(&config, &Registry::new(), "ckf_test", &[]).unwrap();
            Self::serve(&transport).await
        }

        /// A health server on a new listener guarded by `transport.incoming` (limits of its own).
        async fn serve(transport: &Transport) -> Self {
            let (reporter, health) = grpc::health(&[]).await;
            grpc::set_all(&reporter, &[], tonic_health::ServingStatus::Serving).await;
            let listener = grpc::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
            let addr = listener.addr;
            let incoming = transport.incoming(listener.incoming);
            let limits = incoming.limits().clone();
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let task = tokio::spawn(
                transport
                    .server(tonic::transport::Server::builder())
                    .add_service(health)
                    .serve_with_incoming_shutdown(incoming, async {
                        let _ = stopped.await;
                    }),
            );
            Self {
                addr,
                metrics: transport.metrics.clone(),
                limits,
                stop,
                task,
            }
        }

        async fn client(&self) -> HealthClient<tonic::transport::Channel> {
            let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr))
                .unwrap()
                .connect()
                .await
                .unwrap();
            HealthClient::new(channel)
        }

        fn refused(&self, reason: &str) -> u64 {
            self.metrics.refused.with_label_values(&[reason]).get()
        }

        fn connections(&self, state: &str) -> i64 {
            self.metrics.connections.with_label_values(&[state]).get()
        }

        async fn stop(self) {
            self.stop.send(()).unwrap();
            tokio::time::timeout(Duration::from_secs(10), self.task)
                .await
                .expect("server stops")
                .unwrap()
                .unwrap();
        }
    }

    async fn check(client: &mut HealthClient<tonic::transport::Channel>) {
        let status = client
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(status.status(), tonic_health::ServingStatus::Serving.into());
    }

    /// Reads until the server closes the connection (EOF or reset); `Err` if it is still open
    /// after `bound` (a bound against hanging, far above every deadline used here).
    async fn closed_by_server(stream: &mut TcpStream, bound: Duration) -> Result<(), ()> {
        let mut buf = [0u8; 1024];
        tokio::time::timeout(bound, async {
            loop {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {} // the server's own SETTINGS frame
                }
            }
        })
        .await
        .map_err(|_| ())
    }

    async fn wait_until(what: &str, mut holds: impl FnMut() -> bool) {
        for _ in 0..500 {
            if holds() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{what}: not within 5 s");
    }

    #[tokio::test]
    async fn a_connection_over_max_connections_is_closed_and_the_held_one_works() {
        let server = TestServer::start(config(1, 10_000)).await;
        let mut client = server.client().await;
        check(&mut client).await;
        assert_eq!(server.limits.held(), 1);
        assert_eq!(server.connections("established"), 1);

        let mut extra = TcpStream::connect(server.addr).await.unwrap();
        closed_by_server(&mut extra, Duration::from_secs(5))
            .await
            .expect("the connection over the limit is closed at once");
        assert_eq!(server.refused(REFUSED_MAX_CONNECTIONS), 1);
        check(&mut client).await;

        // the permit comes back when the held connection closes
        drop(client);
        wait_until("permit released", || server.limits.held() == 0).await;
        assert_eq!(server.connections("established"), 0);
        let mut again = server.client().await;
        check(&mut again).await;
        assert_eq!(server.refused(REFUSED_MAX_CONNECTIONS), 1);
        drop(again);
        server.stop().await;
    }

    #[tokio::test]
    async fn a_silent_or_half_preface_connection_is_closed_after_the_handshake_timeout() {
        let server = TestServer::start(config(16, 300)).await;
        let mut silent = TcpStream::connect(server.addr).await.unwrap();
        let mut half = TcpStream::connect(server.addr).await.unwrap();
        half.write_all(PREFACE_MAGIC).await.unwrap(); // magic, but no SETTINGS frame
        wait_until("both admitted", || server.connections("handshake") == 2).await;

        closed_by_server(&mut silent, Duration::from_secs(10))
            .await
            .expect("a silent connection is closed");
        closed_by_server(&mut half, Duration::from_secs(10))
            .await
            .expect("a connection that stops inside its preface is closed");
        assert_eq!(server.refused(REFUSED_HANDSHAKE_TIMEOUT), 2);
        wait_until("gauge back to 0", || server.connections("handshake") == 0).await;
        assert_eq!(server.limits.held(), 0);
        server.stop().await;
    }

    #[tokio::test]
    async fn a_real_client_idle_past_the_handshake_timeout_is_not_cut() {
        let server = TestServer::start(config(16, 200)).await;
        let mut client = server.client().await;
        check(&mut client).await;
        // idle for several handshake timeouts on the same connection
        tokio::time::sleep(Duration::from_millis(800)).await;
        check(&mut client).await;
        assert_eq!(server.refused(REFUSED_HANDSHAKE_TIMEOUT), 0);
        assert_eq!(server.connections("established"), 1);
        assert_eq!(server.connections("handshake"), 0);

        // a raw client that sends the whole preface by hand is established too
        let mut raw = TcpStream::connect(server.addr).await.unwrap();
        raw.write_all(PREFACE_MAGIC).await.unwrap();
        raw.write_all(&EMPTY_SETTINGS).await.unwrap();
        wait_until("raw preface established", || {
            server.connections("established") == 2
        })
        .await;
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(server.refused(REFUSED_HANDSHAKE_TIMEOUT), 0);
        drop((raw, client));
        server.stop().await;
    }

    /// A raw connection from `local` (e.g. `127.0.0.2`) to `server`.
    async fn connect_from(local: &str, server: std::net::SocketAddr) -> TcpStream {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(format!("{local}:0").parse().unwrap()).unwrap();
        socket.connect(server).await.unwrap()
    }

    /// A raw connection that sent the whole client preface.
    async fn established_from(local: &str, server: std::net::SocketAddr) -> TcpStream {
        let mut stream = connect_from(local, server).await;
        stream.write_all(PREFACE_MAGIC).await.unwrap();
        stream.write_all(&EMPTY_SETTINGS).await.unwrap();
        stream
    }

    #[tokio::test]
    async fn one_peer_over_max_connections_per_peer_is_refused_while_another_peer_connects() {
        let server = TestServer::start(TransportConfig {
            max_connections_per_peer: 2,
            ..config(16, 10_000)
        })
        .await;
        let one: std::net::IpAddr = "127.0.0.1".parse().unwrap();
        let two: std::net::IpAddr = "127.0.0.2".parse().unwrap();
        let held = [
            established_from("127.0.0.1", server.addr).await,
            established_from("127.0.0.1", server.addr).await,
        ];
        wait_until("two held", || server.limits.held_by(one) == 2).await;

        let mut third = connect_from("127.0.0.1", server.addr).await;
        closed_by_server(&mut third, Duration::from_secs(5))
            .await
            .expect("the peer's connection over the limit is closed at once");
        assert_eq!(server.refused(REFUSED_MAX_CONNECTIONS_PER_PEER), 1);
        assert_eq!(server.refused(REFUSED_MAX_CONNECTIONS), 0);
        assert_eq!(
            server.limits.held_by(one),
            2,
            "the refused one held nothing"
        );

        // another address is admitted and served
        let other = established_from("127.0.0.2", server.addr).await;
        wait_until("other peer held", || server.limits.held_by(two) == 1).await;
        assert_eq!(server.limits.peers(), 2);
        let mut client = server.client().await; // from 127.0.0.1: full
        assert!(
            client
                .check(HealthCheckRequest {
                    service: String::new()
                })
                .await
                .is_err(),
            "a third connection from 127.0.0.1 is refused"
        );

        // entries leave the map when their peer holds nothing
        drop(held);
        wait_until("127.0.0.1 released", || server.limits.held_by(one) == 0).await;
        assert_eq!(server.limits.peers(), 1);
        check(&mut server.client().await).await;
        drop(other);
        wait_until("map empty", || server.limits.peers() == 0).await;
        server.stop().await;
    }

    #[tokio::test]
    async fn two_listeners_of_one_transport_do_not_share_permits() {
        let registry = Registry::new();
        let transport = Transport::new(&config(1, 10_000), &registry, "ckf_test", &[]).unwrap();
        let a = TestServer::serve(&transport).await;
        let b = TestServer::serve(&transport).await;
        let held = established_from("127.0.0.1", a.addr).await;
        wait_until("a full", || a.limits.held() == 1).await;

        let mut extra = TcpStream::connect(a.addr).await.unwrap();
        closed_by_server(&mut extra, Duration::from_secs(5))
            .await
            .expect("a is full");
        assert_eq!(a.refused(REFUSED_MAX_CONNECTIONS), 1);
        // b still has its own permit
        let mut client = b.client().await;
        check(&mut client).await;
        assert_eq!((a.limits.held(), b.limits.held()), (1, 1));
        assert_eq!(
            b.refused(REFUSED_MAX_CONNECTIONS),
            1,
            "metrics are shared: only a's"
        );
        drop((held, client));
        a.stop().await;
        b.stop().await;
    }

    #[tokio::test]
    async fn a_connection_without_an_open_stream_is_closed_after_the_idle_timeout_pings_or_not() {
        let server = TestServer::start(TransportConfig {
            idle_timeout_ms: 300,
            ..config(16, 10_000)
        })
        .await;
        let mut silent = established_from("127.0.0.1", server.addr).await;
        // a peer that keeps sending PINGs (what answering keepalives looks like) is idle too
        let mut pinging = established_from("127.0.0.1", server.addr).await;
        let (mut read_half, mut write_half) = pinging.split();
        let pings = async {
            let mut ping = vec![0, 0, 8, 0x6, 0, 0, 0, 0, 0];
            ping.extend([7; 8]);
            while write_half.write_all(&ping).await.is_ok() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        let mut buf = [0u8; 1024];
        let drained = async {
            tokio::time::timeout(Duration::from_secs(10), async {
                loop {
                    match read_half.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                }
            })
            .await
        };
        tokio::select! {
            () = pings => panic!("pings stop only when the connection is closed"),
            closed = drained => closed.expect("a pinging connection without streams is closed"),
        }
        closed_by_server(&mut silent, Duration::from_secs(10))
            .await
            .expect("a silent established connection is closed");
        wait_until("both counted", || server.refused(REFUSED_IDLE_TIMEOUT) == 2).await;
        assert_eq!(server.refused(REFUSED_HANDSHAKE_TIMEOUT), 0);
        wait_until("permits back", || server.limits.held() == 0).await;
        server.stop().await;
    }

    #[tokio::test]
    async fn an_open_stream_keeps_its_quiet_connection_past_the_idle_timeout() {
        let server = TestServer::start(TransportConfig {
            idle_timeout_ms: 300,
            ..config(16, 10_000)
        })
        .await;
        let mut client = server.client().await;
        // a health Watch: the client sends nothing after its request, the stream stays open
        let mut watch = client
            .watch(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .unwrap()
            .into_inner();
        watch.message().await.unwrap().expect("the first status");
        tokio::time::sleep(Duration::from_millis(1_200)).await; // four idle timeouts
        assert_eq!(server.refused(REFUSED_IDLE_TIMEOUT), 0);
        assert_eq!(server.connections("established"), 1);
        check(&mut client).await;

        // once the last stream ends, the connection is idle and closed
        drop(watch);
        wait_until("closed as idle", || {
            server.refused(REFUSED_IDLE_TIMEOUT) == 1
        })
        .await;
        wait_until("gauge back to 0", || server.connections("established") == 0).await;
        drop(client);
        server.stop().await;
    }

    // ---- request limits (no network: the service is called directly) --------------------

    /// A fake `grpc.health.v1.Health` whose every call waits for `release`.
    #[derive(Clone)]
    struct Slow {
        release: Arc<tokio::sync::Semaphore>,
    }

    impl NamedService for Slow {
        const NAME: &'static str = "grpc.health.v1.Health";
    }

    impl Service<http::Request<Body>> for Slow {
        type Response = http::Response<Body>;
        type Error = Infallible;
        type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Request<Body>) -> Self::Future {
            let release = Arc::clone(&self.release);
            Box::pin(async move {
                release.acquire().await.unwrap().forget();
                Ok(Status::ok("done").into_http())
            })
        }
    }

    fn request(method: &str) -> http::Request<Body> {
        http::Request::builder()
            .uri(format!("http://x/grpc.health.v1.Health/{method}"))
            .body(Body::empty())
            .unwrap()
    }

    fn grpc_status(response: &http::Response<Body>) -> (i32, String) {
        let status = Status::from_header_map(response.headers()).expect("a grpc-status header");
        (status.code() as i32, status.message().to_owned())
    }

    async fn call<S: Service<http::Request<Body>>>(
        service: &mut S,
        request: http::Request<Body>,
    ) -> S::Future
    where
        S::Error: std::fmt::Debug,
    {
        std::future::poll_fn(|cx| service.poll_ready(cx))
            .await
            .unwrap();
        service.call(request)
    }

    fn limits(max_concurrent_requests: u32, request_timeout_ms: u64) -> (RequestLimits, Registry) {
        let registry = Registry::new();
        let metrics = TransportMetrics::new(&registry, "ckf_test");
        let config = TransportConfig {
            max_concurrent_requests,
            request_timeout_ms,
            ..TransportConfig::default()
        };
        let limits =
            RequestLimits::new(&config, &metrics, &[tonic_health::pb::FILE_DESCRIPTOR_SET])
                .unwrap();
        (limits, registry)
    }

    #[test]
    fn streaming_methods_come_from_the_descriptors() {
        let paths = streaming_methods(&[tonic_health::pb::FILE_DESCRIPTOR_SET]).unwrap();
        assert_eq!(
            paths,
            HashSet::from(["/grpc.health.v1.Health/Watch".to_owned()])
        );
        assert!(streaming_methods(&[b"\xff\xff"]).is_err());
    }

    #[tokio::test]
    async fn over_max_concurrent_requests_is_shed_at_once_with_unavailable() {
        let (limits, _registry) = limits(2, 60_000);
        let release = Arc::new(tokio::sync::Semaphore::new(0));
        let mut service = limits.limit(Slow {
            release: Arc::clone(&release),
        });
        // `poll_ready` takes the permit: each future below holds one until it resolves
        let first = call(&mut service.clone(), request("Check")).await;
        let second = call(&mut service.clone(), request("Watch")).await;
        let response = call(&mut service, request("Check")).await.await.unwrap();
        let (code, message) = grpc_status(&response);
        assert_eq!(code, tonic::Code::Unavailable as i32, "{message}");
        assert!(
            message.contains("grpc.health.v1.Health has transport.max_concurrent_requests = 2"),
            "{message}"
        );
        assert_eq!(
            limits.metrics.shed.with_label_values(&[Slow::NAME]).get(),
            1
        );
        release.add_permits(2);
        for pending in [first, second] {
            let response = pending.await.unwrap();
            assert_eq!(grpc_status(&response).0, tonic::Code::Ok as i32);
        }
        // permits are back: a new request is not shed
        release.add_permits(1);
        let response = call(&mut service, request("Check")).await.await.unwrap();
        assert_eq!(grpc_status(&response).0, tonic::Code::Ok as i32);
    }

    #[tokio::test]
    async fn a_unary_request_times_out_and_a_streaming_one_does_not() {
        let (limits, _registry) = limits(8, 100);
        let release = Arc::new(tokio::sync::Semaphore::new(0));
        let mut service = limits.limit(Slow {
            release: Arc::clone(&release),
        });
        let response = call(&mut service, request("Check")).await.await.unwrap();
        let (code, message) = grpc_status(&response);
        assert_eq!(code, tonic::Code::DeadlineExceeded as i32, "{message}");
        assert!(
            message.contains("/grpc.health.v1.Health/Check took longer than transport.request_timeout_ms = 100 ms"),
            "{message}"
        );
        assert_eq!(
            limits
                .metrics
                .timed_out
                .with_label_values(&[Slow::NAME])
                .get(),
            1
        );

        let watch = tokio::spawn(call(&mut service, request("Watch")).await);
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(!watch.is_finished(), "a streaming method is not cut");
        release.add_permits(1);
        let response = watch.await.unwrap().unwrap();
        assert_eq!(grpc_status(&response).0, tonic::Code::Ok as i32);
    }
}
