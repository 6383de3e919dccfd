//! `FindMatchesStream` against a hostile client: streams that send and never
//! read their answers are held by HTTP/2 flow control (the client's sends stop being taken, so
//! the indexer buffers a bounded amount per stream), they keep their `limits.max_query_streams`
//! slots while their connections stay open (a further stream is refused `RESOURCE_EXHAUSTED`),
//! and the slots come back once the client's connections close. One stream kept open across a
//! producer's `kill -9` and restart drops its lane once the lane is retired and answers it again
//! once the new incarnation has converged, on the same stream. A message within every request
//! limit whose answer would not fit `limits.max_message_bytes` is refused naming that limit
//! (it was searched, counted as answered, and failed in tonic's encoder with `OUT_OF_RANGE`).

use std::time::Duration;

use ckf_e2e::check::wait_converged;
use ckf_e2e::cluster::{
    Indexer, IndexerSpec, Producer, ProducerSpec, TestDir, channel, format, is_active,
};
use ckf_e2e::hashes::HashPool;
use ckf_e2e::metrics;
use ckf_e2e::wait::{DEADLINE, eventually};
use ckf_proto::v1::{self, LaneState, query_client::QueryClient};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

const STREAMS: usize = 4;
/// Messages a stream may send before the test calls its flow control missing: 20 000 messages
/// of 1 024 queries are about 200 MiB of requests per stream.
const MESSAGE_CAP: u64 = 20_000;

fn open_streams(indexer: &Indexer) -> f64 {
    let text = indexer.metrics().expect("metrics");
    metrics::value(&text, "ckf_indexer_query_streams", &[]).unwrap_or(-1.0)
}

/// One answered message on a new stream over a new connection.
async fn one_answer(addr: std::net::SocketAddr) -> Result<u64, tonic::Status> {
    let mut client = QueryClient::new(channel(addr).await.expect("channel"));
    let (tx, rx) = mpsc::channel(1);
    tx.send(v1::FindMatchesStreamRequest {
        id: 5,
        queries: vec![v1::BlockHashQuery {
            block_hashes: vec![1, 2, 3],
        }],
    })
    .await
    .expect("queued");
    let mut answers = client
        .find_matches_stream(ReceiverStream::new(rx))
        .await?
        .into_inner();
    let answer = answers.message().await?.expect("an answer");
    Ok(answer.id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_that_never_read_are_held_by_flow_control_until_their_connections_close() {
    let dir = TestDir::new("query-stream-unread");
    let spec = IndexerSpec {
        max_message_bytes: 4 << 20,
        extra_limits: format!("max_query_streams = {STREAMS}\n"),
        ..IndexerSpec::default()
    };
    let indexer = Indexer::start(&dir, &spec);
    let addr = indexer.addr;

    // The hostile client runs on a runtime of its own, so that dropping the runtime closes its
    // sockets (dropping the tonic handles alone does not: a request body blocked on the
    // server's flow-control window keeps the HTTP/2 stream, and so its connection, alive).
    let (client, sent) = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("client runtime");
        let (held, sent) = runtime.block_on(async move {
            let mut held = Vec::new();
            let mut sent = Vec::new();
            for _ in 0..STREAMS {
                let mut client = QueryClient::new(channel(addr).await.expect("channel"))
                    .max_encoding_message_size(8 << 20);
                let (tx, rx) = mpsc::channel(1);
                let answers = client
                    .find_matches_stream(ReceiverStream::new(rx))
                    .await
                    .expect("a stream slot");
                let queries: Vec<v1::BlockHashQuery> = (0..1024)
                    .map(|i| v1::BlockHashQuery {
                        block_hashes: vec![i],
                    })
                    .collect();
                let mut n = 0u64;
                // Sends until one is not taken within 2 s (flow control holds it) or the cap.
                while n < MESSAGE_CAP {
                    let request = v1::FindMatchesStreamRequest {
                        id: n,
                        queries: queries.clone(),
                    };
                    match tokio::time::timeout(Duration::from_secs(2), tx.send(request)).await {
                        Ok(Ok(())) => n += 1,
                        Ok(Err(_)) => panic!("stream closed by the indexer after {n} messages"),
                        Err(_) => break,
                    }
                }
                sent.push(n);
                held.push((client, tx, answers));
            }
            (held, sent)
        });
        ((runtime, held), sent)
    })
    .join()
    .expect("client thread");
    for n in &sent {
        assert!(*n < MESSAGE_CAP, "no backpressure: {sent:?} messages taken");
    }

    // The unread streams keep their slots: one more is refused, naming the limit.
    assert_eq!(open_streams(&indexer), STREAMS as f64);
    let status = one_answer(addr).await.expect_err("no slot left");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");

    // The client goes away (its sockets close): every slot comes back and a new stream is
    // answered.
    std::thread::spawn(move || drop(client))
        .join()
        .expect("drop the client");
    eventually("the unread streams' slots come back", DEADLINE, || async {
        let open = open_streams(&indexer);
        if open == 0.0 {
            Ok(())
        } else {
            Err(format!("{open} open"))
        }
    })
    .await;
    assert_eq!(one_answer(addr).await.expect("a slot"), 5);
}

/// One open `FindMatchesStream`: sends id-tagged messages and reads their answers in turn.
struct OpenStream {
    tx: mpsc::Sender<v1::FindMatchesStreamRequest>,
    answers: tonic::Streaming<v1::FindMatchesStreamResponse>,
    next_id: u64,
}

impl OpenStream {
    async fn open(addr: std::net::SocketAddr) -> Self {
        let mut client = QueryClient::new(channel(addr).await.expect("channel"));
        let (tx, rx) = mpsc::channel(1);
        let answers = client
            .find_matches_stream(ReceiverStream::new(rx))
            .await
            .expect("stream")
            .into_inner();
        Self {
            tx,
            answers,
            next_id: 0,
        }
    }

    /// `(ready mask, depth per ready lane)` of each query, from one message.
    async fn ask(&mut self, queries: &[&[u64]]) -> Vec<(u64, Vec<u32>)> {
        self.next_id += 1;
        let id = self.next_id;
        self.tx
            .send(v1::FindMatchesStreamRequest {
                id,
                queries: queries
                    .iter()
                    .map(|q| v1::BlockHashQuery {
                        block_hashes: q.to_vec(),
                    })
                    .collect(),
            })
            .await
            .expect("the stream takes the message");
        let answer = self
            .answers
            .message()
            .await
            .expect("an answer, not a status")
            .expect("the stream is open");
        assert_eq!(answer.id, id);
        answer
            .results
            .into_iter()
            .map(|r| {
                assert_eq!(
                    r.ready_lanes().count_ones() as usize,
                    r.depths.len(),
                    "{r:?}"
                );
                (r.ready_lanes(), r.depths)
            })
            .collect()
    }
}

/// The depth of `lane` in a compact answer, `None` when the lane was not ready.
fn depth_of(answer: &(u64, Vec<u32>), lane: u32) -> Option<u32> {
    let (mask, depths) = answer;
    (mask & (1 << lane) != 0).then(|| depths[(mask & ((1 << lane) - 1)).count_ones() as usize])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_stream_follows_a_producer_killed_and_restarted() {
    let dir = TestDir::new("query-stream-failover");
    let spec = IndexerSpec {
        heartbeat_deadline_ms: 2_500,
        ..IndexerSpec::default()
    };
    let indexer = Indexer::start(&dir, &spec);
    let endpoints = [indexer.url()];
    let (mut a, mut b) = Producer::start_ab(&dir, &endpoints);
    let (lane_a, lane_b) = (indexer.lane_index("dc-a"), indexer.lane_index("dc-b"));
    let mut pool = HashPool::new(&format(), 5);
    let of_a = pool.take(30);
    let of_b = pool.take(20);
    let of_a2 = pool.take(25);
    a.store(1, &of_a).await;
    b.store(1, &of_b).await;
    wait_converged(&indexer, &a).await;
    wait_converged(&indexer, &b).await;

    let mut stream = OpenStream::open(indexer.addr).await;
    let answer = stream.ask(&[&of_a, &of_b]).await;
    assert_eq!(depth_of(&answer[0], lane_a), Some(30), "{answer:?}");
    assert_eq!(depth_of(&answer[1], lane_b), Some(20), "{answer:?}");

    a.kill9();
    indexer
        .wait_lane("dc-a", "retired", |l| l.state() == LaneState::Retired)
        .await;
    // Retired before this message was sent: the same stream no longer answers dc-a, and dc-b
    // keeps its depth.
    let answer = stream.ask(&[&of_a, &of_b]).await;
    assert_eq!(depth_of(&answer[0], lane_a), None, "{answer:?}");
    assert_eq!(depth_of(&answer[1], lane_a), None, "{answer:?}");
    assert_eq!(depth_of(&answer[1], lane_b), Some(20), "{answer:?}");

    let mut a2 = Producer::start(&dir, "producer-a2", &ProducerSpec::new("dc-a"), &endpoints);
    a2.store(1, &of_a2).await;
    wait_converged(&indexer, &a2).await;
    // Bounded poll on the same stream (the new lane is ready once its snapshot is installed).
    let polls = DEADLINE.as_millis() / 50;
    for poll in 0.. {
        let answer = stream.ask(&[&of_a2, &of_b]).await;
        match (depth_of(&answer[0], lane_a), depth_of(&answer[1], lane_b)) {
            (Some(25), Some(20)) => break,
            _ if poll < polls => tokio::time::sleep(Duration::from_millis(50)).await,
            _ => panic!("the stream never answered the new incarnation: {answer:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_whose_answer_exceeds_max_message_bytes_is_refused_naming_the_limit() {
    let dir = TestDir::new("query-answer-too-large");
    // 4 KiB messages and the default max_query_batch of 1 024: 1 024 empty queries are a
    // 2 KiB request, and with two ready lanes an 8 KiB answer.
    let spec = IndexerSpec {
        max_message_bytes: 4 << 10,
        ..IndexerSpec::default()
    };
    let indexer = Indexer::start(&dir, &spec);
    let (_a, _b) = Producer::start_ab(&dir, &[indexer.url()]);
    indexer.wait_lane("dc-a", "active", is_active).await;
    indexer.wait_lane("dc-b", "active", is_active).await;
    let empty = |n| {
        vec![
            v1::BlockHashQuery {
                block_hashes: vec![]
            };
            n
        ]
    };
    let counted = || {
        let text = indexer.metrics().expect("metrics");
        [
            ("find_matches_batch", "ckf_indexer_queries_total"),
            ("find_matches_batch", "ckf_indexer_queries_refused_total"),
            ("find_matches_stream", "ckf_indexer_queries_total"),
            ("find_matches_stream", "ckf_indexer_queries_refused_total"),
        ]
        .map(|(method, name)| metrics::value(&text, name, &[("method", method)]).unwrap_or(0.0))
    };
    let mut client = QueryClient::new(channel(indexer.addr).await.expect("channel"));

    // What fits is answered.
    let answer = client
        .find_matches_batch(v1::FindMatchesBatchRequest { queries: empty(64) })
        .await
        .expect("64 queries fit")
        .into_inner();
    assert_eq!(answer.results.len(), 64);
    assert!(
        answer.results.iter().all(|r| r.ready_lanes() == 0b11),
        "{answer:?}"
    );

    let status = client
        .find_matches_batch(v1::FindMatchesBatchRequest {
            queries: empty(1024),
        })
        .await
        .expect_err("the answer does not fit");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("limits.max_message_bytes = 4096"),
        "{status:?}"
    );

    let (tx, rx) = mpsc::channel(1);
    tx.send(v1::FindMatchesStreamRequest {
        id: 9,
        queries: empty(1024),
    })
    .await
    .expect("queued");
    let mut answers = client
        .find_matches_stream(ReceiverStream::new(rx))
        .await
        .expect("stream")
        .into_inner();
    let status = answers
        .message()
        .await
        .expect_err("the answer does not fit");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("limits.max_message_bytes = 4096")
            && status.message().contains("message id 9"),
        "{status:?}"
    );
    // The refused queries count as refused, not as answered.
    assert_eq!(counted(), [64.0, 1024.0, 0.0, 1024.0]);
}
