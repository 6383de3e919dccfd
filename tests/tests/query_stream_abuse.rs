//! `FindMatchesStream` against a hostile client (issue 12 review): streams that send and never
//! read their answers are held by HTTP/2 flow control (the client's sends stop being taken, so
//! the indexer buffers a bounded amount per stream), they keep their `limits.max_query_streams`
//! slots while their connections stay open (a further stream is refused `RESOURCE_EXHAUSTED`),
//! and the slots come back once the client's connections close.

use std::time::Duration;

use ckf_e2e::cluster::{Indexer, IndexerSpec, TestDir, channel};
use ckf_e2e::metrics;
use ckf_e2e::wait::{DEADLINE, eventually};
use ckf_proto::v1::{self, query_client::QueryClient};
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
