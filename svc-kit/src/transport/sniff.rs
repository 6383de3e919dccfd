//! The HTTP/2 preface and frame-header sniffer: reads the bytes a connection passes (never
//! buffering or changing them) to tell when the client preface is complete (the handshake
//! deadline ends there) and which HTTP/2 streams are open (the idle deadline runs while none
//! is).
//!
//! # Why it is home-made
//!
//! `handshake_timeout_ms` and `idle_timeout_ms` are connection deadlines that depend on what
//! HTTP/2 did on the connection, and none of the settings the stack offers sees that:
//! * tonic 0.14's `Server` builds hyper's connection builder itself and exposes only
//!   `timeout` (a deadline on every request, streams included, and only once a request
//!   exists), `concurrency_limit_per_connection` / `load_shed` (requests, not connections),
//!   `max_connection_age` (+ `_grace`: closes every connection at an age, busy or not, so it
//!   would cut a producer's long-lived Relay stream), `http2_keepalive_interval` / `_timeout`
//!   and `tcp_keepalive` (they close only a peer that stops answering; a live client that
//!   answers pings and opens no stream is kept forever), and the HTTP/2 limits
//!   (`max_concurrent_streams`, header list size, pending reset streams, windows, frame size);
//! * hyper 1's HTTP/2 server builder has no handshake or idle deadline at all
//!   (`header_read_timeout` exists for HTTP/1 only), and tonic does not hand its builder out;
//! * tower layers wrap the request service: they see requests, never a connection, so a
//!   connection that sends no preface, or only `PING`s and `SETTINGS`, never reaches them.
//!
//! So the accepted connection's bytes are watched here, below hyper: the magic and the first
//! `SETTINGS` frame for the handshake deadline, and each frame header both ways (type, flags,
//! stream id; payloads skipped) for the open-stream count. Under TLS this runs on the
//! decrypted bytes ([`crate::transport::PrefaceWatch`], watched by
//! [`crate::transport::Decrypted`]).

use std::collections::HashSet;
use std::time::Duration;

use tokio::time::Instant;

/// The HTTP/2 client connection preface magic (RFC 9113 section 3.4).
pub(crate) const PREFACE_MAGIC: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// HTTP/2 frame header length.
pub(crate) const FRAME_HEADER: usize = 9;
/// HTTP/2 `SETTINGS` frame type.
pub(crate) const SETTINGS_FRAME: u8 = 0x4;

/// Reads a connection's first bytes: done once the magic and one whole `SETTINGS` frame went
/// by. Anything else is never done (hyper closes such a connection itself, or the deadline does).
#[derive(Debug, Default)]
pub(crate) struct PrefaceParser {
    seen: usize,
    header: [u8; FRAME_HEADER],
    /// Bytes up to the end of the first frame, once its header was read.
    end: Option<usize>,
    failed: bool,
}

impl PrefaceParser {
    /// Feeds newly read bytes; `true` once the preface is complete.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> bool {
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
pub(crate) const DATA_FRAME: u8 = 0x0;
/// HTTP/2 `HEADERS` frame type.
pub(crate) const HEADERS_FRAME: u8 = 0x1;
/// HTTP/2 `RST_STREAM` frame type.
pub(crate) const RST_STREAM_FRAME: u8 = 0x3;
/// HTTP/2 `END_STREAM` flag (on `DATA` and `HEADERS`).
pub(crate) const END_STREAM: u8 = 0x1;

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
pub(crate) struct StreamTracker {
    client: FrameWalker,
    server: FrameWalker,
    pub(crate) open: HashSet<u32>,
    highest: u32,
    /// When the last open stream ended (the connection's accept time before the first).
    pub(crate) idle_since: Instant,
}

impl StreamTracker {
    pub(crate) fn new() -> Self {
        Self {
            client: FrameWalker::new(PREFACE_MAGIC.len()),
            server: FrameWalker::new(0),
            open: HashSet::new(),
            highest: 0,
            idle_since: Instant::now(),
        }
    }

    /// Bytes read from the client.
    pub(crate) fn read(&mut self, bytes: &[u8]) {
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
    pub(crate) fn wrote(&mut self, bytes: &[u8]) {
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
    pub(crate) fn idle_deadline(&self, idle: Duration) -> Instant {
        if self.open.is_empty() {
            self.idle_since + idle
        } else {
            Instant::now() + idle
        }
    }
}
