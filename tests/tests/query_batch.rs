//! Batched and streamed queries: `FindMatchesBatch`, `FindMatchesStream` and `ckf load`
//! against the real binaries. Two producers load a cluster; batched and streamed answers equal the unary answers
//! for the same queries; the batch and block limits are refused with INVALID_ARGUMENT naming the
//! limit and the index; the stream echoes ids in order and outlives the unary request timeout;
//! the new RPCs need the query token; `ckf load --json` reports exactly the queries it sent with
//! zero errors (counts only, never timings).

use std::collections::BTreeMap;
use std::process::Command;

use ckf_e2e::binary;
use ckf_e2e::cluster::{Indexer, IndexerSpec, Producer, TestDir, channel, format, is_active};
use ckf_e2e::hashes::HashPool;
use ckf_e2e::metrics;
use ckf_e2e::wait::{DEADLINE, eventually};
use ckf_proto::v1::{self, query_client::QueryClient};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Request};

const TOKEN: &str = "q-batch.0123456789";

fn bearer<T>(request: T, token: Option<&str>) -> Request<T> {
    let mut request = Request::new(request);
    if let Some(token) = token {
        let value = format!("Bearer {token}").parse().expect("header value");
        request.metadata_mut().insert("authorization", value);
    }
    request
}

fn wire(queries: &[Vec<u64>]) -> Vec<v1::BlockHashQuery> {
    queries
        .iter()
        .map(|q| v1::BlockHashQuery {
            block_hashes: q.clone(),
        })
        .collect()
}

/// A unary answer as `(lane, depth)` per ready lane, and the ready mask.
fn unary_form(response: &v1::FindMatchesResponse) -> (Vec<(u32, u32)>, u64) {
    let lanes = response.matches.iter().map(|m| (m.lane, m.depth)).collect();
    (lanes, response.ready_lanes())
}

/// A compact batch result in the same form (depths follow the set bits of the mask).
fn compact_form(result: &v1::QueryResult) -> (Vec<(u32, u32)>, u64) {
    let lanes: Vec<u32> = (0..64)
        .filter(|l| result.ready_lanes() & (1 << l) != 0)
        .collect();
    assert_eq!(lanes.len(), result.depths.len(), "{result:?}");
    (
        lanes
            .into_iter()
            .zip(result.depths.iter().copied())
            .collect(),
        result.ready_lanes(),
    )
}

/// Indexer (query token, a 200 ms unary timeout, `limits` lines such as
/// `max_query_batch = 16`) with dc-a and dc-b producers holding overlapping prefixes; returns
/// the queries to ask.
async fn loaded_cluster(
    dir: &TestDir,
    limits: &str,
) -> (Indexer, Producer, Producer, Vec<Vec<u64>>) {
    let token_file = dir.path().join("query.token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).expect("token file");
    let spec = IndexerSpec {
        extra_toml: format!(
            "[auth]\nquery_token_file = {token_file:?}\n[transport]\nrequest_timeout_ms = 200\n"
        ),
        extra_limits: limits.into(),
        ..IndexerSpec::default()
    };
    let mut indexer = Indexer::start(dir, &spec);
    indexer.query_token = Some(TOKEN.into());
    let (mut a, mut b) = Producer::start_ab(dir, &[indexer.url()]);
    indexer.wait_lane("dc-a", "active", is_active).await;
    indexer.wait_lane("dc-b", "active", is_active).await;
    let mut pool = HashPool::new(&format(), 12);
    let shared = pool.take(20);
    let only_a = pool.take(8);
    let only_b = pool.take(6);
    let absent = pool.take(4);
    a.store(1, &shared).await;
    a.store(2, &only_a).await;
    b.store(7, &shared[..9]).await;
    b.store(8, &only_b).await;
    // Visible on both lanes before anything is compared.
    eventually("stores visible", DEADLINE, || async {
        let depths = indexer.depths(&shared).await?;
        let want = BTreeMap::from([("dc-a".to_owned(), 20), ("dc-b".to_owned(), 9)]);
        let b_only = indexer.depths(&only_b).await?;
        if depths == want && b_only.get("dc-b") == Some(&6) {
            Ok(())
        } else {
            Err(format!("{depths:?} {b_only:?}"))
        }
    })
    .await;
    let mut queries = vec![
        shared.clone(),
        shared[..5].to_vec(),
        shared[..12].to_vec(),
        only_a.clone(),
        only_b.clone(),
        absent.clone(),
        Vec::new(),
        [&shared[..3], &absent[..]].concat(),
        [&only_a[..4], &shared[..]].concat(),
    ];
    // Every length 1..=20 of the shared prefix too.
    queries.extend((1..=20).map(|n| shared[..n].to_vec()));
    (indexer, a, b, queries)
}

async fn client(indexer: &Indexer) -> QueryClient<Channel> {
    QueryClient::new(channel(indexer.addr).await.expect("channel"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_and_stream_answer_as_unary_within_limits_and_with_the_token() {
    let dir = TestDir::new("query-batch");
    let (indexer, _a, _b, queries) =
        loaded_cluster(&dir, "max_query_blocks = 64\nmax_query_batch = 16\n").await;
    let mut unary = Vec::new();
    for q in &queries {
        unary.push(unary_form(&indexer.find(q).await.expect("FindMatches")));
    }
    assert_eq!(unary[0], (vec![(0, 20), (1, 9)], 0b11));
    assert_eq!(unary[4], (vec![(0, 0), (1, 6)], 0b11));
    let mut client = client(&indexer).await;

    // Batches of at most 16 queries (the limit), in order.
    let mut batched = Vec::new();
    for chunk in queries.chunks(16) {
        let results = client
            .find_matches_batch(bearer(
                v1::FindMatchesBatchRequest {
                    queries: wire(chunk),
                },
                Some(TOKEN),
            ))
            .await
            .expect("FindMatchesBatch")
            .into_inner()
            .results;
        assert_eq!(results.len(), chunk.len());
        batched.extend(results.iter().map(compact_form));
    }
    assert_eq!(batched, unary);

    // One stream: messages of 1..=7 queries with descending ids, answered in order, one of
    // them after a pause longer than the unary request timeout (200 ms): streams are exempt.
    let (tx, rx) = mpsc::channel(64);
    let mut answers = client
        .find_matches_stream(bearer(ReceiverStream::new(rx), Some(TOKEN)))
        .await
        .expect("FindMatchesStream")
        .into_inner();
    let mut sent_ids = Vec::new();
    let mut start = 0;
    let mut size = 1;
    while start < queries.len() {
        let end = (start + size).min(queries.len());
        let id = 1_000_000 - sent_ids.len() as u64 * 7;
        if sent_ids.len() == 3 {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
        tx.send(v1::FindMatchesStreamRequest {
            id,
            queries: wire(&queries[start..end]),
        })
        .await
        .expect("stream open");
        sent_ids.push(id);
        start = end;
        size = size % 7 + 1;
    }
    drop(tx);
    let mut ids = Vec::new();
    let mut streamed = Vec::new();
    while let Some(answer) = answers.message().await.expect("stream answer") {
        ids.push(answer.id);
        streamed.extend(answer.results.iter().map(compact_form));
    }
    assert_eq!(ids, sent_ids);
    assert_eq!(streamed, unary);

    // Limits: 17 queries; a 65-hash query at index 2 (batch) or 1 (stream message id 9).
    let too_many = vec![vec![1u64]; 17];
    let status = client
        .find_matches_batch(bearer(
            v1::FindMatchesBatchRequest {
                queries: wire(&too_many),
            },
            Some(TOKEN),
        ))
        .await
        .expect_err("17 queries refused");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status
            .message()
            .contains("FindMatchesBatch carries 17 queries (limits.max_query_batch = 16)"),
        "{status:?}"
    );
    let long = vec![vec![], vec![5], vec![9u64; 65], vec![9u64; 66]];
    let status = client
        .find_matches_batch(bearer(
            v1::FindMatchesBatchRequest {
                queries: wire(&long),
            },
            Some(TOKEN),
        ))
        .await
        .expect_err("65 blocks refused");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status
            .message()
            .contains("query #2 carries 65 block hashes (limits.max_query_blocks = 64)"),
        "{status:?}"
    );
    let (tx, rx) = mpsc::channel(4);
    let mut answers = client
        .find_matches_stream(bearer(ReceiverStream::new(rx), Some(TOKEN)))
        .await
        .expect("FindMatchesStream")
        .into_inner();
    tx.send(v1::FindMatchesStreamRequest {
        id: 9,
        queries: wire(&long[1..]),
    })
    .await
    .expect("send");
    let status = answers.message().await.expect_err("refused message");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains(
            "FindMatchesStream message id 9: query #1 carries 65 block hashes (limits.max_query_blocks = 64)"
        ),
        "{status:?}"
    );

    // Auth: no token and a wrong token are refused on both new RPCs.
    for token in [None, Some("q-wrong")] {
        let status = client
            .find_matches_batch(bearer(
                v1::FindMatchesBatchRequest {
                    queries: wire(&queries[..2]),
                },
                token,
            ))
            .await
            .expect_err("batch without the token");
        assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
        let (_tx, rx) = mpsc::channel(1);
        let status = client
            .find_matches_stream(bearer(ReceiverStream::new(rx), token))
            .await
            .expect_err("stream without the token");
        assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    }

    // Per-method counters (queries, not messages).
    let text = indexer.metrics().expect("metrics");
    let count = |name, method| metrics::value(&text, name, &[("method", method)]);
    let n = queries.len() as f64;
    assert_eq!(
        count("ckf_indexer_queries_total", "find_matches_batch"),
        Some(n)
    );
    assert_eq!(
        count("ckf_indexer_queries_total", "find_matches_stream"),
        Some(n)
    );
    assert_eq!(
        count("ckf_indexer_queries_refused_total", "find_matches_batch"),
        Some(17.0 + 4.0)
    );
    assert_eq!(
        count("ckf_indexer_queries_refused_total", "find_matches_stream"),
        Some(3.0)
    );
}

/// `ckf load --json` against `indexer` over the first `limit` requests of the workload, then
/// `args`.
fn load_command(indexer: &Indexer, limit: u32, args: &[&str]) -> Command {
    let mut command = Command::new(binary("ckf"));
    command
        .args(["load", "--indexer", &indexer.url(), "--json", "--limit"])
        .arg(limit.to_string())
        .args(args);
    command
}

/// Runs `ckf load --json` with `args`; returns its JSON summary.
fn ckf_load(indexer: &Indexer, args: &[&str]) -> serde_json::Value {
    let out = load_command(indexer, 200, args)
        .output()
        .expect("run ckf load");
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("ckf load --json printed no JSON ({e}): {out:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ckf_load_sends_what_it_reports_with_zero_errors() {
    let dir = TestDir::new("query-load");
    // Default limits: the synthetic workload's queries are up to 160 blocks long.
    let (indexer, _a, _b, _) = loaded_cluster(&dir, "").await;
    let token_file = dir.path().join("query.token");
    let token = token_file.to_str().expect("utf-8");
    let before = indexer.metrics().expect("metrics");
    let answered = |text: &str, method| {
        metrics::value(text, "ckf_indexer_queries_total", &[("method", method)]).unwrap_or(0.0)
    };

    // (mode, extra flags, messages, queries per message, indexer method label)
    let runs: [(&str, &[&str], u64, u64, &str); 4] = [
        ("unary", &["--concurrency", "4"], 120, 1, "find_matches"),
        (
            "batch",
            &["--batch", "16", "--connections", "2"],
            30,
            16,
            "find_matches_batch",
        ),
        (
            "stream",
            &["--batch", "8", "--concurrency", "3"],
            40,
            8,
            "find_matches_stream",
        ),
        // Open loop at a rate the machine sustains easily; counts, not timings, are checked.
        (
            "batch",
            &["--batch", "4", "--rate", "2000"],
            25,
            4,
            "find_matches_batch",
        ),
    ];
    let mut expected: BTreeMap<&str, f64> = BTreeMap::new();
    for (mode, flags, messages, per_message, method) in runs {
        let requests = messages.to_string();
        let mut args = vec![
            "--mode",
            mode,
            "--requests",
            &requests,
            "--token-file",
            token,
        ];
        args.extend_from_slice(flags);
        let report = ckf_load(&indexer, &args);
        let what = format!("{mode} {flags:?}: {report}");
        assert_eq!(report["messages"], messages, "{what}");
        assert_eq!(report["queries"], messages * per_message, "{what}");
        assert_eq!(report["queries_sent"], messages * per_message, "{what}");
        assert_eq!(report["error_count"], 0, "{what}");
        assert_eq!(report["mode"], mode, "{what}");
        // The indexer was found from the URL's port and its CPU time read from /proc.
        assert_eq!(report["indexer_pid"], indexer.pid(), "{what}");
        assert!(report["indexer_cpu_us_per_query"].is_number(), "{what}");
        // The send delay (due time to sent) exists only for a run on a schedule, and is part
        // of each message's latency, so it cannot exceed the largest one.
        if flags.contains(&"--rate") {
            let delay = &report["send_delay_us"];
            let (p50, max) = (delay["p50"].as_f64(), delay["max"].as_f64());
            assert!(p50.is_some_and(|p| p > 0.0) && max >= p50, "{what}");
            assert!(max <= report["latency_us"]["max"].as_f64(), "{what}");
        } else {
            assert!(report["send_delay_us"].is_null(), "{what}");
        }
        *expected.entry(method).or_default() += (messages * per_message) as f64;
    }
    // The indexer answered exactly those queries.
    let after = indexer.metrics().expect("metrics");
    for (method, n) in expected {
        assert_eq!(
            answered(&after, method) - answered(&before, method),
            n,
            "{method}"
        );
    }

    // Health mode (the unary floor): every check is answered SERVING and timed like a query,
    // and none of them reaches the Query service.
    let report = ckf_load(
        &indexer,
        &["--mode", "health", "--requests", "50", "--concurrency", "2"],
    );
    assert_eq!(report["mode"], "health", "{report}");
    assert_eq!(report["messages"], 50, "{report}");
    assert_eq!(report["queries"], 50, "{report}");
    assert_eq!(report["error_count"], 0, "{report}");
    assert!(report["indexer_cpu_us_per_query"].is_number(), "{report}");
    let after_health = indexer.metrics().expect("metrics");
    for method in ["find_matches", "find_matches_batch", "find_matches_stream"] {
        assert_eq!(
            answered(&after_health, method),
            answered(&after, method),
            "{method}"
        );
    }

    // Without the token every message fails UNAUTHENTICATED, counted by code.
    let report = ckf_load(&indexer, &["--mode", "batch", "--requests", "5"]);
    assert_eq!(report["queries"], 0, "{report}");
    assert_eq!(report["errors"]["UNAUTHENTICATED"], 5, "{report}");
    assert_eq!(report["error_count"], 5, "{report}");
}

/// Runs `ckf load` with `args` against `indexer` and waits for it within the deadline (a run
/// still going then is killed and fails the test: a hang, not a slow run). Its output goes to
/// files in `dir`.
async fn ckf_load_bounded(dir: &TestDir, indexer: &Indexer, args: &[&str]) -> std::process::Output {
    let out_path = dir.path().join("load.out");
    let err_path = dir.path().join("load.err");
    let mut child = load_command(indexer, 50, args)
        .stdout(std::fs::File::create(&out_path).expect("stdout file"))
        .stderr(std::fs::File::create(&err_path).expect("stderr file"))
        .spawn()
        .expect("spawn ckf load");
    let mut status = None;
    for _ in 0..DEADLINE.as_millis() / 50 {
        status = child.try_wait().expect("wait ckf load");
        if status.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("ckf load {args:?} still running after {DEADLINE:?}");
    };
    std::process::Output {
        status,
        stdout: std::fs::read(&out_path).expect("stdout"),
        stderr: std::fs::read(&err_path).expect("stderr"),
    }
}

/// Open-loop rates beyond the generator: a rate whose interval between messages rounds to zero
/// is refused (it ran forever: every message was due at the start, so none was due after the
/// end, and the pacer's unbounded queue grew by gigabytes), and a rate above what the slots
/// sustain ends at `--duration` with the messages due but never sent counted as `NOT_SENT`
/// (the backlog was sent after the end, stretching a 0.3 s run to minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ckf_load_open_loop_beyond_its_slots_ends_and_counts_what_it_did_not_send() {
    let dir = TestDir::new("query-load-overrate");
    let indexer = Indexer::start(&dir, &IndexerSpec::default());

    let out = ckf_load_bounded(&dir, &indexer, &["--rate", "1e12", "--duration", "1"]).await;
    assert!(!out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--rate"), "{stderr}");

    // One query per message at 1e6/s: one message due every microsecond, 300 000 before the
    // end; a single slot answers a small part of them.
    let out = ckf_load_bounded(
        &dir,
        &indexer,
        &[
            "--mode",
            "batch",
            "--batch",
            "1",
            "--rate",
            "1e6",
            "--duration",
            "300ms",
            "--concurrency",
            "1",
        ],
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON summary");
    let answered = report["messages"].as_u64().expect("messages");
    let not_sent = report["errors"]["NOT_SENT"].as_u64().unwrap_or(0);
    let failed = report["error_count"].as_u64().expect("error_count") - not_sent;
    assert!(not_sent > 0, "{report}");
    assert_eq!(answered + failed + not_sent, 300_000, "{report}");
    assert_eq!(report["queries_sent"], answered + failed, "{report}");
}
