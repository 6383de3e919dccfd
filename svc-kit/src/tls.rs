//! TLS for every ckf server and client: rustls with the ring provider (tonic's `tls-ring`
//! feature, tokio-rustls; no OpenSSL, no aws-lc).
//!
//! | piece | what |
//! | --- | --- |
//! | [`ServerTlsConfig`] | the `[tls]` section of both services and its start rules ([`ServerTlsConfig::check`]) |
//! | [`ServerTls`] | the loaded certificate chain, key and client CA as a rustls `ServerConfig`, swapped whole on reload |
//! | [`ServerTls::accept`] | accepted TCP connections -> TLS streams (each handshake in its own task, bounded by a timeout) |
//! | [`ServerTls::spawn_reloader`] | reload on SIGHUP and on a file change (polled) |
//! | [`serve_router`] | a tonic `Router` served on plaintext or TLS connections |
//! | [`ClientTlsConfig`], [`ClientTls`], [`endpoint`] | the client side: trust roots, client certificate, `https://` fails closed |
//! | [`peer_names`], [`cert_names`] | the names of the verified client certificate (for authorization) |
//! | [`exposure`] | who may call a non-loopback listener: refused without authorization unless `insecure = true` ([`check_exposure`]) |
//!
//! Rules (both services, same shape): a certificate + key -> TLS; no certificate and a loopback
//! listen address -> plaintext, logged at INFO; no certificate, a non-loopback address and
//! `plaintext = false` -> refused at start naming the keys; `plaintext = true` -> plaintext,
//! logged at WARN. Off loopback a listener must also authorize its callers, or `insecure = true`
//! ([`exposure`]). With `client_ca_file` the server asks for a client certificate and verifies
//! it against that bundle (`client_auth = "required"`: a connection without one is refused in
//! the handshake; `"optional"`: it may connect without one, and [`peer_names`] is then empty).
//!
//! Reload: [`ServerTls::reload`] reads every file again and builds a new `ServerConfig`; only a
//! complete, consistent set replaces the served one, so a half-written or bad file keeps the
//! old certificate (the error is logged and counted). A new config applies to connections
//! accepted afterwards; established connections keep the session they negotiated.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_rustls::rustls;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::codegen::{Bytes, http};
use tonic::service::Routes;
use tonic::transport::Endpoint;
use tonic::transport::server::{Connected, Router};
use tower::{Layer, Service};

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::Invalid;
use crate::shutdown::Shutdown;
use crate::transport::{PrefaceWatch, WatchAbove};

pub mod exposure;
pub use exposure::{Exposure, Guard, INSECURE_KEY, Listener, check_exposure};

/// Default `reload_interval_ms`: how often the certificate files are checked for a change.
pub const DEFAULT_RELOAD_INTERVAL_MS: u64 = 10_000;
/// Smallest nonzero `reload_interval_ms`.
pub const MIN_RELOAD_INTERVAL_MS: u64 = 100;
/// How long a client may take to complete the TLS handshake before its connection is closed
/// (a peer that connects and sends nothing must not hold a handshake task forever).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Accepted-and-handshaken connections buffered toward the server before the acceptor waits.
const ACCEPTED_BUFFER: usize = 64;
/// The HTTP/2 ALPN id (gRPC runs on HTTP/2 only).
const ALPN_H2: &[u8] = b"h2";

/// Whether a client must present a certificate when `client_ca_file` is set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ClientAuth {
    /// A connection without a valid client certificate is refused in the handshake.
    #[default]
    Required,
    /// A client may connect without a certificate (one it presents is still verified).
    Optional,
}

impl fmt::Display for ClientAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Required => "required",
            Self::Optional => "optional",
        })
    }
}

/// The `[tls]` section of a server (indexer: Relay + Query; producer: Ingest). Paths are PEM
/// files; every file is read at start and on every reload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerTlsConfig {
    /// Server certificate chain (PEM, leaf first).
    pub cert_file: Option<PathBuf>,
    /// Private key of the leaf certificate (PEM: PKCS#8, RSA/PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
    /// CA bundle (PEM) client certificates are verified against; unset: no client
    /// certificate is asked for.
    pub client_ca_file: Option<PathBuf>,
    /// `required` or `optional` (meaningful with `client_ca_file` only).
    pub client_auth: ClientAuth,
    /// Serve without TLS on a non-loopback address, on purpose (logged at WARN).
    pub plaintext: bool,
    /// How often the files are checked for a change, in milliseconds (SIGHUP also reloads);
    /// 0 = on SIGHUP only.
    pub reload_interval_ms: u64,
}

impl Default for ServerTlsConfig {
    fn default() -> Self {
        Self {
            cert_file: None,
            key_file: None,
            client_ca_file: None,
            client_auth: ClientAuth::Required,
            plaintext: false,
            reload_interval_ms: DEFAULT_RELOAD_INTERVAL_MS,
        }
    }
}

/// How one listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// TLS (with or without client certificates).
    Tls,
    /// Plaintext on a loopback address (no certificate configured).
    PlaintextLoopback,
    /// Plaintext on a non-loopback address because `plaintext = true`.
    PlaintextExplicit,
}

impl ServerTlsConfig {
    /// Checks the section (key names prefixed with `section`, e.g. `"tls"`) against the
    /// listen addresses it serves (`(key, address)`, e.g. `("listen", 0.0.0.0:7400)`).
    ///
    /// # Errors
    /// [`Invalid`]: a certificate without its key (or the reverse); a client CA or
    /// `client_auth = "optional"` without a certificate / CA; `plaintext = true` together with
    /// a certificate; a non-loopback listen address with neither a certificate nor
    /// `plaintext = true`; a nonzero `reload_interval_ms` below [`MIN_RELOAD_INTERVAL_MS`].
    pub fn check(&self, section: &str, listens: &[(&str, SocketAddr)]) -> Result<(), Invalid> {
        let key = |k: &str| format!("{section}.{k}");
        match (&self.cert_file, &self.key_file) {
            (Some(_), None) => {
                return Err(Invalid::new(
                    key("key_file"),
                    "(unset)",
                    format!("is required with {}", key("cert_file")),
                ));
            }
            (None, Some(path)) => {
                return Err(Invalid::new(
                    key("key_file"),
                    path.display(),
                    format!("needs {} (the certificate of this key)", key("cert_file")),
                ));
            }
            _ => {}
        }
        if let (Some(ca), None) = (&self.client_ca_file, &self.cert_file) {
            return Err(Invalid::new(
                key("client_ca_file"),
                ca.display(),
                format!(
                    "client certificates need TLS: set {} and {}",
                    key("cert_file"),
                    key("key_file")
                ),
            ));
        }
        if self.client_auth == ClientAuth::Optional && self.client_ca_file.is_none() {
            return Err(Invalid::new(
                key("client_auth"),
                self.client_auth,
                format!(
                    "only applies with {} (the CA client certificates are verified against)",
                    key("client_ca_file")
                ),
            ));
        }
        if self.plaintext && self.cert_file.is_some() {
            return Err(Invalid::new(
                key("plaintext"),
                true,
                format!("conflicts with {}: remove one of them", key("cert_file")),
            ));
        }
        if self.reload_interval_ms != 0 && self.reload_interval_ms < MIN_RELOAD_INTERVAL_MS {
            return Err(Invalid::new(
                key("reload_interval_ms"),
                self.reload_interval_ms,
                format!(
                    "must be 0 (SIGHUP only) or at least {MIN_RELOAD_INTERVAL_MS} milliseconds"
                ),
            ));
        }
        if self.cert_file.is_none()
            && !self.plaintext
            && let Some((listen_key, addr)) = listens
                .iter()
                .find(|(_, a)| !a.ip().to_canonical().is_loopback())
        {
            return Err(Invalid::new(
                *listen_key,
                addr,
                format!(
                    "is not a loopback address and no TLS certificate is configured: set \
                         {} and {} (or {} = true to serve plaintext on purpose)",
                    key("cert_file"),
                    key("key_file"),
                    key("plaintext")
                ),
            ));
        }
        Ok(())
    }

    /// How a listener on `addr` serves under this (checked) section.
    pub fn transport(&self, addr: SocketAddr) -> Transport {
        if self.cert_file.is_some() {
            Transport::Tls
        } else if addr.ip().to_canonical().is_loopback() {
            Transport::PlaintextLoopback
        } else {
            Transport::PlaintextExplicit
        }
    }

    /// Logs how the listener `what` on `addr` serves: TLS at INFO, loopback plaintext at INFO,
    /// non-loopback plaintext at WARN.
    pub fn log_transport(&self, what: &str, addr: SocketAddr) {
        match self.transport(addr) {
            Transport::Tls => tracing::info!(
                listener = what,
                %addr,
                client_ca = self.client_ca_file.as_ref().map(|p| p.display().to_string()),
                // Without a client CA no client certificate is asked for or verified.
                client_auth = %self
                    .client_ca_file
                    .as_ref()
                    .map_or_else(|| "none".to_owned(), |_| self.client_auth.to_string()),
                "serving TLS"
            ),
            Transport::PlaintextLoopback => tracing::info!(
                listener = what,
                %addr,
                "serving plaintext (no TLS certificate configured; loopback address only)"
            ),
            Transport::PlaintextExplicit => tracing::warn!(
                listener = what,
                %addr,
                "serving PLAINTEXT on a non-loopback address (plaintext = true): traffic and \
                 credentials can be read and altered on the network"
            ),
        }
    }
}

/// A certificate, key or CA file that could not be used. Each message names the
/// configuration key, the path and what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The file could not be read.
    #[error("{key} = {}: cannot read the file: {source}", path.display())]
    Read {
        /// The configuration key (or flag) that names the file.
        key: String,
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The file is not well-formed PEM.
    #[error("{key} = {}: not valid PEM: {detail}", path.display())]
    BadPem {
        /// The configuration key.
        key: String,
        /// The path.
        path: PathBuf,
        /// The PEM parser's complaint.
        detail: String,
    },
    /// No certificate in a certificate or CA file.
    #[error(
        "{key} = {}: no certificate in the file (expected PEM \"BEGIN CERTIFICATE\" sections)",
        path.display()
    )]
    NoCertificate {
        /// The configuration key.
        key: String,
        /// The path.
        path: PathBuf,
    },
    /// No private key in a key file.
    #[error(
        "{key} = {}: no private key in the file (expected PEM \"BEGIN PRIVATE KEY\", \
         \"BEGIN RSA PRIVATE KEY\" or \"BEGIN EC PRIVATE KEY\")",
        path.display()
    )]
    NoPrivateKey {
        /// The configuration key.
        key: String,
        /// The path.
        path: PathBuf,
    },
    /// The key is not the key of the leaf certificate.
    #[error(
        "{key_key} = {}: the private key does not match the certificate in {cert_key} = {}",
        key_path.display(),
        cert_path.display()
    )]
    KeyMismatch {
        /// The certificate's configuration key.
        cert_key: String,
        /// The certificate path.
        cert_path: PathBuf,
        /// The key's configuration key.
        key_key: String,
        /// The key path.
        key_path: PathBuf,
    },
    /// The certificate is outside its validity period now (expired, or not yet valid): a peer
    /// would refuse every handshake with it, so it is refused like any other bad file (at
    /// start, exit 2; on reload, the old certificate is kept and the reload counted `error`).
    /// For a CA file: every certificate in it is outside its validity period.
    #[error(
        "{key} = {}: the certificate is not valid now ({now}): valid from {not_before} until {not_after}",
        path.display()
    )]
    OutsideValidity {
        /// The configuration key.
        key: String,
        /// The path.
        path: PathBuf,
        /// The certificate's `notBefore` (UTC).
        not_before: String,
        /// The certificate's `notAfter` (UTC).
        not_after: String,
        /// The time of the check (UTC).
        now: String,
    },
    /// rustls refused the material (unsupported key type, a CA certificate it cannot use...).
    #[error("{key} = {}: {detail}", path.display())]
    Rejected {
        /// The configuration key.
        key: String,
        /// The path.
        path: PathBuf,
        /// rustls' reason.
        detail: String,
    },
}

/// Reads `path` (named by configuration key `key`).
fn read(key: &str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        key: key.to_owned(),
        path: path.to_owned(),
        source,
    })
}

fn bad_pem(key: &str, path: &Path, error: &pem::Error) -> TlsError {
    TlsError::BadPem {
        key: key.to_owned(),
        path: path.to_owned(),
        detail: error.to_string(),
    }
}

/// Every certificate of the PEM file `path` (at least one).
///
/// # Errors
/// [`TlsError::Read`], [`TlsError::BadPem`], [`TlsError::NoCertificate`].
pub fn read_certificates(key: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read(key, path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad_pem(key, path, &e))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            key: key.to_owned(),
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

/// [`TlsError::OutsideValidity`] unless `cert` is within its validity period now. A
/// certificate that does not parse as X.509 is left to rustls, which refuses it with its own
/// reason.
fn check_validity(key: &str, path: &Path, cert: &CertificateDer<'_>) -> Result<(), TlsError> {
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(cert.as_ref()) else {
        return Ok(());
    };
    let validity = parsed.validity();
    if validity.is_valid() {
        return Ok(());
    }
    Err(TlsError::OutsideValidity {
        key: key.to_owned(),
        path: path.to_owned(),
        not_before: validity.not_before.to_string(),
        not_after: validity.not_after.to_string(),
        now: x509_parser::time::ASN1Time::now().to_string(),
    })
}

/// The certificates of the CA (trust root) file `path`, refused with
/// [`TlsError::OutsideValidity`] (naming the first) when none of them is valid now: such a file
/// would fail every handshake. Expired certificates beside a valid one are kept (bundles
/// carry old roots during a rotation).
///
/// # Errors
/// As [`read_certificates`], and [`TlsError::OutsideValidity`].
pub fn read_ca_certificates(
    key: &str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = read_certificates(key, path)?;
    let mut first_error = None;
    for cert in &certs {
        match check_validity(key, path, cert) {
            Ok(()) => return Ok(certs),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    Err(first_error.expect("read_certificates returns at least one"))
}

/// The first private key of the PEM file `path` (PKCS#8, PKCS#1 or SEC1).
///
/// # Errors
/// [`TlsError::Read`], [`TlsError::BadPem`], [`TlsError::NoPrivateKey`].
pub fn read_private_key(key: &str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = read(key, path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| match e {
        pem::Error::NoItemsFound => TlsError::NoPrivateKey {
            key: key.to_owned(),
            path: path.to_owned(),
        },
        other => bad_pem(key, path, &other),
    })
}

/// The crypto provider of every ckf TLS config (ring).
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A certificate chain and its key checked against each other: [`TlsError::OutsideValidity`]
/// when the leaf is expired or not yet valid, [`TlsError::KeyMismatch`]
/// when the key is not the leaf's.
fn certified_key(
    cert_key: &str,
    cert_path: &Path,
    key_key: &str,
    key_path: &Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
    let certs = read_certificates(cert_key, cert_path)?;
    // The leaf only: it is what this side presents; the chain above it is the peer's to judge.
    check_validity(cert_key, cert_path, &certs[0])?;
    let key = read_private_key(key_key, key_path)?;
    let rejected = |detail: String| TlsError::Rejected {
        key: key_key.to_owned(),
        path: key_path.to_owned(),
        detail,
    };
    let signing = provider()
        .key_provider
        .load_private_key(key.clone_key())
        .map_err(|e| rejected(format!("unusable private key: {e}")))?;
    let certified = rustls::sign::CertifiedKey::new(certs.clone(), signing);
    match certified.keys_match() {
        Ok(()) => Ok((certs, key)),
        Err(rustls::Error::InconsistentKeys(_)) => Err(TlsError::KeyMismatch {
            cert_key: cert_key.to_owned(),
            cert_path: cert_path.to_owned(),
            key_key: key_key.to_owned(),
            key_path: key_path.to_owned(),
        }),
        Err(e) => Err(rejected(e.to_string())),
    }
}

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
    fn current(&self) -> Arc<rustls::ServerConfig> {
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
    /// `tonic::Request::peer_certs` (and so [`peer_names`]) needs `IO::ConnectInfo` to be
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

/// Serves `router` on `incoming` until `signal` resolves: plaintext when `tls` is `None`, else
/// TLS through [`ServerTls::accept`]. The bounds are tonic's own
/// (`Router::serve_with_incoming_shutdown`), so any layer stack tonic serves works here.
///
/// # Errors
/// The server's transport error.
pub async fn serve_router<L, ResBody, S, IO, IE, F>(
    router: Router<L>,
    incoming: S,
    tls: Option<&ServerTls>,
    signal: F,
) -> Result<(), tonic::transport::Error>
where
    S: Stream<Item = Result<IO, IE>> + Send + 'static,
    IO: AsyncRead + AsyncWrite + Connected + WatchAbove + Unpin + Send + 'static,
    IE: Into<tonic::codegen::StdError> + Send + 'static,
    F: Future<Output = ()>,
    L: Layer<Routes>,
    L::Service: Service<http::Request<tonic::body::Body>, Response = http::Response<ResBody>>
        + Clone
        + Send
        + 'static,
    <L::Service as Service<http::Request<tonic::body::Body>>>::Future: Send,
    <L::Service as Service<http::Request<tonic::body::Body>>>::Error:
        Into<tonic::codegen::StdError> + Send,
    ResBody: tonic::codegen::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<tonic::codegen::StdError>,
{
    match tls {
        None => router.serve_with_incoming_shutdown(incoming, signal).await,
        Some(tls) => {
            router
                .serve_with_incoming_shutdown(tls.accept(incoming), signal)
                .await
        }
    }
}

/// The names of a DER certificate: its DNS and URI subject alternative names, then its
/// subject common name(s), each once, in that order. Empty when the certificate does not parse.
pub fn cert_names(der: &[u8]) -> Vec<String> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return Vec::new();
    };
    let mut names: Vec<String> = Vec::new();
    let mut push = |name: &str| {
        if !names.iter().any(|n| n == name) {
            names.push(name.to_owned());
        }
    };
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                x509_parser::extensions::GeneralName::DNSName(dns) => push(dns),
                x509_parser::extensions::GeneralName::URI(uri) => push(uri),
                _ => {}
            }
        }
    }
    for cn in cert.subject().iter_common_name() {
        if let Ok(cn) = cn.as_str() {
            push(cn);
        }
    }
    names
}

/// The serial number of a DER certificate as lower-case hex bytes separated by `:` (as
/// the reload log lines print it); `None` when it does not parse.
pub fn cert_serial(der: &[u8]) -> Option<String> {
    x509_parser::parse_x509_certificate(der)
        .ok()
        .map(|(_, cert)| cert.raw_serial_as_string())
}

/// The names ([`cert_names`]) of the verified client certificate of `request`'s connection:
/// DNS and URI SANs and the subject CN of the leaf. Empty for a plaintext connection or a TLS
/// connection without a client certificate (`client_auth = "optional"`, or no client CA).
/// The certificate has been verified against `client_ca_file` in the handshake.
pub fn peer_names<T>(request: &tonic::Request<T>) -> Vec<String> {
    request
        .peer_certs()
        .and_then(|chain| chain.first().map(|leaf| cert_names(leaf.as_ref())))
        .unwrap_or_default()
}

/// The client side's TLS section (the producer's `[indexer_tls]`; ckf-cli's `--ca`, `--cert`,
/// `--key`, `--server-name`). Paths are PEM files.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientTlsConfig {
    /// Trust roots the server certificate is verified against; required for `https://`.
    pub ca_file: Option<PathBuf>,
    /// Client certificate chain (mutual TLS), optional.
    pub cert_file: Option<PathBuf>,
    /// Private key of the client certificate.
    pub key_file: Option<PathBuf>,
    /// Name checked in the server certificate instead of the URL's host.
    pub server_name: Option<String>,
}

impl ClientTlsConfig {
    /// Checks the section (keys prefixed with `section`) against the endpoints it is used
    /// for (`(key, url)`).
    ///
    /// # Errors
    /// [`Invalid`]: an `https://` endpoint without `ca_file` (TLS fails closed: no trust
    /// roots, no connection); a certificate without its key or the reverse; client
    /// certificate or server name without `ca_file`; an empty `server_name`.
    pub fn check(&self, section: &str, endpoints: &[(String, &str)]) -> Result<(), Invalid> {
        let key = |k: &str| format!("{section}.{k}");
        match (&self.cert_file, &self.key_file) {
            (Some(_), None) => {
                return Err(Invalid::new(
                    key("key_file"),
                    "(unset)",
                    format!("is required with {}", key("cert_file")),
                ));
            }
            (None, Some(path)) => {
                return Err(Invalid::new(
                    key("key_file"),
                    path.display(),
                    format!("needs {}", key("cert_file")),
                ));
            }
            _ => {}
        }
        if let Some(name) = &self.server_name
            && name.is_empty()
        {
            return Err(Invalid::new(
                key("server_name"),
                "\"\"",
                "must not be empty (unset it to check the URL's host)",
            ));
        }
        if self.ca_file.is_none()
            && let Some(path) = &self.cert_file
        {
            return Err(Invalid::new(
                key("cert_file"),
                path.display(),
                format!("needs {} (TLS trust roots)", key("ca_file")),
            ));
        }
        for (endpoint_key, url) in endpoints {
            if is_https(url) && self.ca_file.is_none() {
                return Err(Invalid::new(
                    endpoint_key.as_str(),
                    url,
                    format!(
                        "https:// needs trust roots: set {} (a PEM CA bundle); TLS fails closed \
                         without them",
                        key("ca_file")
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Loads the files: `None` when no `ca_file` is set (plaintext `http://` only).
    ///
    /// # Errors
    /// [`TlsError`] naming the key and file that cannot be used.
    pub fn load(&self, section: &str) -> Result<Option<ClientTls>, TlsError> {
        let keys = ["ca_file", "cert_file", "key_file"].map(|k| format!("{section}.{k}"));
        self.load_as(keys)
    }

    /// As [`ClientTlsConfig::load`], with the names errors give the `ca_file`, `cert_file` and
    /// `key_file` (e.g. the flags `--ca`, `--cert`, `--key`).
    ///
    /// # Errors
    /// [`TlsError`] naming the key and file that cannot be used.
    pub fn load_as(&self, keys: [String; 3]) -> Result<Option<ClientTls>, TlsError> {
        let Some(ca_file) = &self.ca_file else {
            return Ok(None);
        };
        let [ca_key, cert_key, key_key] = &keys;
        // Parse everything now so a bad file is reported at start, with its key; tonic takes
        // the PEM bytes themselves.
        read_ca_certificates(ca_key, ca_file)?;
        let ca_pem = read(ca_key, ca_file)?;
        let identity = match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key_path)) => {
                certified_key(cert_key, cert, key_key, key_path)?;
                Some((read(cert_key, cert)?, read(key_key, key_path)?))
            }
            _ => None,
        };
        Ok(Some(ClientTls {
            keys: keys.clone(),
            config: self.clone(),
            ca_pem,
            identity,
        }))
    }
}

/// Loaded client TLS material ([`ClientTlsConfig::load`]).
#[derive(Clone)]
pub struct ClientTls {
    keys: [String; 3],
    config: ClientTlsConfig,
    ca_pem: Vec<u8>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls")
            .field("config", &self.config)
            .field("client_certificate", &self.identity.is_some())
            .finish_non_exhaustive()
    }
}

impl ClientTls {
    /// The same files read again (a rotated client certificate or CA is picked up by the next
    /// connection); when they no longer load, a WARN is logged and `self` is kept.
    pub fn reloaded(&self) -> Self {
        match self.config.load_as(self.keys.clone()) {
            Ok(Some(fresh)) => fresh,
            Ok(None) => self.clone(),
            Err(error) => {
                tracing::warn!(%error, "client TLS files no longer load: using the previous ones");
                self.clone()
            }
        }
    }

    /// Whether a client certificate is presented.
    pub fn has_client_certificate(&self) -> bool {
        self.identity.is_some()
    }

    /// tonic's client TLS settings.
    fn tonic_config(&self) -> tonic::transport::ClientTlsConfig {
        let mut config = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&self.ca_pem));
        if let Some((cert, key)) = &self.identity {
            config = config.identity(tonic::transport::Identity::from_pem(cert, key));
        }
        if let Some(name) = &self.config.server_name {
            config = config.domain_name(name.clone());
        }
        config
    }
}

/// Why [`endpoint`] cannot build an endpoint.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// Not a valid URL.
    #[error("{url}: not a valid endpoint URL: {detail}")]
    InvalidUrl {
        /// The URL.
        url: String,
        /// The parser's complaint.
        detail: String,
    },
    /// `https://` without trust roots: refused (fails closed).
    #[error(
        "{url}: https:// needs trust roots (a CA bundle: --ca, or ca_file); refusing to connect without verifying the server"
    )]
    HttpsWithoutRoots {
        /// The URL.
        url: String,
    },
    /// TLS material was given for an `http://` URL.
    #[error("{url}: TLS settings are given but the URL is http:// (plaintext): use https://")]
    TlsForHttp {
        /// The URL.
        url: String,
    },
    /// tonic refused the TLS settings.
    #[error("{url}: TLS settings refused: {detail}")]
    Tls {
        /// The URL.
        url: String,
        /// tonic's complaint.
        detail: String,
    },
}

/// Whether `url` starts with `https://` (ASCII case-insensitive).
pub fn is_https(url: &str) -> bool {
    url.get(..8)
        .is_some_and(|s| s.eq_ignore_ascii_case("https://"))
}

/// Whether `url`'s host is a loopback address or `localhost` (an unparsable URL is not).
pub fn is_loopback_url(url: &str) -> bool {
    let Ok(uri) = url.parse::<tonic::transport::Uri>() else {
        return false;
    };
    let Some(host) = uri.host() else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.to_canonical().is_loopback())
}

/// An endpoint for `url`: `https://` uses `tls` (required: [`EndpointError::HttpsWithoutRoots`]
/// otherwise); `http://` is plaintext (`strict`: TLS material given for an `http://` URL is
/// refused as [`EndpointError::TlsForHttp`], else it is ignored). The HTTP/2 windows are
/// [`crate::transport::http2::endpoint`]'s; other connection settings (timeouts, keepalive)
/// are the caller's; [`warn_if_plaintext_remote`] is the start-time warning.
///
/// # Errors
/// [`EndpointError`].
pub fn endpoint(
    url: &str,
    tls: Option<&ClientTls>,
    strict: bool,
) -> Result<Endpoint, EndpointError> {
    let invalid = |detail: String| EndpointError::InvalidUrl {
        url: url.to_owned(),
        detail,
    };
    let endpoint = Endpoint::from_shared(url.to_owned()).map_err(|e| invalid(e.to_string()))?;
    let endpoint = crate::transport::http2::endpoint(endpoint);
    if is_https(url) {
        let tls = tls.ok_or_else(|| EndpointError::HttpsWithoutRoots {
            url: url.to_owned(),
        })?;
        return endpoint
            .tls_config(tls.tonic_config())
            .map_err(|e| EndpointError::Tls {
                url: url.to_owned(),
                detail: e.to_string(),
            });
    }
    if strict && tls.is_some() {
        return Err(EndpointError::TlsForHttp {
            url: url.to_owned(),
        });
    }
    Ok(endpoint)
}

/// Logs a WARN when `url` is plaintext (`http://`) to a host that is not loopback; returns
/// whether it did. Callers log once per configured endpoint, not per connection attempt.
pub fn warn_if_plaintext_remote(url: &str) -> bool {
    let warn = !is_https(url) && !is_loopback_url(url);
    if warn {
        tracing::warn!(
            %url,
            "connecting in PLAINTEXT (http://) to a non-loopback host: anyone on the path can \
             read and alter the traffic; use https:// with a CA bundle"
        );
    }
    warn
}

/// Clap flags of a server's `[tls]` section and the top-level `insecure` key (flattened into
/// each service's command line).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServerTlsFlags {
    /// tls.cert_file: TLS certificate chain, PEM [default: none].
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// tls.key_file: TLS private key, PEM [default: none].
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// tls.client_ca_file: CA bundle client certificates are verified against, PEM [default: none].
    #[arg(long, value_name = "FILE")]
    pub tls_client_ca: Option<PathBuf>,
    /// tls.client_auth: whether a client certificate is required with --tls-client-ca
    /// [default: required].
    #[arg(long, value_enum, value_name = "MODE")]
    pub tls_client_auth: Option<ClientAuth>,
    /// tls.plaintext: serve plaintext on a non-loopback address on purpose [default: false].
    #[arg(long)]
    pub plaintext: bool,
    /// insecure: let a non-loopback listener serve callers without authorization, on purpose
    /// (WARN at start and every hour, gauge *_insecure = 1) [default: false].
    #[arg(long)]
    pub insecure: bool,
}

impl ServerTlsFlags {
    /// `overrides` plus the flags that were given.
    pub fn overrides(&self, overrides: crate::config::Overrides) -> crate::config::Overrides {
        overrides
            .set("tls.cert_file", self.tls_cert.clone())
            .set("tls.key_file", self.tls_key.clone())
            .set("tls.client_ca_file", self.tls_client_ca.clone())
            .set("tls.client_auth", self.tls_client_auth)
            .set("tls.plaintext", self.plaintext.then_some(true))
            .set(INSECURE_KEY, self.insecure.then_some(true))
    }
}

#[cfg(test)]
mod tests;
