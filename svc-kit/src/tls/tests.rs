//! Loader errors with their precise messages, the start rules, and real handshakes through
//! [`ServerTls::accept`] + [`serve_router`] (mTLS, a foreign CA, plaintext, reload).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use super::*;
use crate::shutdown::Shutdown;

/// A test CA that issues leaves.
struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.self_signed(&key).unwrap();
        Self {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// (certificate PEM, key PEM) of a leaf with DNS SANs `sans` and common name `cn`.
    fn leaf(&self, sans: &[&str], cn: &str) -> (String, String) {
        self.leaf_valid(sans, cn, None)
    }

    /// As [`Ca::leaf`], valid from `years.0` to `years.1` (January 1st) when given.
    fn leaf_valid(&self, sans: &[&str], cn: &str, years: Option<(i32, i32)>) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(sans.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        if let Some((from, until)) = years {
            params.not_before = rcgen::date_time_ymd(from, 1, 1);
            params.not_after = rcgen::date_time_ymd(until, 1, 1);
        }
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// Writes `text` to `dir/name` and returns the path.
fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn server_config(cert: &Path, key: &Path, ca: Option<&Path>) -> ServerTlsConfig {
    ServerTlsConfig {
        cert_file: Some(cert.to_owned()),
        key_file: Some(key.to_owned()),
        client_ca_file: ca.map(Path::to_owned),
        ..ServerTlsConfig::default()
    }
}

/// A test CA (written to `dir/ca.crt`) and a `localhost` server config verifying client
/// certificates against it, `client_auth = optional`.
fn optional_mtls_server(dir: &Path) -> (PathBuf, ServerTlsConfig) {
    let ca = Ca::new("ckf test CA");
    let (cert, key) = ca.leaf(&["localhost"], "indexer");
    let ca_file = write(dir, "ca.crt", &ca.pem);
    let cert = write(dir, "server.crt", &cert);
    let key = write(dir, "server.key", &key);
    let config = ServerTlsConfig {
        client_auth: ClientAuth::Optional,
        ..server_config(&cert, &key, Some(&ca_file))
    };
    (ca_file, config)
}

fn load_error(config: &ServerTlsConfig) -> String {
    ServerTls::load(config, "tls").unwrap_err().to_string()
}

#[test]
fn a_missing_file_names_the_key_and_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("ca");
    let (cert, key) = ca.leaf(&["localhost"], "server");
    let key = write(dir.path(), "server.key", &key);
    let missing = dir.path().join("nope.crt");
    let text = load_error(&server_config(&missing, &key, None));
    assert_eq!(
        text,
        format!(
            "tls.cert_file = {}: cannot read the file: No such file or directory (os error 2)",
            missing.display()
        )
    );
    let cert = write(dir.path(), "server.crt", &cert);
    let missing_ca = dir.path().join("ca.crt");
    let text = load_error(&server_config(&cert, &key, Some(&missing_ca)));
    assert!(
        text.starts_with(&format!(
            "tls.client_ca_file = {}: cannot read the file",
            missing_ca.display()
        )),
        "{text}"
    );
}

#[test]
fn bad_pem_and_files_without_the_expected_item_say_so() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("ca");
    let (cert_pem, key_pem) = ca.leaf(&["localhost"], "server");
    let cert = write(dir.path(), "server.crt", &cert_pem);
    let key = write(dir.path(), "server.key", &key_pem);

    // A section that never ends.
    let truncated = write(dir.path(), "truncated.crt", &cert_pem[..cert_pem.len() / 2]);
    let text = load_error(&server_config(&truncated, &key, None));
    assert!(
        text.starts_with(&format!(
            "tls.cert_file = {}: not valid PEM:",
            truncated.display()
        )),
        "{text}"
    );

    // No certificate at all (a key where the certificate should be).
    let text = load_error(&server_config(&key, &key, None));
    assert_eq!(
        text,
        format!(
            "tls.cert_file = {}: no certificate in the file (expected PEM \"BEGIN CERTIFICATE\" \
             sections)",
            key.display()
        )
    );

    // No key (a certificate where the key should be).
    let text = load_error(&server_config(&cert, &cert, None));
    assert!(
        text.starts_with(&format!(
            "tls.key_file = {}: no private key in the file",
            cert.display()
        )),
        "{text}"
    );

    // Garbage inside the armour.
    let garbage = write(
        dir.path(),
        "garbage.crt",
        "-----BEGIN CERTIFICATE-----\n!!!not base64!!!\n-----END CERTIFICATE-----\n",
    );
    let text = load_error(&server_config(&garbage, &key, None));
    assert!(
        text.starts_with(&format!(
            "tls.cert_file = {}: not valid PEM",
            garbage.display()
        )),
        "{text}"
    );
}

#[test]
fn a_key_of_another_certificate_is_a_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("ca");
    let (cert, _) = ca.leaf(&["localhost"], "server");
    let (_, other_key) = ca.leaf(&["localhost"], "other");
    let cert = write(dir.path(), "server.crt", &cert);
    let key = write(dir.path(), "other.key", &other_key);
    let text = load_error(&server_config(&cert, &key, None));
    assert_eq!(
        text,
        format!(
            "tls.key_file = {}: the private key does not match the certificate in \
             tls.cert_file = {}",
            key.display(),
            cert.display()
        )
    );
    // The client side reports the same mismatch under its own keys.
    let ca_file = write(dir.path(), "ca.crt", &ca.pem);
    let client = ClientTlsConfig {
        ca_file: Some(ca_file),
        cert_file: Some(cert.clone()),
        key_file: Some(key.clone()),
        server_name: None,
    };
    let text = client.load("indexer_tls").unwrap_err().to_string();
    assert!(
        text.starts_with(&format!(
            "indexer_tls.key_file = {}: the private key does not match",
            key.display()
        )),
        "{text}"
    );
}

#[test]
fn certificates_outside_their_validity_are_refused_at_start_and_on_reload() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("ca");
    let (expired_pem, expired_key_pem) = ca.leaf_valid(&["localhost"], "old", Some((2000, 2001)));
    let expired = write(dir.path(), "expired.crt", &expired_pem);
    let expired_key = write(dir.path(), "expired.key", &expired_key_pem);
    let text = load_error(&server_config(&expired, &expired_key, None));
    assert!(
        text.starts_with(&format!(
            "tls.cert_file = {}: the certificate is not valid now (",
            expired.display()
        )) && text.contains("valid from Jan  1 00:00:00 2000 +00:00 until Jan  1 00:00:00 2001"),
        "{text}"
    );
    let (future_pem, future_key_pem) = ca.leaf_valid(&["localhost"], "new", Some((2990, 2999)));
    let future = write(dir.path(), "future.crt", &future_pem);
    let future_key = write(dir.path(), "future.key", &future_key_pem);
    let err = ServerTls::load(&server_config(&future, &future_key, None), "tls").unwrap_err();
    assert!(matches!(err, TlsError::OutsideValidity { .. }), "{err}");

    // The client side: its own certificate, and a CA file whose only root has expired.
    let ca_file = write(dir.path(), "ca.crt", &ca.pem);
    let client = |ca_file: &Path, cert: Option<(&Path, &Path)>| ClientTlsConfig {
        ca_file: Some(ca_file.to_owned()),
        cert_file: cert.map(|c| c.0.to_owned()),
        key_file: cert.map(|c| c.1.to_owned()),
        server_name: None,
    };
    let text = client(&ca_file, Some((&expired, &expired_key)))
        .load("indexer_tls")
        .unwrap_err()
        .to_string();
    assert!(
        text.starts_with(&format!(
            "indexer_tls.cert_file = {}: the certificate is not valid now",
            expired.display()
        )),
        "{text}"
    );
    let old_root = {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.not_before = rcgen::date_time_ymd(2000, 1, 1);
        params.not_after = rcgen::date_time_ymd(2001, 1, 1);
        params.self_signed(&key).unwrap().pem()
    };
    let old_ca_file = write(dir.path(), "old-ca.crt", &old_root);
    let text = client(&old_ca_file, None)
        .load("indexer_tls")
        .unwrap_err()
        .to_string();
    assert!(
        text.starts_with(&format!(
            "indexer_tls.ca_file = {}: the certificate is not valid now",
            old_ca_file.display()
        )),
        "{text}"
    );
    // A bundle with the expired root beside a valid one is accepted (a rotation in progress).
    let bundle = write(dir.path(), "bundle.crt", &format!("{old_root}{}", ca.pem));
    client(&bundle, None).load("indexer_tls").unwrap().unwrap();
    let (leaf_pem, leaf_key_pem) = ca.leaf(&["localhost"], "server");
    let leaf = write(dir.path(), "leaf.crt", &leaf_pem);
    let leaf_key = write(dir.path(), "leaf.key", &leaf_key_pem);
    let err =
        ServerTls::load(&server_config(&leaf, &leaf_key, Some(&old_ca_file)), "tls").unwrap_err();
    assert!(
        err.to_string().starts_with("tls.client_ca_file = ")
            && matches!(err, TlsError::OutsideValidity { .. }),
        "{err}"
    );

    // On reload an expired replacement is refused and the served certificate stays.
    let tls = ServerTls::load(&server_config(&leaf, &leaf_key, None), "tls")
        .unwrap()
        .unwrap();
    let served = tls.current();
    std::fs::copy(&expired, &leaf).unwrap();
    std::fs::copy(&expired_key, &leaf_key).unwrap();
    let err = tls.reload().unwrap_err();
    assert!(matches!(err, TlsError::OutsideValidity { .. }), "{err}");
    assert!(Arc::ptr_eq(&served, &tls.current()));
}

#[test]
fn start_rules_name_the_keys() {
    let public: SocketAddr = "0.0.0.0:7400".parse().unwrap();
    let loopback: SocketAddr = "127.0.0.1:7400".parse().unwrap();
    let none = ServerTlsConfig::default();
    none.check("tls", &[("listen", loopback)]).unwrap();
    assert_eq!(none.transport(loopback), Transport::PlaintextLoopback);
    let text = none
        .check("tls", &[("listen", loopback), ("query_listen", public)])
        .unwrap_err()
        .to_string();
    assert!(
        text.starts_with("query_listen = 0.0.0.0:7400: is not a loopback address"),
        "{text}"
    );
    assert!(text.contains("tls.cert_file and tls.key_file"), "{text}");
    assert!(text.contains("tls.plaintext = true"), "{text}");

    let plaintext = ServerTlsConfig {
        plaintext: true,
        ..ServerTlsConfig::default()
    };
    plaintext.check("tls", &[("listen", public)]).unwrap();
    assert_eq!(plaintext.transport(public), Transport::PlaintextExplicit);

    let cert_only = ServerTlsConfig {
        cert_file: Some("a.crt".into()),
        ..ServerTlsConfig::default()
    };
    let text = cert_only.check("tls", &[]).unwrap_err().to_string();
    assert_eq!(
        text,
        "tls.key_file = (unset): is required with tls.cert_file"
    );
    let both = ServerTlsConfig {
        key_file: Some("a.key".into()),
        plaintext: true,
        ..cert_only.clone()
    };
    let text = both.check("tls", &[]).unwrap_err().to_string();
    assert!(
        text.starts_with("tls.plaintext = true: conflicts with tls.cert_file"),
        "{text}"
    );
    let tls = ServerTlsConfig {
        plaintext: false,
        ..both
    };
    tls.check("tls", &[("listen", public)]).unwrap();
    assert_eq!(tls.transport(public), Transport::Tls);
    let optional = ServerTlsConfig {
        client_auth: ClientAuth::Optional,
        ..tls.clone()
    };
    let text = optional.check("tls", &[]).unwrap_err().to_string();
    assert!(
        text.starts_with("tls.client_auth = optional: only applies with tls.client_ca_file"),
        "{text}"
    );
    let ca_without_cert = ServerTlsConfig {
        client_ca_file: Some("ca.crt".into()),
        ..ServerTlsConfig::default()
    };
    let text = ca_without_cert.check("tls", &[]).unwrap_err().to_string();
    assert!(
        text.starts_with("tls.client_ca_file = ca.crt: client certificates need TLS"),
        "{text}"
    );
    let fast = ServerTlsConfig {
        reload_interval_ms: 5,
        ..tls
    };
    let text = fast.check("tls", &[]).unwrap_err().to_string();
    assert!(
        text.starts_with("tls.reload_interval_ms = 5: must be 0"),
        "{text}"
    );
}

#[test]
fn https_without_trust_roots_fails_closed() {
    let none = ClientTlsConfig::default();
    none.check(
        "indexer_tls",
        &[("indexers".into(), "http://10.1.2.3:7400")],
    )
    .unwrap();
    let text = none
        .check(
            "indexer_tls",
            &[("indexers[0]".into(), "https://indexer:7400")],
        )
        .unwrap_err()
        .to_string();
    assert!(
        text.starts_with("indexers[0] = https://indexer:7400: https:// needs trust roots: set indexer_tls.ca_file"),
        "{text}"
    );
    let err = endpoint("https://indexer:7400", None, false).unwrap_err();
    assert!(
        matches!(err, EndpointError::HttpsWithoutRoots { .. }),
        "{err}"
    );
    assert!(endpoint("http://127.0.0.1:7400", None, true).is_ok());
    assert!(is_loopback_url("http://127.0.0.1:1"));
    assert!(is_loopback_url("http://[::1]:1"));
    assert!(is_loopback_url("https://LOCALHOST:1"));
    assert!(!is_loopback_url("http://indexer:1"));
    assert!(is_https("HTTPS://x:1"));
    assert!(!is_https("http://x:1"));
}

#[test]
fn names_are_sans_then_the_common_name_once() {
    let ca = Ca::new("ca");
    let (pem, _) = ca.leaf(&["producer.dc-a.ckf", "localhost"], "producer.dc-a.ckf");
    let der = CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
    assert_eq!(
        cert_names(der.as_ref()),
        vec!["producer.dc-a.ckf", "localhost"]
    );
    let (pem, _) = ca.leaf(&["a.example"], "the cn");
    let der = CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
    assert_eq!(cert_names(der.as_ref()), vec!["a.example", "the cn"]);
    assert!(cert_names(b"not a certificate").is_empty());
}

/// A TLS health server on loopback whose interceptor records [`peer_names`] of every call.
struct TestServer {
    addr: SocketAddr,
    tls: ServerTls,
    names: Arc<Mutex<Vec<Vec<String>>>>,
    stop: Shutdown,
}

async fn start_server(config: &ServerTlsConfig) -> TestServer {
    let tls = ServerTls::load(config, "tls").unwrap().unwrap();
    let listener = crate::grpc::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let (_reporter, health) = crate::grpc::health(&[]).await;
    let names = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&names);
    // The health service behind an interceptor that records the peer's names.
    let service = tonic::service::interceptor::InterceptedService::new(
        health,
        move |req: tonic::Request<()>| {
            seen.lock().unwrap().push(peer_names(&req));
            Ok(req)
        },
    );
    let stop = Shutdown::new();
    let router = tonic::transport::Server::builder().add_service(service);
    let served = tls.clone();
    let wait = stop.wait();
    tokio::spawn(async move {
        serve_router(router, listener.incoming, Some(&served), wait)
            .await
            .unwrap();
    });
    TestServer {
        addr: listener.addr,
        tls,
        names,
        stop,
    }
}

/// A client TLS config trusting `ca` (PEM path), with an optional client certificate.
fn client(ca: &Path, identity: Option<(&Path, &Path)>) -> ClientTls {
    ClientTlsConfig {
        ca_file: Some(ca.to_owned()),
        cert_file: identity.map(|(c, _)| c.to_owned()),
        key_file: identity.map(|(_, k)| k.to_owned()),
        server_name: Some("localhost".into()),
    }
    .load("client")
    .unwrap()
    .unwrap()
}

async fn check(addr: SocketAddr, tls: Option<&ClientTls>) -> Result<(), String> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let channel = endpoint(&format!("{scheme}://{addr}"), tls, true)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .map(|_| ())
        .map_err(|s| format!("check: {s:?}"))
}

#[tokio::test]
async fn mutual_tls_verifies_the_client_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("ckf test CA");
    let (cert, key) = ca.leaf(&["localhost"], "indexer");
    let (client_cert, client_key) = ca.leaf(&["producer.dc-a.ckf"], "producer.dc-a.ckf");
    let ca_file = write(dir.path(), "ca.crt", &ca.pem);
    let cert = write(dir.path(), "server.crt", &cert);
    let key = write(dir.path(), "server.key", &key);
    let client_cert = write(dir.path(), "client.crt", &client_cert);
    let client_key = write(dir.path(), "client.key", &client_key);
    let server = start_server(&server_config(&cert, &key, Some(&ca_file))).await;

    check(
        server.addr,
        Some(&client(&ca_file, Some((&client_cert, &client_key)))),
    )
    .await
    .unwrap();
    assert_eq!(
        *server.names.lock().unwrap(),
        vec![vec!["producer.dc-a.ckf".to_owned()]]
    );

    // Without a client certificate, with one from another CA, and in plaintext: refused
    // before any call reaches the service.
    let err = check(server.addr, Some(&client(&ca_file, None)))
        .await
        .unwrap_err();
    assert!(err.contains("connect") || err.contains("check"), "{err}");
    let other = Ca::new("another CA");
    let (foreign_cert, foreign_key) = other.leaf(&["producer.dc-a.ckf"], "producer.dc-a.ckf");
    let foreign_cert = write(dir.path(), "foreign.crt", &foreign_cert);
    let foreign_key = write(dir.path(), "foreign.key", &foreign_key);
    check(
        server.addr,
        Some(&client(&ca_file, Some((&foreign_cert, &foreign_key)))),
    )
    .await
    .unwrap_err();
    check(server.addr, None).await.unwrap_err();
    assert_eq!(
        server.names.lock().unwrap().len(),
        1,
        "refused clients reached the service"
    );
    server.stop.trigger();
}

#[tokio::test]
async fn optional_client_auth_admits_anonymous_clients_with_no_names() {
    let dir = tempfile::tempdir().unwrap();
    let (ca_file, config) = optional_mtls_server(dir.path());
    let server = start_server(&config).await;
    check(server.addr, Some(&client(&ca_file, None)))
        .await
        .unwrap();
    assert_eq!(*server.names.lock().unwrap(), vec![Vec::<String>::new()]);
    server.stop.trigger();
}

#[tokio::test]
async fn reload_serves_the_new_certificate_to_new_connections_only() {
    let dir = tempfile::tempdir().unwrap();
    let old_ca = Ca::new("old CA");
    let new_ca = Ca::new("new CA");
    let (cert_pem, key_pem) = old_ca.leaf(&["localhost"], "indexer");
    let old_ca_file = write(dir.path(), "old-ca.crt", &old_ca.pem);
    let new_ca_file = write(dir.path(), "new-ca.crt", &new_ca.pem);
    let cert = write(dir.path(), "server.crt", &cert_pem);
    let key = write(dir.path(), "server.key", &key_pem);
    let server = start_server(&server_config(&cert, &key, None)).await;
    let old_client = client(&old_ca_file, None);
    let channel = endpoint(&format!("https://{}", server.addr), Some(&old_client), true)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut established = HealthClient::new(channel);
    let ping = || HealthCheckRequest {
        service: String::new(),
    };
    established.check(ping()).await.unwrap();

    // A bad replacement (the key of another certificate) is refused and changes nothing.
    let (new_cert_pem, new_key_pem) = new_ca.leaf(&["localhost"], "indexer");
    std::fs::write(&cert, &new_cert_pem).unwrap();
    let err = server.tls.reload().unwrap_err();
    assert!(matches!(err, TlsError::KeyMismatch { .. }), "{err}");
    check(server.addr, Some(&old_client)).await.unwrap();

    std::fs::write(&key, &new_key_pem).unwrap();
    server.tls.reload().unwrap();
    check(server.addr, Some(&client(&new_ca_file, None)))
        .await
        .unwrap();
    check(server.addr, Some(&old_client)).await.unwrap_err();
    // The connection made before the reload keeps its session.
    established.check(ping()).await.unwrap();
    server.stop.trigger();
}

#[tokio::test]
async fn a_file_change_is_picked_up_by_the_reloader_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let old_ca = Ca::new("old CA");
    let new_ca = Ca::new("new CA");
    let (cert_pem, key_pem) = old_ca.leaf(&["localhost"], "indexer");
    let new_ca_file = write(dir.path(), "new-ca.crt", &new_ca.pem);
    let cert = write(dir.path(), "server.crt", &cert_pem);
    let key = write(dir.path(), "server.key", &key_pem);
    let config = ServerTlsConfig {
        reload_interval_ms: 100,
        ..server_config(&cert, &key, None)
    };
    let server = start_server(&config).await;
    let registry = prometheus::Registry::new();
    let counter =
        crate::metrics::counter_vec(&registry, "t_tls_reload_total", "reloads", &["result"]);
    server
        .tls
        .spawn_reloader(Some(counter.clone()), server.stop.clone());

    // Written atomically (rename) so the reloader never sees half a pair.
    let (new_cert_pem, new_key_pem) = new_ca.leaf(&["localhost"], "indexer");
    let staged_key = write(dir.path(), "staged.key", &new_key_pem);
    let staged_cert = write(dir.path(), "staged.crt", &new_cert_pem);
    std::fs::rename(&staged_key, &key).unwrap();
    std::fs::rename(&staged_cert, &cert).unwrap();
    let new_client = client(&new_ca_file, None);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while check(server.addr, Some(&new_client)).await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "new certificate never served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(counter.with_label_values(&["ok"]).get() >= 1);

    // A broken file: counted as an error, the new certificate stays. (The two renames above
    // may have been seen apart, as a key mismatch: count from here.)
    let errors = counter.with_label_values(&["error"]).get();
    std::fs::write(&cert, "garbage").unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while counter.with_label_values(&["error"]).get() == errors {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the bad file was never noticed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    check(server.addr, Some(&new_client)).await.unwrap();
    server.stop.trigger();
}

/// The idle deadline under TLS: the stream tracking reads the decrypted frames (the
/// [`crate::transport::PrefaceWatch`] above TLS), not the TLS records below. A health `Watch`
/// keeps its connection past several idle timeouts; once it ends, the connection is closed.
#[tokio::test]
async fn under_tls_an_open_stream_keeps_its_connection_and_an_idle_one_is_closed() {
    use crate::transport::{REFUSED_HANDSHAKE_TIMEOUT, REFUSED_IDLE_TIMEOUT, TransportConfig};
    let dir = tempfile::tempdir().unwrap();
    let (ca_file, config) = optional_mtls_server(dir.path());
    let tls = ServerTls::load(&config, "tls").unwrap().unwrap();
    let transport = crate::Transport::new(
        &TransportConfig {
            idle_timeout_ms: 300,
            ..TransportConfig::default()
        },
        &prometheus::Registry::new(),
        "ckf_test",
        &[],
    )
    .unwrap();
    let listener = crate::grpc::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = listener.addr;
    let (_reporter, health) = crate::grpc::health(&[]).await;
    let router = tonic::transport::Server::builder().add_service(health);
    let stop = Shutdown::new();
    let wait = stop.wait();
    let incoming = transport.incoming(listener.incoming);
    tokio::spawn(async move {
        serve_router(router, incoming, Some(&tls), wait)
            .await
            .unwrap();
    });
    let refused = |reason: &str| transport.metrics.refused.with_label_values(&[reason]).get();
    let established = || {
        transport
            .metrics
            .connections
            .with_label_values(&["established"])
            .get()
    };

    let channel = endpoint(
        &format!("https://{addr}"),
        Some(&client(&ca_file, None)),
        true,
    )
    .unwrap()
    .connect()
    .await
    .unwrap();
    let mut health = HealthClient::new(channel);
    let mut watch = health
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    watch.message().await.unwrap().expect("the first status");
    tokio::time::sleep(Duration::from_millis(1_200)).await; // four idle timeouts
    assert_eq!(refused(REFUSED_IDLE_TIMEOUT), 0, "an open stream was cut");
    assert_eq!(established(), 1);

    drop(watch);
    for _ in 0..500 {
        if refused(REFUSED_IDLE_TIMEOUT) == 1 && established() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        refused(REFUSED_IDLE_TIMEOUT),
        1,
        "the idle connection was not closed"
    );
    assert_eq!(established(), 0);
    assert_eq!(refused(REFUSED_HANDSHAKE_TIMEOUT), 0);
    stop.trigger();
}
