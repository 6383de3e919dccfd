use super::*;

fn greeting() -> Vec<u8> {
    let mut g = vec![0u8; 64];
    g[0] = 0xff;
    g[9] = 0x7f;
    g[10] = 3;
    g[12..16].copy_from_slice(b"NULL");
    g
}

/// The greeting and a NULL READY command: a whole handshake.
fn handshake() -> Vec<u8> {
    let mut h = greeting();
    let ready = b"\x05READY\x0bSocket-Type\0\0\0\x03PUB";
    h.extend_from_slice(&[0x04, ready.len() as u8]);
    h.extend_from_slice(ready);
    h
}

type Seen<T> = Arc<Mutex<Vec<T>>>;

fn options(
    max_connections: usize,
    handshake_timeout: Duration,
) -> (ProxyOptions, Seen<ZmtpViolation>, Seen<Dropped>) {
    let (on_violation, violations) = recording();
    let (on_dropped, drops) = recording_drops();
    let mut o = ProxyOptions::new(ZmtpLimits::for_engine(1024), on_violation, on_dropped);
    o.max_connections = max_connections;
    o.handshake_timeout = handshake_timeout;
    (o, violations, drops)
}

fn defaults() -> (ProxyOptions, Seen<ZmtpViolation>, Seen<Dropped>) {
    options(DEFAULT_MAX_CONNECTIONS, DEFAULT_HANDSHAKE_TIMEOUT)
}

async fn engine_listener() -> (TcpListener, Endpoint) {
    let l = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
    let port = l.local_addr().unwrap().port();
    let e = Endpoint::Tcp {
        host: "127.0.0.1".into(),
        port,
    };
    (l, e)
}

fn port_of(local: &str) -> u16 {
    local.rsplit(':').next().unwrap().parse().unwrap()
}

/// Reads until the peer closes; panics if it stays open for 5 s. Returns the bytes read.
async fn until_closed(s: &mut TcpStream) -> usize {
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest))
        .await
        .expect("closed, not hanging")
        .unwrap_or(0)
}

/// A bind proxy on a free loopback port in front of `internal`; returns it and the port.
async fn bind_on_free_port(internal: Endpoint, options: ProxyOptions) -> (Proxy, u16) {
    // Port 0 cannot be named to engines; bind a free port first to learn one.
    let probe = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
    let port = probe.local_addr().unwrap().port();
    drop(probe);
    let public = Endpoint::Tcp {
        host: "127.0.0.1".into(),
        port,
    };
    (bind_proxy(&public, internal, options).await.unwrap(), port)
}

#[tokio::test]
async fn good_bytes_pass_both_ways_and_a_huge_frame_header_closes_the_connection() {
    let (engine, endpoint) = engine_listener().await;
    let (options, seen, _) = defaults();
    let proxy = connect_proxy(endpoint, options).await.unwrap();
    let mut zmq = TcpStream::connect(("127.0.0.1", port_of(&proxy.local)))
        .await
        .unwrap();
    let (mut eng, _) = engine.accept().await.unwrap();

    // zeromq -> engine passes unchanged.
    zmq.write_all(b"hello engine").await.unwrap();
    let mut got = [0u8; 12];
    eng.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"hello engine");

    // engine -> zeromq: a greeting and a small frame pass.
    let mut ok = greeting();
    ok.extend_from_slice(&[0x00, 3, b'a', b'b', b'c']);
    eng.write_all(&ok).await.unwrap();
    let mut got = vec![0u8; ok.len()];
    zmq.read_exact(&mut got).await.unwrap();
    assert_eq!(got, ok);

    // A header claiming 2^50 bytes: never forwarded, the connection closes.
    let mut bomb = vec![0x02];
    bomb.extend_from_slice(&(1u64 << 50).to_be_bytes());
    eng.write_all(&bomb).await.unwrap();
    assert_eq!(
        until_closed(&mut zmq).await,
        0,
        "no byte of the bomb reaches zeromq"
    );
    let seen = seen.lock().unwrap();
    assert!(matches!(
        seen.as_slice(),
        [ZmtpViolation::FrameTooLarge { claimed, .. }] if *claimed == 1 << 50
    ));
}

#[tokio::test]
async fn an_unreachable_engine_is_retried_while_zeromq_s_connection_is_held() {
    let (engine, endpoint) = engine_listener().await;
    let port = engine.local_addr().unwrap().port();
    drop(engine);
    let (options, seen, drops) = defaults();
    let proxy = connect_proxy(endpoint, options).await.unwrap();
    let mut zmq = TcpStream::connect(("127.0.0.1", port_of(&proxy.local)))
        .await
        .unwrap();
    // zeromq's greeting, sent while the engine is down, is held.
    zmq.write_all(&greeting()).await.unwrap();
    tokio::time::sleep(UPSTREAM_RETRY * 3).await;
    let engine = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    let (mut conn, _) = tokio::time::timeout(UPSTREAM_RETRY * 5, engine.accept())
        .await
        .expect("the proxy reached the engine within a few retries")
        .unwrap();
    let mut got = vec![0u8; 64];
    conn.read_exact(&mut got).await.unwrap();
    assert_eq!(got, greeting(), "what zeromq sent meanwhile arrives first");
    conn.write_all(&handshake()).await.unwrap();
    let mut back = vec![0u8; handshake().len()];
    zmq.read_exact(&mut back).await.unwrap();
    assert_eq!(back, handshake());
    assert!(seen.lock().unwrap().is_empty());
    assert!(drops.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_held_connection_is_closed_when_zeromq_sends_more_than_it_may_hold() {
    let (engine, endpoint) = engine_listener().await;
    drop(engine);
    let (options, _, _) = defaults();
    let proxy = connect_proxy(endpoint, options).await.unwrap();
    let mut zmq = TcpStream::connect(("127.0.0.1", port_of(&proxy.local)))
        .await
        .unwrap();
    zmq.write_all(&vec![0u8; MAX_HELD_BYTES + 1]).await.unwrap();
    assert_eq!(until_closed(&mut zmq).await, 0);
}

#[tokio::test]
async fn bind_mode_forwards_engines_to_the_internal_listener() {
    let (internal, internal_endpoint) = engine_listener().await;
    let (options, _, _) = defaults();
    let (_proxy, port) = bind_on_free_port(internal_endpoint, options).await;
    let mut eng = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let g = greeting();
    eng.write_all(&g).await.unwrap();
    let (mut zmq, _) = internal.accept().await.unwrap();
    let mut got = vec![0u8; 64];
    zmq.read_exact(&mut got).await.unwrap();
    assert_eq!(got, g);
    zmq.write_all(b"sub").await.unwrap();
    let mut got = [0u8; 3];
    eng.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"sub");
}

#[tokio::test]
async fn bind_mode_forwards_to_a_private_ipc_socket() {
    let ipc = PrivateIpc::create().unwrap();
    let Endpoint::Ipc(path) = ipc.endpoint().clone() else {
        panic!("not ipc: {:?}", ipc.endpoint());
    };
    let internal = UnixListener::bind(&path).unwrap();
    let (options, _, _) = defaults();
    let (_proxy, port) = bind_on_free_port(ipc.endpoint().clone(), options).await;
    let mut eng = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    eng.write_all(&handshake()).await.unwrap();
    let (mut zmq, _) = internal.accept().await.unwrap();
    let mut got = vec![0u8; handshake().len()];
    zmq.read_exact(&mut got).await.unwrap();
    assert_eq!(got, handshake());
}

#[test]
fn the_private_directory_is_0700_new_and_removed_on_drop() {
    use std::os::unix::fs::PermissionsExt;
    let parent = tempfile::tempdir().unwrap();
    let a = PrivateIpc::create_in(parent.path()).unwrap();
    let b = PrivateIpc::create_in(parent.path()).unwrap();
    assert_ne!(a.dir(), b.dir(), "a fresh directory each time");
    let mode = std::fs::metadata(a.dir()).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "mode {mode:o}");
    assert_eq!(
        a.endpoint(),
        &Endpoint::Ipc(a.dir().join("sub").to_str().unwrap().to_owned())
    );
    let dir = a.dir().to_owned();
    std::fs::write(dir.join("sub"), b"").unwrap();
    drop(a);
    assert!(!dir.exists(), "removed with its content");
}

#[test]
fn a_too_long_socket_path_is_refused_with_the_path_and_the_limit() {
    let parent = tempfile::tempdir().unwrap();
    let deep = parent.path().join("d".repeat(100));
    std::fs::create_dir(&deep).unwrap();
    let err = PrivateIpc::create_in(&deep).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    let text = err.to_string();
    assert!(text.contains(&*deep.to_string_lossy()), "{text}");
    assert!(text.contains("at most 107"), "{text}");
    // The refused directory is not left behind.
    assert_eq!(std::fs::read_dir(&deep).unwrap().count(), 0);
    // A missing parent names the parent.
    let err = PrivateIpc::create_in(&parent.path().join("missing")).unwrap_err();
    assert!(err.to_string().contains("missing"), "{err}");
}

#[tokio::test]
async fn a_connection_over_the_limit_is_closed_at_once_while_the_others_keep_forwarding() {
    let (internal, internal_endpoint) = engine_listener().await;
    let (options, _, drops) = options(1, DEFAULT_HANDSHAKE_TIMEOUT);
    let (_proxy, port) = bind_on_free_port(internal_endpoint, options).await;

    let mut first = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    first.write_all(&handshake()).await.unwrap();
    let (mut zmq, _) = internal.accept().await.unwrap();
    let mut got = vec![0u8; handshake().len()];
    zmq.read_exact(&mut got).await.unwrap();

    let mut second = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    // Closed without reading, whatever it sends.
    let _ = second.write_all(&handshake()).await;
    assert_eq!(until_closed(&mut second).await, 0);
    assert_eq!(drops.lock().unwrap().as_slice(), [Dropped::ConnectionLimit]);

    // The first one still proxies both ways.
    first.write_all(&[0x00, 2, b'o', b'k']).await.unwrap();
    let mut got = [0u8; 4];
    zmq.read_exact(&mut got).await.unwrap();
    assert_eq!(&got[2..], b"ok");
    zmq.write_all(b"sub").await.unwrap();
    let mut got = [0u8; 3];
    first.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"sub");

    // Its end frees the slot: a new connection is forwarded again.
    drop(first);
    assert_eq!(until_closed(&mut zmq).await, 0);
    let mut third = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    third.write_all(&greeting()).await.unwrap();
    let (mut zmq, _) = tokio::time::timeout(Duration::from_secs(5), internal.accept())
        .await
        .expect("the third connection is forwarded")
        .unwrap();
    let mut got = vec![0u8; 64];
    zmq.read_exact(&mut got).await.unwrap();
    assert_eq!(got, greeting());
    assert_eq!(drops.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_silent_connection_is_closed_at_the_deadline_without_reaching_zeromq() {
    let (internal, internal_endpoint) = engine_listener().await;
    let (options, violations, drops) = options(4, Duration::from_millis(200));
    let (_proxy, port) = bind_on_free_port(internal_endpoint, options).await;
    let mut silent = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    assert_eq!(until_closed(&mut silent).await, 0);
    assert_eq!(
        drops.lock().unwrap().as_slice(),
        [Dropped::HandshakeTimeout]
    );
    assert!(violations.lock().unwrap().is_empty());
    // zeromq's listener never saw it.
    let none = tokio::time::timeout(Duration::from_millis(100), internal.accept()).await;
    assert!(none.is_err(), "no upstream connection for a silent peer");
}

#[tokio::test]
async fn a_greeting_without_its_first_command_is_closed_at_the_deadline() {
    let (internal, internal_endpoint) = engine_listener().await;
    let (options, _, drops) = options(4, Duration::from_millis(200));
    let (_proxy, port) = bind_on_free_port(internal_endpoint, options).await;
    let mut eng = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    eng.write_all(&greeting()).await.unwrap();
    let (mut zmq, _) = internal.accept().await.unwrap();
    let mut got = vec![0u8; 64];
    zmq.read_exact(&mut got).await.unwrap();
    assert_eq!(until_closed(&mut eng).await, 0);
    assert_eq!(
        until_closed(&mut zmq).await,
        0,
        "zeromq's side is closed too"
    );
    assert_eq!(
        drops.lock().unwrap().as_slice(),
        [Dropped::HandshakeTimeout]
    );
}

#[tokio::test]
async fn a_completed_handshake_outlives_the_deadline() {
    let (internal, internal_endpoint) = engine_listener().await;
    let (options, _, drops) = options(4, Duration::from_millis(200));
    let (_proxy, port) = bind_on_free_port(internal_endpoint, options).await;
    let mut eng = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    eng.write_all(&handshake()).await.unwrap();
    let (mut zmq, _) = internal.accept().await.unwrap();
    let mut got = vec![0u8; handshake().len()];
    zmq.read_exact(&mut got).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    eng.write_all(&[0x00, 1, b'x']).await.unwrap();
    let mut got = [0u8; 3];
    zmq.read_exact(&mut got).await.unwrap();
    assert_eq!(got, [0x00, 1, b'x']);
    assert!(drops.lock().unwrap().is_empty());
}

#[tokio::test]
async fn connect_mode_closes_an_engine_that_never_greets_and_bounds_connections() {
    let (engine, endpoint) = engine_listener().await;
    let (options, _, drops) = options(1, Duration::from_millis(200));
    let proxy = connect_proxy(endpoint, options).await.unwrap();
    let port = port_of(&proxy.local);
    let mut zmq = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (_silent_engine, _) = engine.accept().await.unwrap();
    let mut over = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    assert_eq!(until_closed(&mut over).await, 0);
    assert_eq!(until_closed(&mut zmq).await, 0);
    assert_eq!(
        drops.lock().unwrap().as_slice(),
        [Dropped::ConnectionLimit, Dropped::HandshakeTimeout]
    );
}

#[tokio::test]
async fn bad_first_bytes_never_open_zeromq_s_side() {
    let (internal, internal_endpoint) = engine_listener().await;
    let (options, violations, _) = defaults();
    let (_proxy, port) = bind_on_free_port(internal_endpoint, options).await;
    let mut eng = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    eng.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    assert_eq!(until_closed(&mut eng).await, 0);
    assert!(matches!(
        violations.lock().unwrap().as_slice(),
        [ZmtpViolation::BadGreeting(_)]
    ));
    let none = tokio::time::timeout(Duration::from_millis(100), internal.accept()).await;
    assert!(none.is_err(), "no upstream connection for a non-ZMTP peer");
}
