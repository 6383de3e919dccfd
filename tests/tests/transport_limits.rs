//! Transport limits (`[transport]`, `ckf_svc_kit::transport`) against the real binaries:
//! raw TCP connections that never send the HTTP/2 preface are closed after
//! `handshake_timeout_ms` while a real client's queries keep working; a connection over
//! `max_connections` is closed at accept while the held ones keep working; a request over
//! `max_concurrent_requests` is shed at once with `UNAVAILABLE`; a unary request still open
//! after `request_timeout_ms` gets `DEADLINE_EXCEEDED`. Every refusal is counted.
//!
//! Listener isolation and idleness: established idle connections filling `query_listen`'s
//! `max_connections` do not stop a producer attaching on `listen` (each listener has its own
//! permits); connections without an open stream are closed after `idle_timeout_ms` while a
//! producer's Relay stream is kept; Relay streams that never send `Attach` end with
//! `INVALID_ARGUMENT` after the heartbeat deadline, give their `max_concurrent_requests` slot
//! back, and never stop a real producer attaching.

use std::net::SocketAddr;
use std::time::Duration;

use ckf_e2e::check::wait_converged;
use ckf_e2e::cluster::{Indexer, IndexerSpec, Producer, TestDir, format};
use ckf_e2e::hashes::HashPool;
use ckf_e2e::metrics;
use ckf_e2e::{Service, binary, wait_until};
use ckf_proto::v1;
use ckf_proto::v1::query_client::QueryClient;
use ckf_proto::v1::relay_client::RelayClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::Code;
use tonic::transport::Channel;

/// The HTTP/2 client preface magic and an empty SETTINGS frame: a complete preface.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
/// Bound on waiting for anything here (far above every configured deadline).
const BOUND: Duration = Duration::from_secs(20);

/// A `ckf-indexer` with the given `[transport]` lines; returns it and its gRPC and metrics
/// addresses.
fn indexer(dir: &TestDir, name: &str, transport: &str) -> (Service, SocketAddr, SocketAddr) {
    let config = dir.path().join(format!("{name}.toml"));
    let toml = format!(
        "listen = \"127.0.0.1:0\"\nmetrics_listen = \"127.0.0.1:0\"\nlog_format = \"json\"\n\
         [manifest]\ndomain = \"e2e\"\nlanes = [\"dc-a\"]\n\
         [table]\nbucket_count = 1024\n\
         [transport]\n{transport}\n"
    );
    std::fs::write(&config, toml).unwrap();
    let args = ["--config".to_owned(), config.display().to_string()];
    let mut svc = Service::spawn(name, &binary("ckf-indexer"), &args, dir.path());
    let record = svc
        .wait_for_record("ckf-indexer serving", BOUND)
        .unwrap_or_else(|e| panic!("ckf-indexer: {e}"));
    let addr = |field: &str| record[field].as_str().unwrap().parse().unwrap();
    (svc, addr("grpc_addr"), addr("metrics_addr"))
}

async fn connect(addr: SocketAddr) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

async fn query_client(addr: SocketAddr) -> QueryClient<Channel> {
    QueryClient::new(connect(addr).await)
}

async fn list_lanes(client: &mut QueryClient<Channel>) -> Result<usize, tonic::Status> {
    let lanes = client.list_lanes(v1::ListLanesRequest {}).await?;
    Ok(lanes.into_inner().lanes.len())
}

/// Reads until the server closes `stream` (EOF or reset). `false` if still open after `bound`.
async fn closed_by_server(stream: &mut TcpStream, bound: Duration) -> bool {
    let mut buf = [0u8; 512];
    tokio::time::timeout(bound, async {
        while let Ok(n) = stream.read(&mut buf).await {
            if n == 0 {
                return;
            }
        }
    })
    .await
    .is_ok()
}

fn metric(addr: SocketAddr, name: &str, labels: &[(&str, &str)]) -> f64 {
    let text = metrics::scrape(addr).unwrap();
    metrics::value(&text, name, labels).unwrap_or_else(|| panic!("{name} {labels:?} absent"))
}

fn wait_metric(addr: SocketAddr, name: &str, labels: &[(&str, &str)], at_least: f64) {
    wait_until(&format!("{name}{labels:?} >= {at_least}"), BOUND, || {
        (metric(addr, name, labels) >= at_least).then_some(())
    })
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_are_closed_after_the_handshake_timeout_while_queries_work() {
    let dir = TestDir::new("transport_silent");
    let (_svc, addr, metrics_addr) = indexer(&dir, "indexer", "handshake_timeout_ms = 500");
    let mut client = query_client(addr).await;
    assert_eq!(list_lanes(&mut client).await.unwrap(), 1);

    let mut silent = Vec::new();
    for _ in 0..5 {
        silent.push(TcpStream::connect(addr).await.unwrap());
    }
    // one that sends half the magic and stops
    let mut half = TcpStream::connect(addr).await.unwrap();
    half.write_all(&PREFACE[..12]).await.unwrap();
    silent.push(half);
    wait_metric(
        metrics_addr,
        "ckf_indexer_connections",
        &[("state", "handshake")],
        6.0,
    );

    // queries keep working on the real client's connection while the silent ones are open
    let querying = tokio::spawn(async move {
        for _ in 0..20 {
            assert_eq!(list_lanes(&mut client).await.unwrap(), 1);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        client
    });
    for (i, stream) in silent.iter_mut().enumerate() {
        assert!(
            closed_by_server(stream, BOUND).await,
            "silent connection {i} still open after {BOUND:?}"
        );
    }
    let mut client = querying.await.unwrap();
    assert_eq!(list_lanes(&mut client).await.unwrap(), 1);
    wait_metric(
        metrics_addr,
        "ckf_indexer_connections_refused_total",
        &[("reason", "handshake_timeout")],
        6.0,
    );
    assert_eq!(
        metric(
            metrics_addr,
            "ckf_indexer_connections_refused_total",
            &[("reason", "handshake_timeout")]
        ),
        6.0,
        "the real client's connection was never counted as timed out"
    );
    assert_eq!(
        metric(
            metrics_addr,
            "ckf_indexer_connections",
            &[("state", "established")]
        ),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_over_max_connections_is_closed_while_held_ones_work() {
    let dir = TestDir::new("transport_max_connections");
    let (_svc, addr, metrics_addr) = indexer(&dir, "indexer", "max_connections = 3");
    let mut client = query_client(addr).await;
    assert_eq!(list_lanes(&mut client).await.unwrap(), 1);
    // two more held connections that completed their preface
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(PREFACE).await.unwrap();
        held.push(stream);
    }
    wait_metric(
        metrics_addr,
        "ckf_indexer_connections",
        &[("state", "established")],
        3.0,
    );

    for _ in 0..3 {
        let mut extra = TcpStream::connect(addr).await.unwrap();
        assert!(
            closed_by_server(&mut extra, BOUND).await,
            "a connection over max_connections was kept"
        );
    }
    assert_eq!(
        metric(
            metrics_addr,
            "ckf_indexer_connections_refused_total",
            &[("reason", "max_connections")]
        ),
        3.0
    );
    // a fresh gRPC client cannot connect while the limit is held ...
    let refused = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .map(QueryClient::new);
    if let Ok(mut refused) = refused {
        // (the TCP connect succeeds before the server closes it: the first call fails)
        assert!(list_lanes(&mut refused).await.is_err());
    }
    // ... while the held one keeps working
    assert_eq!(list_lanes(&mut client).await.unwrap(), 1);

    // closing held connections frees their permits
    drop(held);
    wait_until("permits released", BOUND, || {
        (metric(
            metrics_addr,
            "ckf_indexer_connections",
            &[("state", "established")],
        ) == 1.0)
            .then_some(())
    })
    .unwrap();
    let mut again = query_client(addr).await;
    assert_eq!(list_lanes(&mut again).await.unwrap(), 1);
}

/// A `ListLanes` whose request body never ends: the unary handler waits for its message, so
/// the request holds its `max_concurrent_requests` permit until `request_timeout_ms`.
async fn hanging_list_lanes(channel: Channel) -> Result<v1::ListLanesResponse, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/ckf.v1.Query/ListLanes");
    let codec = tonic_prost::ProstCodec::<v1::ListLanesRequest, v1::ListLanesResponse>::default();
    let never = tokio_stream::pending::<v1::ListLanesRequest>();
    grpc.client_streaming(tonic::Request::new(never), path, codec)
        .await
        .map(tonic::Response::into_inner)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_over_the_limit_are_shed_at_once_and_a_stuck_one_times_out() {
    let dir = TestDir::new("transport_shed");
    let (_svc, addr, metrics_addr) = indexer(
        &dir,
        "indexer",
        "max_concurrent_requests = 1\nrequest_timeout_ms = 4000",
    );
    let channel = connect(addr).await;
    let mut client = QueryClient::new(channel.clone());
    assert_eq!(list_lanes(&mut client).await.unwrap(), 1);

    let mut hanging = tokio::spawn(hanging_list_lanes(channel.clone()));
    // once the stuck request holds the only permit, the next one is shed
    let mut shed = None;
    for _ in 0..1000 {
        // The stuck request is itself shed when it reaches the server while one of these
        // probes holds the permit (a race of two requests for one permit): send it again.
        if hanging.is_finished() {
            let lost = hanging.await.unwrap().unwrap_err();
            assert_eq!(lost.code(), Code::Unavailable, "{lost:?}");
            hanging = tokio::spawn(hanging_list_lanes(channel.clone()));
        }
        match list_lanes(&mut client).await {
            Err(status) => {
                shed = Some(status);
                break;
            }
            // the stuck request has not reached the server yet
            Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    let status = shed.expect("a request is shed while the stuck one holds the permit");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status
            .message()
            .contains("ckf.v1.Query has transport.max_concurrent_requests = 1"),
        "{status:?}"
    );
    assert!(
        !hanging.is_finished(),
        "the shed reply came while the stuck request still held the permit"
    );
    assert!(
        metric(
            metrics_addr,
            "ckf_indexer_requests_shed_total",
            &[("service", "ckf.v1.Query")]
        ) >= 1.0
    );

    // the stuck unary request is cut by the request timeout, which frees the permit
    let stuck = tokio::time::timeout(BOUND, hanging)
        .await
        .expect("the stuck request ends")
        .unwrap()
        .unwrap_err();
    assert_eq!(stuck.code(), Code::DeadlineExceeded, "{stuck:?}");
    assert!(
        stuck
            .message()
            .contains("transport.request_timeout_ms = 4000"),
        "{stuck:?}"
    );
    assert_eq!(list_lanes(&mut client).await.unwrap(), 1);
    assert_eq!(
        metric(
            metrics_addr,
            "ckf_indexer_requests_timed_out_total",
            &[("service", "ckf.v1.Query")]
        ),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_producer_closes_silent_ingest_connections_too() {
    let dir = TestDir::new("transport_producer");
    let config = dir.path().join("producer.toml");
    std::fs::write(
        &config,
        "listen = \"127.0.0.1:0\"\nmetrics_listen = \"127.0.0.1:0\"\nlog_format = \"json\"\n\
         indexers = [\"http://127.0.0.1:9\"]\n\
         [pool]\ndomain = \"e2e\"\ndc = \"dc-a\"\n[table]\nbucket_count = 1024\n\
         [transport]\nhandshake_timeout_ms = 300\n",
    )
    .unwrap();
    let args = ["--config".to_owned(), config.display().to_string()];
    let mut svc = Service::spawn("producer", &binary("ckf-producer"), &args, dir.path());
    let record = svc
        .wait_for_record("producer started", BOUND)
        .unwrap_or_else(|e| panic!("ckf-producer: {e}"));
    let addr: SocketAddr = record["ingest_addr"].as_str().unwrap().parse().unwrap();
    let metrics_addr: SocketAddr = record["metrics_addr"].as_str().unwrap().parse().unwrap();

    let mut silent = TcpStream::connect(addr).await.unwrap();
    assert!(closed_by_server(&mut silent, BOUND).await);
    wait_metric(
        metrics_addr,
        "ckf_producer_connections_refused_total",
        &[("reason", "handshake_timeout")],
        1.0,
    );
    // a real client is served
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut ingest = v1::ingest_client::IngestClient::new(channel);
    ingest.get_stats(v1::GetStatsRequest {}).await.unwrap();
}

/// Raw connections to `addr` that each sent a complete preface and then nothing.
async fn idle_connections(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut held = Vec::new();
    for _ in 0..n {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(PREFACE).await.unwrap();
        held.push(stream);
    }
    held
}

/// Log lines of `indexer` whose message is `needle` (its log is JSON, one record a line).
fn log_count(indexer: &Indexer, needle: &str) -> usize {
    indexer
        .log()
        .lines()
        .filter(|line| line.contains(&format!("\"message\":\"{needle}")))
        .count()
}

fn indexer_metric(indexer: &Indexer, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric(indexer.metrics_addr, name, labels)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_filling_query_listen_do_not_stop_a_producer_attaching_on_listen() {
    let dir = TestDir::new("transport_listeners");
    let spec = IndexerSpec {
        extra_toml: "query_listen = \"127.0.0.1:0\"\n[transport]\nmax_connections = 4\n".into(),
        ..IndexerSpec::default()
    };
    let indexer = Indexer::start(&dir, &spec);
    let held = idle_connections(indexer.query_addr, 4).await;
    wait_metric(
        indexer.metrics_addr,
        "ckf_indexer_connections",
        &[("state", "established")],
        4.0,
    );
    // query_listen is full ...
    let mut extra = TcpStream::connect(indexer.query_addr).await.unwrap();
    assert!(
        closed_by_server(&mut extra, BOUND).await,
        "query_listen over max_connections"
    );
    assert_eq!(
        indexer_metric(
            &indexer,
            "ckf_indexer_connections_refused_total",
            &[("reason", "max_connections")]
        ),
        1.0
    );

    // ... and a producer still connects and attaches on listen
    let mut producer = Producer::start_dc(&dir, "dc-a", &[indexer.url()]);
    wait_until("the producer attached on listen", BOUND, || {
        (log_count(&indexer, "attachment authorized") == 1).then_some(())
    })
    .unwrap();
    assert_eq!(
        indexer_metric(
            &indexer,
            "ckf_indexer_connections_refused_total",
            &[("reason", "max_connections")]
        ),
        1.0,
        "the producer's connection was not refused"
    );
    // once the idle ones go, Query serves what the producer published
    drop(held);
    let mut pool = HashPool::new(&format(), 21);
    producer.store(1, &pool.take(20)).await;
    wait_converged(&indexer, &producer).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_without_streams_are_closed_as_idle_while_a_relay_stream_is_kept() {
    let dir = TestDir::new("transport_idle");
    let spec = IndexerSpec {
        extra_toml: "[transport]\nidle_timeout_ms = 1000\n".into(),
        ..IndexerSpec::default()
    };
    let indexer = Indexer::start(&dir, &spec);
    let mut producer = Producer::start_dc(&dir, "dc-a", &[indexer.url()]);
    wait_until("the producer attached", BOUND, || {
        (log_count(&indexer, "attachment authorized") == 1).then_some(())
    })
    .unwrap();

    let mut idle = idle_connections(indexer.addr, 3).await;
    for (i, stream) in idle.iter_mut().enumerate() {
        assert!(
            closed_by_server(stream, BOUND).await,
            "idle connection {i} still open after {BOUND:?}"
        );
    }
    assert!(
        indexer_metric(
            &indexer,
            "ckf_indexer_connections_refused_total",
            &[("reason", "idle_timeout")]
        ) >= 3.0
    );
    // A negative: several idle timeouts later the producer's stream (heartbeats every 200 ms,
    // and open all along) was never cut. Nothing marks a cut that did not happen, so this waits
    // three idle timeouts, then checks: one attachment, and its data arrives.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut pool = HashPool::new(&format(), 22);
    producer.store(1, &pool.take(20)).await;
    wait_converged(&indexer, &producer).await;
    assert_eq!(
        log_count(&indexer, "attachment authorized"),
        1,
        "the producer reattached: its connection was cut"
    );
}

/// A Relay `Publish` whose request stream never sends a frame (no `Attach`).
async fn attachless_publish(addr: SocketAddr) -> tonic::Status {
    let mut client = RelayClient::new(connect(addr).await);
    match client
        .publish(tokio_stream::pending::<v1::RelayFrame>())
        .await
    {
        Ok(_) => panic!("an Attach-less stream was accepted"),
        Err(status) => status,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attachless_relay_streams_end_after_the_deadline_give_back_their_slots_and_a_producer_attaches()
 {
    let dir = TestDir::new("transport_attachless");
    // 8 Attach-less streams and one producer fit max_concurrent_requests = 9; the stream
    // limit (limits.max_relay_streams = 64) counts attached streams only.
    let spec = IndexerSpec {
        heartbeat_deadline_ms: 6_000,
        extra_toml: "[transport]\nmax_concurrent_requests = 9\n".into(),
        ..IndexerSpec::default()
    };
    let indexer = Indexer::start(&dir, &spec);
    let attachless: Vec<_> = (0..8)
        .map(|_| tokio::spawn(attachless_publish(indexer.addr)))
        .collect();
    // while they are open, a producer attaches
    let mut producer = Producer::start_dc(&dir, "dc-a", &[indexer.url()]);
    wait_until("the producer attached", BOUND, || {
        (log_count(&indexer, "attachment authorized") == 1).then_some(())
    })
    .unwrap();
    assert!(
        attachless.iter().all(|task| !task.is_finished()),
        "the producer attached only after the Attach-less streams ended"
    );
    for task in attachless {
        let status = tokio::time::timeout(BOUND, task).await.unwrap().unwrap();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(
            status
                .message()
                .contains("nothing within the heartbeat deadline"),
            "{status:?}"
        );
    }
    assert_eq!(
        indexer_metric(
            &indexer,
            "ckf_indexer_attach_refused_total",
            &[("code", "invalid_argument")]
        ),
        8.0
    );
    // their slots came back: 9 more (the attached producer holds none) are all answered by the
    // handler, none shed with UNAVAILABLE
    let again: Vec<_> = (0..9)
        .map(|_| tokio::spawn(attachless_publish(indexer.addr)))
        .collect();
    for task in again {
        let status = tokio::time::timeout(BOUND, task).await.unwrap().unwrap();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    }
    assert_eq!(
        indexer_metric(
            &indexer,
            "ckf_indexer_requests_shed_total",
            &[("service", "ckf.v1.Relay")]
        ),
        0.0
    );
    let mut pool = HashPool::new(&format(), 23);
    producer.store(1, &pool.take(20)).await;
    wait_converged(&indexer, &producer).await;
}
