//! The client side: its TLS section, the loaded trust roots and client certificate, and the
//! endpoint builder (`https://` fails closed without a CA bundle; plaintext to a remote
//! address is warned about).

use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use tonic::transport::Endpoint;

use crate::config::Invalid;
use crate::tls::certs::{TlsError, certified_key, check_cert_and_key, read, read_ca_certificates};

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
        check_cert_and_key(section, self.cert_file.as_deref(), self.key_file.as_deref())?;
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
