//! Unit tests of the transport limits: the preface and frame sniffer, connection admission and
//! deadlines (plaintext), request shedding and unary timeouts.

use std::collections::HashSet;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::Status;
use tonic::body::Body;
use tonic::codegen::http;
use tonic::server::NamedService;
use tower::Service;

use super::sniff::{
    DATA_FRAME, END_STREAM, HEADERS_FRAME, PREFACE_MAGIC, PrefaceParser, RST_STREAM_FRAME,
    SETTINGS_FRAME, StreamTracker,
};
use super::*;
use crate::config::Validate;
use crate::grpc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

/// An empty `SETTINGS` frame: the shortest complete client preface after the magic.
const EMPTY_SETTINGS: [u8; 9] = [0, 0, 0, SETTINGS_FRAME, 0, 0, 0, 0, 0];

fn config(max_connections: u32, handshake_timeout_ms: u64) -> TransportConfig {
    TransportConfig {
        max_connections,
        handshake_timeout_ms,
        ..TransportConfig::default()
    }
}

#[test]
fn the_parser_wants_the_magic_and_one_whole_settings_frame() {
    let mut whole = PREFACE_MAGIC.to_vec();
    whole.extend([0, 0, 6, SETTINGS_FRAME, 0, 0, 0, 0, 0]);
    whole.extend([0, 3, 0, 0, 0, 100]); // one setting: MAX_CONCURRENT_STREAMS = 100
    for split in 0..whole.len() {
        let mut parser = PrefaceParser::default();
        assert!(!parser.feed(&whole[..split]), "done after {split} bytes");
        assert!(parser.feed(&whole[split..]), "split at {split}");
    }
    let mut empty = PREFACE_MAGIC.to_vec();
    empty.extend(EMPTY_SETTINGS);
    assert!(PrefaceParser::default().feed(&empty));

    let mut wrong_magic = empty.clone();
    wrong_magic[3] = b'X';
    assert!(!PrefaceParser::default().feed(&wrong_magic));
    let mut not_settings = empty.clone();
    not_settings[PREFACE_MAGIC.len() + 3] = 0x6; // PING
    assert!(!PrefaceParser::default().feed(&not_settings));
    assert!(!PrefaceParser::default().feed(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
    // a TLS ClientHello record is never a preface
    assert!(!PrefaceParser::default().feed(&[0x16, 3, 1, 0, 200, 1, 0, 0, 196]));
}

#[test]
fn every_key_is_validated_with_its_name() {
    TransportConfig::default().validate().unwrap();
    type Breaker = fn(&mut TransportConfig);
    let cases: [(&str, Breaker); 10] = [
        ("transport.stream_window_kib = 63", |c| {
            c.stream_window_kib = 63
        }),
        ("transport.stream_window_kib = 8193", |c| {
            c.stream_window_kib = 8193
        }),
        ("transport.request_timeout_ms = 0", |c| {
            c.request_timeout_ms = 0
        }),
        ("transport.idle_timeout_ms = 99", |c| c.idle_timeout_ms = 99),
        ("transport.max_connections_per_peer = 1000001", |c| {
            c.max_connections_per_peer = 1_000_001
        }),
        ("transport.handshake_timeout_ms = 10", |c| {
            c.handshake_timeout_ms = 10
        }),
        ("transport.max_concurrent_requests = 0", |c| {
            c.max_concurrent_requests = 0
        }),
        ("transport.max_connections = 0", |c| c.max_connections = 0),
        ("transport.max_concurrent_streams = 0", |c| {
            c.max_concurrent_streams = 0
        }),
        ("transport.max_header_list_bytes = 16", |c| {
            c.max_header_list_bytes = 16
        }),
    ];
    for (prefix, break_it) in cases {
        let mut config = TransportConfig::default();
        break_it(&mut config);
        let text = config.validate().unwrap_err().to_string();
        assert!(text.starts_with(prefix), "{text}");
        assert!(text.contains("must be in"), "{text}");
    }
    // 0 turns both off
    let off = TransportConfig {
        idle_timeout_ms: 0,
        max_connections_per_peer: 0,
        ..TransportConfig::default()
    };
    off.validate().unwrap();
    assert_eq!(off.idle_timeout(), None);
}

#[test]
fn the_stream_tracker_opens_on_client_headers_and_ends_on_server_end_stream_or_reset() {
    fn frame(kind: u8, flags: u8, stream: u32, payload: usize) -> Vec<u8> {
        let mut bytes = (payload as u32).to_be_bytes()[1..].to_vec();
        bytes.extend([kind, flags]);
        bytes.extend(stream.to_be_bytes());
        bytes.extend(std::iter::repeat_n(0xAB, payload));
        bytes
    }
    let mut client = PREFACE_MAGIC.to_vec();
    client.extend(EMPTY_SETTINGS);
    client.extend(frame(HEADERS_FRAME, 0x4, 1, 30)); // opens 1
    client.extend(frame(DATA_FRAME, END_STREAM, 1, 5)); // request done: still open
    client.extend(frame(HEADERS_FRAME, 0x4, 3, 30)); // opens 3
    client.extend(frame(0x6, 0, 0, 8)); // PING: nothing
    let mut tracker = StreamTracker::new();
    // byte by byte: frame headers split anywhere are still read
    for byte in &client {
        tracker.read(std::slice::from_ref(byte));
    }
    assert_eq!(tracker.open, HashSet::from([1, 3]));
    // client trailers on an old id do not reopen anything
    tracker.read(&frame(HEADERS_FRAME, END_STREAM | 0x4, 1, 3));
    assert_eq!(tracker.open.len(), 2);

    let mut server = EMPTY_SETTINGS.to_vec();
    server.extend(frame(HEADERS_FRAME, 0x4, 1, 10)); // response headers
    server.extend(frame(DATA_FRAME, 0, 1, 100));
    tracker.wrote(&server);
    assert_eq!(
        tracker.open.len(),
        2,
        "a response without END_STREAM is not the end"
    );
    tracker.wrote(&frame(HEADERS_FRAME, END_STREAM | 0x4, 1, 10)); // trailers
    assert_eq!(tracker.open, HashSet::from([3]));
    let busy = tracker.idle_since;
    tracker.read(&frame(RST_STREAM_FRAME, 0, 3, 4)); // the client cancels 3
    assert!(tracker.open.is_empty());
    assert!(tracker.idle_since >= busy);
    // a server reset ends a stream too
    tracker.read(&frame(HEADERS_FRAME, 0x4, 5, 1));
    tracker.wrote(&frame(RST_STREAM_FRAME, 0, 5, 4));
    assert!(tracker.open.is_empty());
}

struct TestServer {
    addr: std::net::SocketAddr,
    metrics: TransportMetrics,
    limits: ConnectionLimits,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl TestServer {
    async fn start(config: TransportConfig) -> Self {
        let transport = Transport::new(&config, &Registry::new(), "ckf_test", &[]).unwrap();
        Self::serve(&transport).await
    }

    /// A health server on a new listener guarded by `transport.incoming` (limits of its own).
    async fn serve(transport: &Transport) -> Self {
        let (reporter, health) = grpc::health(&[]).await;
        grpc::set_all(&reporter, &[], tonic_health::ServingStatus::Serving).await;
        let listener = grpc::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.addr;
        let incoming = transport.incoming(listener.incoming);
        let limits = incoming.limits().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(
            transport
                .server(tonic::transport::Server::builder())
                .add_service(health)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                }),
        );
        Self {
            addr,
            metrics: transport.metrics.clone(),
            limits,
            stop,
            task,
        }
    }

    async fn client(&self) -> HealthClient<tonic::transport::Channel> {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect()
            .await
            .unwrap();
        HealthClient::new(channel)
    }

    fn refused(&self, reason: &str) -> u64 {
        self.metrics.refused.with_label_values(&[reason]).get()
    }

    fn connections(&self, state: &str) -> i64 {
        self.metrics.connections.with_label_values(&[state]).get()
    }

    async fn stop(self) {
        self.stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("server stops")
            .unwrap()
            .unwrap();
    }
}

async fn check(client: &mut HealthClient<tonic::transport::Channel>) {
    let status = client
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.status(), tonic_health::ServingStatus::Serving.into());
}

/// Reads until the server closes the connection (EOF or reset); `Err` if it is still open
/// after `bound` (a bound against hanging, far above every deadline used here).
async fn closed_by_server(stream: &mut TcpStream, bound: Duration) -> Result<(), ()> {
    let mut buf = [0u8; 1024];
    tokio::time::timeout(bound, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {} // the server's own SETTINGS frame
            }
        }
    })
    .await
    .map_err(|_| ())
}

async fn wait_until(what: &str, mut holds: impl FnMut() -> bool) {
    for _ in 0..500 {
        if holds() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: not within 5 s");
}

#[tokio::test]
async fn a_connection_over_max_connections_is_closed_and_the_held_one_works() {
    let server = TestServer::start(config(1, 10_000)).await;
    let mut client = server.client().await;
    check(&mut client).await;
    assert_eq!(server.limits.held(), 1);
    assert_eq!(server.connections("established"), 1);

    let mut extra = TcpStream::connect(server.addr).await.unwrap();
    closed_by_server(&mut extra, Duration::from_secs(5))
        .await
        .expect("the connection over the limit is closed at once");
    assert_eq!(server.refused(REFUSED_MAX_CONNECTIONS), 1);
    check(&mut client).await;

    // the permit comes back when the held connection closes
    drop(client);
    wait_until("permit released", || server.limits.held() == 0).await;
    assert_eq!(server.connections("established"), 0);
    let mut again = server.client().await;
    check(&mut again).await;
    assert_eq!(server.refused(REFUSED_MAX_CONNECTIONS), 1);
    drop(again);
    server.stop().await;
}

#[tokio::test]
async fn a_silent_or_half_preface_connection_is_closed_after_the_handshake_timeout() {
    let server = TestServer::start(config(16, 300)).await;
    let mut silent = TcpStream::connect(server.addr).await.unwrap();
    let mut half = TcpStream::connect(server.addr).await.unwrap();
    half.write_all(PREFACE_MAGIC).await.unwrap(); // magic, but no SETTINGS frame
    wait_until("both admitted", || server.connections("handshake") == 2).await;

    closed_by_server(&mut silent, Duration::from_secs(10))
        .await
        .expect("a silent connection is closed");
    closed_by_server(&mut half, Duration::from_secs(10))
        .await
        .expect("a connection that stops inside its preface is closed");
    assert_eq!(server.refused(REFUSED_HANDSHAKE_TIMEOUT), 2);
    wait_until("gauge back to 0", || server.connections("handshake") == 0).await;
    assert_eq!(server.limits.held(), 0);
    server.stop().await;
}

#[tokio::test]
async fn a_real_client_idle_past_the_handshake_timeout_is_not_cut() {
    let server = TestServer::start(config(16, 200)).await;
    let mut client = server.client().await;
    check(&mut client).await;
    // idle for several handshake timeouts on the same connection
    tokio::time::sleep(Duration::from_millis(800)).await;
    check(&mut client).await;
    assert_eq!(server.refused(REFUSED_HANDSHAKE_TIMEOUT), 0);
    assert_eq!(server.connections("established"), 1);
    assert_eq!(server.connections("handshake"), 0);

    // a raw client that sends the whole preface by hand is established too
    let mut raw = TcpStream::connect(server.addr).await.unwrap();
    raw.write_all(PREFACE_MAGIC).await.unwrap();
    raw.write_all(&EMPTY_SETTINGS).await.unwrap();
    wait_until("raw preface established", || {
        server.connections("established") == 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(server.refused(REFUSED_HANDSHAKE_TIMEOUT), 0);
    drop((raw, client));
    server.stop().await;
}

/// A raw connection from `local` (e.g. `127.0.0.2`) to `server`.
async fn connect_from(local: &str, server: std::net::SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{local}:0").parse().unwrap()).unwrap();
    socket.connect(server).await.unwrap()
}

/// A raw connection that sent the whole client preface.
async fn established_from(local: &str, server: std::net::SocketAddr) -> TcpStream {
    let mut stream = connect_from(local, server).await;
    stream.write_all(PREFACE_MAGIC).await.unwrap();
    stream.write_all(&EMPTY_SETTINGS).await.unwrap();
    stream
}

#[tokio::test]
async fn one_peer_over_max_connections_per_peer_is_refused_while_another_peer_connects() {
    let server = TestServer::start(TransportConfig {
        max_connections_per_peer: 2,
        ..config(16, 10_000)
    })
    .await;
    let one: std::net::IpAddr = "127.0.0.1".parse().unwrap();
    let two: std::net::IpAddr = "127.0.0.2".parse().unwrap();
    let held = [
        established_from("127.0.0.1", server.addr).await,
        established_from("127.0.0.1", server.addr).await,
    ];
    wait_until("two held", || server.limits.held_by(one) == 2).await;

    let mut third = connect_from("127.0.0.1", server.addr).await;
    closed_by_server(&mut third, Duration::from_secs(5))
        .await
        .expect("the peer's connection over the limit is closed at once");
    assert_eq!(server.refused(REFUSED_MAX_CONNECTIONS_PER_PEER), 1);
    assert_eq!(server.refused(REFUSED_MAX_CONNECTIONS), 0);
    assert_eq!(
        server.limits.held_by(one),
        2,
        "the refused one held nothing"
    );

    // another address is admitted and served
    let other = established_from("127.0.0.2", server.addr).await;
    wait_until("other peer held", || server.limits.held_by(two) == 1).await;
    assert_eq!(server.limits.peers(), 2);
    let mut client = server.client().await; // from 127.0.0.1: full
    assert!(
        client
            .check(HealthCheckRequest {
                service: String::new()
            })
            .await
            .is_err(),
        "a third connection from 127.0.0.1 is refused"
    );

    // entries leave the map when their peer holds nothing
    drop(held);
    wait_until("127.0.0.1 released", || server.limits.held_by(one) == 0).await;
    assert_eq!(server.limits.peers(), 1);
    check(&mut server.client().await).await;
    drop(other);
    wait_until("map empty", || server.limits.peers() == 0).await;
    server.stop().await;
}

#[tokio::test]
async fn two_listeners_of_one_transport_do_not_share_permits() {
    let registry = Registry::new();
    let transport = Transport::new(&config(1, 10_000), &registry, "ckf_test", &[]).unwrap();
    let a = TestServer::serve(&transport).await;
    let b = TestServer::serve(&transport).await;
    let held = established_from("127.0.0.1", a.addr).await;
    wait_until("a full", || a.limits.held() == 1).await;

    let mut extra = TcpStream::connect(a.addr).await.unwrap();
    closed_by_server(&mut extra, Duration::from_secs(5))
        .await
        .expect("a is full");
    assert_eq!(a.refused(REFUSED_MAX_CONNECTIONS), 1);
    // b still has its own permit
    let mut client = b.client().await;
    check(&mut client).await;
    assert_eq!((a.limits.held(), b.limits.held()), (1, 1));
    assert_eq!(
        b.refused(REFUSED_MAX_CONNECTIONS),
        1,
        "metrics are shared: only a's"
    );
    drop((held, client));
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn a_connection_without_an_open_stream_is_closed_after_the_idle_timeout_pings_or_not() {
    let server = TestServer::start(TransportConfig {
        idle_timeout_ms: 300,
        ..config(16, 10_000)
    })
    .await;
    let mut silent = established_from("127.0.0.1", server.addr).await;
    // a peer that keeps sending PINGs (what answering keepalives looks like) is idle too
    let mut pinging = established_from("127.0.0.1", server.addr).await;
    let (mut read_half, mut write_half) = pinging.split();
    let pings = async {
        let mut ping = vec![0, 0, 8, 0x6, 0, 0, 0, 0, 0];
        ping.extend([7; 8]);
        while write_half.write_all(&ping).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let mut buf = [0u8; 1024];
    let drained = async {
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match read_half.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await
    };
    tokio::select! {
        () = pings => panic!("pings stop only when the connection is closed"),
        closed = drained => closed.expect("a pinging connection without streams is closed"),
    }
    closed_by_server(&mut silent, Duration::from_secs(10))
        .await
        .expect("a silent established connection is closed");
    wait_until("both counted", || server.refused(REFUSED_IDLE_TIMEOUT) == 2).await;
    assert_eq!(server.refused(REFUSED_HANDSHAKE_TIMEOUT), 0);
    wait_until("permits back", || server.limits.held() == 0).await;
    server.stop().await;
}

#[tokio::test]
async fn an_open_stream_keeps_its_quiet_connection_past_the_idle_timeout() {
    let server = TestServer::start(TransportConfig {
        idle_timeout_ms: 300,
        ..config(16, 10_000)
    })
    .await;
    let mut client = server.client().await;
    // a health Watch: the client sends nothing after its request, the stream stays open
    let mut watch = client
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    watch.message().await.unwrap().expect("the first status");
    tokio::time::sleep(Duration::from_millis(1_200)).await; // four idle timeouts
    assert_eq!(server.refused(REFUSED_IDLE_TIMEOUT), 0);
    assert_eq!(server.connections("established"), 1);
    check(&mut client).await;

    // once the last stream ends, the connection is idle and closed
    drop(watch);
    wait_until("closed as idle", || {
        server.refused(REFUSED_IDLE_TIMEOUT) == 1
    })
    .await;
    wait_until("gauge back to 0", || server.connections("established") == 0).await;
    drop(client);
    server.stop().await;
}

// ---- request limits (no network: the service is called directly) --------------------

/// A fake `grpc.health.v1.Health` whose every call waits for `release`.
#[derive(Clone)]
struct Slow {
    release: Arc<tokio::sync::Semaphore>,
}

impl NamedService for Slow {
    const NAME: &'static str = "grpc.health.v1.Health";
}

impl Service<http::Request<Body>> for Slow {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<Body>) -> Self::Future {
        let release = Arc::clone(&self.release);
        Box::pin(async move {
            release.acquire().await.unwrap().forget();
            Ok(Status::ok("done").into_http())
        })
    }
}

fn request(method: &str) -> http::Request<Body> {
    http::Request::builder()
        .uri(format!("http://x/grpc.health.v1.Health/{method}"))
        .body(Body::empty())
        .unwrap()
}

fn grpc_status(response: &http::Response<Body>) -> (i32, String) {
    let status = Status::from_header_map(response.headers()).expect("a grpc-status header");
    (status.code() as i32, status.message().to_owned())
}

async fn call<S: Service<http::Request<Body>>>(
    service: &mut S,
    request: http::Request<Body>,
) -> S::Future
where
    S::Error: std::fmt::Debug,
{
    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .unwrap();
    service.call(request)
}

fn limits(max_concurrent_requests: u32, request_timeout_ms: u64) -> (RequestLimits, Registry) {
    let registry = Registry::new();
    let metrics = TransportMetrics::new(&registry, "ckf_test");
    let config = TransportConfig {
        max_concurrent_requests,
        request_timeout_ms,
        ..TransportConfig::default()
    };
    let limits =
        RequestLimits::new(&config, &metrics, &[tonic_health::pb::FILE_DESCRIPTOR_SET]).unwrap();
    (limits, registry)
}

#[test]
fn streaming_methods_come_from_the_descriptors() {
    let paths = streaming_methods(&[tonic_health::pb::FILE_DESCRIPTOR_SET]).unwrap();
    assert_eq!(
        paths,
        HashSet::from(["/grpc.health.v1.Health/Watch".to_owned()])
    );
    assert!(streaming_methods(&[b"\xff\xff"]).is_err());
}

#[tokio::test]
async fn over_max_concurrent_requests_is_shed_at_once_with_unavailable() {
    let (limits, _registry) = limits(2, 60_000);
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let mut service = limits.limit(Slow {
        release: Arc::clone(&release),
    });
    // `poll_ready` takes the permit: each future below holds one until it resolves
    let first = call(&mut service.clone(), request("Check")).await;
    let second = call(&mut service.clone(), request("Watch")).await;
    let response = call(&mut service, request("Check")).await.await.unwrap();
    let (code, message) = grpc_status(&response);
    assert_eq!(code, tonic::Code::Unavailable as i32, "{message}");
    assert!(
        message.contains("grpc.health.v1.Health has transport.max_concurrent_requests = 2"),
        "{message}"
    );
    assert_eq!(
        limits.metrics.shed.with_label_values(&[Slow::NAME]).get(),
        1
    );
    release.add_permits(2);
    for pending in [first, second] {
        let response = pending.await.unwrap();
        assert_eq!(grpc_status(&response).0, tonic::Code::Ok as i32);
    }
    // permits are back: a new request is not shed
    release.add_permits(1);
    let response = call(&mut service, request("Check")).await.await.unwrap();
    assert_eq!(grpc_status(&response).0, tonic::Code::Ok as i32);
}

#[tokio::test]
async fn a_unary_request_times_out_and_a_streaming_one_does_not() {
    let (limits, _registry) = limits(8, 100);
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let mut service = limits.limit(Slow {
        release: Arc::clone(&release),
    });
    let response = call(&mut service, request("Check")).await.await.unwrap();
    let (code, message) = grpc_status(&response);
    assert_eq!(code, tonic::Code::DeadlineExceeded as i32, "{message}");
    assert!(
        message.contains(
            "/grpc.health.v1.Health/Check took longer than transport.request_timeout_ms = 100 ms"
        ),
        "{message}"
    );
    assert_eq!(
        limits
            .metrics
            .timed_out
            .with_label_values(&[Slow::NAME])
            .get(),
        1
    );

    let watch = tokio::spawn(call(&mut service, request("Watch")).await);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!watch.is_finished(), "a streaming method is not cut");
    release.add_permits(1);
    let response = watch.await.unwrap().unwrap();
    assert_eq!(grpc_status(&response).0, tonic::Code::Ok as i32);
}
