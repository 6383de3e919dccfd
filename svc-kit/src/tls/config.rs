//! The `[tls]` section of a server: its keys and defaults, how a listener serves
//! ([`Transport`]: TLS, plaintext on loopback, plaintext on purpose) and the start rules that
//! decide it, and the command-line flags that override the section.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::config::Invalid;
use crate::tls::certs::check_cert_and_key;

/// The configuration key (top level, both services) that lets a non-loopback listener serve
/// without authorization ([`crate::tls::exposure`]).
pub const INSECURE_KEY: &str = "insecure";

/// Default `reload_interval_ms`: how often the certificate files are checked for a change.
pub const DEFAULT_RELOAD_INTERVAL_MS: u64 = 10_000;
/// Smallest nonzero `reload_interval_ms`.
pub const MIN_RELOAD_INTERVAL_MS: u64 = 100;

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
        check_cert_and_key(section, self.cert_file.as_deref(), self.key_file.as_deref())?;
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
