//! Connection admission on one listener: `max_connections` permits and per-peer counts taken at
//! accept (one connection over a limit is closed at once and counted), each admitted
//! connection handed on as a [`Guarded`] stream with its deadlines.
//!
//! tonic's `Server` has no connection limit (`concurrency_limit_per_connection` bounds
//! requests within one connection), so the accepted stream is filtered here before tonic
//! sees it.

use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_stream::Stream;

use crate::transport::config::TransportConfig;
use crate::transport::connection::{Admission, Guarded, guard};
use crate::transport::metrics::{
    REFUSED_MAX_CONNECTIONS, REFUSED_MAX_CONNECTIONS_PER_PEER, TransportMetrics,
};
use crate::transport::peers::{PeerAddr, PeerCounts, PeerSlot, lock_peers};

/// One listener's connection limits: its own `max_connections` permits, its own
/// `max_connections_per_peer` counts, and the handshake and idle deadlines. Clones share the
/// permits; build one per listener ([`crate::transport::Transport::incoming`] does) so no listener's clients can
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
        Some(guard(
            io,
            Admission {
                permit,
                peer,
                gauge: self.metrics.connections.clone(),
                refused: self.metrics.refused.clone(),
                handshake_timeout: self.handshake_timeout,
                idle_timeout: self.idle_timeout,
            },
        ))
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
