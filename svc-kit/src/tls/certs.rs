//! Reading the certificate, key and CA files (PEM) and checking them: each failure a
//! [`TlsError`] naming the configuration key, the path and what is wrong; the ring crypto
//! provider; a certificate chain checked against its key.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls;

use crate::config::Invalid;

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
pub(crate) fn read(key: &str, path: &Path) -> Result<Vec<u8>, TlsError> {
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
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A certificate chain and its key checked against each other: [`TlsError::OutsideValidity`]
/// when the leaf is expired or not yet valid, [`TlsError::KeyMismatch`]
/// when the key is not the leaf's.
pub(crate) fn certified_key(
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

/// The configuration rule both sides share: a certificate (`cert_file`) and its private key
/// (`key_file`) come together or not at all.
///
/// # Errors
/// [`Invalid`] naming `<section>.key_file`.
pub(crate) fn check_cert_and_key(
    section: &str,
    cert_file: Option<&Path>,
    key_file: Option<&Path>,
) -> Result<(), Invalid> {
    let key = |k: &str| format!("{section}.{k}");
    match (cert_file, key_file) {
        (Some(_), None) => Err(Invalid::new(
            key("key_file"),
            "(unset)",
            format!("is required with {}", key("cert_file")),
        )),
        (None, Some(path)) => Err(Invalid::new(
            key("key_file"),
            path.display(),
            format!("needs {} (the certificate of this key)", key("cert_file")),
        )),
        _ => Ok(()),
    }
}
