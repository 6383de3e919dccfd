//! Real engine publishers: the real vLLM 0.33.0 and SGLang 0.5.23 publishers (their own
//! `ZmqEventPublisher` and event classes, run by `tests/engines/drive.py` in the venv of
//! `scripts/engine-venv.sh`) publish to a real `ckf-producer` over ZMQ; after every step of
//! each scenario the producer holds exactly the canonical hashes of the engine's model
//! (`GetMemberBlocks`) and the indexer answers token queries (`FindMatchesByTokens`) with the
//! model's depths: cached prefix, partly cached, uncached, LoRA / salt / multimodal scoped.
//! TensorRT-LLM's format comes from a publisher in `drive.py` that restates its wire format
//! (`Trtllm`: PUB and ROUTER replay sockets, tagged-map events, `mm_keys`, `lora_id` alone, an
//! image's digest string as a token id), since its own module needs the TensorRT-LLM runtime,
//! which is not installable here.

use ckf_e2e::cluster::{Indexer, IndexerSpec, Producer, ProducerSpec, TestDir, is_active};
use ckf_e2e::engines::{
    Driver, EngineSpec, Expect, Step, engine_python, run_steps, wait_members, wait_queries,
};
use ckf_e2e::metrics;
use ckf_e2e::wait::{DEADLINE, eventually};
use std::collections::{BTreeSet, HashSet};
use std::time::{Duration, Instant};

/// Tokens per KV block in every scenario (not the default 16, so the setting is exercised).
const BLOCK_SIZE: u32 = 4;
/// The engine's worker id.
const WORKER: u64 = 7;

/// A producer counter a scenario must have moved: `(metric, labels, at least)`; the
/// `publisher` label (`7/0`) is added.
type Counted = (&'static str, &'static [(&'static str, &'static str)], f64);

const GAPS: &str = "ckf_producer_engine_gaps_total";
const REPLAYS: &str = "ckf_producer_engine_replays_total";
const CLEARED: &str = "ckf_producer_engine_members_cleared_total";
const SKIPPED: &str = "ckf_producer_engine_skipped_events_total";
const DROPPED: &str = "ckf_producer_engine_connections_dropped_total";
const UNCERTAIN: &str = "ckf_producer_engine_uncertain_total";
const REREAD: &str = "ckf_producer_engine_reread_batches_total";
const CONNECTED: &str = "ckf_producer_engine_connected";

/// One scenario of `drive.py` against an indexer (lane `dc-a`) and a producer configured with
/// the engine (`--engine`, `--block-size`); then the producer's counters in `counted`.
async fn scenario(name: &str, dp_size: u16, counted: &[Counted]) {
    scenario_with(name, EngineSpec::new(WORKER, dp_size), counted).await;
}

/// As [`scenario`], for a given engine.
async fn scenario_with(name: &str, engine: EngineSpec, counted: &[Counted]) {
    let Some(python) = engine_python() else {
        return;
    };
    let dir = TestDir::new(&format!("engines-{name}"));
    let indexer = Indexer::start(
        &dir,
        &IndexerSpec {
            lanes: vec!["dc-a".into()],
            block_size: Some(BLOCK_SIZE),
            ..IndexerSpec::default()
        },
    );
    let spec = ProducerSpec {
        block_size: Some(BLOCK_SIZE),
        engines: vec![engine.flag()],
        ..ProducerSpec::new("dc-a")
    };
    let producer = Producer::start(&dir, "producer-a", &spec, &[indexer.url()]);
    indexer.wait_lane("dc-a", "active", is_active).await;
    let mut driver = Driver::spawn(&python, &dir, name, &engine, BLOCK_SIZE);
    let model = run_steps(&mut driver, producer.addr, indexer.addr, "dc-a").await;
    assert!(
        !model.queries.is_empty(),
        "{name}: the scenario checks token queries"
    );
    let text = producer.metrics().expect("scrape the producer");
    let publisher = format!("{WORKER}/0");
    for &(metric, labels, at_least) in counted {
        let mut all = vec![("publisher", publisher.as_str())];
        all.extend_from_slice(labels);
        let value = metrics::value(&text, metric, &all).unwrap_or(0.0);
        assert!(
            value >= at_least,
            "{name}: {metric}{all:?} = {value}, expected at least {at_least}"
        );
    }
}

/// vLLM: stores (one with a prefix shared with another request), removes, a clear, stores again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_store_remove_clear() {
    scenario("store_remove_clear", 1, &[]).await;
}

/// vLLM's publisher exactly as shipped, given a concrete host: it connects its PUB to the
/// producer's bound SUB (`mode=bind`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_connecting_to_a_binding_producer() {
    let engine = EngineSpec {
        producer_binds: true,
        ..EngineSpec::new(WORKER, 1)
    };
    scenario_with("connect", engine, &[]).await;
}

/// Local ports of the TCP sockets process `pid` listens on (Linux `/proc`).
/// A ZMTP 3.0 NULL-mechanism greeting and the PUB socket's `READY` command: what an engine's
/// publisher sends first.
fn zmtp_pub_handshake() -> Vec<u8> {
    let mut bytes = vec![0u8; 64];
    bytes[0] = 0xff;
    bytes[9] = 0x7f;
    bytes[10] = 3;
    bytes[12..16].copy_from_slice(b"NULL");
    let ready = b"\x05READY\x0bSocket-Type\0\0\0\x03PUB";
    bytes.extend_from_slice(&[0x04, u8::try_from(ready.len()).expect("short")]);
    bytes.extend_from_slice(ready);
    bytes
}

fn tcp_listen_ports(pid: u32) -> BTreeSet<u16> {
    let inodes: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the producer's fds")
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|link| {
            let link = link.to_string_lossy().into_owned();
            Some(link.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
        })
        .collect();
    let mut ports = BTreeSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st ... inode (field 9); st 0A = LISTEN.
            if f.len() > 9 && f[3] == "0A" && inodes.contains(f[9]) {
                let port = f[1].rsplit(':').next().expect("addr:port");
                ports.insert(u16::from_str_radix(port, 16).expect("hex port"));
            }
        }
    }
    ports
}

/// The engine guard: in bind mode the producer opens no TCP port for zeromq (its
/// listener is a private Unix socket behind the guard), so its TCP listeners are exactly its
/// Ingest, metrics and engine ports; a flood of silent connections on the engine port is capped
/// (`connection_limit`) and timed out (`handshake_timeout`), and vLLM's publisher then works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binding_producer_opens_no_tcp_port_for_zeromq_and_sheds_a_connection_flood() {
    let Some(python) = engine_python() else {
        return;
    };
    let engine = EngineSpec {
        producer_binds: true,
        // No replay socket: its relay's loopback listener would be one more TCP port.
        replay_port: None,
        ..EngineSpec::new(WORKER, 1)
    };
    let dir = TestDir::new("engines-bind-guard");
    let indexer = Indexer::start(
        &dir,
        &IndexerSpec {
            lanes: vec!["dc-a".into()],
            block_size: Some(BLOCK_SIZE),
            ..IndexerSpec::default()
        },
    );
    let spec = ProducerSpec {
        block_size: Some(BLOCK_SIZE),
        engines: vec![engine.flag()],
        ..ProducerSpec::new("dc-a")
    };
    let producer = Producer::start(&dir, "producer-a", &spec, &[indexer.url()]);
    indexer.wait_lane("dc-a", "active", is_active).await;
    let expected: BTreeSet<u16> = [
        producer.addr.port(),
        producer.metrics_addr.port(),
        engine.port,
    ]
    .into();
    let pid = producer.pid();
    eventually("the producer's TCP listeners", DEADLINE, || {
        let expected = expected.clone();
        async move {
            let got = tcp_listen_ports(pid);
            if got == expected {
                Ok(())
            } else {
                Err(format!(
                    "listening on {got:?}, expected exactly {expected:?}"
                ))
            }
        }
    })
    .await;

    // 80 silent connections: 64 held, 16 closed at accept; the 64 closed at the deadline.
    let mut flood = Vec::new();
    for _ in 0..80 {
        flood.push(
            tokio::net::TcpStream::connect(("127.0.0.1", engine.port))
                .await
                .expect("connect to the engine endpoint"),
        );
    }
    let publisher = format!("{WORKER}/0");
    let endpoint = engine.endpoint();
    let dropped = |reason: &'static str| {
        let labels = [
            ("publisher", publisher.clone()),
            ("endpoint", endpoint.clone()),
            ("reason", reason.to_owned()),
        ];
        let text = producer.metrics().unwrap_or_default();
        let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        metrics::value(&text, DROPPED, &labels).unwrap_or(0.0)
    };
    eventually("connections over the limit closed", DEADLINE, || {
        let n = dropped("connection_limit");
        async move {
            if n >= 16.0 {
                Ok(())
            } else {
                Err(format!("connection_limit = {n}"))
            }
        }
    })
    .await;
    assert_eq!(dropped("connection_limit"), 16.0, "exactly those over 64");
    eventually(
        "silent connections closed at the deadline",
        Duration::from_secs(30),
        || {
            let n = dropped("handshake_timeout");
            async move {
                if n >= 64.0 {
                    Ok(())
                } else {
                    Err(format!("handshake_timeout = {n}"))
                }
            }
        },
    )
    .await;
    drop(flood);

    // 200 peers, one after the other, that complete the handshake and break off in the middle
    // of a frame: zeromq drops each at once and the receive loop goes on without pausing (it
    // used to sleep 500 ms per broken peer, holding their descriptors and stalling the engine's
    // events behind them for minutes).
    let fds = || std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    let baseline = fds();
    for _ in 0..200 {
        use tokio::io::AsyncWriteExt;
        let mut peer = tokio::net::TcpStream::connect(("127.0.0.1", engine.port))
            .await
            .expect("connect to the engine endpoint");
        use tokio::io::AsyncReadExt;
        peer.write_all(&zmtp_pub_handshake()).await.expect("send");
        // zeromq's own greeting and READY back: the peer is in its receive queue now.
        let mut got = Vec::new();
        let mut buf = [0u8; 256];
        while got.len() < 64 + 2 + 10 {
            match tokio::time::timeout(Duration::from_secs(5), peer.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
                other => panic!("no ZMTP handshake from the producer: {other:?}"),
            }
        }
        let mut frame = vec![0x02]; // a long message frame, the last of its message
        frame.extend_from_slice(&(1u64 << 20).to_be_bytes());
        frame.extend_from_slice(&[0u8; 100]);
        peer.write_all(&frame).await.expect("send");
        drop(peer);
    }
    let decode_errors = || {
        let text = producer.metrics().unwrap_or_default();
        let labels = [
            ("publisher", publisher.as_str()),
            ("endpoint", endpoint.as_str()),
            ("kind", "zmtp_peer_error"),
        ];
        metrics::value(&text, "ckf_producer_engine_decode_errors_total", &labels).unwrap_or(0.0)
    };
    eventually("broken peers dropped and counted", DEADLINE, || {
        let (n, open) = (decode_errors(), fds());
        async move {
            if n >= 150.0 && open <= baseline + 8 {
                Ok(())
            } else {
                Err(format!(
                    "zmtp_peer_error = {n}, {open} fds open (baseline {baseline})"
                ))
            }
        }
    })
    .await;

    // The engine itself is served as before.
    let mut driver = Driver::spawn(&python, &dir, "connect", &engine, BLOCK_SIZE);
    let model = run_steps(&mut driver, producer.addr, indexer.addr, "dc-a").await;
    assert!(!model.queries.is_empty());
}

/// vLLM with two data-parallel ranks: a publisher per rank on port + r, members (7, 0) and
/// (7, 1) kept apart; the lane answers for their union.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_two_dp_ranks() {
    scenario("two_ranks", 2, &[]).await;
}

/// vLLM: three batches never reach the producer; the gap is filled from the publisher's real
/// replay socket, then a second gap right after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_gap_filled_by_replay() {
    scenario(
        "gap_replay",
        1,
        &[(GAPS, &[], 2.0), (REPLAYS, &[("outcome", "filled")], 2.0)],
    )
    .await;
}

/// vLLM: lost batches the replay buffer no longer has: the producer clears the member itself,
/// later stores come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_gap_the_replay_cannot_fill() {
    scenario(
        "gap_unfilled",
        1,
        &[(GAPS, &[], 2.0), (CLEARED, &[("reason", "gap")], 1.0)],
    )
    .await;
}

/// vLLM restarts: a new publisher on the same ports, sequence from 0: the member is cleared,
/// then holds only the new stores. The dropped connection made the publisher uncertain; the
/// new process was found by its sequence going backwards or by its replay buffer (the clear's
/// reason is `restart` or `unverified`, whichever came first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_publisher_restart() {
    scenario(
        "restart",
        1,
        &[
            (CLEARED, &[], 1.0),
            (UNCERTAIN, &[("cause", "reconnect")], 1.0),
        ],
    )
    .await;
}

/// An engine restart whose new process publishes, before the producer's SUB socket is back,
/// up to the old process's last sequence - 1, the same sequence, or 3 above it, then goes idle:
/// the reconnection is verified against the new process's replay buffer, the old blocks are
/// cleared and the new ones re-read, with no live batch after (the CHECK sends none).
async fn restart_at(name: &str) {
    scenario(
        name,
        1,
        &[
            (UNCERTAIN, &[("cause", "reconnect")], 1.0),
            (CLEARED, &[], 1.0),
            (REREAD, &[], 2.0),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_restart_to_a_sequence_below_the_last_applied() {
    restart_at("restart_below").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_restart_to_the_last_applied_sequence() {
    restart_at("restart_equal").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_restart_to_a_sequence_above_the_last_applied() {
    restart_at("restart_above").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_restart_to_the_last_applied_sequence() {
    restart_at("sglang_restart_equal").await;
}

/// vLLM's process stops (SIGSTOP) with nothing new to publish: the producer's idle check of
/// it times out and clears its member. Once the process runs again, its buffer is re-read (the
/// publisher stays unsettled after a failed replay until a re-read completes), so the member
/// holds exactly what the engine holds, with no new batch from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_stalled_past_the_replay_timeout_is_reread_once_it_runs_again() {
    let Some(python) = engine_python() else {
        return;
    };
    let dir = TestDir::new("engines-stall");
    let indexer = indexer(&dir);
    let engine = EngineSpec::new(WORKER, 1);
    let spec = ProducerSpec {
        block_size: Some(BLOCK_SIZE),
        engines: vec![engine.flag()],
        args: ["--verify-idle-ms", "500", "--replay-timeout-ms", "500"]
            .map(String::from)
            .to_vec(),
        ..ProducerSpec::new("dc-a")
    };
    let producer = Producer::start(&dir, "producer-a", &spec, &[indexer.url()]);
    indexer.wait_lane("dc-a", "active", is_active).await;
    let mut driver = Driver::spawn(&python, &dir, "stall", &engine, BLOCK_SIZE);
    let mut checks = 0;
    loop {
        match driver.next_step().await {
            Step::Ready(expect) => wait_members(producer.addr, "warm-up", &expect).await,
            Step::Check(expect) => {
                checks += 1;
                let what = format!("check {checks}");
                wait_members(producer.addr, &what, &expect).await;
                wait_queries(indexer.addr, "dc-a", &what, &expect).await;
            }
            Step::Pause(name) if name == "stall" => {
                driver.signal(libc::SIGSTOP);
                eventually("the stalled engine's member cleared", DEADLINE, || {
                    let failed = engine_metric(&producer, REPLAYS, &[("outcome", "failed")]);
                    let cleared = engine_metric(&producer, CLEARED, &[]);
                    async move {
                        if failed >= 1.0 && cleared >= 1.0 {
                            Ok(())
                        } else {
                            Err(format!("{failed} replays failed, {cleared} clears"))
                        }
                    }
                })
                .await;
                driver.signal(libc::SIGCONT);
            }
            step => panic!("unexpected step {step:?}"),
        }
        if checks == 2 {
            break;
        }
        driver.go();
    }
    assert!(
        engine_metric(&producer, REREAD, &[]) >= 1.0,
        "the member came back through a re-read"
    );
}

/// A counter or gauge of the engine's rank-0 publisher (`7/0`) with extra `labels`.
fn engine_metric(producer: &Producer, name: &str, labels: &[(&str, &str)]) -> f64 {
    let text = producer.metrics().unwrap_or_default();
    let publisher = format!("{WORKER}/0");
    let mut all = vec![("publisher", publisher.as_str())];
    all.extend_from_slice(labels);
    metrics::value(&text, name, &all).unwrap_or(0.0)
}

/// An indexer with lane `dc-a` for [`BLOCK_SIZE`].
fn indexer(dir: &TestDir) -> Indexer {
    Indexer::start(
        dir,
        &IndexerSpec {
            lanes: vec!["dc-a".into()],
            block_size: Some(BLOCK_SIZE),
            ..IndexerSpec::default()
        },
    )
}

/// A producer of `dc-a` configured with `engines`.
fn producer(dir: &TestDir, engines: &[&EngineSpec], indexer: &Indexer) -> Producer {
    let spec = ProducerSpec {
        block_size: Some(BLOCK_SIZE),
        engines: engines.iter().map(|e| e.flag()).collect(),
        ..ProducerSpec::new("dc-a")
    };
    Producer::start(dir, "producer-a", &spec, &[indexer.url()])
}

/// Checks one CHECK-like step: the producer's members, then the lane's token answers.
async fn check(producer: &Producer, indexer: &Indexer, what: &str, expect: &Expect) {
    wait_members(producer.addr, what, expect).await;
    wait_queries(indexer.addr, "dc-a", what, expect).await;
}

/// The engine (vLLM) is gone for six seconds, then a new process stores a request every 50 ms:
/// the producer reconnects (its own retry, where zeromq's backoff would have reached seconds;
/// how long it took is printed, not asserted), and holds exactly what the new process stored,
/// those stores published before the reconnection included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_engine_down_for_seconds_is_reconnected_and_converges() {
    let Some(python) = engine_python() else {
        return;
    };
    let dir = TestDir::new("engines-outage");
    let indexer = indexer(&dir);
    let engine = EngineSpec::new(WORKER, 1);
    let producer = producer(&dir, &[&engine], &indexer);
    indexer.wait_lane("dc-a", "active", is_active).await;
    let mut driver = Driver::spawn(&python, &dir, "outage", &engine, BLOCK_SIZE);
    let mut index = 0;
    let mut reconnected = None;
    loop {
        index += 1;
        let what = format!("outage step {index}");
        match driver.next_step().await {
            Step::Ready(expect) => wait_members(producer.addr, &what, &expect).await,
            Step::Check(expect) | Step::Catchup(expect) => {
                check(&producer, &indexer, &what, &expect).await;
            }
            Step::Pause(name) if name == "down" => {
                eventually(&format!("{what}: disconnected"), DEADLINE, || {
                    let n = engine_metric(&producer, CONNECTED, &[]);
                    async move {
                        if n == 0.0 {
                            Ok(())
                        } else {
                            Err(format!("connected = {n}"))
                        }
                    }
                })
                .await;
            }
            Step::Pause(name) if name == "up" => {
                let up = Instant::now();
                eventually(&format!("{what}: reconnected"), DEADLINE, || {
                    let n = engine_metric(&producer, CONNECTED, &[]);
                    async move {
                        if n >= 1.0 {
                            Ok(())
                        } else {
                            Err(format!("connected = {n}"))
                        }
                    }
                })
                .await;
                reconnected = Some(up.elapsed());
            }
            Step::Pause(name) => panic!("{what}: unknown PAUSE {name:?}"),
            Step::Emptied(expect) => wait_members(producer.addr, &what, &expect).await,
            Step::Done => break,
        }
        driver.go();
    }
    let model = driver.model();
    check(&producer, &indexer, "outage final", &model).await;
    driver.go();
    driver.wait_success();
    // How long the reconnection took is reported, not asserted (a busy machine is slower).
    let reconnected = reconnected.expect("the driver paused at `up`");
    eprintln!("reconnected {reconnected:?} after the engine listened again");
    assert!(engine_metric(&producer, UNCERTAIN, &[("cause", "reconnect")]) >= 1.0);
    assert!(engine_metric(&producer, CLEARED, &[]) >= 1.0);
}

/// Runs `scenario`, whose engine publishes before any producer exists; the producer starts at
/// `PAUSE start`. Returns the producer and the final model.
async fn late_producer(scenario: &str) -> Option<(Producer, Expect)> {
    let python = engine_python()?;
    let dir = TestDir::new(&format!("engines-{scenario}"));
    let indexer = indexer(&dir);
    let engine = EngineSpec::new(WORKER, 1);
    let mut driver = Driver::spawn(&python, &dir, scenario, &engine, BLOCK_SIZE);
    let mut producer_a: Option<Producer> = None;
    let mut index = 0;
    loop {
        index += 1;
        let what = format!("{scenario} step {index}");
        match driver.next_step().await {
            Step::Pause(name) if name == "start" => {
                assert!(producer_a.is_none(), "{what}: started once");
                let p = producer(&dir, &[&engine], &indexer);
                indexer.wait_lane("dc-a", "active", is_active).await;
                producer_a = Some(p);
            }
            Step::Check(expect) => {
                let p = producer_a
                    .as_ref()
                    .expect("a CHECK after the producer started");
                check(p, &indexer, &what, &expect).await;
            }
            Step::Done => break,
            other => panic!("{what}: unexpected step {other:?}"),
        }
        driver.go();
    }
    let producer_a = producer_a.expect("the producer started");
    let model = driver.model();
    check(&producer_a, &indexer, &format!("{scenario} final"), &model).await;
    driver.go();
    driver.wait_success();
    Some((producer_a, model))
}

/// A producer started after its engine published 11 batches (a 40-block chain among them)
/// re-reads the engine's replay buffer at its first connection: it holds every block the
/// engine holds with no live batch after, and the lane answers the chain's full depth.
async fn a_late_producer_indexes_what_the_engine_already_holds(scenario: &str) {
    let Some((p, model)) = late_producer(scenario).await else {
        return;
    };
    assert!(model.members[0].canonical.len() >= 40 + 5 + 3);
    assert_eq!(
        engine_metric(&p, UNCERTAIN, &[("cause", "first_contact")]),
        1.0
    );
    assert_eq!(
        engine_metric(&p, REREAD, &[]),
        11.0,
        "the 11 batches published before the producer started"
    );
    assert_eq!(engine_metric(&p, CLEARED, &[]), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_late_producer_indexes_the_engines_buffer() {
    a_late_producer_indexes_what_the_engine_already_holds("late_producer").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_late_producer_indexes_the_engines_buffer() {
    a_late_producer_indexes_what_the_engine_already_holds("sglang_late_producer").await;
}

/// With a replay buffer of 4 batches, what the engine stored before its last 4 batches is out
/// of reach of a producer that starts later: the producer holds exactly the rest (the model
/// leaves the evicted request out, and its token query answers depth 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_late_producer_past_the_engines_buffer_holds_what_the_buffer_still_has() {
    let Some((p, model)) = late_producer("late_producer_past_buffer").await else {
        return;
    };
    let evicted = model
        .queries
        .iter()
        .find(|q| q.name == "evicted-from-the-buffer")
        .expect("the scenario queries the evicted request");
    assert_eq!(evicted.expected_depth, 0);
    assert_eq!(
        engine_metric(&p, REREAD, &[]),
        4.0,
        "the buffer's 4 batches"
    );
}

/// Two engines of one DC (vLLM worker 7, SGLang worker 8) store the same tokens; vLLM restarts
/// and stores C: its member holds C only, SGLang's member keeps A and B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_engines_sharing_tokens_one_restarts() {
    let Some(python) = engine_python() else {
        return;
    };
    let dir = TestDir::new("engines-shared");
    let indexer = indexer(&dir);
    let vllm = EngineSpec::new(WORKER, 1);
    let sglang = EngineSpec::new(WORKER + 1, 1);
    let producer = producer(&dir, &[&vllm, &sglang], &indexer);
    indexer.wait_lane("dc-a", "active", is_active).await;
    let mut restarting = Driver::spawn(&python, &dir, "shared_restart", &vllm, BLOCK_SIZE);
    let mut steady = Driver::spawn(&python, &dir, "sglang_shared_steady", &sglang, BLOCK_SIZE);
    let (restarted, kept) = tokio::join!(
        run_steps(&mut restarting, producer.addr, indexer.addr, "dc-a"),
        run_steps(&mut steady, producer.addr, indexer.addr, "dc-a"),
    );
    assert_eq!(restarted.members[0].canonical.len(), 3, "C only");
    assert_eq!(kept.members[0].canonical.len(), 6 + 3, "A and B");
    // After both ended, SGLang's member still holds A and B.
    wait_members(producer.addr, "SGLang's member at the end", &kept).await;
}

/// vLLM LoRA (`lora_name` and the per-block extra keys vLLM builds), a cache salt on the first
/// block only (continuations inherit it), a multimodal item across two blocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_lora_salt_and_multimodal() {
    scenario("lora", 1, &[]).await;
}

/// vLLM with `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES` off: 32-byte digests as block hashes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_bytes_block_hashes() {
    scenario("bytes_hashes", 1, &[]).await;
}

/// vLLM: CPU-tier stores and removals (same engine hashes as GPU blocks), a non-main KV-cache
/// group and a foreign block size never enter the filter nor touch GPU blocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_cpu_tier_other_group_and_block_size_stay_out() {
    scenario(
        "cpu_tier",
        1,
        &[
            // CPU stores: A's first 4 blocks, B's 3, C's 3; then the removal of A's 4 copies.
            (SKIPPED, &[("reason", "medium")], 14.0),
            (SKIPPED, &[("reason", "group")], 4.0),
            (SKIPPED, &[("reason", "block_size")], 2.0),
        ],
    )
    .await;
}

/// SGLang: `CPU_PINNED` stores and removals, a foreign block size: never in the filter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_cpu_pinned_tier_stays_out() {
    scenario(
        "sglang_cpu_tier",
        1,
        &[
            (SKIPPED, &[("reason", "medium")], 14.0),
            (SKIPPED, &[("reason", "block_size")], 2.0),
        ],
    )
    .await;
}

/// Older vLLM encoding: positional tagged arrays, with shorter and longer tails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_older_positional_events() {
    scenario("positional", 1, &[]).await;
}

/// SGLang: signed (negative) int64 block hashes, `cache_salt` on every store, a LoRA name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_signed_hashes_and_cache_salt() {
    scenario("sglang", 1, &[]).await;
}

/// TensorRT-LLM's format (drive.py's `Trtllm`, its wire format restated): int64 block hashes,
/// a request whose image starts mid-block (the image's digest string in place of its first
/// token id, `mm_keys` on every block it spans), an image named by a uuid, a LoRA named by
/// `lora_id` alone (queried as LoRA name `"7"`), removals and a clear. The image's blocks
/// answer only a query naming the image with `IMAGE_DIGEST_TOKEN` at its first position, the
/// LoRA's only the adapter; two gaps (one of them over the image store, one over the clear)
/// are filled from the publisher's ROUTER replay socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trtllm_image_lora_and_string_tokens() {
    scenario(
        "trtllm",
        1,
        &[
            (GAPS, &[], 2.0),
            // Both gaps: the replay starts at the last applied batch, byte for byte.
            (REPLAYS, &[("outcome", "verified")], 2.0),
            (REPLAYS, &[("outcome", "filled")], 2.0),
        ],
    )
    .await;
}
