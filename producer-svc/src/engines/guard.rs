//! A loopback relay in front of every engine socket, so the ZMQ library only ever reads a byte
//! stream that [`ZmtpGuard`] has checked (why: [`ckf_engine::zmtp`]).
//!
//! ```text
//! connect mode: zeromq SUB/DEALER --tcp--> 127.0.0.1:<guard port> --guard--> engine endpoint
//! bind mode:    engine --> configured endpoint (guard listener) --guard--> 127.0.0.1:<zeromq port>
//! ```
//!
//! Each accepted connection gets its own upstream connection and its own guard over the bytes
//! coming *from the engine*; what zeromq sends (greeting, SUBSCRIBE, replay requests) goes
//! through unchanged. On the first violation both connections are closed and the violation is
//! counted (`ckf_producer_engine_decode_errors_total{kind="zmtp_..."}`) and logged at most once
//! per [`LOG_INTERVAL`](super::publisher::LOG_INTERVAL). zeromq then reconnects as it does after
//! any disconnection, and the lost messages show as a sequence gap (replay, or clear).
//!
//! In connect mode an upstream that cannot be reached closes the accepted connection before
//! any byte is relayed, so zeromq's handshake fails exactly as it would against the engine
//! itself (its reconnect backoff and the `engine_connected` gauge are unchanged). The relay's
//! own listener is bound to loopback only.

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ckf_engine::zmtp::{ZmtpGuard, ZmtpLimits, ZmtpViolation};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::task::JoinHandle;

use super::config::Endpoint;

/// How long an upstream connection may take to open.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Relay read size, in bytes.
const CHUNK: usize = 64 << 10;

/// Called with each violation (the publisher task counts and logs it).
pub type OnViolation = Arc<dyn Fn(&ZmtpViolation) + Send + Sync>;

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

/// Either kind of stream an endpoint names.
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

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

    fn split(
        self,
    ) -> (
        Box<dyn AsyncRead + Send + Unpin>,
        Box<dyn AsyncWrite + Send + Unpin>,
    ) {
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
pub async fn connect_relay(
    upstream: Endpoint,
    limits: ZmtpLimits,
    on_violation: OnViolation,
) -> io::Result<Relay> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let local = format!("tcp://{}", listener.local_addr()?);
    let task = tokio::spawn(async move {
        loop {
            let Ok((local, _)) = listener.accept().await else {
                continue;
            };
            let _ = local.set_nodelay(true);
            let upstream = upstream.clone();
            let on_violation = Arc::clone(&on_violation);
            tokio::spawn(async move {
                // Unreachable engine: close before any byte, as the engine itself would.
                let Ok(engine) = Stream::connect(&upstream).await else {
                    return;
                };
                relay(engine, Stream::Tcp(local), limits, on_violation).await;
            });
        }
    });
    Ok(Relay { local, task })
}

/// Bind mode: listens on `public` (what engines connect to) and relays each connection to
/// `internal`, zeromq's own loopback listener.
///
/// # Errors
/// `public` cannot be bound (taken address, bad path), with the OS error.
pub async fn bind_relay(
    public: &Endpoint,
    internal: Endpoint,
    limits: ZmtpLimits,
    on_violation: OnViolation,
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
    let task = tokio::spawn(async move {
        loop {
            let accepted = match &listener {
                Listener::Tcp(l) => l.accept().await.map(|(s, _)| {
                    let _ = s.set_nodelay(true);
                    Stream::Tcp(s)
                }),
                Listener::Unix(l) => l.accept().await.map(|(s, _)| Stream::Unix(s)),
            };
            let Ok(engine) = accepted else { continue };
            let internal = internal.clone();
            let on_violation = Arc::clone(&on_violation);
            tokio::spawn(async move {
                let Ok(zeromq) = Stream::connect(&internal).await else {
                    return;
                };
                relay(engine, zeromq, limits, on_violation).await;
            });
        }
    });
    Ok(Relay { local, task })
}

/// Relays one connection both ways until either side ends or the engine's bytes break a limit.
async fn relay(engine: Stream, zeromq: Stream, limits: ZmtpLimits, on_violation: OnViolation) {
    let (mut from_engine, mut to_engine) = engine.split();
    let (mut from_zeromq, mut to_zeromq) = zeromq.split();
    let guarded = async {
        let mut guard = ZmtpGuard::new(limits);
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = match from_engine.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if let Err(violation) = guard.inspect(&buf[..n]) {
                on_violation(&violation);
                return;
            }
            if to_zeromq.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    let plain = async {
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

    #[tokio::test]
    async fn good_bytes_pass_both_ways_and_a_huge_frame_header_closes_the_connection() {
        let (engine, endpoint) = engine_listener().await;
        let (on, seen) = recording();
        let relay = connect_relay(endpoint, ZmtpLimits::for_engine(1024), on)
            .await
            .unwrap();
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
        let mut rest = Vec::new();
        let n = tokio::time::timeout(Duration::from_secs(5), zmq.read_to_end(&mut rest))
            .await
            .expect("closed, not hanging")
            .unwrap_or(0);
        assert_eq!(n, 0, "no byte of the bomb reaches zeromq");
        let seen = seen.lock().unwrap();
        assert!(matches!(
            seen.as_slice(),
            [ZmtpViolation::FrameTooLarge { claimed, .. }] if *claimed == 1 << 50
        ));
    }

    #[tokio::test]
    async fn an_unreachable_engine_closes_the_local_connection_at_once() {
        let (engine, endpoint) = engine_listener().await;
        drop(engine);
        let (on, seen) = recording();
        let relay = connect_relay(endpoint, ZmtpLimits::for_engine(1024), on)
            .await
            .unwrap();
        let mut zmq = TcpStream::connect(("127.0.0.1", port_of(&relay.local)))
            .await
            .unwrap();
        let mut rest = Vec::new();
        let n = tokio::time::timeout(Duration::from_secs(5), zmq.read_to_end(&mut rest))
            .await
            .expect("closed")
            .unwrap_or(0);
        assert_eq!(n, 0);
        assert!(seen.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn bind_mode_relays_engines_to_the_internal_listener() {
        let (internal, internal_endpoint) = engine_listener().await;
        let (on, _seen) = recording();
        let public = Endpoint::Tcp {
            host: "127.0.0.1".into(),
            port: 0,
        };
        // Port 0 cannot be named to engines; bind a free port first to learn one.
        let probe = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let port = probe.local_addr().unwrap().port();
        drop(probe);
        let public = match public {
            Endpoint::Tcp { host, .. } => Endpoint::Tcp { host, port },
            other => other,
        };
        let _relay = bind_relay(&public, internal_endpoint, ZmtpLimits::for_engine(1024), on)
            .await
            .unwrap();
        let mut eng = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let (mut zmq, _) = internal.accept().await.unwrap();
        let g = greeting();
        eng.write_all(&g).await.unwrap();
        let mut got = vec![0u8; 64];
        zmq.read_exact(&mut got).await.unwrap();
        assert_eq!(got, g);
        zmq.write_all(b"sub").await.unwrap();
        let mut got = [0u8; 3];
        eng.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"sub");
    }
}
