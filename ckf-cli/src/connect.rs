//! Connecting to a service from the command line: the client TLS material of the flags, a
//! bearer token file, a channel (`https://` with TLS, `http://` in plaintext), and the hint
//! printed under a connection error. Shared by the operator commands and the benchmark tools.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use ckf_core::access::Secret;
use ckf_svc_kit::access::read_token_file;
use ckf_svc_kit::errors::error_chain;
use ckf_svc_kit::tls::{ClientTls, ClientTlsConfig, warn_if_plaintext_remote};
use clap::Args;
use tonic::transport::Channel;

/// Client TLS flags of every command that connects (`https://` URLs need `--ca`).
#[derive(Debug, Clone, Default, Args)]
pub struct TlsArgs {
    /// CA bundle (PEM) the server certificate is verified against; required for https://.
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// Client certificate (PEM) for servers that require one (mutual TLS); needs --key.
    #[arg(long, value_name = "FILE", requires = "key", requires = "ca")]
    pub cert: Option<PathBuf>,
    /// Private key (PEM) of --cert.
    #[arg(long, value_name = "FILE", requires = "cert")]
    pub key: Option<PathBuf>,
    /// Name checked in the server certificate instead of the URL's host.
    #[arg(long, value_name = "NAME", requires = "ca")]
    pub server_name: Option<String>,
}

/// Connects to a gRPC endpoint in plaintext (the in-process demo's loopback services).
///
/// # Errors
/// An invalid URL or a failed connection, naming the URL.
pub async fn connect(url: &str) -> Result<Channel> {
    connect_with(url, None).await
}

/// The client TLS material the flags name (`None` without `--ca`).
///
/// # Errors
/// A file that cannot be used, naming the flag and the path.
pub fn client_tls(args: &TlsArgs) -> Result<Option<ClientTls>> {
    let config = ClientTlsConfig {
        ca_file: args.ca.clone(),
        cert_file: args.cert.clone(),
        key_file: args.key.clone(),
        server_name: args.server_name.clone(),
    };
    Ok(config.load_as(["--ca", "--cert", "--key"].map(str::to_owned))?)
}

/// Connects to a gRPC endpoint: `https://` with `tls` (required), `http://` in plaintext
/// (refused when TLS flags were given, so `--ca` never silently means nothing).
///
/// # Errors
/// An invalid URL, `https://` without `--ca`, TLS flags with `http://`, or a failed
/// connection, naming the URL.
pub async fn connect_with(url: &str, tls: Option<&ClientTls>) -> Result<Channel> {
    warn_if_plaintext_remote(url);
    ckf_svc_kit::tls::endpoint(url, tls, true)?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| anyhow!("{}", error_chain(&e)))
        .with_context(|| format!("cannot connect to {url}"))
}

/// The token of `--token-file`, if given.
///
/// # Errors
/// An unreadable file or one that is not a token (empty, several lines), naming the path.
pub fn token_of(file: Option<&Path>) -> Result<Option<Secret>> {
    file.map(|path| read_token_file("--token-file", path).map_err(|e| anyhow!("{e}")))
        .transpose()
}

/// A hint for the usual causes of a connection error whose text is `chain` (an error with its
/// sources) on a connection to `url`, made with or without a client certificate: the TLS
/// failures a first deployment meets, which the error names only in rustls' or h2's terms (or,
/// for a refused client certificate under TLS 1.3, only as a broken pipe: the server's alert
/// comes after the client considers the handshake done).
pub fn hint(chain: &str, url: &str, client_certificate: bool) -> Option<&'static str> {
    let text = chain.to_ascii_lowercase();
    let has = |needles: &[&str]| needles.iter().any(|n| text.contains(n));
    let cut = has(&[
        "connection reset",
        "frame with invalid size",
        "broken pipe",
        "unexpected eof",
        "connection closed",
        // hyper cancels a request queued on a connection the server closed before it was
        // ready (a TLS listener reading a plaintext preface): the same cut, seen earlier.
        "connection was not ready",
    ]);
    let https = ckf_svc_kit::tls::is_https(url);
    if has(&[
        "ckf.v1.query: unauthenticated",
        "ckf.v1.query: no credentials",
    ]) || (has(&["query"]) && has(&["no credentials", "bearer token matches no"]))
    {
        return Some(
            "the indexer's Query needs its bearer token: pass --token-file FILE (the file of \
             its auth.query_token_file)",
        );
    }
    if has(&["ingest"]) && has(&["no credentials", "bearer token matches no"]) {
        return Some(
            "the producers' Ingest needs a source's bearer token: pass --ingest-token-file FILE \
             (an [[ingest_auth.sources]] token_file)",
        );
    }
    if has(&["certificaterequired", "certificate required"])
        || (https && cut && !client_certificate)
    {
        Some(
            "the server may require a client certificate (mutual TLS): pass --cert and --key \
             (e.g. query.crt / query.key from `ckf certs`)",
        )
    } else if has(&["unknownissuer", "unknown issuer", "badsignature"]) {
        Some("the server's certificate is not signed by the CA of --ca: pass the CA that issued it")
    } else if has(&[
        "decrypterror",
        "decrypt error",
        "badcertificate",
        "bad certificate",
    ]) {
        Some(
            "the TLS handshake failed on a certificate: the server may not trust the CA of \
             --cert, or the server's certificate is not from the CA of --ca",
        )
    } else if has(&["notvalidforname", "not valid for name"]) {
        Some(
            "the server's certificate does not name the host of the URL: use a name it has, or \
             --server-name",
        )
    } else if has(&["expired", "notvalidyet"]) {
        Some("a certificate is outside its validity period: re-issue it (`ckf certs --reissue`)")
    } else if has(&[
        "corrupt message",
        "invalidcontenttype",
        "wrong version number",
    ]) {
        Some("the server does not speak TLS: use an http:// URL (and no --ca)")
    } else if cut && !https {
        Some(
            "the connection was cut during the handshake: if the server serves TLS, use an \
             https:// URL with --ca (and --cert/--key when it requires client certificates)",
        )
    } else if cut {
        Some(
            "the server cut the connection: its log says why (a client certificate from another \
             CA or mapping to no principal, a connection limit)",
        )
    } else {
        None
    }
}

/// A Query channel: `channel` sending `token` and, when given, the indexer `domain` asked
/// about (`ckf-domain`) with every call.
///
/// # Errors
/// A domain that cannot be metadata (the indexer checks the name itself).
pub fn query_channel(
    channel: Channel,
    token: Option<Secret>,
    domain: Option<&str>,
) -> Result<ckf_svc_kit::access::AuthedChannel> {
    use ckf_svc_kit::access::{authed, authed_with};
    match domain {
        None => Ok(authed(channel, token)),
        Some(domain) => authed_with(channel, token, ckf_proto::metadata::DOMAIN_KEY, domain)
            .map_err(|e| anyhow!("--domain: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::hint;

    /// The texts tonic and hyper gave for a plaintext client on a TLS listener, seen in CI
    /// runs: each depends on when the server's close reaches the client.
    #[test]
    fn a_plaintext_client_cut_by_a_tls_listener_gets_the_https_hint() {
        for chain in [
            "ListLanes: transport error: connection reset by peer",
            "ListLanes: transport error: broken pipe",
            "ListLanes: code: 'The operation was cancelled', message: \"operation was canceled\", \
             source: tonic::transport::Error(Transport, hyper::Error(Canceled, \"connection was \
             not ready\")): transport error: operation was canceled: connection was not ready",
        ] {
            let got = hint(chain, "http://127.0.0.1:1", false).unwrap_or("");
            assert!(
                got.contains("use an https:// URL with --ca"),
                "{chain}: {got}"
            );
        }
    }

    /// The same cut over https, without a client certificate, points at mutual TLS; an
    /// unrelated error gets no hint.
    #[test]
    fn cuts_over_https_point_at_client_certificates_and_other_errors_get_none() {
        let cut = "transport error: operation was canceled: connection was not ready";
        assert!(
            hint(cut, "https://h:1", false)
                .unwrap()
                .contains("client certificate")
        );
        assert_eq!(
            hint(
                "status: NotFound, message: \"no lane\"",
                "http://h:1",
                false
            ),
            None
        );
    }
}
