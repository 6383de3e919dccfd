//! Stalls shorter than the heartbeat deadline: a process stopped (SIGSTOP) while a peer keeps
//! sending it a steady flow of small messages, then continued (SIGCONT).
//!
//! While it is stopped its peer keeps writing until HTTP/2 flow control stops it, so the
//! stopped process finds a window's worth of small DATA frames waiting when it continues.
//! Each stream below runs such a flow (about 2 000 small messages a second, each its own
//! DATA frame), the receiving process is stopped for 2 s and then for half the heartbeat
//! deadline, and the flow goes on: no connection is closed, every message is answered in
//! order, no lane is retired and the lane ends equal to its producer. A stall past the
//! deadline still retires the lane, as `HEARTBEAT_TIMEOUT`.
//!
//! - Ingest `Publish` (1-hash batches), the producer stopped;
//! - `FindMatchesStream` (4-hash queries), the indexer stopped;
//! - Relay: the producer publishes a delta per batch of that flow, the indexer is stopped. The
//!   producer runs its default attachment queue (1,024 batches, fewer than a stall's worth at
//!   this rate): once the queue is half full it cuts at most one batch per 100 ms, the flow's
//!   changes coalescing meanwhile, so the queue never fills and the attachment is not fenced.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ckf_e2e::check::wait_converged;
use ckf_e2e::cluster::{
    Indexer, IndexerSpec, Producer, ProducerSpec, TestDir, channel, event, format,
};
use ckf_e2e::hashes::HashPool;
use ckf_e2e::wait::{DEADLINE, eventually};
use ckf_proto::v1::{self, ingest_client::IngestClient, kv_event::Kind, query_client::QueryClient};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use tokio_stream::wrappers::ReceiverStream;

/// The indexer's `lag.heartbeat_deadline_ms` in these tests.
const HEARTBEAT_DEADLINE_MS: u64 = 3_000;
/// Messages sent per millisecond tick (each followed by a yield, so each leaves in its own
/// DATA frame while the window is open).
const PER_TICK: u64 = 2;
/// The stalls: 2 s, then half the heartbeat deadline.
const STALLS: [Duration; 2] = [
    Duration::from_secs(2),
    Duration::from_millis(HEARTBEAT_DEADLINE_MS / 2),
];
/// How long the flow runs before the first stall, between stalls and after the last one.
const FLOWING: Duration = Duration::from_millis(700);
/// Worker id of the flow's events.
const WORKER: u64 = 9;
/// Distinct hashes the flow stores and removes in turn.
const CYCLE: usize = 64;

/// A running flow: messages `make(0)`, `make(1)`, ... sent at a steady pace until stopped.
struct Flow {
    stop: Arc<AtomicBool>,
    task: JoinHandle<u64>,
}

impl Flow {
    fn start<T: Send + 'static>(
        tx: mpsc::Sender<T>,
        make: impl Fn(u64) -> T + Send + 'static,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let stop = Arc::clone(&stop);
            async move {
                let mut tick = tokio::time::interval(Duration::from_millis(1));
                tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
                let mut sent = 0;
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    for _ in 0..PER_TICK {
                        if tx.send(make(sent)).await.is_err() {
                            return sent;
                        }
                        sent += 1;
                        tokio::task::yield_now().await;
                    }
                }
                sent
            }
        });
        Self { stop, task }
    }

    /// Stops sending and closes the request stream; the number of messages sent.
    async fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("flow task")
    }
}

/// Runs `flow`, stops `pid` for each of [`STALLS`] in turn (SIGSTOP, SIGCONT), keeps the flow
/// going a while after each, then ends it; the number of messages sent.
async fn stall_during(flow: Flow, signal: impl Fn(i32)) -> u64 {
    tokio::time::sleep(FLOWING).await;
    for stall in STALLS {
        signal(libc::SIGSTOP);
        tokio::time::sleep(stall).await;
        signal(libc::SIGCONT);
        tokio::time::sleep(FLOWING).await;
    }
    flow.finish().await
}

/// The `i`-th event of the flow: `hashes[i % CYCLE]` stored on even rounds, removed on odd.
fn flow_event(hashes: &[u64], i: u64) -> Kind {
    let hash = hashes[(i as usize) % CYCLE];
    if (i as usize / CYCLE).is_multiple_of(2) {
        Kind::Stored(v1::Stored {
            block_hashes: vec![hash],
            parent_hash: None,
        })
    } else {
        Kind::Removed(v1::Removed {
            block_hashes: vec![hash],
        })
    }
}

/// The model after the flow's first `sent` events.
fn apply_flow(producer: &mut Producer, hashes: &[u64], sent: u64) {
    for i in 0..sent {
        match flow_event(hashes, i) {
            Kind::Stored(s) => producer.model.store(WORKER, &s.block_hashes),
            Kind::Removed(r) => producer.model.remove(WORKER, &r.block_hashes),
            _ => unreachable!(),
        }
    }
}

/// A status with its whole source chain (the HTTP/2 error under a transport failure).
fn status_chain(status: &tonic::Status) -> String {
    let mut text = format!("{:?}: {}", status.code(), status.message());
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        text.push_str(&format!(": {error}"));
        source = error.source();
    }
    text
}

/// Opens an Ingest `Publish` stream to `producer` fed by a [`Flow`] of 1-hash batches (source
/// `stall`, sequences from 1) over `hashes`; the flow and a task reading every reply, checking
/// each is the next sequence with every event applied, returning the count.
async fn ingest_flow(
    producer: &Producer,
    hashes: Vec<u64>,
) -> (Flow, JoinHandle<Result<u64, String>>) {
    let mut client = IngestClient::new(channel(producer.addr).await.expect("ingest channel"));
    let (tx, rx) = mpsc::channel(1);
    let flow = Flow::start(tx, move |i| v1::KvEventBatch {
        source_id: "stall".into(),
        sequence: i + 1,
        events: vec![event(WORKER, flow_event(&hashes, i))],
    });
    let mut replies = client
        .publish(ReceiverStream::new(rx))
        .await
        .expect("Ingest Publish")
        .into_inner();
    let reader = tokio::spawn(async move {
        let mut answered = 0u64;
        loop {
            let reply = match replies.message().await {
                Ok(Some(reply)) => reply,
                Ok(None) => return Ok(answered),
                Err(status) => {
                    return Err(format!(
                        "after {answered} replies: {}",
                        status_chain(&status)
                    ));
                }
            };
            if reply.sequence != answered + 1
                || reply.gap.is_some()
                || reply.duplicate
                || reply.refused.is_some()
                || reply.events.len() != 1
                || reply.events[0].status() != v1::EventStatus::Applied
            {
                return Err(format!("reply {} is not applied: {reply:?}", answered + 1));
            }
            answered += 1;
        }
    });
    (flow, reader)
}

fn indexer_spec() -> IndexerSpec {
    IndexerSpec {
        heartbeat_deadline_ms: HEARTBEAT_DEADLINE_MS,
        ..IndexerSpec::default()
    }
}

/// A producer of dc-a with the default publication settings: its attachment queue (1,024
/// batches) holds less than the flow's rate times a stall, so the Relay stream survives the
/// indexer's stalls only because the producer cuts less often while the queue is more than
/// half full.
fn start_producer(dir: &TestDir, indexer: &Indexer) -> Producer {
    Producer::start(
        dir,
        "producer-a",
        &ProducerSpec::new("dc-a"),
        &[indexer.url()],
    )
}

/// A hot standby of dc-a (`--start-mode if-vacant`) retrying every 200 ms at most.
fn start_standby(dir: &TestDir, indexer: &Indexer) -> Producer {
    let spec = ProducerSpec {
        args: vec!["--start-mode".into(), "if-vacant".into()],
        max_backoff_ms: 200,
        ..ProducerSpec::new("dc-a")
    };
    Producer::start(dir, "standby", &spec, &[indexer.url()])
}

/// `indexer`'s lane of dc-a: active, never retired, still under `lease_epoch`.
async fn lane_kept(indexer: &Indexer, lease_epoch: u64) {
    let lane = indexer.lane("dc-a").await.expect("ListLanes");
    assert_eq!(lane.retirements, 0, "the lane was retired: {lane:?}");
    assert_eq!(
        lane.lease_epoch, lease_epoch,
        "the lane changed lease: {lane:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_publish_survives_producer_stalls_shorter_than_the_deadline() {
    let dir = TestDir::new("stall-ingest");
    let indexer = Indexer::start(&dir, &indexer_spec());
    let mut producer = start_producer(&dir, &indexer);
    let first = wait_converged(&indexer, &producer).await;
    let hashes = HashPool::new(&format(), 11).take(CYCLE);

    let (flow, reader) = ingest_flow(&producer, hashes.clone()).await;
    let sent = stall_during(flow, |s| producer.signal(s)).await;
    let answered = reader.await.expect("reader task");
    assert_eq!(
        answered,
        Ok(sent),
        "Ingest Publish: {sent} batches sent; producer log:\n{}",
        producer.log()
    );

    apply_flow(&mut producer, &hashes, sent);
    wait_converged(&indexer, &producer).await;
    lane_kept(&indexer, first.lease_epoch).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_survives_indexer_stalls_shorter_than_the_deadline() {
    let dir = TestDir::new("stall-relay");
    let indexer = Indexer::start(&dir, &indexer_spec());
    let mut producer = start_producer(&dir, &indexer);
    let first = wait_converged(&indexer, &producer).await;
    let hashes = HashPool::new(&format(), 12).take(CYCLE);

    let (flow, reader) = ingest_flow(&producer, hashes.clone()).await;
    let sent = stall_during(flow, |s| indexer.signal(s)).await;
    let answered = reader.await.expect("reader task");
    assert_eq!(answered, Ok(sent), "Ingest Publish: {sent} batches sent");

    apply_flow(&mut producer, &hashes, sent);
    wait_converged(&indexer, &producer).await;
    let lane = indexer.lane("dc-a").await.expect("ListLanes");
    assert!(
        lane.retirements == 0 && lane.lease_epoch == first.lease_epoch,
        "the lane was retired or re-leased: {lane:?}\nindexer log:\n{}\nproducer log:\n{}",
        indexer.log(),
        producer.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn find_matches_stream_survives_indexer_stalls_shorter_than_the_deadline() {
    let dir = TestDir::new("stall-query");
    let indexer = Indexer::start(&dir, &indexer_spec());
    let mut producer = start_producer(&dir, &indexer);
    let stored = HashPool::new(&format(), 13).take(4);
    producer.store(1, &stored).await;
    let first = wait_converged(&indexer, &producer).await;
    let lane_bit = 1u64 << indexer.lane_index("dc-a");

    let mut client = QueryClient::new(channel(indexer.addr).await.expect("query channel"));
    let (tx, rx) = mpsc::channel(1);
    let query = stored.clone();
    let flow = Flow::start(tx, move |id| v1::FindMatchesStreamRequest {
        id,
        queries: vec![v1::BlockHashQuery {
            block_hashes: query.clone(),
        }],
    });
    let mut replies = client
        .find_matches_stream(ReceiverStream::new(rx))
        .await
        .expect("FindMatchesStream")
        .into_inner();
    let reader = tokio::spawn(async move {
        let mut answered = 0u64;
        loop {
            let reply = match replies.message().await {
                Ok(Some(reply)) => reply,
                Ok(None) => return Ok(answered),
                Err(status) => {
                    return Err(format!(
                        "after {answered} replies: {}",
                        status_chain(&status)
                    ));
                }
            };
            let result = reply.results.first();
            if reply.id != answered
                || reply.results.len() != 1
                || result.is_none_or(|r| r.ready_lanes() & lane_bit == 0 || !r.depths.contains(&4))
            {
                return Err(format!("reply {answered} is wrong: {reply:?}"));
            }
            answered += 1;
        }
    });
    let sent = stall_during(flow, |s| indexer.signal(s)).await;
    let answered = reader.await.expect("reader task");
    assert_eq!(
        answered,
        Ok(sent),
        "FindMatchesStream: {sent} messages sent; indexer log:\n{}",
        indexer.log()
    );
    lane_kept(&indexer, first.lease_epoch).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_stall_past_the_deadline_retires_the_lane_as_heartbeat_timeout() {
    let dir = TestDir::new("stall-past-deadline");
    let indexer = Indexer::start(&dir, &indexer_spec());
    let mut producer = start_producer(&dir, &indexer);
    let first = wait_converged(&indexer, &producer).await;
    let hashes = HashPool::new(&format(), 14).take(CYCLE);

    let (flow, reader) = ingest_flow(&producer, hashes.clone()).await;
    tokio::time::sleep(FLOWING).await;
    producer.signal(libc::SIGSTOP);
    let retired = indexer
        .wait_lane("dc-a", "retired", |l| l.state() == v1::LaneState::Retired)
        .await;
    producer.signal(libc::SIGCONT);
    assert_eq!(
        retired.last_retire_reason(),
        v1::RetireReason::HeartbeatTimeout,
        "{retired:?}"
    );
    assert!(
        retired
            .last_retire_detail
            .contains(&format!("heartbeat deadline {HEARTBEAT_DEADLINE_MS} ms")),
        "{retired:?}"
    );
    tokio::time::sleep(FLOWING).await;
    let sent = flow.finish().await;
    let answered = reader.await.expect("reader task");
    assert_eq!(answered, Ok(sent), "Ingest Publish: {sent} batches sent");

    // The same incarnation re-attaches under a newer lease and converges.
    apply_flow(&mut producer, &hashes, sent);
    let back = wait_converged(&indexer, &producer).await;
    assert_eq!(back.incarnation, first.incarnation);
    assert!(back.lease_epoch > first.lease_epoch, "{back:?}");
    assert_eq!(back.retirements, 1, "{back:?}");
}

/// The indexer itself stopped past the heartbeat deadline, its producer alive and sending
/// (heartbeats and a batch, queued in the connection meanwhile) and a hot standby retrying its
/// `IF_VACANT` attach: the indexer does not count its own stall as the producer's silence, in
/// its deadline checks or in deciding the standby's attach (which may come first on resume),
/// so the lane is kept by the same producer and takes the batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_indexer_stall_past_the_deadline_keeps_the_lane_of_a_live_producer() {
    let dir = TestDir::new("indexer-stall-past-deadline");
    let indexer = Indexer::start(&dir, &indexer_spec());
    let mut producer = start_producer(&dir, &indexer);
    let first = wait_converged(&indexer, &producer).await;
    let standby = start_standby(&dir, &indexer);
    eventually(
        "the standby refused while the lane is held",
        DEADLINE,
        || async {
            let lane = indexer.lane("dc-a").await?;
            if lane.contention_count > 0 {
                Ok(())
            } else {
                Err(format!("{lane:?}"))
            }
        },
    )
    .await;
    let hashes = HashPool::new(&format(), 15).take(8);

    // The stall itself: the batch comes half a deadline into it, which lasts a deadline and a
    // half.
    indexer.signal(libc::SIGSTOP);
    tokio::time::sleep(Duration::from_millis(HEARTBEAT_DEADLINE_MS / 2)).await;
    producer.store(WORKER, &hashes).await;
    tokio::time::sleep(Duration::from_millis(HEARTBEAT_DEADLINE_MS)).await;
    indexer.signal(libc::SIGCONT);

    wait_converged(&indexer, &producer).await;
    let lane = indexer.lane("dc-a").await.expect("ListLanes");
    assert!(
        lane.retirements == 0
            && lane.lease_epoch == first.lease_epoch
            && lane.incarnation == first.incarnation,
        "the lane was retired or re-leased after the indexer's own stall: {lane:?}\nindexer log:\n{}\nstandby log:\n{}",
        indexer.log(),
        standby.log()
    );
}

/// An indexer stopped long enough for a busy producer's Relay stream to fill its windows and
/// the producer's send to give up (`send_stalled`): the producer waited, it was not silent, so
/// it re-attaches as it started (`TAKEOVER`) and keeps its pool, even with a hot standby
/// retrying `IF_VACANT` beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_that_waited_on_a_stopped_indexer_keeps_the_takeover_mode() {
    let dir = TestDir::new("indexer-stall-send-stalled");
    let indexer = Indexer::start(&dir, &indexer_spec());
    // A 1 s connect timeout: a frame waits for window room at most the 3 s deadline.
    let spec = ProducerSpec {
        args: vec!["--connect-timeout-ms".into(), "1000".into()],
        ..ProducerSpec::new("dc-a")
    };
    let mut producer = Producer::start(&dir, "producer-a", &spec, &[indexer.url()]);
    let first = wait_converged(&indexer, &producer).await;
    let standby = start_standby(&dir, &indexer);
    let hashes = HashPool::new(&format(), 16).take(CYCLE);

    let (flow, reader) = ingest_flow(&producer, hashes.clone()).await;
    tokio::time::sleep(FLOWING).await;
    indexer.signal(libc::SIGSTOP);
    // The stall lasts until it filled the Relay stream and the producer's send waited out its
    // timeout (the session ended `send_stalled`).
    eventually(
        "the producer's send gave up on the stopped indexer (send_stalled)",
        DEADLINE,
        || {
            let stalled = producer
                .log_records("attachment ended")
                .iter()
                .any(|r| r["reason"] == "send_stalled");
            let log = if stalled {
                String::new()
            } else {
                producer.log()
            };
            async move { if stalled { Ok(()) } else { Err(log) } }
        },
    )
    .await;
    indexer.signal(libc::SIGCONT);
    tokio::time::sleep(FLOWING).await;
    let sent = flow.finish().await;
    assert_eq!(reader.await.expect("reader task"), Ok(sent));
    apply_flow(&mut producer, &hashes, sent);

    let log = producer.log();
    assert!(
        !log.contains("silent past the indexer's heartbeat deadline"),
        "waiting on a stopped indexer was taken for this producer's own silence:\n{log}"
    );
    eventually(
        "the takeover producer holds its pool again",
        DEADLINE,
        || async {
            let lane = indexer.lane("dc-a").await?;
            if lane.incarnation == first.incarnation && lane.state() == v1::LaneState::Active {
                Ok(())
            } else {
                Err(format!("{lane:?}"))
            }
        },
    )
    .await;
    wait_converged(&indexer, &producer).await;
    drop(standby);
}
