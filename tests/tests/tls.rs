//! TLS with the real binaries: certificates from `ckf certs`, an indexer and producers serving
//! TLS (mutual TLS on the Relay), refusals at start (exit 2), refused clients (plaintext,
//! foreign CA), and a certificate reload on SIGHUP that new connections see while an open relay
//! stream keeps its lease.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use ckf_e2e::cluster::{BUCKETS, DOMAIN, SEED, TestDir, event, is_active};
use ckf_e2e::wait::{DEADLINE, eventually};
use ckf_e2e::{Service, binary, metrics};
use ckf_proto::v1::{self, ingest_client::IngestClient, kv_event::Kind, query_client::QueryClient};
use ckf_svc_kit::tls::{
    ClientTls, ClientTlsConfig, cert_names, cert_serial, endpoint, read_certificates,
};
use tokio_rustls::rustls;
use tonic::transport::Channel;

/// Runs `ckf certs --out dir --pools dc-a,dc-b` plus `extra`; panics unless it succeeds.
fn ckf_certs(dir: &Path, extra: &[&str]) {
    let out = ckf(&[
        &[
            "certs",
            "--out",
            dir.to_str().unwrap(),
            "--pools",
            "dc-a,dc-b",
        ],
        extra,
    ]
    .concat());
    assert!(
        out.status.success(),
        "ckf certs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn ckf(args: &[&str]) -> Output {
    Command::new(binary("ckf"))
        .args(args)
        .output()
        .expect("run ckf")
}

/// A started service and the addresses it logged.
struct Running {
    svc: Service,
    grpc: SocketAddr,
    metrics: SocketAddr,
}

/// Starts `ckf-indexer` with `tls_toml` as its `[tls]` section (lanes dc-a, dc-b).
fn start_indexer(dir: &TestDir, name: &str, tls_toml: &str) -> Running {
    start_indexer_with(dir, name, "", tls_toml, &[])
}

/// [`start_indexer`] with the top-level keys `top` first in its file (`listen` comes after
/// them) and `flags` after `--config`.
fn start_indexer_with(
    dir: &TestDir,
    name: &str,
    top: &str,
    tls_toml: &str,
    flags: &[&str],
) -> Running {
    let toml = format!(
        "{top}listen = \"127.0.0.1:0\"\nmetrics_listen = \"127.0.0.1:0\"\nlog_format = \"json\"\n\
         [manifest]\ndomain = \"{DOMAIN}\"\nlanes = [\"dc-a\", \"dc-b\"]\n\
         [table]\nbucket_count = {BUCKETS}\nseed = {SEED}\n\
         [lag]\nheartbeat_deadline_ms = 5000\n[tls]\n{tls_toml}"
    );
    let config = dir.path().join(format!("{name}.toml"));
    std::fs::write(&config, toml).unwrap();
    let mut args = vec!["--config".to_owned(), config.display().to_string()];
    args.extend(flags.iter().map(|&f| f.to_owned()));
    let mut svc = Service::spawn(name, &binary("ckf-indexer"), &args, dir.path());
    let record = svc
        .wait_for_record("ckf-indexer serving", DEADLINE)
        .unwrap_or_else(|e| panic!("ckf-indexer: {e}"));
    Running {
        svc,
        grpc: addr(&record, "grpc_addr"),
        metrics: addr(&record, "metrics_addr"),
    }
}

/// Starts `ckf-producer` of `dc` publishing to `indexer` with `extra_toml` appended (its
/// `[tls]` / `[indexer_tls]` sections).
fn start_producer(dir: &TestDir, name: &str, dc: &str, indexer: &str, extra_toml: &str) -> Running {
    start_producer_with(dir, name, dc, indexer, "", extra_toml, &[])
}

/// [`start_producer`] with the top-level keys `top` first in its file and `flags` after
/// `--config`.
fn start_producer_with(
    dir: &TestDir,
    name: &str,
    dc: &str,
    indexer: &str,
    top: &str,
    extra_toml: &str,
    flags: &[&str],
) -> Running {
    let toml = format!(
        "{top}listen = \"127.0.0.1:0\"\nmetrics_listen = \"127.0.0.1:0\"\nlog_format = \"json\"\n\
         indexers = [\"{indexer}\"]\n[pool]\ndomain = \"{DOMAIN}\"\ndc = \"{dc}\"\n\
         [table]\nbucket_count = {BUCKETS}\nseed = {SEED}\n\
         [publication]\nbatch_threshold = 64\nmax_delay_ms = 5\nheartbeat_interval_ms = 200\n\
         [reconnect]\ninitial_backoff_ms = 50\nmax_backoff_ms = 500\nconnect_timeout_ms = 3000\n\
         {extra_toml}"
    );
    let config = dir.path().join(format!("{name}.toml"));
    std::fs::write(&config, toml).unwrap();
    let mut args = vec!["--config".to_owned(), config.display().to_string()];
    args.extend(flags.iter().map(|&f| f.to_owned()));
    let mut svc = Service::spawn(name, &binary("ckf-producer"), &args, dir.path());
    let record = svc
        .wait_for_record("producer started", DEADLINE)
        .unwrap_or_else(|e| panic!("ckf-producer: {e}"));
    Running {
        svc,
        grpc: addr(&record, "ingest_addr"),
        metrics: addr(&record, "metrics_addr"),
    }
}

fn addr(record: &serde_json::Value, field: &str) -> SocketAddr {
    record[field]
        .as_str()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("record without {field}: {record}"))
}

/// The `[tls]` lines of a server with `stem.crt` / `stem.key` from `certs`, verifying client
/// certificates against the CA when `mtls`.
fn server_tls(certs: &Path, stem: &str, mtls: bool) -> String {
    let mut toml = format!(
        "cert_file = {:?}\nkey_file = {:?}\nreload_interval_ms = 0\n",
        certs.join(format!("{stem}.crt")),
        certs.join(format!("{stem}.key"))
    );
    if mtls {
        toml.push_str(&format!("client_ca_file = {:?}\n", certs.join("ca.crt")));
    }
    toml
}

/// Client TLS trusting `ca_dir`'s CA, presenting `identity_dir/stem.crt` when given.
fn client_tls(ca_dir: &Path, identity: Option<(&Path, &str)>) -> ClientTls {
    let file = |dir: &Path, stem: &str, ext: &str| dir.join(format!("{stem}.{ext}"));
    ClientTlsConfig {
        ca_file: Some(ca_dir.join("ca.crt")),
        cert_file: identity.map(|(dir, stem)| file(dir, stem, "crt")),
        key_file: identity.map(|(dir, stem)| file(dir, stem, "key")),
        server_name: Some("localhost".into()),
    }
    .load("test")
    .unwrap()
    .unwrap()
}

async fn tls_channel(addr: SocketAddr, tls: &ClientTls) -> Result<Channel, String> {
    endpoint(&format!("https://{addr}"), Some(tls), true)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(3))
        .connect()
        .await
        .map_err(|e| format!("connect {addr}: {e:?}"))
}

async fn list_lanes(channel: Channel) -> Result<v1::ListLanesResponse, String> {
    QueryClient::new(channel)
        .list_lanes(v1::ListLanesRequest {})
        .await
        .map(tonic::Response::into_inner)
        .map_err(|s| format!("ListLanes: {s:?}"))
}

async fn lane(indexer: SocketAddr, tls: &ClientTls, index: u32) -> Result<v1::LaneInfo, String> {
    let lanes = list_lanes(tls_channel(indexer, tls).await?).await?;
    lanes
        .lanes
        .into_iter()
        .find(|l| l.lane == index)
        .ok_or_else(|| format!("no lane {index}"))
}

/// The leaf certificate `addr` serves to a TLS client trusting `ca` (a raw rustls handshake,
/// no HTTP/2), as DER.
async fn served_leaf(addr: SocketAddr, ca: &Path, client: Option<(&Path, &Path)>) -> Vec<u8> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in read_certificates("ca", ca).unwrap() {
        roots.add(cert).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let mut config = match client {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                read_certificates("cert", cert).unwrap(),
                ckf_svc_kit::tls::read_private_key("key", key).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let stream = connector.connect(name, tcp).await.expect("TLS handshake");
    let (_, session) = stream.get_ref();
    session.peer_certificates().expect("server certificate")[0]
        .as_ref()
        .to_vec()
}

fn serial(der: &[u8]) -> String {
    cert_serial(der).expect("a parsable certificate")
}

/// `worker` 1 stores `hashes` through `PublishBatch` on the producer's TLS Ingest.
async fn publish(ingest: SocketAddr, tls: &ClientTls, sequence: u64, hashes: &[u64]) {
    let mut client = IngestClient::new(tls_channel(ingest, tls).await.expect("ingest over TLS"));
    let kind = Kind::Stored(v1::Stored {
        block_hashes: hashes.to_vec(),
        parent_hash: None,
    });
    let result = client
        .publish_batch(v1::KvEventBatch {
            source_id: "e2e".into(),
            sequence,
            events: vec![event(1, kind)],
        })
        .await
        .expect("PublishBatch over TLS")
        .into_inner();
    assert_eq!(
        result.events[0].status(),
        v1::EventStatus::Applied,
        "{result:?}"
    );
}

fn metric(addr: SocketAddr, name: &str, labels: &[(&str, &str)]) -> f64 {
    let text = metrics::scrape(addr).unwrap_or_default();
    metrics::value(&text, name, labels).unwrap_or(0.0)
}

#[tokio::test]
async fn mutual_tls_end_to_end_and_refused_clients() {
    let dir = TestDir::new("tls-mtls");
    let certs = dir.path().join("certs");
    ckf_certs(&certs, &[]);
    let foreign = dir.path().join("foreign");
    ckf_certs(&foreign, &[]);

    let indexer = start_indexer(&dir, "indexer", &server_tls(&certs, "indexer", true));
    let url = format!("https://{}", indexer.grpc);
    let indexer_tls = |stem: &str| {
        format!(
            "[indexer_tls]\nca_file = {:?}\ncert_file = {:?}\nkey_file = {:?}\nserver_name = \"localhost\"\n",
            certs.join("ca.crt"),
            certs.join(format!("{stem}.crt")),
            certs.join(format!("{stem}.key"))
        )
    };
    let producer = start_producer(
        &dir,
        "producer-a",
        "dc-a",
        &url,
        &format!(
            "[tls]\n{}{}",
            server_tls(&certs, "producer-dc-a-ingest", false),
            indexer_tls("producer-dc-a")
        ),
    );
    let query = client_tls(&certs, Some((&certs, "query")));

    // The producer attaches over mutual TLS; events sent to its TLS Ingest reach the lane.
    eventually("lane dc-a active over mTLS", DEADLINE, || async {
        let lane = lane(indexer.grpc, &query, 0).await?;
        if is_active(&lane) {
            Ok(())
        } else {
            Err(format!("{lane:?}"))
        }
    })
    .await;
    let ingest_tls = client_tls(&certs, None);
    publish(producer.grpc, &ingest_tls, 1, &[11, 12, 13]).await;
    eventually("FindMatches over TLS sees the blocks", DEADLINE, || async {
        let channel = tls_channel(indexer.grpc, &query).await?;
        let answer = QueryClient::new(channel)
            .find_matches(v1::FindMatchesRequest {
                block_hashes: vec![11, 12, 13],
            })
            .await
            .map_err(|s| format!("{s:?}"))?
            .into_inner();
        let depth = answer.matches.iter().find(|m| m.lane == 0).map(|m| m.depth);
        if depth == Some(3) {
            Ok(())
        } else {
            Err(format!("{answer:?}"))
        }
    })
    .await;
    // `ckf lanes` over mutual TLS.
    let out = ckf(&[
        "lanes",
        "--indexer",
        &url,
        "--ca",
        certs.join("ca.crt").to_str().unwrap(),
        "--cert",
        certs.join("query.crt").to_str().unwrap(),
        "--key",
        certs.join("query.key").to_str().unwrap(),
        "--server-name",
        "localhost",
    ]);
    assert!(
        out.status.success(),
        "ckf lanes: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("active"));

    // A plaintext client gets nothing from the TLS listener.
    let plain = tonic::transport::Endpoint::from_shared(format!("http://{}", indexer.grpc))
        .unwrap()
        .connect_timeout(Duration::from_secs(3))
        .timeout(Duration::from_secs(3));
    let refused = match plain.connect().await {
        Err(_) => true,
        Ok(channel) => list_lanes(channel).await.is_err(),
    };
    assert!(refused, "a plaintext client was served by the TLS indexer");
    let out = ckf(&["lanes", "--indexer", &format!("http://{}", indexer.grpc)]);
    assert!(!out.status.success(), "ckf lanes in plaintext succeeded");
    // The CLI says why, in an operator's terms.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "hint: the connection was cut during the handshake: if the server serves TLS"
        ),
        "{stderr}"
    );
    let out = ckf(&[
        "health",
        "--endpoint",
        &format!("https://{}", indexer.grpc),
        "--ca",
        certs.join("ca.crt").to_str().unwrap(),
        "--server-name",
        "localhost",
    ]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "health without a client certificate"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("hint: the server may require a client certificate (mutual TLS)"),
        "{stderr}"
    );

    // No client certificate, or one from another CA (even with the right names): refused.
    let anonymous = client_tls(&certs, None);
    let err = match tls_channel(indexer.grpc, &anonymous).await {
        Err(e) => e,
        Ok(channel) => list_lanes(channel).await.unwrap_err(),
    };
    assert!(!err.is_empty());
    let impostor = client_tls(&certs, Some((&foreign, "producer-dc-b")));
    let served = match tls_channel(indexer.grpc, &impostor).await {
        Err(_) => false,
        Ok(channel) => list_lanes(channel).await.is_ok(),
    };
    assert!(!served, "a client certificate of another CA was accepted");

    // A producer for dc-b with the foreign CA's certificate never gets a lease: its
    // connection attempts fail (counted) while its lane stays unassigned.
    let impostor_toml = format!(
        "[indexer_tls]\nca_file = {:?}\ncert_file = {:?}\nkey_file = {:?}\nserver_name = \"localhost\"\n",
        certs.join("ca.crt"),
        foreign.join("producer-dc-b.crt"),
        foreign.join("producer-dc-b.key")
    );
    let impostor = start_producer(&dir, "impostor-b", "dc-b", &url, &impostor_toml);
    eventually("the impostor's attempts fail", DEADLINE, || async {
        let failures = metric(impostor.metrics, "ckf_producer_reconnects_total", &[]);
        if failures >= 3.0 {
            Ok(())
        } else {
            Err(format!("{failures} reconnects"))
        }
    })
    .await;
    let lane_b = lane(indexer.grpc, &query, 1).await.unwrap();
    assert_eq!(lane_b.state(), v1::LaneState::Unassigned, "{lane_b:?}");
    assert_eq!(lane_b.lease_epoch, 0, "{lane_b:?}");
    let lane_a = lane(indexer.grpc, &query, 0).await.unwrap();
    assert!(is_active(&lane_a), "{lane_a:?}");
    drop((impostor, producer, indexer));
}

/// Runs a service binary with `args` and returns its exit code and stderr.
fn refused_start(binary_name: &str, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(binary(binary_name))
        .args(args)
        .env("RUST_LOG", "error")
        .output()
        .expect("run service");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn unsafe_configurations_are_refused_at_start_with_exit_2() {
    // https:// without trust roots: the producer fails closed.
    let (code, stderr) = refused_start(
        "ckf-producer",
        &[
            "--dc",
            "dc-a",
            "--indexer",
            "https://127.0.0.1:1",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("https:// needs trust roots: set indexer_tls.ca_file"),
        "{stderr}"
    );

    // A non-loopback listen address with neither a certificate nor plaintext = true.
    let (code, stderr) = refused_start(
        "ckf-indexer",
        &["--listen", "0.0.0.0:0", "--metrics-listen", "127.0.0.1:0"],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("listen = 0.0.0.0:0: is not a loopback address"),
        "{stderr}"
    );
    assert!(stderr.contains("tls.cert_file"), "{stderr}");
    let (code, stderr) = refused_start(
        "ckf-producer",
        &[
            "--dc",
            "dc-a",
            "--indexer",
            "http://127.0.0.1:1",
            "--listen",
            "0.0.0.0:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("is not a loopback address"), "{stderr}");

    // A certificate file that does not exist: exit 2, naming the key and the path.
    let dir = TestDir::new("tls-refused");
    let missing: PathBuf = dir.path().join("missing.crt");
    let (code, stderr) = refused_start(
        "ckf-indexer",
        &[
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--tls-cert",
            missing.to_str().unwrap(),
            "--tls-key",
            missing.to_str().unwrap(),
        ],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "tls.cert_file = {}: cannot read the file",
            missing.display()
        )),
        "{stderr}"
    );
}

/// Off loopback, TLS is not enough: a Relay, Query or Ingest listener that does not authorize
/// its callers is refused at start naming the settings, unless `insecure` (flag or key), which
/// starts, warns and exports `ckf_*_insecure` = 1; with authorization it starts secure (0).
#[tokio::test]
async fn a_non_loopback_listener_without_authorization_needs_insecure() {
    let dir = TestDir::new("tls-insecure");
    let certs = dir.path().join("certs");
    ckf_certs(&certs, &[]);
    let file = |name: &str| certs.join(name).display().to_string();
    let (indexer_crt, indexer_key) = (file("indexer.crt"), file("indexer.key"));
    let (ingest_crt, ingest_key) = (
        file("producer-dc-a-ingest.crt"),
        file("producer-dc-a-ingest.key"),
    );

    // The indexer: TLS on 0.0.0.0 without client certificates, auth.required or a query
    // token: both of its services are open, and both are named with what closes them.
    let indexer_args = [
        "--listen",
        "0.0.0.0:0",
        "--metrics-listen",
        "127.0.0.1:0",
        "--tls-cert",
        &indexer_crt,
        "--tls-key",
        &indexer_key,
    ];
    let (code, stderr) = refused_start("ckf-indexer", &indexer_args);
    assert_eq!(code, Some(2), "{stderr}");
    for needle in [
        "listen = 0.0.0.0:0: is not a loopback address and serves Relay",
        "and Query",
        "without authorization",
        "for Relay: auth.required = true",
        "for Query: auth.query_token_file, or tls.client_ca_file",
        "insecure = true (--insecure, CKF_INDEXER_INSECURE=true)",
    ] {
        assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
    }
    // Client certificates required close Query; Relay still needs auth.required.
    let ca = file("ca.crt");
    let with_ca = [&indexer_args[..], &["--tls-client-ca", &ca]].concat();
    let (code, stderr) = refused_start("ckf-indexer", &with_ca);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("serves Relay (any client"), "{stderr}");
    assert!(!stderr.contains("Query"), "{stderr}");

    // The producer: Ingest on 0.0.0.0 over TLS without ingest_auth.required.
    let producer_args = [
        "--dc",
        "dc-a",
        "--indexer",
        "http://127.0.0.1:1",
        "--listen",
        "0.0.0.0:0",
        "--metrics-listen",
        "127.0.0.1:0",
        "--tls-cert",
        &ingest_crt,
        "--tls-key",
        &ingest_key,
    ];
    let (code, stderr) = refused_start("ckf-producer", &producer_args);
    assert_eq!(code, Some(2), "{stderr}");
    for needle in [
        "listen = 0.0.0.0:0: is not a loopback address and serves Ingest",
        "for Ingest: ingest_auth.required = true",
        "insecure = true (--insecure, CKF_PRODUCER_INSECURE=true)",
    ] {
        assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
    }

    // insecure: the flag (indexer) and the key (producer). Both start, warn, export 1.
    let tls = server_tls(&certs, "indexer", false);
    let indexer = start_indexer_with(
        &dir,
        "indexer-insecure",
        "",
        &tls,
        &["--listen", "0.0.0.0:0", "--insecure"],
    );
    assert!(indexer.grpc.ip().is_unspecified(), "{}", indexer.grpc);
    let ingest_tls = server_tls(&certs, "producer-dc-a-ingest", false);
    let producer = start_producer_with(
        &dir,
        "producer-insecure",
        "dc-a",
        "http://127.0.0.1:1",
        "insecure = true\n",
        &format!("[tls]\n{ingest_tls}"),
        &["--listen", "0.0.0.0:0"],
    );
    assert!(producer.grpc.ip().is_unspecified(), "{}", producer.grpc);
    for (what, running, gauge, open) in [
        (
            "indexer",
            &indexer,
            "ckf_indexer_insecure",
            "Relay on listen = 0.0.0.0:0",
        ),
        (
            "producer",
            &producer,
            "ckf_producer_insecure",
            "Ingest on listen = 0.0.0.0:0",
        ),
    ] {
        assert_eq!(metric(running.metrics, gauge, &[]), 1.0, "{what}");
        eventually(&format!("the {what}'s insecure WARN"), DEADLINE, || async {
            let log = running.svc.log();
            let warned = log.lines().any(|l| {
                l.contains("\"WARN\"")
                    && l.contains("running INSECURE")
                    && l.contains(open)
                    && l.contains("to close it: ")
            });
            if warned { Ok(()) } else { Err(log) }
        })
        .await;
    }
    drop((indexer, producer));

    // With authorization the same listeners start secure, without the WARN: gauge 0.
    let auth = format!(
        "{}[auth]\nrequired = true\n[[auth.producers]]\nname = \"dc-a\"\npools = [\"dc-a\"]\n\
         cert_names = [\"producer.dc-a.ckf\"]\n",
        server_tls(&certs, "indexer", true)
    );
    let indexer = start_indexer_with(
        &dir,
        "indexer-secure",
        "",
        &auth,
        &["--listen", "0.0.0.0:0"],
    );
    let ingest_auth = format!(
        "[tls]\n{ingest_tls}[ingest_auth]\nrequired = true\n[[ingest_auth.sources]]\n\
         name = \"router\"\ncert_names = [\"query.ckf\"]\nsource_ids = [\"*\"]\nworkers = [\"*\"]\n"
    );
    let producer = start_producer_with(
        &dir,
        "producer-secure",
        "dc-a",
        "http://127.0.0.1:1",
        "",
        &ingest_auth,
        &["--listen", "0.0.0.0:0"],
    );
    for (running, gauge) in [
        (&indexer, "ckf_indexer_insecure"),
        (&producer, "ckf_producer_insecure"),
    ] {
        let text = metrics::scrape(running.metrics).unwrap();
        assert_eq!(metrics::value(&text, gauge, &[]), Some(0.0), "{gauge}");
        assert!(!running.svc.log().contains("running INSECURE"), "{gauge}");
    }
}

#[tokio::test]
async fn sighup_reloads_the_certificate_for_new_connections_and_keeps_open_streams() {
    let dir = TestDir::new("tls-reload");
    let certs = dir.path().join("certs");
    ckf_certs(&certs, &[]);
    let mut indexer = start_indexer(&dir, "indexer", &server_tls(&certs, "indexer", true));
    let url = format!("https://{}", indexer.grpc);
    let producer_toml = format!(
        "[indexer_tls]\nca_file = {:?}\ncert_file = {:?}\nkey_file = {:?}\nserver_name = \"localhost\"\n",
        certs.join("ca.crt"),
        certs.join("producer-dc-a.crt"),
        certs.join("producer-dc-a.key")
    );
    let _producer = start_producer(&dir, "producer-a", "dc-a", &url, &producer_toml);
    let query = client_tls(&certs, Some((&certs, "query")));
    let attached = eventually("lane dc-a active", DEADLINE, || async {
        let lane = lane(indexer.grpc, &query, 0).await?;
        if is_active(&lane) {
            Ok(lane)
        } else {
            Err(format!("{lane:?}"))
        }
    })
    .await;
    let client = Some((certs.join("query.crt"), certs.join("query.key")));
    let client = client.as_ref().map(|(c, k)| (c.as_path(), k.as_path()));
    let before = served_leaf(indexer.grpc, &certs.join("ca.crt"), client).await;
    assert_eq!(cert_names(&before), vec!["indexer", "localhost"]);

    // Re-issue from the same CA under another name; SIGHUP.
    ckf_certs(
        &certs,
        &["--reissue", "--hosts", "indexer-2,localhost,127.0.0.1"],
    );
    indexer.svc.signal(libc::SIGHUP);
    let after = eventually("the re-issued certificate is served", DEADLINE, || async {
        let leaf = served_leaf(indexer.grpc, &certs.join("ca.crt"), client).await;
        if cert_names(&leaf).first().map(String::as_str) == Some("indexer-2") {
            Ok(leaf)
        } else {
            Err(format!("still {:?}", cert_names(&leaf)))
        }
    })
    .await;
    assert_ne!(serial(&before), serial(&after));
    eventually("the reload is counted", DEADLINE, || async {
        let ok = metric(
            indexer.metrics,
            "ckf_indexer_tls_reload_total",
            &[("result", "ok")],
        );
        if ok == 1.0 {
            Ok(())
        } else {
            Err(format!("{ok} ok reloads"))
        }
    })
    .await;
    // The relay stream opened before the reload is the same one: same lease, still active,
    // one lease granted in all.
    let lane_now = lane(indexer.grpc, &query, 0).await.unwrap();
    assert!(is_active(&lane_now), "{lane_now:?}");
    assert_eq!(lane_now.lease_epoch, attached.lease_epoch, "{lane_now:?}");
    assert_eq!(
        metric(indexer.metrics, "ckf_indexer_leases_granted_total", &[]),
        1.0
    );

    // A broken certificate file: the reload fails, is counted, and the served certificate stays.
    std::fs::write(certs.join("indexer.crt"), "not a certificate\n").unwrap();
    indexer.svc.signal(libc::SIGHUP);
    eventually("the failed reload is counted", DEADLINE, || async {
        let errors = metric(
            indexer.metrics,
            "ckf_indexer_tls_reload_total",
            &[("result", "error")],
        );
        if errors == 1.0 {
            Ok(())
        } else {
            Err(format!("{errors} errors"))
        }
    })
    .await;
    let still = served_leaf(indexer.grpc, &certs.join("ca.crt"), client).await;
    assert_eq!(serial(&still), serial(&after));
    assert!(indexer.svc.exited().is_none(), "the indexer died on SIGHUP");
}
