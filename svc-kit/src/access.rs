//! The service side of `ckf_core::access`, shared by both services and the CLI: reading token
//! files (refused at start naming the key and the path), the credentials a gRPC request
//! presents (`authorization` metadata and the verified client certificate's names), the
//! `authorization: Bearer` value a client sends, and a policy that a SIGHUP re-reads.
//!
//! Rotation: token files are read at start and again on every SIGHUP ([`reload_on_sighup`]);
//! a reload that fails (unreadable or empty file) is logged at ERROR and the previous tokens
//! stay in force. The rest of the policy (principals, grants) is configuration: restart to
//! change it.

use std::path::Path;
use std::sync::{Arc, RwLock};

use ckf_core::access::{AccessError, Credentials, Secret};
use tonic::metadata::{AsciiMetadataValue, MetadataMap};

use crate::config::Invalid;
use crate::shutdown::Shutdown;

/// The gRPC metadata key of bearer tokens.
pub const AUTHORIZATION: &str = "authorization";

/// Reads the token file `path` given under configuration key `key`: one line, surrounding
/// whitespace trimmed (`ckf_core::access::Secret::from_file_text`).
///
/// # Errors
/// [`Invalid`] naming `key`, the path and why: unreadable (the OS error) or not a token (empty,
/// several lines, a space or control byte).
pub fn read_token_file(key: &str, path: &Path) -> Result<Secret, Invalid> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Invalid::new(
            key,
            path.display(),
            format!("cannot read the token file: {e}"),
        )
    })?;
    let secret = Secret::from_file_text(&text)
        .map_err(|e| Invalid::new(key, path.display(), format!("not a usable token file: {e}")))?;
    if secret.expose().len() < MIN_TOKEN_BYTES {
        return Err(Invalid::new(
            key,
            path.display(),
            format!(
                "the token is {} byte(s), too short to resist guessing: use at least {MIN_TOKEN_BYTES} \
                 (`ckf certs` writes 64 hex characters; or `openssl rand -hex 32`)",
                secret.expose().len()
            ),
        ));
    }
    warn_if_others_can_read(key, path);
    Ok(secret)
}

/// The shortest token a token file may hold, in bytes: 16 printable characters (a random hex
/// token of 64 bits); `ckf certs` writes 64 hex characters (256 bits).
pub const MIN_TOKEN_BYTES: usize = 16;

/// Logs a WARN when every user may read the token file, or anyone but its owner may write it
/// (mode `& 0o026`). Group read is not warned about: Kubernetes Secret volumes are mode 0440
/// with an `fsGroup`, the usual way to give a non-root container its keys. Not refused: the
/// mode a bind mount or volume shows is not always the operator's to choose. Once per file and
/// mode ([`first_warning`]): a start reads each file twice (validation, then the access
/// setup), and a SIGHUP re-reads it.
fn warn_if_others_can_read(key: &str, path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = std::fs::metadata(path) {
            let mode = meta.permissions().mode() & 0o777;
            if first_warning(path, (mode & 0o026 != 0).then_some(mode)) {
                tracing::warn!(
                    key,
                    path = %path.display(),
                    mode = format!("{mode:04o}"),
                    "token file readable by every user or writable by others: chmod 600 it (or mount it with mode 0400 / 0440)"
                );
            }
        }
    }
}

/// Whether the loose mode `loose` (`None`: the file's mode is fine) of the token file `path` is
/// to be warned about: the first time this process sees that file with that mode. A fine mode
/// forgets the file, so loosening it again warns again.
fn first_warning(path: &Path, loose: Option<u32>) -> bool {
    static WARNED: std::sync::Mutex<Vec<(std::path::PathBuf, u32)>> =
        std::sync::Mutex::new(Vec::new());
    let mut warned = WARNED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    warned.retain(|(p, m)| p != path || Some(*m) == loose);
    match loose {
        Some(mode) if !warned.iter().any(|(p, _)| p == path) => {
            warned.push((path.to_path_buf(), mode));
            true
        }
        _ => false,
    }
}

/// Reads the optional token file of `key`.
///
/// # Errors
/// As [`read_token_file`].
pub fn read_optional_token_file(key: &str, path: Option<&Path>) -> Result<Option<Secret>, Invalid> {
    path.map(|p| read_token_file(key, p)).transpose()
}

/// The credentials `metadata` (and the verified client certificate, whose names are
/// `cert_names`) present.
///
/// # Errors
/// [`AccessError::Unauthenticated`] for an `authorization` value that is not
/// `Bearer <token>`.
pub fn credentials_of(
    metadata: &MetadataMap,
    cert_names: Vec<String>,
) -> Result<Credentials, AccessError> {
    let authorization = metadata.get(AUTHORIZATION).map(|v| v.as_bytes());
    Credentials::from_parts(authorization, cert_names)
}

/// The credentials a request presents: its bearer token and the names of its verified client
/// certificate (with mutual TLS: `[tls] client_ca_file`).
///
/// # Errors
/// As [`credentials_of`].
pub fn credentials<T>(request: &tonic::Request<T>) -> Result<Credentials, AccessError> {
    credentials_of(request.metadata(), peer_cert_names(request))
}

/// Names of the verified client certificate of `request` (empty without one): DNS / URI SANs
/// and subject CN ([`crate::tls::peer_names`]).
fn peer_cert_names<T>(request: &tonic::Request<T>) -> Vec<String> {
    crate::tls::peer_names(request)
}

/// The `authorization` value a client sends for `token`: `Bearer <token>`.
///
/// # Panics
/// Never: a [`Secret`] is printable ASCII.
pub fn bearer_value(token: &Secret) -> AsciiMetadataValue {
    let mut value = b"Bearer ".to_vec();
    value.extend_from_slice(token.expose());
    AsciiMetadataValue::try_from(value.as_slice()).expect("a Secret is printable ASCII")
}

/// Adds `authorization: Bearer <token>` to `request` when `token` is given.
pub fn with_bearer<T>(mut request: tonic::Request<T>, token: Option<&Secret>) -> tonic::Request<T> {
    if let Some(token) = token {
        request
            .metadata_mut()
            .insert(AUTHORIZATION, bearer_value(token));
    }
    request
}

/// A tonic interceptor that adds `authorization: Bearer <token>` to every request of a client
/// (none when no token is given), and one more metadata entry when given (a `Query` client's
/// `ckf-domain`), for clients whose calls are spread over many functions.
#[derive(Clone, Default)]
pub struct Bearer {
    token: Option<Secret>,
    extra: Option<(&'static str, AsciiMetadataValue)>,
}

impl std::fmt::Debug for Bearer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token itself.
        f.debug_struct("Bearer")
            .field("token", &self.token.is_some())
            .field("extra", &self.extra)
            .finish()
    }
}

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let mut request = with_bearer(request, self.token.as_ref());
        if let Some((key, value)) = &self.extra {
            request.metadata_mut().insert(*key, value.clone());
        }
        Ok(request)
    }
}

/// A channel whose every request carries a bearer token (or none): what [`authed`] returns.
pub type AuthedChannel =
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Bearer>;

/// `channel` with `token` sent on every request (`None`: requests go out as they are).
pub fn authed(channel: tonic::transport::Channel, token: Option<Secret>) -> AuthedChannel {
    tonic::service::interceptor::InterceptedService::new(channel, Bearer { token, extra: None })
}

/// As [`authed`], every request also carrying the metadata entry `key: value` (e.g. a `Query`
/// client's `ckf-domain`).
///
/// # Errors
/// A value that cannot be ASCII metadata (not visible ASCII), quoted.
pub fn authed_with(
    channel: tonic::transport::Channel,
    token: Option<Secret>,
    key: &'static str,
    value: &str,
) -> Result<AuthedChannel, String> {
    let ascii = AsciiMetadataValue::try_from(value)
        .map_err(|_| format!("{key} {value:?} is not visible ASCII"))?;
    Ok(tonic::service::interceptor::InterceptedService::new(
        channel,
        Bearer {
            token,
            extra: Some((key, ascii)),
        },
    ))
}

/// A value shared by handlers that a reload can replace (readers take a cheap `Arc` clone).
#[derive(Debug)]
pub struct Reloadable<T> {
    current: RwLock<Arc<T>>,
}

impl<T> Reloadable<T> {
    /// Starts with `value`.
    pub fn new(value: T) -> Self {
        Self {
            current: RwLock::new(Arc::new(value)),
        }
    }

    /// The value in force.
    pub fn get(&self) -> Arc<T> {
        // A poisoned lock still holds a complete value (writers only swap an Arc).
        Arc::clone(&self.current.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Replaces the value.
    pub fn set(&self, value: T) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(value);
    }
}

/// Runs `reload` on every SIGHUP until `shutdown` (a spawned task; does nothing off Unix).
/// `reload` returns what it loaded (logged at INFO) or why it failed (logged at ERROR, the
/// previous value stays in force); `what` names it in the log.
///
/// # Errors
/// The OS error when the SIGHUP handler cannot be installed.
pub fn reload_on_sighup(
    what: &'static str,
    shutdown: Shutdown,
    mut reload: impl FnMut() -> Result<String, String> + Send + 'static,
) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hangups = signal(SignalKind::hangup())?;
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = shutdown.wait() => return,
                    got = hangups.recv() => if got.is_none() { return },
                }
                match reload() {
                    Ok(loaded) => tracing::info!(what, %loaded, "SIGHUP: reloaded"),
                    Err(error) => tracing::error!(
                        what,
                        %error,
                        "SIGHUP: reload failed; the previous credentials stay in force"
                    ),
                }
            }
        });
    }
    #[cfg(not(unix))]
    let _ = (what, shutdown, &mut reload);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loose_token_file_mode_is_warned_about_once_until_it_changes() {
        let path = Path::new("/nonexistent/first-warning.token");
        let other = Path::new("/nonexistent/other.token");
        assert!(first_warning(path, Some(0o644)), "first sight");
        assert!(
            !first_warning(path, Some(0o644)),
            "the second read of a start"
        );
        assert!(first_warning(other, Some(0o644)), "another file");
        assert!(first_warning(path, Some(0o666)), "a new mode");
        assert!(!first_warning(path, None), "fixed");
        assert!(first_warning(path, Some(0o644)), "loosened again");
    }

    #[test]
    fn token_files_are_refused_naming_key_and_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.token");
        let err = read_token_file("auth.query_token_file", &path).unwrap_err();
        assert_eq!(err.key, "auth.query_token_file");
        assert!(err.value.contains("t.token"), "{err}");
        assert!(err.rule.contains("cannot read"), "{err}");
        std::fs::write(&path, "\n  \n").unwrap();
        let err = read_token_file("k", &path).unwrap_err();
        assert!(err.rule.contains("empty"), "{err}");
        std::fs::write(&path, "s3cret\n").unwrap();
        let err = read_token_file("k", &path).unwrap_err();
        assert!(err.rule.contains("6 byte(s), too short"), "{err}");
        std::fs::write(&path, "s3cret.0123456789\n").unwrap();
        assert_eq!(
            read_token_file("k", &path).unwrap().expose(),
            b"s3cret.0123456789"
        );
        assert!(read_optional_token_file("k", None).unwrap().is_none());
    }

    #[test]
    fn bearer_round_trip_through_metadata() {
        let token = Secret::new(b"abc.DEF-123").unwrap();
        let request = with_bearer(tonic::Request::new(()), Some(&token));
        let creds = credentials(&request).unwrap();
        assert!(creds.bearer.unwrap().matches(b"abc.DEF-123"));
        let none = credentials(&tonic::Request::new(())).unwrap();
        assert!(none.is_empty());
    }

    #[test]
    fn reloadable_swaps_the_value() {
        let r = Reloadable::new(1);
        let before = r.get();
        r.set(2);
        assert_eq!((*before, *r.get()), (1, 2));
    }
}
