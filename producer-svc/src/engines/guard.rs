//! A loopback proxy in front of every engine socket, so the ZMQ library only ever reads a byte
//! stream that [`ZmtpGuard`] has checked (why: [`ckf_engine::zmtp`]).
//!
//! ```text
//! connect mode: zeromq SUB/DEALER --tcp--> 127.0.0.1:<guard port> --guard--> engine endpoint
//! bind mode:    engine --> configured endpoint (guard listener) --guard--> ipc://<private dir>/sub
//! ```
//!
//! Each accepted connection gets its own upstream connection and its own guard over the bytes
//! coming *from the engine*; what zeromq sends (greeting, SUBSCRIBE, replay requests) goes
//! through unchanged. On the first violation both connections are closed and the violation is
//! counted (`ckf_producer_engine_decode_errors_total{kind="zmtp_..."}`) and logged at most once
//! per [`LOG_INTERVAL`](super::publisher::LOG_INTERVAL). zeromq then reconnects as it does after
//! any disconnection, and the lost messages show as a sequence gap (replay, or clear).
//!
//! In connect mode an upstream that cannot be reached (an engine that is down or restarting)
//! does not close the accepted connection: the proxy holds it, keeps what zeromq sends
//! (its greeting and first commands, at most [`MAX_HELD_BYTES`]), and tries the engine again
//! every [`UPSTREAM_RETRY`] until it answers or zeromq gives up. zeromq's own reconnect backoff
//! (100 ms doubling to 30 s, fixed in the `zeromq` crate) therefore never grows while an engine
//! is down, and the connection, its `Connected` monitor event and the sequence rule's check
//! follow within [`UPSTREAM_RETRY`] of the engine listening again. The proxy's own listener is
//! bound to loopback only.
//!
//! # Bind mode: zeromq's own listener is private
//!
//! zeromq's listener must not be reachable by anything but the proxy, or a local process could
//! connect to it directly and bypass the guard. It is therefore a Unix socket in a directory
//! created for the one publisher with mode 0700 ([`PrivateIpc`], under `$XDG_RUNTIME_DIR` or
//! else the temporary directory, with a random name, refused if it exists), removed when the
//! publisher ends. Only this user (and root, who could read the producer's memory anyway) can
//! reach it; no TCP port is opened for zeromq.
//!
//! # Connection limit and handshake deadline
//!
//! Whoever reaches an engine endpoint could otherwise open connections without end (each one
//! holds file descriptors, a 64 KiB buffer and an upstream zeromq connection). So every proxy:
//!
//! - forwards at most [`ProxyOptions::max_connections`] connections at once (default
//!   [`DEFAULT_MAX_CONNECTIONS`], enough for every rank's reconnects and replays); one more is
//!   closed at accept, before any byte is read or forwarded;
//! - gives each connection [`ProxyOptions::handshake_timeout`] (default
//!   [`DEFAULT_HANDSHAKE_TIMEOUT`]) from accept for the engine to send its whole ZMTP greeting
//!   and first command ([`ZmtpGuard::handshake_done`]); a connection still short of it then is
//!   closed;
//! - in bind mode opens the upstream zeromq connection only once the engine has sent its first
//!   bytes (and they pass the guard), so a connection that never speaks costs zeromq nothing.
//!   Waiting for more is not possible: libzmq sends the rest of its greeting only after it has
//!   read the start of its peer's.
//!
//! Both closings are counted in `ckf_producer_engine_connections_dropped_total{reason=
//! "connection_limit" | "handshake_timeout"}` (see [`Dropped`]) and logged like violations.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ckf_engine::zmtp::{GREETING_BYTES, ZmtpGuard, ZmtpLimits, ZmtpViolation};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout_at};

use super::config::Endpoint;

/// How long an upstream connection may take to open.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Connect mode: wait between attempts to reach an engine that is down, while zeromq's
/// connection is held.
pub const UPSTREAM_RETRY: Duration = Duration::from_millis(200);
/// Connect mode: bytes of zeromq's held while the engine is unreachable (its greeting and
/// first commands take under 1 KiB); more closes the connection.
pub const MAX_HELD_BYTES: usize = 64 << 10;
/// Proxy read size, in bytes.
const CHUNK: usize = 64 << 10;
/// Pause after a failed accept (e.g. no file descriptor left), so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// Default of [`ProxyOptions::max_connections`]: connections forwarded at once per proxy (one
/// proxy per publisher endpoint; an engine rank holds one, plus reconnects in flight).
pub const DEFAULT_MAX_CONNECTIONS: usize = 64;
/// Default of [`ProxyOptions::handshake_timeout`].
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest Unix socket path, in bytes (`sun_path` holds 108 with the terminating NUL).
pub const MAX_UNIX_SOCKET_PATH: usize = 107;

/// Called with each violation (the publisher task counts and logs it).
pub type OnViolation = Arc<dyn Fn(&ZmtpViolation) + Send + Sync>;
/// Called with each connection closed for a [`Dropped`] reason (counted and logged).
pub type OnDropped = Arc<dyn Fn(Dropped) + Send + Sync>;

/// Why a proxy closed a connection that broke no ZMTP rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// [`ProxyOptions::max_connections`] were already forwarded: closed at accept.
    ConnectionLimit,
    /// The engine had not completed its greeting and first command within
    /// [`ProxyOptions::handshake_timeout`] of accept.
    HandshakeTimeout,
}

impl Dropped {
    /// The `reason` label of `ckf_producer_engine_connections_dropped_total`.
    pub fn reason(self) -> &'static str {
        match self {
            Self::ConnectionLimit => "connection_limit",
            Self::HandshakeTimeout => "handshake_timeout",
        }
    }
}

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::ConnectionLimit => "the proxy's connection limit is reached",
            Self::HandshakeTimeout => "no ZMTP greeting and first command before the deadline",
        })
    }
}

/// What one proxy enforces and whom it tells.
#[derive(Clone)]
pub struct ProxyOptions {
    /// Bounds of the engine's ZMTP stream.
    pub limits: ZmtpLimits,
    /// Connections forwarded at once; one more is closed at accept. At least 1.
    pub max_connections: usize,
    /// Time from accept for the engine's greeting and first command.
    pub handshake_timeout: Duration,
    /// Told of each ZMTP violation.
    pub on_violation: OnViolation,
    /// Told of each connection closed over the limit or the deadline.
    pub on_dropped: OnDropped,
}

impl ProxyOptions {
    /// Options with the default limit and deadline.
    pub fn new(limits: ZmtpLimits, on_violation: OnViolation, on_dropped: OnDropped) -> Self {
        Self {
            limits,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            on_violation,
            on_dropped,
        }
    }
}

impl std::fmt::Debug for ProxyOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyOptions")
            .field("limits", &self.limits)
            .field("max_connections", &self.max_connections)
            .field("handshake_timeout", &self.handshake_timeout)
            .finish_non_exhaustive()
    }
}

/// A running proxy; dropping it stops accepting (forwarded connections end with their peers).
#[derive(Debug)]
pub struct Proxy {
    /// The address zeromq must use: `tcp://127.0.0.1:<port>` to connect to (connect mode).
    pub local: String,
    task: JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A directory only this user can enter (mode 0700), made for one bind-mode publisher, holding
/// the Unix socket zeromq listens on ([`PrivateIpc::endpoint`]); removed with its content on
/// drop. See the module docs for why.
#[derive(Debug)]
pub struct PrivateIpc {
    dir: tempfile::TempDir,
    endpoint: Endpoint,
}

impl PrivateIpc {
    /// A new private directory under `$XDG_RUNTIME_DIR` (when it is an absolute directory),
    /// else under [`std::env::temp_dir`].
    ///
    /// # Errors
    /// As [`PrivateIpc::create_in`].
    pub fn create() -> io::Result<Self> {
        let runtime = std::env::var_os("XDG_RUNTIME_DIR")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute() && p.is_dir());
        Self::create_in(&runtime.unwrap_or_else(std::env::temp_dir))
    }

    /// A new directory `parent/ckf-zmq-<random>` with mode 0700; the socket path is
    /// `<that>/sub`.
    ///
    /// # Errors
    /// The directory cannot be created (the OS error, with the path; an existing one is
    /// refused, never reused), or the socket path is not UTF-8 or longer than
    /// [`MAX_UNIX_SOCKET_PATH`] bytes (then set `XDG_RUNTIME_DIR` or `TMPDIR` to a shorter
    /// directory).
    pub fn create_in(parent: &Path) -> io::Result<Self> {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::Builder::new()
            .prefix("ckf-zmq-")
            .rand_bytes(8)
            .permissions(std::fs::Permissions::from_mode(0o700))
            .tempdir_in(parent)
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("private socket directory in {}: {e}", parent.display()),
                )
            })?;
        let path = dir.path().join("sub");
        let Some(text) = path.to_str() else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("private socket path {} is not UTF-8", path.display()),
            ));
        };
        if text.len() > MAX_UNIX_SOCKET_PATH {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "private socket path {text} is {} bytes; a Unix socket path holds at most \
                     {MAX_UNIX_SOCKET_PATH} (set XDG_RUNTIME_DIR or TMPDIR to a shorter directory)",
                    text.len()
                ),
            ));
        }
        let endpoint = Endpoint::Ipc(text.to_owned());
        Ok(Self { dir, endpoint })
    }

    /// `ipc://<dir>/sub`, for zeromq to bind and the proxy to connect to.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The private directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// Either kind of stream an endpoint names.
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

type Reader = Box<dyn AsyncRead + Send + Unpin>;
type Writer = Box<dyn AsyncWrite + Send + Unpin>;

impl Stream {
    async fn connect(endpoint: &Endpoint) -> io::Result<Self> {
        let connect = async {
            match endpoint {
                Endpoint::Tcp { host, port } => {
                    let s = TcpStream::connect((host.as_str(), *port)).await?;
                    s.set_nodelay(true)?;
                    Ok(Self::Tcp(s))
                }
                Endpoint::Ipc(path) => Ok(Self::Unix(UnixStream::connect(path).await?)),
            }
        };
        tokio::time::timeout(UPSTREAM_CONNECT_TIMEOUT, connect)
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))?
    }

    fn split(self) -> (Reader, Writer) {
        match self {
            Self::Tcp(s) => {
                let (r, w) = s.into_split();
                (Box::new(r), Box::new(w))
            }
            Self::Unix(s) => {
                let (r, w) = s.into_split();
                (Box::new(r), Box::new(w))
            }
        }
    }
}

/// Connect mode: a loopback listener whose every connection is forwarded to `upstream`.
///
/// # Errors
/// The loopback listener cannot be bound.
pub async fn connect_proxy(upstream: Endpoint, options: ProxyOptions) -> io::Result<Proxy> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let local = format!("tcp://{}", listener.local_addr()?);
    let permits = Arc::new(Semaphore::new(options.max_connections.max(1)));
    let task = tokio::spawn(async move {
        loop {
            let local = match listener.accept().await {
                Ok((s, _)) => s,
                Err(_) => {
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
                drop(local);
                (options.on_dropped)(Dropped::ConnectionLimit);
                continue;
            };
            let _ = local.set_nodelay(true);
            let upstream = upstream.clone();
            let options = options.clone();
            tokio::spawn(async move {
                let _permit = permit;
                let mut local = local;
                let mut held = Vec::new();
                let Some(engine) = connect_holding(&upstream, &mut local, &mut held).await else {
                    return;
                };
                // The handshake deadline runs from the engine's connection.
                let deadline = Instant::now() + options.handshake_timeout;
                let guard = ZmtpGuard::new(options.limits);
                let zeromq = Stream::Tcp(local);
                forward(
                    engine.split(),
                    zeromq,
                    guard,
                    (&[], &held),
                    deadline,
                    &options,
                )
                .await;
            });
        }
    });
    Ok(Proxy { local, task })
}

/// Bind mode: listens on `public` (what engines connect to) and forwards each connection to
/// `internal`, zeromq's own listener (a [`PrivateIpc`] endpoint).
///
/// # Errors
/// `public` cannot be bound (taken address, bad path), with the OS error.
pub async fn bind_proxy(
    public: &Endpoint,
    internal: Endpoint,
    options: ProxyOptions,
) -> io::Result<Proxy> {
    enum Listener {
        Tcp(TcpListener),
        Unix(UnixListener),
    }
    let listener = match public {
        Endpoint::Tcp { host, port } => {
            let host = if host == "*" {
                "0.0.0.0"
            } else {
                host.as_str()
            };
            Listener::Tcp(TcpListener::bind((host, *port)).await?)
        }
        Endpoint::Ipc(path) => {
            // A stale socket file from an earlier run would make bind fail (zeromq removes it too).
            let _ = std::fs::remove_file(path);
            Listener::Unix(UnixListener::bind(path)?)
        }
    };
    let local = public.to_string();
    let permits = Arc::new(Semaphore::new(options.max_connections.max(1)));
    let task = tokio::spawn(async move {
        loop {
            let accepted = match &listener {
                Listener::Tcp(l) => l.accept().await.map(|(s, _)| {
                    let _ = s.set_nodelay(true);
                    Stream::Tcp(s)
                }),
                Listener::Unix(l) => l.accept().await.map(|(s, _)| Stream::Unix(s)),
            };
            let Ok(engine) = accepted else {
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            };
            let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
                drop(engine);
                (options.on_dropped)(Dropped::ConnectionLimit);
                continue;
            };
            let internal = internal.clone();
            let options = options.clone();
            tokio::spawn(async move {
                let _permit = permit;
                bind_connection(engine, &internal, &options).await;
            });
        }
    });
    Ok(Proxy { local, task })
}

/// Connect mode: connects to `upstream`, trying again every [`UPSTREAM_RETRY`] while it is
/// unreachable and holding what zeromq sends meanwhile in `held`. `None` when zeromq closes
/// its side (it gave up) or sends more than [`MAX_HELD_BYTES`].
async fn connect_holding(
    upstream: &Endpoint,
    local: &mut TcpStream,
    held: &mut Vec<u8>,
) -> Option<Stream> {
    let mut buf = [0u8; 4096];
    loop {
        if let Ok(engine) = Stream::connect(upstream).await {
            return Some(engine);
        }
        let wait = tokio::time::sleep(UPSTREAM_RETRY);
        tokio::pin!(wait);
        loop {
            tokio::select! {
                () = &mut wait => break,
                read = local.read(&mut buf) => match read {
                    Ok(0) | Err(_) => return None,
                    Ok(n) if held.len() + n > MAX_HELD_BYTES => return None,
                    Ok(n) => held.extend_from_slice(&buf[..n]),
                },
            }
        }
    }
}

/// One bind-mode connection: waits (until the deadline) for the engine's first bytes, checks
/// them, and only then opens zeromq's side and forwards.
async fn bind_connection(engine: Stream, internal: &Endpoint, options: &ProxyOptions) {
    let deadline = Instant::now() + options.handshake_timeout;
    let (mut from_engine, to_engine) = engine.split();
    let mut guard = ZmtpGuard::new(options.limits);
    let mut first = [0u8; GREETING_BYTES];
    let n = match timeout_at(deadline, from_engine.read(&mut first)).await {
        Err(_) => {
            (options.on_dropped)(Dropped::HandshakeTimeout);
            return;
        }
        Ok(Ok(0) | Err(_)) => return,
        Ok(Ok(n)) => n,
    };
    if let Err(violation) = guard.inspect(&first[..n]) {
        (options.on_violation)(&violation);
        return;
    }
    let Ok(zeromq) = Stream::connect(internal).await else {
        return;
    };
    forward(
        (from_engine, to_engine),
        zeromq,
        guard,
        (&first[..n], &[]),
        deadline,
        options,
    )
    .await;
}

/// Forwards one connection both ways until either side ends, the engine's bytes break a limit,
/// or `deadline` passes before [`ZmtpGuard::handshake_done`]. `pending` are bytes already
/// read: the engine's (which `guard` has passed), sent to zeromq first, and zeromq's, sent to
/// the engine first.
async fn forward(
    engine: (Reader, Writer),
    zeromq: Stream,
    mut guard: ZmtpGuard,
    pending: (&[u8], &[u8]),
    deadline: Instant,
    options: &ProxyOptions,
) {
    let (pending, zeromq_pending) = pending;
    let (mut from_engine, mut to_engine) = engine;
    let (mut from_zeromq, mut to_zeromq) = zeromq.split();
    let guarded = async {
        if !pending.is_empty() && to_zeromq.write_all(pending).await.is_err() {
            return;
        }
        let mut buf = vec![0u8; CHUNK];
        loop {
            let read = from_engine.read(&mut buf);
            let read = if guard.handshake_done() {
                read.await
            } else {
                match timeout_at(deadline, read).await {
                    Ok(read) => read,
                    Err(_) => {
                        (options.on_dropped)(Dropped::HandshakeTimeout);
                        return;
                    }
                }
            };
            let n = match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if let Err(violation) = guard.inspect(&buf[..n]) {
                (options.on_violation)(&violation);
                return;
            }
            if to_zeromq.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    let plain = async {
        if !zeromq_pending.is_empty() && to_engine.write_all(zeromq_pending).await.is_err() {
            return;
        }
        let _ = tokio::io::copy(&mut from_zeromq, &mut to_engine).await;
    };
    // Whichever direction ends first ends the connection: dropping both halves closes both
    // sockets, which zeromq sees as a disconnection.
    tokio::select! {
        () = guarded => {}
        () = plain => {}
    }
}

/// A violation callback that records the violations (tests).
pub fn recording() -> (OnViolation, Arc<Mutex<Vec<ZmtpViolation>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    let on = Arc::new(move |v: &ZmtpViolation| sink.lock().expect("not poisoned").push(v.clone()));
    (on, seen)
}

/// A [`Dropped`] callback that records what it is told (tests).
pub fn recording_drops() -> (OnDropped, Arc<Mutex<Vec<Dropped>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    let on = Arc::new(move |d: Dropped| sink.lock().expect("not poisoned").push(d));
    (on, seen)
}

#[cfg(test)]
mod tests;
