//! The transport metrics of one service: connections held by state, connections refused or
//! closed by a limit (by reason), requests shed and requests timed out (by gRPC service).

use prometheus::{IntCounterVec, IntGaugeVec, Registry};

use crate::metrics::{counter_vec, int_gauge_vec};

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
