//! One admitted connection's deadlines and what watches its HTTP/2 bytes: the state its
//! wrappers share, the guard on the accepted stream ([`Guarded`]: holds the admission, ends
//! the connection at the handshake or idle deadline) and, under TLS, the watch on the
//! decrypted stream above it ([`PrefaceWatch`]), which sees the plaintext preface and frames.
//! Both are the one wrapper of [`crate::transport::watched`] with their own watcher.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Context;
use std::time::Duration;

use prometheus::{IntCounterVec, IntGaugeVec};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, Sleep};

use crate::transport::metrics::{REFUSED_HANDSHAKE_TIMEOUT, REFUSED_IDLE_TIMEOUT};
use crate::transport::peers::PeerSlot;
use crate::transport::sniff::{PrefaceParser, StreamTracker};
use crate::transport::watched::{Watched, Watcher};

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

/// One admitted connection: holds its `max_connections` permit (and its peer's share of
/// `max_connections_per_peer`) until dropped, and fails every read, write and flush with
/// `TimedOut` (so hyper or the TLS acceptor closes it) once
/// * the handshake deadline passes before the HTTP/2 preface was read, counted as
///   `refused{reason="handshake_timeout"}`, or
/// * the connection had no open HTTP/2 stream for `idle_timeout_ms`, counted as
///   `refused{reason="idle_timeout"}`.
///
/// On a plaintext connection it reads the preface and frame headers itself. Under TLS its
/// bytes are ciphertext: the TLS acceptor wraps this stream, calls [`Watched::watch_above`] and
/// wraps the decrypted stream in [`PrefaceWatch`], which sees the plaintext. The deadlines
/// stay here. `ConnectInfo` is the inner stream's (`remote_addr()` works).
pub type Guarded<IO> = Watched<IO, Deadlines>;

/// The [`Watcher`] of a [`Guarded`] connection: its deadlines, its preface parser while the
/// bytes below are the HTTP/2 ones, and what it holds while admitted.
#[derive(Debug)]
pub struct Deadlines {
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

/// What an admitted connection is given by its listener's limits.
pub(crate) struct Admission {
    /// Its `max_connections` permit.
    pub(crate) permit: OwnedSemaphorePermit,
    /// Its share of its peer's `max_connections_per_peer`, when counted.
    pub(crate) peer: Option<PeerSlot>,
    /// `PREFIX_connections{state}`, moved from `handshake` to `established` and back down.
    pub(crate) gauge: IntGaugeVec,
    /// `PREFIX_connections_refused_total{reason}`, for the deadlines.
    pub(crate) refused: IntCounterVec,
    /// `handshake_timeout_ms`.
    pub(crate) handshake_timeout: Duration,
    /// `idle_timeout_ms`, `None` when 0 (never).
    pub(crate) idle_timeout: Option<Duration>,
}

/// `io`, just admitted, guarded: counted as `handshake` from now until its preface arrives or
/// it closes.
pub(crate) fn guard<IO>(io: IO, admission: Admission) -> Guarded<IO> {
    admission.gauge.with_label_values(&["handshake"]).inc();
    let watcher = Deadlines {
        state: Arc::new(ConnectionState {
            established: AtomicBool::new(false),
            gauge: admission.gauge,
            streams: admission
                .idle_timeout
                .map(|_| Mutex::new(StreamTracker::new())),
        }),
        parser: Some(PrefaceParser::default()),
        plaintext: true,
        deadline: Some(Box::pin(tokio::time::sleep(admission.handshake_timeout))),
        idle_timeout: admission.idle_timeout,
        idle: None,
        closed: None,
        refused: admission.refused,
        _permit: admission.permit,
        _peer: admission.peer,
    };
    Watched::wrap(io, watcher)
}

impl<IO> Watched<IO, Deadlines> {
    /// Stops reading the preface and frames here (the bytes here are TLS records) and returns
    /// the marker for a [`PrefaceWatch`] over the decrypted stream. The deadlines stay here,
    /// so the handshake one covers the TLS handshake too.
    pub fn watch_above(&mut self) -> PrefaceMarker {
        let watcher = self.watcher_mut();
        watcher.parser = None;
        watcher.plaintext = false;
        PrefaceMarker(Arc::clone(&watcher.state))
    }

    /// Whether the whole HTTP/2 client preface has been read.
    pub fn is_established(&self) -> bool {
        self.watcher().state.is_established()
    }
}

impl Deadlines {
    fn close(&mut self, reason: &'static str) -> io::Error {
        self.closed = Some(reason);
        self.refused.with_label_values(&[reason]).inc();
        let peer = self.state.tracker().map(|t| t.open.len());
        tracing::debug!(reason, open_streams = ?peer, "connection closed by a transport deadline");
        timed_out(reason)
    }
}

impl Watcher for Deadlines {
    /// `Err(TimedOut)` once a deadline passed (see [`Guarded`]); registers the waker so an idle
    /// connection is woken (and closed) at the deadline.
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
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

    fn read(&mut self, bytes: &[u8], cx: &mut Context<'_>) {
        if self.plaintext {
            self.state.read(bytes);
        }
        if let Some(parser) = &mut self.parser
            && parser.feed(bytes)
        {
            self.parser = None;
            self.deadline = None;
            self.state.mark_established();
            // arms the idle deadline now, not at the next read (it cannot be due yet;
            // were it, the next poll would report it)
            let _ = self.check(cx);
        }
    }

    fn wrote(&mut self, bytes: &[u8]) {
        if self.plaintext {
            self.state.wrote(bytes);
        }
    }

    fn wrote_vectored(&mut self, bufs: &[io::IoSlice<'_>], n: usize) {
        if self.plaintext {
            self.state.wrote_vectored(bufs, n);
        }
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

impl<IO> WatchAbove for Watched<IO, Deadlines> {
    fn watch_above(&mut self) -> Option<PrefaceMarker> {
        Some(Watched::<IO, Deadlines>::watch_above(self))
    }
}

/// A decrypted stream (e.g. TLS over a [`Guarded`] connection) that reads the HTTP/2 preface
/// and marks its connection established (which clears the [`Guarded`] deadline below), and
/// passes the frames going both ways to the idle tracking of the connection below.
pub type PrefaceWatch<IO> = Watched<IO, Decrypted>;

/// The [`Watcher`] of a [`PrefaceWatch`]: the marker of the connection below (none over an
/// unguarded listener: then it watches nothing) and the preface parser until the preface went
/// by. It has no deadline of its own.
#[derive(Debug)]
pub struct Decrypted {
    parser: Option<PrefaceParser>,
    marker: Option<PrefaceMarker>,
}

impl<IO> Watched<IO, Decrypted> {
    /// Watches `io` for the preface of the connection `marker` came from
    /// ([`Watched::watch_above`]).
    pub fn new(io: IO, marker: PrefaceMarker) -> Self {
        Self::over(io, Some(marker))
    }

    /// As [`Watched::new`] when the connection below handed over a marker
    /// ([`WatchAbove::watch_above`]); a plain pass-through otherwise (an unguarded listener).
    pub fn over(io: IO, marker: Option<PrefaceMarker>) -> Self {
        let watcher = Decrypted {
            parser: marker.as_ref().map(|_| PrefaceParser::default()),
            marker,
        };
        Watched::wrap(io, watcher)
    }
}

impl Watcher for Decrypted {
    fn check(&mut self, _: &mut Context<'_>) -> io::Result<()> {
        Ok(())
    }

    fn read(&mut self, bytes: &[u8], _: &mut Context<'_>) {
        if let Some(marker) = &self.marker {
            marker.0.read(bytes);
            if let Some(parser) = &mut self.parser
                && parser.feed(bytes)
            {
                self.parser = None;
                marker.0.mark_established();
            }
        }
    }

    fn wrote(&mut self, bytes: &[u8]) {
        if let Some(marker) = &self.marker {
            marker.0.wrote(bytes);
        }
    }

    fn wrote_vectored(&mut self, bufs: &[io::IoSlice<'_>], n: usize) {
        if let Some(marker) = &self.marker {
            marker.0.wrote_vectored(bufs, n);
        }
    }
}
