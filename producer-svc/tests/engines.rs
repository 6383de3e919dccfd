//! ZMQ ingest against a fake engine written with the `zeromq` crate (a PUB socket per dp rank
//! and a ROUTER replay socket speaking vLLM's protocol), payloads built by hand with `rmpv`.
//! Every scenario checks the producer's exact state through `Ingest.GetMemberBlocks` and its
//! counters through the metrics registry.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use ckf_core::tokens::{BlockSeed, sequence_hashes};
use ckf_proto::v1;
use common::{eventually, metric};
use producer_svc::engines::config::EngineSpec;
use producer_svc::{ProducerConfig, RunningProducer};
use rmpv::Value as V;
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

const BLOCK: u32 = 4;

// --- payloads -------------------------------------------------------------------------------

fn enc(v: &V) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, v).expect("encode");
    out
}

fn map(items: Vec<(&str, V)>) -> V {
    V::Map(items.into_iter().map(|(k, v)| (V::from(k), v)).collect())
}

/// vLLM's tagged-map `BlockStored` of `tokens` (whole blocks) with engine hashes `hashes`.
fn stored(hashes: &[u64], parent: Option<u64>, tokens: &[u32], medium: &str) -> V {
    map(vec![
        ("type", V::from("BlockStored")),
        (
            "block_hashes",
            V::Array(hashes.iter().map(|h| V::from(*h)).collect()),
        ),
        ("parent_block_hash", parent.map_or(V::Nil, V::from)),
        (
            "token_ids",
            V::Array(tokens.iter().map(|t| V::from(*t)).collect()),
        ),
        ("block_size", V::from(BLOCK)),
        ("lora_id", V::Nil),
        ("medium", V::from(medium)),
    ])
}

fn removed(hashes: &[u64]) -> V {
    map(vec![
        ("type", V::from("BlockRemoved")),
        (
            "block_hashes",
            V::Array(hashes.iter().map(|h| V::from(*h)).collect()),
        ),
        ("medium", V::from("GPU")),
    ])
}

fn all_cleared() -> V {
    map(vec![("type", V::from("AllBlocksCleared"))])
}

/// `[ts, events, dp_rank]`, or `[ts, events]` without a rank.
fn batch(events: Vec<V>, rank: Option<u32>) -> Vec<u8> {
    let mut items = vec![V::F64(1.0), V::Array(events)];
    if let Some(r) = rank {
        items.push(V::from(r));
    }
    enc(&V::Array(items))
}

fn heartbeat() -> Vec<u8> {
    batch(Vec::new(), None)
}

/// The canonical hashes of `tokens` (no salt, no LoRA), the rule's own function.
fn canonical(tokens: &[u32]) -> Vec<u64> {
    sequence_hashes(tokens, BLOCK as usize, BlockSeed::new(None, None), &[]).expect("hashes")
}

fn sorted(mut v: Vec<u64>) -> Vec<u64> {
    v.sort_unstable();
    v
}

// --- fake engine ----------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReplayMode {
    /// Every buffered batch from the requested sequence on, then the end marker.
    Full,
    /// Only the end marker (the engine's buffer lost the batches).
    Empty,
    /// No answer at all.
    Silent,
}

type Buffer = Arc<Mutex<Vec<(i64, Vec<u8>)>>>;

/// One engine with `dp` ranks: PUB on `port + r`, ROUTER replay on `replay_port + r`.
struct FakeEngine {
    pubs: Vec<zeromq::PubSocket>,
    next: Vec<i64>,
    buffers: Vec<Buffer>,
    mode: Arc<Mutex<ReplayMode>>,
    port: u16,
    replay_port: u16,
}

impl FakeEngine {
    async fn start(dp: u32) -> Self {
        for attempt in 0u32..50 {
            let base = 20_000 + ((std::process::id() * 7 + attempt * 997) % 20_000) as u16;
            let mut pubs = Vec::new();
            let mut ok = true;
            for r in 0..dp as u16 {
                let mut s = zeromq::PubSocket::new();
                if s.bind(&format!("tcp://127.0.0.1:{}", base + r))
                    .await
                    .is_err()
                {
                    ok = false;
                    break;
                }
                pubs.push(s);
            }
            if !ok {
                continue;
            }
            let mode = Arc::new(Mutex::new(ReplayMode::Full));
            let mut buffers = Vec::new();
            let replay_port = base + 1_000;
            for r in 0..dp as u16 {
                let mut router = zeromq::RouterSocket::new();
                if router
                    .bind(&format!("tcp://127.0.0.1:{}", replay_port + r))
                    .await
                    .is_err()
                {
                    ok = false;
                    break;
                }
                let buffer: Buffer = Arc::default();
                tokio::spawn(serve_replay(router, buffer.clone(), mode.clone()));
                buffers.push(buffer);
            }
            if !ok {
                continue;
            }
            return Self {
                pubs,
                next: vec![0; dp as usize],
                buffers,
                mode,
                port: base,
                replay_port,
            };
        }
        panic!("no free ports for the fake engine");
    }

    fn spec(&self, worker_id: u64, dp: u32, replay: bool) -> EngineSpec {
        let mut s = format!(
            "worker_id={worker_id},endpoint=tcp://127.0.0.1:{},dp_size={dp}",
            self.port
        );
        if replay {
            s.push_str(&format!(
                ",replay_endpoint=tcp://127.0.0.1:{}",
                self.replay_port
            ));
        }
        s.parse().expect("valid spec")
    }

    fn set_mode(&self, mode: ReplayMode) {
        *self.mode.lock().unwrap() = mode;
    }

    /// Numbers `payload` and keeps it for replay; sends it unless `lose`.
    async fn send(&mut self, rank: usize, payload: Vec<u8>, lose: bool) -> i64 {
        let seq = self.next[rank];
        self.next[rank] += 1;
        self.buffers[rank]
            .lock()
            .unwrap()
            .push((seq, payload.clone()));
        if !lose {
            self.send_raw(rank, vec![Bytes::new(), seq_bytes(seq), payload.into()])
                .await;
        }
        seq
    }

    async fn publish(&mut self, rank: usize, payload: Vec<u8>) -> i64 {
        self.send(rank, payload, false).await
    }

    async fn send_raw(&mut self, rank: usize, parts: Vec<Bytes>) {
        let msg = ZmqMessage::try_from(parts).expect("non-empty");
        self.pubs[rank].send(msg).await.expect("publish");
    }

    /// The engine restarted: numbering starts again at 0, its replay buffer is empty.
    fn restart(&mut self, rank: usize) {
        self.next[rank] = 0;
        self.buffers[rank].lock().unwrap().clear();
    }
}

fn seq_bytes(seq: i64) -> Bytes {
    Bytes::copy_from_slice(&seq.to_be_bytes())
}

async fn serve_replay(
    mut router: zeromq::RouterSocket,
    buffer: Buffer,
    mode: Arc<Mutex<ReplayMode>>,
) {
    while let Ok(msg) = router.recv().await {
        let parts = msg.into_vec();
        let (Some(peer), Some(start)) = (parts.first(), parts.get(2)) else {
            continue;
        };
        let start = i64::from_be_bytes(start[..8].try_into().expect("8 bytes"));
        let mode = *mode.lock().unwrap();
        if mode == ReplayMode::Silent {
            continue;
        }
        let mut replies = Vec::new();
        if mode == ReplayMode::Full {
            for (s, p) in buffer.lock().unwrap().iter().filter(|(s, _)| *s >= start) {
                replies.push(vec![
                    peer.clone(),
                    Bytes::new(),
                    Bytes::new(),
                    seq_bytes(*s),
                    Bytes::from(p.clone()),
                ]);
            }
        }
        replies.push(vec![
            peer.clone(),
            Bytes::new(),
            Bytes::new(),
            seq_bytes(-1),
            Bytes::new(),
        ]);
        for r in replies {
            let _ = router
                .send(ZmqMessage::try_from(r).expect("non-empty"))
                .await;
        }
    }
}

// --- producer helpers -----------------------------------------------------------------------

async fn producer(
    engines: Vec<EngineSpec>,
    edit: impl FnOnce(&mut ProducerConfig),
) -> RunningProducer {
    // No indexer listens there: publication retries in the background, ingest is unaffected.
    let mut config = common::fast_config(vec!["http://127.0.0.1:9".into()]);
    config.block_size = BLOCK;
    config.engines = engines;
    config.engine.replay_timeout_ms = 1_000;
    edit(&mut config);
    common::start_with(config).await
}

async fn blocks(p: &RunningProducer, worker_id: u64, dp_rank: u32) -> Vec<u64> {
    let mut c = common::ingest_client(p).await;
    c.get_member_blocks(v1::GetMemberBlocksRequest {
        member: common::member(worker_id, dp_rank),
    })
    .await
    .expect("GetMemberBlocks")
    .into_inner()
    .block_hashes
}

async fn wait_blocks(p: &RunningProducer, worker: u64, rank: u32, want: &[u64]) {
    let want = sorted(want.to_vec());
    let mut last = Vec::new();
    for _ in 0..200 {
        last = blocks(p, worker, rank).await;
        if last == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("member {worker}/{rank}: {last:?}, want {want:?}");
}

/// Publishes heartbeats until the producer has received one on every rank (the SUB socket is
/// connected and subscribed: ZMQ drops what a PUB sends before that).
async fn prime(p: &RunningProducer, engine: &mut FakeEngine, worker: u64) {
    for rank in 0..engine.pubs.len() {
        let label = format!("{worker}/{rank}");
        for _ in 0..200 {
            if metric(
                p,
                "ckf_producer_engine_batches_total",
                &[("publisher", &label)],
            ) > 0.0
            {
                break;
            }
            engine.publish(rank, heartbeat()).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            metric(
                p,
                "ckf_producer_engine_batches_total",
                &[("publisher", &label)]
            ) > 0.0
        );
    }
}

// --- scenarios ------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_remove_clear_on_two_ranks() {
    let mut engine = FakeEngine::start(2).await;
    let p = producer(vec![engine.spec(7, 2, false)], |_| {}).await;
    prime(&p, &mut engine, 7).await;
    assert_eq!(
        metric(&p, "ckf_producer_engine_connected", &[("publisher", "7/1")]),
        1.0
    );

    let a: Vec<u32> = (0..12).collect();
    let b: Vec<u32> = (100..108).collect();
    let ca = canonical(&a);
    let cb = canonical(&b);
    // Rank 0 names its rank; rank 1's batch has none: the socket's rank applies.
    engine
        .publish(
            0,
            batch(vec![stored(&[11, 12, 13], None, &a, "GPU")], Some(0)),
        )
        .await;
    engine
        .publish(1, batch(vec![stored(&[21, 22], None, &b, "GPU")], None))
        .await;
    wait_blocks(&p, 7, 0, &ca).await;
    wait_blocks(&p, 7, 1, &cb).await;

    // A child block chained on engine hash 13; a CPU-tier copy does not enter.
    let c: Vec<u32> = (12..16).collect();
    let mut abc = a.clone();
    abc.extend(&c);
    engine
        .publish(
            0,
            batch(
                vec![
                    stored(&[14], Some(13), &c, "GPU"),
                    stored(&[91], None, &b, "CPU"),
                ],
                Some(0),
            ),
        )
        .await;
    wait_blocks(&p, 7, 0, &canonical(&abc)).await;
    assert_eq!(
        metric(
            &p,
            "ckf_producer_engine_skipped_events_total",
            &[("publisher", "7/0"), ("reason", "medium")]
        ),
        1.0
    );

    // Removal by engine hash.
    engine
        .publish(0, batch(vec![removed(&[12, 13, 14])], Some(0)))
        .await;
    wait_blocks(&p, 7, 0, &ca[..1]).await;
    // Clear rank 0 only.
    engine.publish(0, batch(vec![all_cleared()], Some(0))).await;
    wait_blocks(&p, 7, 0, &[]).await;
    assert_eq!(blocks(&p, 7, 1).await, sorted(cb.clone()));
    assert_eq!(
        metric(
            &p,
            "ckf_producer_engine_events_total",
            &[("publisher", "7/0"), ("type", "stored")]
        ),
        3.0
    );
    assert_eq!(metric(&p, "ckf_producer_engine_gaps_total", &[]), 0.0);
    assert!(metric(&p, "ckf_producer_engine_lineage_bytes", &[]) >= 0.0);

    // WorkerRemoved over gRPC drops the state and the lineage: a later child of engine hash
    // 22 is an orphan.
    let mut c = common::ingest_client(&p).await;
    c.publish_batch(common::batch("ops", 1, vec![common::worker_removed(7)]))
        .await
        .expect("worker removed");
    assert!(blocks(&p, 7, 1).await.is_empty());
    engine
        .publish(
            1,
            batch(vec![stored(&[23], Some(22), &c_tokens(), "GPU")], None),
        )
        .await;
    eventually("an orphan counted", || async {
        metric(
            &p,
            "ckf_producer_engine_skipped_events_total",
            &[("publisher", "7/1"), ("reason", "orphan")],
        ) == 1.0
    })
    .await;
    assert!(blocks(&p, 7, 1).await.is_empty());
}

fn c_tokens() -> Vec<u32> {
    (200..204).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_is_filled_by_the_replay() {
    let mut engine = FakeEngine::start(1).await;
    let p = producer(vec![engine.spec(3, 1, true)], |_| {}).await;
    prime(&p, &mut engine, 3).await;
    let a: Vec<u32> = (0..4).collect();
    let b: Vec<u32> = (4..8).collect();
    let mut ab = a.clone();
    ab.extend(&b);
    engine
        .publish(0, batch(vec![stored(&[1], None, &a, "GPU")], Some(0)))
        .await;
    // Lost on the way: only the replay has it, and the next live batch chains on it.
    engine
        .send(
            0,
            batch(vec![stored(&[2], Some(1), &b, "GPU")], Some(0)),
            true,
        )
        .await;
    engine.publish(0, batch(vec![removed(&[1])], Some(0))).await;
    let bl = canonical(&ab);
    wait_blocks(&p, 3, 0, &bl[1..]).await;
    // The gap's replay verified the last applied batch, then filled; the first contact's
    // re-read of the engine's buffer came before it (and a second one when that re-read found
    // the buffer empty and the first live batch was not 0: one more gap counted, not a loss).
    let m = |name: &str, outcome: Option<&str>| {
        let mut labels = vec![("publisher", "3/0")];
        labels.extend(outcome.map(|o| ("outcome", o)));
        metric(&p, name, &labels)
    };
    let gaps = m("ckf_producer_engine_gaps_total", None);
    let replays = "ckf_producer_engine_replays_total";
    let requested = m(replays, Some("requested"));
    assert!((1.0..=2.0).contains(&gaps), "{gaps} gaps");
    assert_eq!(
        requested,
        gaps + 1.0,
        "one replay per gap, plus the first contact"
    );
    assert_eq!(m(replays, Some("filled")), requested);
    assert_eq!(m(replays, Some("verified")), 1.0);
    assert_eq!(m(replays, Some("failed")), 0.0);
    assert_eq!(
        metric(&p, "ckf_producer_engine_members_cleared_total", &[]),
        0.0
    );
    // vLLM's end marker (sequence -1, empty payload) closes every replay: it is no batch, and
    // counting it would raise a decode error on every healthy replay (found by a breaker run).
    assert_eq!(
        metric(&p, "ckf_producer_engine_decode_errors_total", &[]),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfillable_gaps_clear_the_publishers_members() {
    // Worker 1: the replay has lost the batches (the gap's verification fails). Worker 2: the
    // replay never answers (timeout). Worker 3: no replay socket (the gap clears at once).
    // Worker 4: a bystander.
    let mut engines = Vec::new();
    for _ in 0..4 {
        engines.push(FakeEngine::start(1).await);
    }
    engines[0].set_mode(ReplayMode::Empty);
    engines[1].set_mode(ReplayMode::Silent);
    let specs = vec![
        engines[0].spec(1, 1, true),
        engines[1].spec(2, 1, true),
        engines[2].spec(3, 1, false),
        engines[3].spec(4, 1, false),
    ];
    let p = producer(specs, |c| c.engine.replay_timeout_ms = 300).await;
    let a: Vec<u32> = (0..8).collect();
    let ca = canonical(&a);
    for (i, e) in engines.iter_mut().enumerate() {
        let w = i as u64 + 1;
        prime(&p, e, w).await;
        e.publish(0, batch(vec![stored(&[5, 6], None, &a, "GPU")], None))
            .await;
        wait_blocks(&p, w, 0, &ca).await;
    }
    for e in &mut engines[..3] {
        e.send(0, batch(vec![removed(&[6])], None), true).await;
        e.publish(0, heartbeat()).await;
    }
    for (w, reason) in [(1u64, "unverified"), (2, "unverified"), (3, "gap")] {
        wait_blocks(&p, w, 0, &[]).await;
        let label = w.to_string() + "/0";
        // Worker 1's empty buffer may also count one gap while priming: a first live batch
        // other than 0 after its first contact's empty re-read.
        let gaps = metric(
            &p,
            "ckf_producer_engine_gaps_total",
            &[("publisher", &label)],
        );
        assert!(
            gaps == 1.0 || (w == 1 && gaps == 2.0),
            "{label}: {gaps} gaps"
        );
        eventually("the clear counted", || async {
            metric(
                &p,
                "ckf_producer_engine_members_cleared_total",
                &[("publisher", &label), ("reason", reason)],
            ) == 1.0
        })
        .await;
    }
    for w in ["1/0", "2/0"] {
        assert!(
            metric(
                &p,
                "ckf_producer_engine_replays_total",
                &[("publisher", w), ("outcome", "failed")]
            ) >= 1.0
        );
    }
    assert_eq!(
        metric(
            &p,
            "ckf_producer_engine_replays_total",
            &[("publisher", "3/0")]
        ),
        0.0
    );
    assert_eq!(blocks(&p, 4, 0).await, sorted(ca.clone()));
    // A later store re-adds what is really cached.
    engines[0]
        .publish(0, batch(vec![stored(&[5], None, &a[..4], "GPU")], None))
        .await;
    wait_blocks(&p, 1, 0, &ca[..1]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequence_going_backwards_is_a_restart() {
    let mut engine = FakeEngine::start(1).await;
    let p = producer(vec![engine.spec(9, 1, true)], |_| {}).await;
    prime(&p, &mut engine, 9).await;
    for _ in 0..3 {
        engine.publish(0, heartbeat()).await;
    }
    let a: Vec<u32> = (0..4).collect();
    let b: Vec<u32> = (10..14).collect();
    engine
        .publish(0, batch(vec![stored(&[1], None, &a, "GPU")], None))
        .await;
    wait_blocks(&p, 9, 0, &canonical(&a)).await;
    engine.restart(0);
    // Same engine hash, other tokens: the new lineage must not reuse the old mapping.
    engine
        .publish(0, batch(vec![stored(&[1], None, &b, "GPU")], None))
        .await;
    wait_blocks(&p, 9, 0, &canonical(&b)).await;
    assert_eq!(
        metric(
            &p,
            "ckf_producer_engine_members_cleared_total",
            &[("publisher", "9/0"), ("reason", "restart")]
        ),
        1.0
    );
    // The new process's buffer was re-read (its first batch came back through it).
    assert!(
        metric(
            &p,
            "ckf_producer_engine_reread_batches_total",
            &[("publisher", "9/0")]
        ) >= 1.0
    );
}

/// An engine restarts behind a connection that never dropped (a crashed host the producer's
/// TCP connection outlived, a partition): no connection event, and what the new process
/// publishes never arrives. Silent for `engine.verify_idle_ms`, the publisher is verified
/// again through a new replay connection: the new process's buffer does not hold the last
/// applied batch, so the old blocks are cleared and the new process's buffer re-read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_publisher_is_verified_again_and_a_restart_behind_it_found() {
    let mut engine = FakeEngine::start(1).await;
    let p = producer(vec![engine.spec(6, 1, true)], |c| {
        c.engine.verify_idle_ms = 300;
    })
    .await;
    prime(&p, &mut engine, 6).await;
    let a: Vec<u32> = (0..4).collect();
    let b: Vec<u32> = (10..14).collect();
    for _ in 0..3 {
        engine.publish(0, heartbeat()).await;
    }
    engine
        .publish(0, batch(vec![stored(&[1], None, &a, "GPU")], None))
        .await;
    wait_blocks(&p, 6, 0, &canonical(&a)).await;
    let idle = |p: &RunningProducer| {
        metric(
            p,
            "ckf_producer_engine_uncertain_total",
            &[("publisher", "6/0"), ("cause", "idle")],
        )
    };
    // Alive and idle: verified, nothing cleared.
    eventually("an idle check", || async { idle(&p) >= 1.0 }).await;
    eventually("the idle check verified", || async {
        metric(
            &p,
            "ckf_producer_engine_replays_total",
            &[("publisher", "6/0"), ("outcome", "verified")],
        ) >= 1.0
    })
    .await;
    assert_eq!(blocks(&p, 6, 0).await, sorted(canonical(&a)));
    // The engine restarts without the connection dropping; its batches never arrive live.
    engine.restart(0);
    engine
        .send(0, batch(vec![stored(&[2], None, &b, "GPU")], None), true)
        .await;
    engine.send(0, heartbeat(), true).await;
    wait_blocks(&p, 6, 0, &canonical(&b)).await;
    assert_eq!(
        metric(
            &p,
            "ckf_producer_engine_members_cleared_total",
            &[("publisher", "6/0"), ("reason", "unverified")]
        ),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_frames_are_counted_and_touch_no_member() {
    let mut bad = FakeEngine::start(1).await;
    let mut good = FakeEngine::start(1).await;
    let p = producer(vec![bad.spec(1, 1, true), good.spec(2, 1, false)], |c| {
        c.engine.max_frame_bytes = 65_536;
    })
    .await;
    prime(&p, &mut bad, 1).await;
    prime(&p, &mut good, 2).await;
    let a: Vec<u32> = (0..8).collect();
    let ca = canonical(&a);
    bad.publish(0, batch(vec![stored(&[1, 2], None, &a, "GPU")], None))
        .await;
    good.publish(0, batch(vec![stored(&[1, 2], None, &a, "GPU")], None))
        .await;
    wait_blocks(&p, 1, 0, &ca).await;
    wait_blocks(&p, 2, 0, &ca).await;

    let full = batch(vec![removed(&[1, 2])], None);
    // Truncated msgpack, a batch of the wrong type, an oversize frame, a flood of unknown
    // event types: each takes its sequence number (no gap) and applies nothing.
    bad.publish(0, full[..full.len() - 3].to_vec()).await;
    bad.publish(0, enc(&V::from("not a batch"))).await;
    bad.publish(0, vec![0x90; 100_000]).await;
    let flood: Vec<V> = (0..2_000)
        .map(|i| map(vec![("type", V::from(format!("Bogus{i}")))]))
        .collect();
    bad.publish(0, batch(flood, None)).await;
    // Frames with the wrong shape carry no usable sequence.
    bad.send_raw(0, vec![Bytes::from_static(b"x")]).await;
    bad.send_raw(
        0,
        vec![
            Bytes::new(),
            Bytes::from_static(b"short"),
            Bytes::from(heartbeat()),
        ],
    )
    .await;
    // One socket keeps its order: once this removal is applied, every frame before it was
    // handled.
    bad.publish(0, batch(vec![removed(&[2])], None)).await;
    wait_blocks(&p, 1, 0, &ca[..1]).await;
    let errors = |kind: &str| {
        metric(
            &p,
            "ckf_producer_engine_decode_errors_total",
            &[("publisher", "1/0"), ("kind", kind)],
        )
    };
    assert_eq!(errors("truncated"), 1.0);
    assert_eq!(errors("type"), 1.0);
    assert_eq!(errors("oversize"), 1.0);
    assert_eq!(errors("parts"), 1.0);
    assert_eq!(errors("sequence"), 1.0);
    assert_eq!(
        metric(
            &p,
            "ckf_producer_engine_events_total",
            &[("publisher", "1/0"), ("type", "unknown")]
        ),
        2_000.0
    );
    assert_eq!(metric(&p, "ckf_producer_engine_gaps_total", &[]), 0.0);
    assert_eq!(
        metric(&p, "ckf_producer_engine_members_cleared_total", &[]),
        0.0
    );
    // The bad publisher's member lost only what its one good removal removed; the other
    // publisher's member is untouched.
    assert_eq!(blocks(&p, 2, 0).await, sorted(ca));
    assert!(p.stats().await.is_ok());
}

#[tokio::test]
async fn get_member_blocks_requires_a_member() {
    let p = producer(Vec::new(), |_| {}).await;
    let mut c = common::ingest_client(&p).await;
    let err = c
        .get_member_blocks(v1::GetMemberBlocksRequest { member: None })
        .await
        .expect_err("refused");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().contains("member is required"),
        "{}",
        err.message()
    );
}

// --- configuration --------------------------------------------------------------------------

/// A change to a valid configuration.
type Edit = Box<dyn Fn(&mut ProducerConfig)>;

#[tokio::test]
async fn serve_refuses_invalid_engine_configs_naming_the_key() {
    let cases: Vec<(Edit, &str, &str)> = vec![
        (
            Box::new(|c| c.engines = vec!["worker_id=1,endpoint=udp://h:1".parse().unwrap()]),
            "engines[0].endpoint",
            "tcp:// or ipc://",
        ),
        (
            Box::new(|c| {
                c.engines = vec!["worker_id=1,endpoint=tcp://h:1,dp_size=0".parse().unwrap()]
            }),
            "engines[0].dp_size",
            "",
        ),
        (
            Box::new(|c| {
                c.engines = vec![
                    "worker_id=1,endpoint=tcp://h:65000,dp_size=1000"
                        .parse()
                        .unwrap(),
                ]
            }),
            "engines[0].endpoint",
            "exceeds 65535",
        ),
        (
            Box::new(|c| {
                c.engines = vec![
                    "worker_id=1,endpoint=tcp://h:1".parse().unwrap(),
                    "worker_id=1,endpoint=tcp://h:2".parse().unwrap(),
                ]
            }),
            "engines[1].worker_id",
            "listed twice",
        ),
        (
            Box::new(|c| {
                c.engines = vec![
                    "worker_id=1,endpoint=tcp://h:1".parse().unwrap(),
                    "worker_id=2,endpoint=tcp://h:1".parse().unwrap(),
                ]
            }),
            "engines[1].endpoint",
            "already used",
        ),
        (
            Box::new(|c| {
                c.engines = vec![
                    "worker_id=1,endpoint=tcp://h:1,format=json"
                        .parse()
                        .unwrap(),
                ]
            }),
            "engines[0].format",
            "auto",
        ),
        (Box::new(|c| c.block_size = 0), "block_size", ""),
        (
            Box::new(|c| c.engine.max_buffered_batches = 0),
            "engine.max_buffered_batches",
            "",
        ),
        (Box::new(|c| c.engine.media.clear()), "engine.media", ""),
    ];
    for (edit, key, rule) in cases {
        let mut config = common::fast_config(vec!["http://127.0.0.1:9".into()]);
        edit(&mut config);
        let err = match producer_svc::serve(config, std::future::pending()).await {
            Ok(_) => panic!("{key}: accepted"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(key) && err.contains(rule), "{key}: {err}");
    }
}

#[test]
fn engine_flags_and_toml_load() {
    use clap::Parser;
    use std::io::Write;
    let cli = producer_svc::Cli::try_parse_from([
        "ckf-producer",
        "--dc",
        "a",
        "--indexer",
        "http://h:1",
        "--block-size",
        "32",
        "--engine",
        "worker_id=7,endpoint=tcp://h:5557,replay_endpoint=tcp://h:5657,dp_size=2",
        "--engine",
        "worker_id=8,endpoint=ipc:///tmp/e8",
    ])
    .expect("parses");
    let layers = ckf_svc_kit::config::Layers {
        env_prefix: "CKF_PENG1_",
        ..cli.layers()
    };
    let c: ProducerConfig = layers.load().expect("valid");
    assert_eq!(c.block_size, 32);
    assert_eq!(c.engines.len(), 2);
    assert_eq!(
        c.engines[0].replay_endpoint.as_deref(),
        Some("tcp://h:5657")
    );
    assert_eq!(c.publishers().unwrap().len(), 3);

    let err = producer_svc::Cli::try_parse_from([
        "ckf-producer",
        "--engine",
        "worker_id=1,endpoint=tcp://h:1,bogus=2",
    ])
    .expect_err("unknown key");
    assert!(err.to_string().contains("unknown key 'bogus'"), "{err}");

    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(
        br#"
indexers = ["http://h:1"]
block_size = 16
[pool]
dc = "a"
[engine]
replay_timeout_ms = 500
[[engines]]
worker_id = 3
endpoint = "tcp://10.0.0.5:5557"
replay_endpoint = "tcp://10.0.0.5:5657"
dp_size = 2
mode = "connect"
"#,
    )
    .unwrap();
    let cli =
        producer_svc::Cli::try_parse_from(["ckf-producer", "--config", f.path().to_str().unwrap()])
            .unwrap();
    let c: ProducerConfig = ckf_svc_kit::config::Layers {
        env_prefix: "CKF_PENG2_",
        ..cli.layers()
    }
    .load()
    .expect("valid");
    assert_eq!(c.engine.replay_timeout_ms, 500);
    assert_eq!(c.engines[0].dp_size, 2);
    let mut f2 = tempfile::NamedTempFile::new().unwrap();
    f2.write_all(b"indexers = [\"http://h:1\"]\n[pool]\ndc = \"a\"\n[[engines]]\nworker_id = 3\nendpoint = \"tcp://h:1\"\ncolour = \"red\"\n").unwrap();
    let cli = producer_svc::Cli::try_parse_from([
        "ckf-producer",
        "--config",
        f2.path().to_str().unwrap(),
    ])
    .unwrap();
    let err = ckf_svc_kit::config::Layers {
        env_prefix: "CKF_PENG3_",
        ..cli.layers()
    }
    .load::<ProducerConfig>()
    .expect_err("unknown key");
    assert!(err.to_string().contains("colour"), "{err}");
}

/// A hostile "engine": a raw TCP listener that completes the ZMTP handshake as a PUB socket,
/// then sends one long-frame header claiming 2^50 bytes, on every connection.
async fn frame_bomb_engine() -> (u16, tokio::task::JoinHandle<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut greeting = vec![0u8; 64];
                greeting[0] = 0xff;
                greeting[9] = 0x7f;
                greeting[10] = 3;
                greeting[12..16].copy_from_slice(b"NULL");
                let _ = s.write_all(&greeting).await;
                let mut peer = [0u8; 64];
                let _ = s.read_exact(&mut peer).await;
                let mut ready = b"\x05READY\x0bSocket-Type".to_vec();
                ready.extend_from_slice(&3u32.to_be_bytes());
                ready.extend_from_slice(b"PUB");
                let mut out = vec![0x04, ready.len() as u8];
                out.extend(ready);
                out.push(0x02);
                out.extend_from_slice(&(1u64 << 50).to_be_bytes());
                let _ = s.write_all(&out).await;
                let mut sink = Vec::new();
                let _ = s.read_to_end(&mut sink).await;
            });
        }
    });
    (port, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_header_claiming_a_petabyte_closes_only_that_connection() {
    // Before the guard proxy, the zeromq crate reserved the claimed size on reading the header
    // and the allocator aborted the whole producer (and this test process with it).
    let (bomb_port, bomb) = frame_bomb_engine().await;
    let mut good = FakeEngine::start(1).await;
    let hostile: EngineSpec = format!("worker_id=1,endpoint=tcp://127.0.0.1:{bomb_port}")
        .parse()
        .unwrap();
    let p = producer(vec![hostile, good.spec(2, 1, false)], |_| {}).await;
    let closed = || {
        metric(
            &p,
            "ckf_producer_engine_decode_errors_total",
            &[("publisher", "1/0"), ("kind", "zmtp_frame_too_large")],
        )
    };
    eventually("the hostile connection refused", || async {
        closed() >= 1.0
    })
    .await;
    // zeromq reconnects and the bomb comes again: refused again, and the producer lives on.
    eventually("a reconnection refused too", || async { closed() >= 2.0 }).await;
    prime(&p, &mut good, 2).await;
    let a: Vec<u32> = (0..8).collect();
    good.publish(0, batch(vec![stored(&[1, 2], None, &a, "GPU")], None))
        .await;
    wait_blocks(&p, 2, 0, &canonical(&a)).await;
    assert!(blocks(&p, 1, 0).await.is_empty());
    assert!(p.stats().await.is_ok());
    bomb.abort();
}

/// A fresh directory under the system's temp dir for one test's journal.
fn state_dir(test: &str) -> std::path::PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!("ckf-{test}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create the state dir");
    dir
}

/// Publishes heartbeats until `done` holds for the producer (bounded).
async fn heartbeats_until(
    p: &RunningProducer,
    engine: &mut FakeEngine,
    what: &str,
    done: impl Fn(&RunningProducer) -> bool,
) {
    for _ in 0..200 {
        if done(p) {
            return;
        }
        engine.publish(0, heartbeat()).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

/// Durability: a restarted producer resumes each engine publisher after the last batch its
/// journal kept, verified in the engine's replay buffer. What the engine published while the
/// producer was down comes from its replay socket; an engine that restarted meanwhile fails
/// the verification: the restored members are cleared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_producer_resumes_after_the_journaled_sequence() {
    let dir = state_dir("engines-resume");
    let mut engine = FakeEngine::start(1).await;
    let spec = engine.spec(5, 1, true);
    let start = || {
        let (spec, dir) = (spec.clone(), dir.clone());
        producer(vec![spec], move |c| {
            c.durability.data_dir = Some(dir);
            c.durability.commit_interval_ms = 5;
        })
    };
    let a: Vec<u32> = (0..4).collect();
    let b: Vec<u32> = (4..8).collect();
    let mut ab = a.clone();
    ab.extend(&b);
    let c = c_tokens();

    let p = start().await;
    prime(&p, &mut engine, 5).await;
    engine
        .publish(0, batch(vec![stored(&[1], None, &a, "GPU")], None))
        .await;
    wait_blocks(&p, 5, 0, &canonical(&a)).await;
    p.shutdown();
    p.wait().await.expect("a clean shutdown");

    // While the producer is down: B (chained on A) reaches nobody, only the replay buffer.
    engine
        .publish(0, batch(vec![stored(&[2], Some(1), &b, "GPU")], None))
        .await;
    let p = start().await;
    // Restored from the journal: A's blocks (the gauge is set by the recovery itself; the
    // member may already hold B too, since the catch-up replays the downtime at once).
    assert_eq!(
        metric(&p, "ckf_producer_recovered_edges", &[]),
        canonical(&a).len() as f64
    );
    let replayed = |p: &RunningProducer| {
        metric(
            p,
            "ckf_producer_engine_replayed_batches_total",
            &[("publisher", "5/0")],
        )
    };
    heartbeats_until(&p, &mut engine, "the downtime replayed", |p| {
        replayed(p) >= 1.0
    })
    .await;
    engine
        .publish(0, batch(vec![stored(&[3], None, &c, "GPU")], None))
        .await;
    let mut abc = canonical(&ab);
    abc.extend(canonical(&c));
    wait_blocks(&p, 5, 0, &abc).await;
    let filled = metric(
        &p,
        "ckf_producer_engine_replays_total",
        &[("outcome", "filled")],
    );
    assert_eq!(filled, 1.0);
    assert_eq!(
        metric(&p, "ckf_producer_engine_members_cleared_total", &[]),
        0.0
    );
    // Old enough that the restarted engine's numbers stay below it.
    for _ in 0..300 {
        engine.publish(0, heartbeat()).await;
    }
    eventually("300 heartbeats received", || async {
        metric(
            &p,
            "ckf_producer_engine_batches_total",
            &[("publisher", "5/0")],
        ) >= 300.0
    })
    .await;
    p.shutdown();
    p.wait().await.expect("a clean shutdown");

    // The engine restarts while the producer is down: its numbers start over.
    engine.restart(0);
    let p = start().await;
    assert_eq!(
        metric(&p, "ckf_producer_recovered_edges", &[]),
        abc.len() as f64
    );
    heartbeats_until(&p, &mut engine, "the restart seen", |p| {
        metric(
            p,
            "ckf_producer_engine_members_cleared_total",
            &[("publisher", "5/0")],
        ) >= 1.0
    })
    .await;
    wait_blocks(&p, 5, 0, &[]).await;
    engine
        .publish(0, batch(vec![stored(&[1], None, &c, "GPU")], None))
        .await;
    wait_blocks(&p, 5, 0, &canonical(&c)).await;
    assert_eq!(
        metric(
            &p,
            "ckf_producer_engine_replays_total",
            &[("publisher", "5/0"), ("outcome", "verified")]
        ),
        0.0,
        "the old sequence cannot be verified against the new process"
    );
    p.shutdown();
    p.wait().await.expect("a clean shutdown");
    let _ = std::fs::remove_dir_all(&dir);
}

// --- load -----------------------------------------------------------------------------------

/// An engine's `/metrics` endpoint serving vLLM's Prometheus text (the fixture
/// `prometheus_client` wrote), or `503` while `down` is set.
async fn metrics_endpoint(down: Arc<std::sync::atomic::AtomicBool>) -> String {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const TEXT: &str = include_str!("../../engine/tests/fixtures/vllm_metrics.txt");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let down = down.load(Ordering::SeqCst);
            tokio::spawn(async move {
                let mut request = [0u8; 1024];
                let _ = socket.read(&mut request).await;
                let (status, body) = if down {
                    ("503 Service Unavailable", "")
                } else {
                    ("200 OK", TEXT)
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(response.as_bytes()).await;
            });
        }
    });
    format!("http://{addr}/metrics")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pools_load_is_scraped_and_an_engine_that_stops_answering_is_unknown() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let down = Arc::new(AtomicBool::new(false));
    let url = metrics_endpoint(Arc::clone(&down)).await;
    let engine = |worker_id: u64, metrics_url: Option<String>| {
        let mut spec: EngineSpec = format!(
            "worker_id={worker_id},endpoint=tcp://127.0.0.1:{}",
            9 + worker_id
        )
        .parse()
        .expect("spec");
        spec.metrics_url = metrics_url;
        spec.prefill_tokens_per_s = 8_000;
        spec
    };
    // Engine 7 answers; engine 8 has no metrics_url (unknown, configured).
    let p = producer(vec![engine(7, Some(url)), engine(8, None)], |c| {
        c.engine.load_interval_ms = 100;
        c.engine.load_timeout_ms = 100;
    })
    .await;
    eventually("the pool's load from engine 7", || async {
        metric(&p, "ckf_producer_pool_engines_reporting", &[]) == 1.0
    })
    .await;
    // The fixture's two vLLM engine cores: 3 + 2 running, 4 + 1 waiting, usage 0.25 / 0.75.
    assert_eq!(metric(&p, "ckf_producer_pool_engines_configured", &[]), 2.0);
    assert_eq!(
        metric(&p, "ckf_producer_pool_requests", &[("state", "running")]),
        5.0
    );
    assert_eq!(
        metric(&p, "ckf_producer_pool_requests", &[("state", "waiting")]),
        5.0
    );
    assert_eq!(metric(&p, "ckf_producer_pool_kv_usage", &[]), 0.5);
    assert_eq!(
        metric(&p, "ckf_producer_pool_prefill_tokens_per_second", &[]),
        8_000.0,
        "only the reporting engine's capacity"
    );
    // The endpoint fails: the load is unknown, not zero, and the failure is counted.
    down.store(true, Ordering::SeqCst);
    eventually("the pool's load unknown", || async {
        metric(&p, "ckf_producer_pool_engines_reporting", &[]) == 0.0
    })
    .await;
    assert!(
        metric(
            &p,
            "ckf_producer_engine_load_scrape_errors_total",
            &[("worker", "7"), ("reason", "fetch")]
        ) >= 1.0
    );
    // Back: known again.
    down.store(false, Ordering::SeqCst);
    eventually("the pool's load known again", || async {
        metric(&p, "ckf_producer_pool_engines_reporting", &[]) == 1.0
    })
    .await;
}

/// The pool's load goes to an indexer that takes load reports, never to one that does not say
/// so (an older indexer would end the stream on a frame it does not know).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pools_load_is_reported_only_to_an_indexer_that_takes_it() {
    use common::fake_relay::{FakeRelay, GrantConfig};
    let url = metrics_endpoint(Arc::new(std::sync::atomic::AtomicBool::new(false))).await;
    let old = FakeRelay::start(GrantConfig::default(), 7).await;
    let new = FakeRelay::start(
        GrantConfig {
            accepts_load: true,
            ..GrantConfig::default()
        },
        8,
    )
    .await;
    let mut spec: EngineSpec = "worker_id=7,endpoint=tcp://127.0.0.1:19"
        .parse()
        .expect("spec");
    spec.metrics_url = Some(url);
    spec.prefill_tokens_per_s = 8_000;
    let p = producer(vec![spec], |c| {
        c.indexers = vec![old.url(), new.url()];
        c.engine.load_interval_ms = 100;
        c.engine.load_timeout_ms = 100;
    })
    .await;
    eventually(
        "two load reports to the indexer that takes them",
        || async { new.with(|s| s.attachments.iter().map(|a| a.loads.len()).sum::<usize>()) >= 2 },
    )
    .await;
    let reports = new.with(|s| s.attachments[0].loads.clone());
    let first = &reports[0];
    assert_eq!((first.running, first.waiting), (5, 5), "{first:?}");
    assert_eq!((first.engines_reporting, first.engines_configured), (1, 1));
    assert_eq!(first.prefill_tokens_per_s, 8_000.0);
    assert!(
        reports.windows(2).all(|w| w[0].sequence < w[1].sequence),
        "increasing sequences: {reports:?}"
    );
    assert!(new.errors().is_empty(), "{:?}", new.errors());
    // The older indexer got none, and the producer counted none to it.
    assert!(old.with(|s| s.attachments.iter().all(|a| a.loads.is_empty())));
    assert!(old.errors().is_empty(), "{:?}", old.errors());
    assert_eq!(
        metric(
            &p,
            "ckf_producer_load_reports_sent_total",
            &[("indexer", old.url().as_str())]
        ),
        0.0
    );
}
