//! A loopback relay in front of every engine socket, so the ZMQ library only ever reads a byte
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
//! does not close the accepted connection: the relay holds it, keeps what zeromq sends
//! (its greeting and first commands, at most [`MAX_HELD_BYTES`]), and tries the engine again
//! every [`UPSTREAM_RETRY`] until it answers or zeromq gives up. zeromq's own reconnect backoff
//! (100 ms doubling to 30 s, fixed in the `zeromq` crate) therefore never grows while an engine
//! is down, and the connection, its `Connected` monitor event and the sequence rule's check
//! follow within [`UPSTREAM_RETRY`] of the engine listening again. The relay's own listener is
//! bound to loopback only.
//!
//! # Bind mode: zeromq's own listener is private
//!
//! zeromq's listener must not be reachable by anything but the relay, or a local process could
//! connect to it directly and bypass the guard. It is therefore a Unix socket in a directory
//! created for the one publisher with mode 0700 ([`PrivateIpc`], under `$XDG_RUNTIME_DIR` or
//! else the temporary directory, with a random name, refused if it exists), removed when the
//! publisher ends. Only this user (and root, who could read the producer's memory anyway) can
//! reach it; no TCP port is opened for zeromq.
//!
//! # Connection limit and handshake deadline
//!
//! Whoever reaches an engine endpoint could otherwise open connections without end (each one
//! holds file descriptors, a 64 KiB buffer and an upstream zeromq connection). So every relay:
//!
//! - relays at most [`RelayOptions::max_connections`] connections at once (default
//!   [`DEFAULT_MAX_CONNECTIONS`], enough for every rank's reconnects and replays); one more is
//!   closed at accept, before any byte is read or relayed;
//! - gives each connection [`RelayOptions::handshake_timeout`] (default
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
/// Relay read size, in bytes.
const CHUNK: usize = 64 << 10;
/// Pause after a failed accept (e.g. no file descriptor left), so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// Default of [`RelayOptions::max_connections`]: connections relayed at once per relay (one
/// relay per publisher endpoint; an engine rank holds one, plus reconnects in flight).
pub const DEFAULT_MAX_CONNECTIONS: usize = 64;
/// Default of [`RelayOptions::handshake_timeout`].
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest Unix socket path, in bytes (`sun_path` holds 108 with the terminating NUL).
pub const MAX_UNIX_SOCKET_PATH: usize = 107;

/// Called with each violation (the publisher task counts and logs it).
pub type OnViolation = Arc<dyn Fn(&ZmtpViolation) + Send + Sync>;
/// Called with each connection closed for a [`Dropped`] reason (counted and logged).
pub type OnDropped = Arc<dyn Fn(Dropped) + Send + Sync>;

/// Why a relay closed a connection that broke no ZMTP rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// [`RelayOptions::max_connections`] were already relayed: closed at accept.
    ConnectionLimit,
    /// The engine had not completed its greeting and first command within
    /// [`RelayOptions::handshake_timeout`] of accept.
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
            Self::ConnectionLimit => "the relay's connection limit is reached",
            Self::HandshakeTimeout => "no ZMTP greeting and first command before the deadline",
        })
    }
}

/// What one relay enforces and whom it tells.
#[derive(Clone)]
pub struct RelayOptions {
    /// Bounds of the engine's ZMTP stream.
    pub limits: ZmtpLimits,
    /// Connections relayed at once; one more is closed at accept. At least 1.
    pub max_connections: usize,
    /// Time from accept for the engine's greeting and first command.
    pub handshake_timeout: Duration,
    /// Told of each ZMTP violation.
    pub on_violation: OnViolation,
    /// Told of each connection closed over the limit or the deadline.
    pub on_dropped: OnDropped,
}

impl RelayOptions {
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

impl std::fmt::Debug for RelayOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayOptions")
            .field("limits", &self.limits)
            .field("max_connections", &self.max_connections)
            .field("handshake_timeout", &self.handshake_timeout)
            .finish_non_exhaustive()
    }
}

/// A running relay; dropping it stops accepting (relayed connections end with their peers).
#[derive(Debug)]
pub struct Relay {
    /// The address zeromq must use: `tcp://127.0.0.1:<port>` to connect to (connect mode).
    pub local: String,
    task: JoinHandle<()>,
}

impl Drop for Relay {
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

    /// `ipc://<dir>/sub`, for zeromq to bind and the relay to connect to.
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

/// Connect mode: a loopback listener whose every connection is relayed to `upstream`.
///
/// # Errors
/// The loopback listener cannot be bound.
pub async fn connect_relay(upstream: Endpoint, options: RelayOptions) -> io::Result<Relay> {
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
                relay(
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
    Ok(Relay { local, task })
}

/// Bind mode: listens on `public` (what engines connect to) and relays each connection to
/// `internal`, zeromq's own listener (a [`PrivateIpc`] endpoint).
///
/// # Errors
/// `public` cannot be bound (taken address, bad path), with the OS error.
pub async fn bind_relay(
    public: &Endpoint,
    internal: Endpoint,
    options: RelayOptions,
) -> io::Result<Relay> {
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
    Ok(Relay { local, task })
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
/// them, and only then opens zeromq's side and relays.
async fn bind_connection(engine: Stream, internal: &Endpoint, options: &RelayOptions) {
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
    relay(
        (from_engine, to_engine),
        zeromq,
        guard,
        (&first[..n], &[]),
        deadline,
        options,
    )
    .await;
}

/// Relays one connection both ways until either side ends, the engine's bytes break a limit,
/// or `deadline` passes before [`ZmtpGuard::handshake_done`]. `pending` are bytes already
/// read: the engine's (which `guard` has passed), sent to zeromq first, and zeromq's, sent to
/// the engine first.
async fn relay(
    engine: (Reader, Writer),
    zeromq: Stream,
    mut guard: ZmtpGuard,
    pending: (&[u8], &[u8]),
    deadline: Instant,
    options: &RelayOptions,
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
mod tests {
    use super::*;

    fn greeting() -> Vec<u8> {
        let mut g = vec![0u8; 64];
        g[0] = 0xff;
        g[9] = 0x7f;
        g[10] = 3;
        g[12..16].copy_from_slice(b"NULL");
        g
    }

    /// The greeting and a NULL READY command: a whole handshake.
    fn handshake() -> Vec<u8> {
        let mut h = greeting();
        let ready = b"\x05READY\x0bSocket-Type\0\0\0\x03PUB";
        h.extend_from_slice(&[0x04, ready.len() as u8]);
        h.extend_from_slice(ready);
        h
    }

    type Seen<T> = Arc<Mutex<Vec<T>>>;

    fn options(
        max_connections: usize,
        handshake_timeout: Duration,
    ) -> (RelayOptions, Seen<ZmtpViolation>, Seen<Dropped>) {
        let (on_violation, violations) = recording();
        let (on_dropped, drops) = recording_drops();
        let mut o = RelayOptions::new(ZmtpLimits::for_engine(1024), on_violation, on_dropped);
        o.max_connections = max_connections;
        o.handshake_timeout = handshake_timeout;
        (o, violations, drops)
    }

    fn defaults() -> (RelayOptions, Seen<ZmtpViolation>, Seen<Dropped>) {
        options(DEFAULT_MAX_CONNECTIONS, DEFAULT_HANDSHAKE_TIMEOUT)
    }

    async fn engine_listener() -> (TcpListener, Endpoint) {
        let l = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let port = l.local_addr().unwrap().port();
        let e = Endpoint::Tcp {
            host: "127.0.0.1".into(),
            port,
        };
        (l, e)
    }

    fn port_of(local: &str) -> u16 {
        local.rsplit(':').next().unwrap().parse().unwrap()
    }

    /// Reads until the peer closes; panics if it stays open for 5 s. Returns the bytes read.
    async fn until_closed(s: &mut TcpStream) -> usize {
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest))
            .await
            .expect("closed, not hanging")
            .unwrap_or(0)
    }

    /// A bind relay on a free loopback port in front of `internal`; returns it and the port.
    async fn bind_on_free_port(internal: Endpoint, options: RelayOptions) -> (Relay, u16) {
        // Port 0 cannot be named to engines; bind a free port first to learn one.
        let probe = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let port = probe.local_addr().unwrap().port();
        drop(probe);
        let public = Endpoint::Tcp {
            host: "127.0.0.1".into(),
            port,
        };
        (bind_relay(&public, internal, options).await.unwrap(), port)
    }

    #[tokio::test]
    async fn good_bytes_pass_both_ways_and_a_huge_frame_header_closes_the_connection() {
        let (engine, endpoint) = engine_listener().await;
        let (options, seen, _) = defaults();
        let relay = connect_relay(endpoint, options).await.unwrap();
        let mut zmq = TcpStream::connect(("127.0.0.1", port_of(&relay.local)))
            .await
            .unwrap();
        let (mut eng, _) = engine.accept().await.unwrap();

        // zeromq -> engine passes unchanged.
        zmq.write_all(b"hello engine").await.unwrap();
        let mut got = [0u8; 12];
        eng.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello engine");

        // engine -> zeromq: a greeting and a small frame pass.
        let mut ok = greeting();
        ok.extend_from_slice(&[0x00, 3, b'a', b'b', b'c']);
        eng.write_all(&ok).await.unwrap();
        let mut got = vec![0u8; ok.len()];
        zmq.read_exact(&mut got).await.unwrap();
        assert_eq!(got, ok);

        // A header claiming 2^50 bytes: never forwarded, the connection closes.
        let mut bomb = vec![0x02];
        bomb.extend_from_slice(&(1u64 << 50).to_be_bytes());
        eng.write_all(&bomb).await.unwrap();
        assert_eq!(
            until_closed(&mut zmq).await,
            0,
            "no byte of the bomb reaches zeromq"
        );
        let seen = seen.lock().unwrap();
        assert!(matches!(
            seen.as_slice(),
            [ZmtpViolation::FrameTooLarge { claimed, .. }] if *claimed == 1 << 50
        ));
    }

    #[tokio::test]
    async fn an_unreachable_engine_is_retried_while_zeromq_s_connection_is_held() {
        let (engine, endpoint) = engine_listener().await;
        let port = engine.local_addr().unwrap().port();
        drop(engine);
        let (options, seen, drops) = defaults();
        let relay = connect_relay(endpoint, options).await.unwrap();
        let mut zmq = TcpStream::connect(("127.0.0.1", port_of(&relay.local)))
            .await
            .unwrap();
        // zeromq's greeting, sent while the engine is down, is held.
        zmq.write_all(&greeting()).await.unwrap();
        tokio::time::sleep(UPSTREAM_RETRY * 3).await;
        let engine = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        let (mut conn, _) = tokio::time::timeout(UPSTREAM_RETRY * 5, engine.accept())
            .await
            .expect("the relay reached the engine within a few retries")
            .unwrap();
        let mut got = vec![0u8; 64];
        conn.read_exact(&mut got).await.unwrap();
        assert_eq!(got, greeting(), "what zeromq sent meanwhile arrives first");
        conn.write_all(&handshake()).await.unwrap();
        let mut back = vec![0u8; handshake().len()];
        zmq.read_exact(&mut back).await.unwrap();
        assert_eq!(back, handshake());
        assert!(seen.lock().unwrap().is_empty());
        assert!(drops.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_held_connection_is_closed_when_zeromq_sends_more_than_it_may_hold() {
        let (engine, endpoint) = engine_listener().await;
        drop(engine);
        let (options, _, _) = defaults();
        let relay = connect_relay(endpoint, options).await.unwrap();
        let mut zmq = TcpStream::connect(("127.0.0.1", port_of(&relay.local)))
            .await
            .unwrap();
        zmq.write_all(&vec![0u8; MAX_HELD_BYTES + 1]).await.unwrap();
        assert_eq!(until_closed(&mut zmq).await, 0);
    }

    #[tokio::test]
    async fn bind_mode_relays_engines_to_the_internal_listener() {
        let (internal, internal_endpoint) = engine_listener().await;
        let (options, _, _) = defaults();
        let (_relay, port) = bind_on_free_port(internal_endpoint, options).await;
        let mut eng = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let g = greeting();
        eng.write_all(&g).await.unwrap();
        let (mut zmq, _) = internal.accept().await.unwrap();
        let mut got = vec![0u8; 64];
        zmq.read_exact(&mut got).await.unwrap();
        assert_eq!(got, g);
        zmq.write_all(b"sub").await.unwrap();
        let mut got = [0u8; 3];
        eng.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"sub");
    }

    #[tokio::test]
    async fn bind_mode_relays_to_a_private_ipc_socket() {
        let ipc = PrivateIpc::create().unwrap();
        let Endpoint::Ipc(path) = ipc.endpoint().clone() else {
            panic!("not ipc: {:?}", ipc.endpoint());
        };
        let internal = UnixListener::bind(&path).unwrap();
        let (options, _, _) = defaults();
        let (_relay, port) = bind_on_free_port(ipc.endpoint().clone(), options).await;
        let mut eng = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        eng.write_all(&handshake()).await.unwrap();
        let (mut zmq, _) = internal.accept().await.unwrap();
        let mut got = vec![0u8; handshake().len()];
        zmq.read_exact(&mut got).await.unwrap();
        assert_eq!(got, handshake());
    }

    #[test]
    fn the_private_directory_is_0700_new_and_removed_on_drop() {
        use std::os::unix::fs::PermissionsExt;
        let parent = tempfile::tempdir().unwrap();
        let a = PrivateIpc::create_in(parent.path()).unwrap();
        let b = PrivateIpc::create_in(parent.path()).unwrap();
        assert_ne!(a.dir(), b.dir(), "a fresh directory each time");
        let mode = std::fs::metadata(a.dir()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "mode {mode:o}");
        assert_eq!(
            a.endpoint(),
            &Endpoint::Ipc(a.dir().join("sub").to_str().unwrap().to_owned())
        );
        let dir = a.dir().to_owned();
        std::fs::write(dir.join("sub"), b"").unwrap();
        drop(a);
        assert!(!dir.exists(), "removed with its content");
    }

    #[test]
    fn a_too_long_socket_path_is_refused_with_the_path_and_the_limit() {
        let parent = tempfile::tempdir().unwrap();
        let deep = parent.path().join("d".repeat(100));
        std::fs::create_dir(&deep).unwrap();
        let err = PrivateIpc::create_in(&deep).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        let text = err.to_string();
        assert!(text.contains(&*deep.to_string_lossy()), "{text}");
        assert!(text.contains("at most 107"), "{text}");
        // The refused directory is not left behind.
        assert_eq!(std::fs::read_dir(&deep).unwrap().count(), 0);
        // A missing parent names the parent.
        let err = PrivateIpc::create_in(&parent.path().join("missing")).unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
    }

    #[tokio::test]
    async fn a_connection_over_the_limit_is_closed_at_once_while_the_others_keep_relaying() {
        let (internal, internal_endpoint) = engine_listener().await;
        let (options, _, drops) = options(1, DEFAULT_HANDSHAKE_TIMEOUT);
        let (_relay, port) = bind_on_free_port(internal_endpoint, options).await;

        let mut first = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        first.write_all(&handshake()).await.unwrap();
        let (mut zmq, _) = internal.accept().await.unwrap();
        let mut got = vec![0u8; handshake().len()];
        zmq.read_exact(&mut got).await.unwrap();

        let mut second = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        // Closed without reading, whatever it sends.
        let _ = second.write_all(&handshake()).await;
        assert_eq!(until_closed(&mut second).await, 0);
        assert_eq!(drops.lock().unwrap().as_slice(), [Dropped::ConnectionLimit]);

        // The first one still relays both ways.
        first.write_all(&[0x00, 2, b'o', b'k']).await.unwrap();
        let mut got = [0u8; 4];
        zmq.read_exact(&mut got).await.unwrap();
        assert_eq!(&got[2..], b"ok");
        zmq.write_all(b"sub").await.unwrap();
        let mut got = [0u8; 3];
        first.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"sub");

        // Its end frees the slot: a new connection is relayed again.
        drop(first);
        assert_eq!(until_closed(&mut zmq).await, 0);
        let mut third = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        third.write_all(&greeting()).await.unwrap();
        let (mut zmq, _) = tokio::time::timeout(Duration::from_secs(5), internal.accept())
            .await
            .expect("the third connection is relayed")
            .unwrap();
        let mut got = vec![0u8; 64];
        zmq.read_exact(&mut got).await.unwrap();
        assert_eq!(got, greeting());
        assert_eq!(drops.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_silent_connection_is_closed_at_the_deadline_without_reaching_zeromq() {
        let (internal, internal_endpoint) = engine_listener().await;
        let (options, violations, drops) = options(4, Duration::from_millis(200));
        let (_relay, port) = bind_on_free_port(internal_endpoint, options).await;
        let mut silent = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        assert_eq!(until_closed(&mut silent).await, 0);
        assert_eq!(
            drops.lock().unwrap().as_slice(),
            [Dropped::HandshakeTimeout]
        );
        assert!(violations.lock().unwrap().is_empty());
        // zeromq's listener never saw it.
        let none = tokio::time::timeout(Duration::from_millis(100), internal.accept()).await;
        assert!(none.is_err(), "no upstream connection for a silent peer");
    }

    #[tokio::test]
    async fn a_greeting_without_its_first_command_is_closed_at_the_deadline() {
        let (internal, internal_endpoint) = engine_listener().await;
        let (options, _, drops) = options(4, Duration::from_millis(200));
        let (_relay, port) = bind_on_free_port(internal_endpoint, options).await;
        let mut eng = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        eng.write_all(&greeting()).await.unwrap();
        let (mut zmq, _) = internal.accept().await.unwrap();
        let mut got = vec![0u8; 64];
        zmq.read_exact(&mut got).await.unwrap();
        assert_eq!(until_closed(&mut eng).await, 0);
        assert_eq!(
            until_closed(&mut zmq).await,
            0,
            "zeromq's side is closed too"
        );
        assert_eq!(
            drops.lock().unwrap().as_slice(),
            [Dropped::HandshakeTimeout]
        );
    }

    #[tokio::test]
    async fn a_completed_handshake_outlives_the_deadline() {
        let (internal, internal_endpoint) = engine_listener().await;
        let (options, _, drops) = options(4, Duration::from_millis(200));
        let (_relay, port) = bind_on_free_port(internal_endpoint, options).await;
        let mut eng = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        eng.write_all(&handshake()).await.unwrap();
        let (mut zmq, _) = internal.accept().await.unwrap();
        let mut got = vec![0u8; handshake().len()];
        zmq.read_exact(&mut got).await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        eng.write_all(&[0x00, 1, b'x']).await.unwrap();
        let mut got = [0u8; 3];
        zmq.read_exact(&mut got).await.unwrap();
        assert_eq!(got, [0x00, 1, b'x']);
        assert!(drops.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn connect_mode_closes_an_engine_that_never_greets_and_bounds_connections() {
        let (engine, endpoint) = engine_listener().await;
        let (options, _, drops) = options(1, Duration::from_millis(200));
        let relay = connect_relay(endpoint, options).await.unwrap();
        let port = port_of(&relay.local);
        let mut zmq = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let (_silent_engine, _) = engine.accept().await.unwrap();
        let mut over = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        assert_eq!(until_closed(&mut over).await, 0);
        assert_eq!(until_closed(&mut zmq).await, 0);
        assert_eq!(
            drops.lock().unwrap().as_slice(),
            [Dropped::ConnectionLimit, Dropped::HandshakeTimeout]
        );
    }

    #[tokio::test]
    async fn bad_first_bytes_never_open_zeromq_s_side() {
        let (internal, internal_endpoint) = engine_listener().await;
        let (options, violations, _) = defaults();
        let (_relay, port) = bind_on_free_port(internal_endpoint, options).await;
        let mut eng = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        eng.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        assert_eq!(until_closed(&mut eng).await, 0);
        assert!(matches!(
            violations.lock().unwrap().as_slice(),
            [ZmtpViolation::BadGreeting(_)]
        ));
        let none = tokio::time::timeout(Duration::from_millis(100), internal.accept()).await;
        assert!(none.is_err(), "no upstream connection for a non-ZMTP peer");
    }
}
