//! The server side's TLS state: the loaded certificate chain, key and client CA as a rustls
//! `ServerConfig`, swapped whole on reload (SIGHUP or a file change, polled); accepting
//! connections (each TLS handshake in its own task, bounded by a timeout).

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_rustls::rustls;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};

use crate::shutdown::Shutdown;
use crate::tls::certs::{TlsError, certified_key, provider, read_ca_certificates};
use crate::tls::config::{ClientAuth, ServerTlsConfig};
use crate::tls::names::cert_names;
use crate::transport::{PrefaceWatch, WatchAbove};

/// How long a client may take to complete the TLS handshake before its connection is closed
/// (a peer that connects and sends nothing must not hold a handshake task forever).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Accepted-and-handshaken connections buffered toward the server before the acceptor waits.
const ACCEPTED_BUFFER: usize = 64;
/// The HTTP/2 ALPN id (gRPC runs on HTTP/2 only).
const ALPN_H2: &[u8] = b"h2";

/// What a [`ServerTls`] reads, with the configuration keys that name each file.
#[derive(Debug, Clone)]
struct ServerFiles {
    section: String,
    cert_file: PathBuf,
    key_file: PathBuf,
    client_ca_file: Option<PathBuf>,
    client_auth: ClientAuth,
}

impl ServerFiles {
    fn key(&self, name: &str) -> String {
        format!("{}.{name}", self.section)
    }

    fn paths(&self) -> Vec<&Path> {
        let mut paths = vec![self.cert_file.as_path(), self.key_file.as_path()];
        paths.extend(self.client_ca_file.as_deref());
        paths
    }

    /// Reads every file and builds the rustls config.
    fn build(&self) -> Result<(rustls::ServerConfig, CertSummary), TlsError> {
        let (cert_key, key_key) = (self.key("cert_file"), self.key("key_file"));
        let (certs, key) = certified_key(&cert_key, &self.cert_file, &key_key, &self.key_file)?;
        let summary = CertSummary::of(&certs[0]);
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Rejected {
                key: cert_key.clone(),
                path: self.cert_file.clone(),
                detail: e.to_string(),
            })?;
        let builder = match &self.client_ca_file {
            None => builder.with_no_client_auth(),
            Some(ca_path) => {
                let ca_key = self.key("client_ca_file");
                let rejected = |detail: String| TlsError::Rejected {
                    key: ca_key.clone(),
                    path: ca_path.clone(),
                    detail,
                };
                let mut roots = rustls::RootCertStore::empty();
                for cert in read_ca_certificates(&ca_key, ca_path)? {
                    roots
                        .add(cert)
                        .map_err(|e| rejected(format!("not a usable CA certificate: {e}")))?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider(),
                );
                let verifier = match self.client_auth {
                    ClientAuth::Required => verifier,
                    ClientAuth::Optional => verifier.allow_unauthenticated(),
                };
                builder.with_client_cert_verifier(
                    verifier.build().map_err(|e| rejected(e.to_string()))?,
                )
            }
        };
        let mut config = builder
            .with_single_cert(certs, key)
            .map_err(|e| TlsError::Rejected {
                key: key_key,
                path: self.key_file.clone(),
                detail: e.to_string(),
            })?;
        config.alpn_protocols = vec![ALPN_H2.to_vec()];
        Ok((config, summary))
    }
}

/// What a log line says about a served certificate.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct CertSummary {
    names: Vec<String>,
    serial: String,
    not_after: String,
}

impl CertSummary {
    fn of(der: &CertificateDer<'_>) -> Self {
        match x509_parser::parse_x509_certificate(der.as_ref()) {
            Ok((_, cert)) => Self {
                names: cert_names(der.as_ref()),
                serial: cert.raw_serial_as_string(),
                not_after: cert.validity().not_after.to_string(),
            },
            Err(_) => Self::default(),
        }
    }
}

/// A server's TLS state: the served rustls config (replaced whole by a successful
/// [`ServerTls::reload`]) and the files it comes from. Cheap to clone (shared); one per
/// `[tls]` section, used by every listener of the service.
#[derive(Clone)]
pub struct ServerTls {
    inner: Arc<ServerTlsInner>,
}

struct ServerTlsInner {
    files: ServerFiles,
    reload_interval: Option<Duration>,
    current: RwLock<Arc<rustls::ServerConfig>>,
    /// The files' stamps taken just before the first load: the reloader's starting point, so
    /// a change between the load and the reloader's first look is not missed.
    loaded_stamps: Vec<Stamp>,
}

/// (modified, size, inode) of a file; `None` when it cannot be read.
type Stamp = Option<(SystemTime, u64, u64)>;

impl fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerTls")
            .field("files", &self.inner.files)
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Loads the `[tls]` section named `section` (already [`ServerTlsConfig::check`]ed):
    /// `None` when no certificate is configured (plaintext).
    ///
    /// # Errors
    /// [`TlsError`] naming the key and file that cannot be used.
    pub fn load(config: &ServerTlsConfig, section: &str) -> Result<Option<Self>, TlsError> {
        let (Some(cert_file), Some(key_file)) = (&config.cert_file, &config.key_file) else {
            return Ok(None);
        };
        let files = ServerFiles {
            section: section.to_owned(),
            cert_file: cert_file.clone(),
            key_file: key_file.clone(),
            client_ca_file: config.client_ca_file.clone(),
            client_auth: config.client_auth,
        };
        let loaded_stamps = stamps(&files);
        let (server_config, summary) = files.build()?;
        tracing::info!(
            cert_file = %files.cert_file.display(),
            names = ?summary.names,
            serial = %summary.serial,
            not_after = %summary.not_after,
            "TLS certificate loaded"
        );
        Ok(Some(Self {
            inner: Arc::new(ServerTlsInner {
                files,
                reload_interval: (config.reload_interval_ms != 0)
                    .then(|| Duration::from_millis(config.reload_interval_ms)),
                current: RwLock::new(Arc::new(server_config)),
                loaded_stamps,
            }),
        }))
    }

    /// The config new connections are accepted with.
    pub(crate) fn current(&self) -> Arc<rustls::ServerConfig> {
        Arc::clone(&self.inner.current.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Reads every file again; on success new connections use the new certificate, key and
    /// client CA. Established connections are not touched.
    ///
    /// # Errors
    /// [`TlsError`]: nothing was replaced, the previous config is still served.
    pub fn reload(&self) -> Result<(), TlsError> {
        let (config, summary) = self.inner.files.build()?;
        *self
            .inner
            .current
            .write()
            .unwrap_or_else(|p| p.into_inner()) = Arc::new(config);
        tracing::info!(
            cert_file = %self.inner.files.cert_file.display(),
            names = ?summary.names,
            serial = %summary.serial,
            not_after = %summary.not_after,
            "TLS certificate reloaded"
        );
        Ok(())
    }

    /// Reloads on SIGHUP and, unless `reload_interval_ms = 0`, when a file's modification
    /// time, size or inode changes (checked every `reload_interval_ms`), until `shutdown`.
    /// Each attempt is counted in `counter` (`result` = `ok` | `error`) when given; a failed
    /// one is logged at ERROR and the previous certificate stays in use.
    pub fn spawn_reloader(
        &self,
        counter: Option<prometheus::IntCounterVec>,
        shutdown: Shutdown,
    ) -> JoinHandle<()> {
        let tls = self.clone();
        tokio::spawn(async move {
            let mut hangup = hangup_signal();
            let mut seen = tls.inner.loaded_stamps.clone();
            let interval = tls.inner.reload_interval;
            loop {
                let trigger = tokio::select! {
                    () = shutdown.wait() => return,
                    () = recv_hangup(&mut hangup) => "SIGHUP",
                    () = sleep_or_forever(interval) => {
                        if stamps(&tls.inner.files) == seen {
                            continue;
                        }
                        "file change"
                    }
                };
                // Stamped before reading: a change while reading triggers another attempt.
                seen = stamps(&tls.inner.files);
                let result = tls.reload();
                let label = match &result {
                    Ok(()) => "ok",
                    Err(error) => {
                        tracing::error!(
                            %error,
                            trigger,
                            "TLS reload failed: still serving the previous certificate"
                        );
                        "error"
                    }
                };
                if let Some(counter) = &counter {
                    counter.with_label_values(&[label]).inc();
                }
            }
        })
    }

    /// TLS streams over the connections of `incoming`. Each handshake runs in its own task
    /// (bounded by [`HANDSHAKE_TIMEOUT`]) with the config current when the connection was
    /// accepted, so a slow client never delays another's accept; failed handshakes are logged
    /// at DEBUG and dropped. The stream ends when `incoming` ends; dropping it stops accepting.
    ///
    /// The connection info tonic attaches to each request is `TlsConnectInfo<IO::ConnectInfo>`:
    /// `tonic::Request::peer_certs` (and so [`crate::tls::peer_names`]) needs `IO::ConnectInfo` to be
    /// `TcpConnectInfo`, which holds for `TcpStream` and for wrappers that report it.
    pub fn accept<S, IO, IE>(
        &self,
        incoming: S,
    ) -> ReceiverStream<io::Result<PrefaceWatch<TlsStream<IO>>>>
    where
        S: Stream<Item = Result<IO, IE>> + Send + 'static,
        IO: AsyncRead + AsyncWrite + WatchAbove + Unpin + Send + 'static,
        IE: Into<tonic::codegen::StdError> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel(ACCEPTED_BUFFER);
        let tls = self.clone();
        tokio::spawn(async move {
            let mut incoming = std::pin::pin!(incoming);
            loop {
                let next = tokio::select! {
                    () = tx.closed() => return,
                    next = incoming.next() => next,
                };
                let mut io = match next {
                    None => return,
                    Some(Ok(io)) => io,
                    Some(Err(error)) => {
                        let error: tonic::codegen::StdError = error.into();
                        tracing::debug!(%error, "accept failed");
                        // Do not spin on a persistent error (e.g. out of file descriptors).
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let acceptor = tokio_rustls::TlsAcceptor::from(tls.current());
                let tx = tx.clone();
                // The transport's handshake deadline (`[transport]`) covers the TLS handshake
                // and ends when the decrypted stream shows the HTTP/2 preface.
                let marker = io.watch_above();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(io)).await {
                        Ok(Ok(stream)) => {
                            let _ = tx.send(Ok(PrefaceWatch::over(stream, marker))).await;
                        }
                        Ok(Err(error)) => tracing::debug!(%error, "TLS handshake failed"),
                        Err(_) => tracing::debug!(
                            timeout_ms = HANDSHAKE_TIMEOUT.as_millis() as u64,
                            "TLS handshake timed out"
                        ),
                    }
                });
            }
        });
        ReceiverStream::new(rx)
    }
}

/// The stamps of every file of `files`.
fn stamps(files: &ServerFiles) -> Vec<Stamp> {
    files
        .paths()
        .into_iter()
        .map(|p| {
            std::fs::metadata(p).ok().map(|m| {
                #[cfg(unix)]
                let inode = std::os::unix::fs::MetadataExt::ino(&m);
                #[cfg(not(unix))]
                let inode = 0;
                (
                    m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    m.len(),
                    inode,
                )
            })
        })
        .collect()
}

#[cfg(unix)]
type Hangup = Option<tokio::signal::unix::Signal>;
#[cfg(not(unix))]
type Hangup = Option<()>;

#[cfg(unix)]
fn hangup_signal() -> Hangup {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(signal) => Some(signal),
        Err(error) => {
            tracing::warn!(%error, "cannot install a SIGHUP handler: TLS reload on file change only");
            None
        }
    }
}

#[cfg(not(unix))]
fn hangup_signal() -> Hangup {
    None
}

async fn recv_hangup(hangup: &mut Hangup) {
    #[cfg(unix)]
    if let Some(signal) = hangup
        && signal.recv().await.is_some()
    {
        return;
    }
    let _ = hangup;
    std::future::pending::<()>().await;
}

async fn sleep_or_forever(interval: Option<Duration>) {
    match interval {
        Some(interval) => tokio::time::sleep(interval).await,
        None => std::future::pending().await,
    }
}
