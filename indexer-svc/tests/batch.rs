//! `FindMatchesBatch` and `FindMatchesStream` in-process: the same answers as unary
//! `FindMatches`, the batch and block limits (naming the index and the stream message id),
//! id echo in order, the per-method counters, and the stream ended by shutdown.

mod common;

use ckf_proto::v1;
use common::*;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

fn batch(queries: &[Vec<u64>]) -> Vec<v1::BlockHashQuery> {
    queries
        .iter()
        .map(|q| v1::BlockHashQuery {
            block_hashes: q.clone(),
        })
        .collect()
}

/// A compact result as unary's `(lane, depth)` list and mask.
fn unpack(result: &v1::QueryResult) -> (Vec<(u32, u32)>, u64) {
    let lanes = (0..64).filter(|lane| result.ready_lanes() & (1 << lane) != 0);
    assert_eq!(lanes.clone().count(), result.depths.len(), "{result:?}");
    (
        lanes.zip(result.depths.iter().copied()).collect(),
        result.ready_lanes(),
    )
}

/// An indexer with lanes dc-a (ready, holding hashes(40, 10)) and dc-b (ready, hashes(40, 3)
/// and hashes(41, 2)), dc-c never attached, and the given limits.
async fn loaded(max_blocks: u32, max_batch: u32) -> (Indexer, Producer, Producer) {
    let mut cfg = config(&["dc-a", "dc-b", "dc-c"]);
    cfg.limits.max_query_blocks = max_blocks;
    cfg.limits.max_query_batch = max_batch;
    let indexer = Indexer::start(cfg).await;
    let mut a = Producer::attach(&indexer, "dc-a", 1).await;
    a.store(1, &hashes(40, 10));
    a.snapshot(8192).await;
    let mut b = Producer::attach(&indexer, "dc-b", 2).await;
    b.store(1, &hashes(40, 3));
    b.store(1, &hashes(41, 2));
    b.snapshot(8192).await;
    indexer
        .wait_lane(0, |l| l.state() == v1::LaneState::Active)
        .await;
    indexer
        .wait_lane(1, |l| l.state() == v1::LaneState::Active)
        .await;
    (indexer, a, b)
}

fn queries() -> Vec<Vec<u64>> {
    vec![
        hashes(40, 10),
        hashes(40, 4),
        hashes(41, 3),
        vec![],
        hashes(99, 2),
        hashes(40, 1),
    ]
}

#[tokio::test]
async fn batch_and_stream_answer_what_unary_answers() {
    let (indexer, _a, _b) = loaded(16, 8).await;
    let queries = queries();
    let mut unary = Vec::new();
    for q in &queries {
        unary.push(indexer.find(q).await);
    }
    // Both lanes hold something: the unary answers are not trivially empty.
    assert_eq!(unary[0], (vec![(0, 10), (1, 3)], 0b11));
    assert_eq!(unary[2], (vec![(0, 0), (1, 2)], 0b11));

    let results = indexer
        .query()
        .find_matches_batch(v1::FindMatchesBatchRequest {
            queries: batch(&queries),
        })
        .await
        .expect("FindMatchesBatch")
        .into_inner()
        .results;
    assert_eq!(results.iter().map(unpack).collect::<Vec<_>>(), unary);

    // Three stream messages with caller ids 7, 3, 1000 (not ordered): echoed in order.
    let (tx, rx) = mpsc::channel(4);
    let mut responses = indexer
        .query()
        .find_matches_stream(ReceiverStream::new(rx))
        .await
        .expect("FindMatchesStream")
        .into_inner();
    for (id, part) in [
        (7u64, &queries[..2]),
        (3, &queries[2..3]),
        (1000, &queries[3..]),
    ] {
        tx.send(v1::FindMatchesStreamRequest {
            id,
            queries: batch(part),
        })
        .await
        .unwrap();
    }
    drop(tx);
    let mut ids = Vec::new();
    let mut streamed = Vec::new();
    while let Some(response) = responses.message().await.expect("stream answer") {
        ids.push(response.id);
        streamed.extend(response.results.iter().map(unpack));
    }
    assert_eq!(ids, [7, 3, 1000]);
    assert_eq!(streamed, unary);

    assert_metrics(
        &indexer,
        &[
            r#"ckf_indexer_queries_total{domain="test",method="find_matches_batch"} 6"#,
            r#"ckf_indexer_queries_total{domain="test",method="find_matches_stream"} 6"#,
            r#"ckf_indexer_query_blocks_total{domain="test",method="find_matches_batch"} 20"#,
            r#"ckf_indexer_queries_refused_total{domain="test",method="find_matches_stream"} 0"#,
            // One search time per query, unary (6), batched (6) and streamed (6) alike: the
            // batch path's unshared histogram copy is added to the shared one.
            "ckf_indexer_query_duration_seconds_count 18",
        ],
    )
    .await;
}

#[tokio::test]
async fn batch_limits_are_invalid_argument_naming_the_limit_and_the_index() {
    let (indexer, _a, _b) = loaded(4, 3).await;
    let status = indexer
        .query()
        .find_matches_batch(v1::FindMatchesBatchRequest {
            queries: batch(&[vec![1], vec![2], vec![3], vec![4]]),
        })
        .await
        .unwrap_err();
    assert_status(
        &status,
        Code::InvalidArgument,
        &["FindMatchesBatch carries 4 queries (limits.max_query_batch = 3)"],
    );
    let status = indexer
        .query()
        .find_matches_batch(v1::FindMatchesBatchRequest {
            queries: batch(&[hashes(40, 4), hashes(40, 5), hashes(40, 6)]),
        })
        .await
        .unwrap_err();
    assert_status(
        &status,
        Code::InvalidArgument,
        &["query #1 carries 5 block hashes (limits.max_query_blocks = 4)"],
    );
    // At the limits exactly: answered.
    let ok = indexer
        .query()
        .find_matches_batch(v1::FindMatchesBatchRequest {
            queries: batch(&[hashes(40, 4), hashes(40, 4), hashes(40, 4)]),
        })
        .await
        .expect("a batch at both limits")
        .into_inner();
    assert_eq!(ok.results.len(), 3);
    assert_eq!(ok.results[0].depths, [4, 3]);

    // A stream: the first message is answered, the second ends the stream naming its id.
    let (tx, rx) = mpsc::channel(4);
    let mut responses = indexer
        .query()
        .find_matches_stream(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    for (id, queries) in [
        (11u64, vec![hashes(40, 2)]),
        (12, vec![vec![], hashes(1, 5)]),
    ] {
        tx.send(v1::FindMatchesStreamRequest {
            id,
            queries: batch(&queries),
        })
        .await
        .unwrap();
    }
    let first = responses.message().await.unwrap().unwrap();
    assert_eq!(
        (first.id, first.results[0].depths.clone()),
        (11, vec![2, 2])
    );
    let status = responses.message().await.unwrap_err();
    assert_status(
        &status,
        Code::InvalidArgument,
        &[
            "FindMatchesStream message id 12: query #1 carries 5 block hashes (limits.max_query_blocks = 4)",
        ],
    );
    assert_metrics(
        &indexer,
        &[
            r#"ckf_indexer_queries_refused_total{domain="test",method="find_matches_batch"} 7"#,
            r#"ckf_indexer_queries_refused_total{domain="test",method="find_matches_stream"} 2"#,
            r#"ckf_indexer_queries_total{domain="test",method="find_matches_stream"} 1"#,
        ],
    )
    .await;
}

#[tokio::test]
async fn an_open_stream_ends_unavailable_at_shutdown() {
    let (indexer, _a, _b) = loaded(16, 8).await;
    let (tx, rx) = mpsc::channel(4);
    let mut responses = indexer
        .query()
        .find_matches_stream(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    tx.send(v1::FindMatchesStreamRequest {
        id: 1,
        queries: batch(&[hashes(40, 3)]),
    })
    .await
    .unwrap();
    assert_eq!(responses.message().await.unwrap().unwrap().id, 1);
    let Indexer { running, .. } = indexer;
    let stopping = tokio::spawn(running.stop());
    let status = responses.message().await.unwrap_err();
    assert_status(&status, Code::Unavailable, &["shutting down"]);
    stopping.await.unwrap().expect("clean stop");
    drop(tx);
}

/// Asserts that the indexer's `/metrics` page holds each of `lines` verbatim.
async fn assert_metrics(indexer: &Indexer, lines: &[&str]) {
    let text = metrics_text(indexer).await;
    for line in lines {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
}

/// Opens a `FindMatchesStream` and gets one answer through it (so the stream is established):
/// the request sender (dropping it half-closes) and the response stream, or the call's status.
async fn open_stream(
    indexer: &Indexer,
) -> Result<
    (
        mpsc::Sender<v1::FindMatchesStreamRequest>,
        tonic::Streaming<v1::FindMatchesStreamResponse>,
    ),
    tonic::Status,
> {
    let (tx, rx) = mpsc::channel(4);
    tx.send(v1::FindMatchesStreamRequest {
        id: 7,
        queries: batch(&[hashes(40, 2)]),
    })
    .await
    .unwrap();
    let mut responses = indexer
        .query()
        .find_matches_stream(ReceiverStream::new(rx))
        .await?
        .into_inner();
    assert_eq!(responses.message().await?.expect("an answer").id, 7);
    Ok((tx, responses))
}

#[tokio::test]
async fn open_streams_are_capped_by_max_query_streams_and_slots_come_back() {
    let mut cfg = config(&["dc-a"]);
    cfg.limits.max_query_streams = 2;
    let indexer = Indexer::start(cfg).await;
    let first = open_stream(&indexer).await.expect("first stream");
    let _second = open_stream(&indexer).await.expect("second stream");
    assert!(
        metrics_text(&indexer)
            .await
            .contains("ckf_indexer_query_streams 2")
    );

    // A third is refused whole, naming the limit; the open ones keep answering.
    let status = open_stream(&indexer).await.unwrap_err();
    assert_status(
        &status,
        Code::ResourceExhausted,
        &["2 query streams are open", "limits.max_query_streams = 2"],
    );
    let (tx, mut responses) = first;
    tx.send(v1::FindMatchesStreamRequest {
        id: 8,
        queries: batch(&[hashes(40, 1)]),
    })
    .await
    .unwrap();
    assert_eq!(responses.message().await.unwrap().unwrap().id, 8);

    // Closing one gives its slot back (the server drops the stream once the client is gone).
    drop(tx);
    assert!(responses.message().await.unwrap().is_none());
    drop(responses);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !metrics_text(&indexer)
        .await
        .contains("ckf_indexer_query_streams 1")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the closed stream's slot never came back"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    open_stream(&indexer)
        .await
        .expect("a stream in the freed slot");
}
