//! `Ingest.GetSourceSequence` tells a source where to resume, against the real
//! binaries.
//!
//! * A durable producer killed with `kill -9` under a source's flood answers, after its restart,
//!   the last batch it holds (`k`, no less than what was acknowledged well before the kill) and
//!   the next one it expects (`k + 1`), its exact state is the state after batch `k`, and
//!   resending from `k + 1` applies every batch once onto exactly its predecessor's state: no
//!   gap, no duplicate, no store of a block already held, no removal of one not held; the lane
//!   converges.
//! * A source never seen, or evicted (`limits.max_tracked_sources`, least recently admitted
//!   first; reading is not a use), is `known = false`; sequence 0 is a valid first batch.
//! * A bad source id is `INVALID_ARGUMENT` naming the request field and the rule; with
//!   `[ingest_auth]` a source outside the caller's grant is `PERMISSION_DENIED` naming principal
//!   and source (counted), no credential `UNAUTHENTICATED`; `ckf source-sequence` prints the
//!   answer in one line, or the refusal.

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ckf_e2e::check::wait_converged;
use ckf_e2e::cluster::{
    Indexer, IndexerSpec, Producer, ProducerSpec, TestDir, channel, event, format,
};
use ckf_e2e::hashes::HashPool;
use ckf_e2e::metrics;
use ckf_e2e::wait::flood_acknowledged_for;
use ckf_proto::v1;
use ckf_proto::v1::ingest_client::IngestClient;
use ckf_proto::v1::kv_event::Kind;
use tonic::transport::Channel;
use tonic::{Code, Request};

/// The group-commit window of the durable producer; what a `kill -9` may lose.
const COMMIT_MS: u64 = 50;
/// Batches the flood may send at most (one fresh block each): more than it sends before the
/// kill, so the kill lands inside the flood.
const BATCHES: usize = 20_000;
/// Batches sent after the resume beyond the last one sent before the kill.
const MORE: usize = 20;
/// The flooding source.
const SOURCE: &str = "resume-test/boot-1";

/// Batch `i` (sequence `i + 1`) of worker 2: it stores `blocks[i]` and removes `blocks[i - 1]`,
/// so after batch `k` the worker owns exactly `held(blocks, k)` (one block: the table stays far
/// from full, whatever the number of batches).
fn batch(blocks: &[u64], i: usize) -> v1::KvEventBatch {
    let mut events = vec![event(
        2,
        Kind::Stored(v1::Stored {
            block_hashes: vec![blocks[i]],
            parent_hash: None,
        }),
    )];
    if i > 0 {
        events.push(event(
            2,
            Kind::Removed(v1::Removed {
                block_hashes: vec![blocks[i - 1]],
            }),
        ));
    }
    v1::KvEventBatch {
        source_id: SOURCE.into(),
        sequence: i as u64 + 1,
        events,
    }
}

/// Worker 2's blocks after batches `1..=k`.
fn held(blocks: &[u64], k: usize) -> Vec<u64> {
    k.checked_sub(1)
        .map(|i| vec![blocks[i]])
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kill9_the_producer_says_where_to_resume_and_resuming_there_loses_nothing() {
    let dir = TestDir::new("source-sequence-resume");
    let indexer = Indexer::start(&dir, &IndexerSpec::default());
    let state = dir.path().join("state-a");
    let mut a = Producer::start(
        &dir,
        "producer-a",
        &ProducerSpec::durable("dc-a", &state, COMMIT_MS, ""),
        &[indexer.url()],
    );
    let before = a.source_sequence(SOURCE).await.unwrap();
    assert!(
        !before.known,
        "a fresh producer knows no source: {before:?}"
    );
    let mut pool = HashPool::new(&format(), 31);
    let blocks: Arc<Vec<u64>> = Arc::new(pool.take(BATCHES));

    let acks: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let flood = {
        let (addr, blocks, acks) = (a.addr, Arc::clone(&blocks), Arc::clone(&acks));
        tokio::spawn(async move {
            let mut client = IngestClient::new(channel(addr).await.expect("channel"));
            for i in 0..BATCHES {
                let Ok(result) = client.publish_batch(batch(&blocks, i)).await else {
                    return; // killed
                };
                let result = result.into_inner();
                assert!(result.gap.is_none() && !result.duplicate, "{result:?}");
                acks.lock().unwrap().push(Instant::now());
            }
        })
    };
    flood_acknowledged_for(&acks, Duration::from_secs(1)).await;
    let incarnation = a.stats().await.unwrap().incarnation;
    // Before the kill: kill9() waits for the exit, which a slow disk can delay.
    let killed_at = Instant::now();
    a.kill9();
    flood.await.unwrap();
    let acked: Vec<Instant> = acks.lock().unwrap().clone();
    assert!(
        acked.len() < BATCHES,
        "the flood ended before the kill; raise BATCHES"
    );
    // As durability.rs: every batch acknowledged more than ten commit windows before the kill
    // must be back; the one in flight may have been applied unacknowledged.
    let margin = Duration::from_millis(10 * COMMIT_MS);
    let must_have = acked.iter().filter(|&&t| t + margin < killed_at).count();
    assert!(must_have > 0, "nothing acknowledged early enough to count");

    a.restart();
    let answer = a.source_sequence(SOURCE).await.unwrap();
    let stats = a.stats().await.unwrap();
    assert!(answer.known, "the restored source is known: {answer:?}");
    assert_eq!(answer.source_id, SOURCE);
    let k = answer.last_applied as usize;
    assert!(
        (must_have..=acked.len() + 1).contains(&k),
        "last applied {k}: {must_have}..={} allowed ({} acknowledged)",
        acked.len() + 1,
        acked.len()
    );
    eprintln!(
        "{} batches acknowledged, {must_have} required, the restarted producer holds {k}",
        acked.len()
    );
    assert_eq!(answer.next_sequence, Some(k as u64 + 1), "{answer:?}");
    assert_eq!(answer.incarnation, stats.incarnation, "{answer:?}");
    assert_ne!(
        answer.incarnation, incarnation,
        "the restart shows as a new incarnation"
    );
    // The answer is the state: worker 2 holds exactly what batch k left.
    assert_eq!(
        a.member_blocks(2).await.unwrap(),
        held(&blocks, k),
        "the recovered blocks are not the state after batch {k}, which GetSourceSequence names"
    );

    // Resume where the producer said: every batch from k + 1 on, the acknowledged ones it lost
    // and new ones, applies in order onto exactly the state its predecessor left (its store is
    // not redundant, its removal not unknown).
    let mut client = IngestClient::new(channel(a.addr).await.expect("channel"));
    let end = acked.len() + MORE;
    for i in k..end {
        let result = client
            .publish_batch(batch(&blocks, i))
            .await
            .unwrap_or_else(|s| panic!("batch {}: {s:?}", i + 1))
            .into_inner();
        assert!(
            result.gap.is_none() && !result.duplicate,
            "batch {} after resuming at {}: {result:?}",
            i + 1,
            k + 1
        );
        assert_eq!(result.events.len(), if i > 0 { 2 } else { 1 }, "{result:?}");
        for event in &result.events {
            assert_eq!(event.status(), v1::EventStatus::Applied, "{result:?}");
            assert_eq!(
                (
                    event.applied_blocks,
                    event.redundant_blocks,
                    event.unknown_blocks
                ),
                (1, 0, 0),
                "batch {} did not apply onto its predecessor's state: {result:?}",
                i + 1
            );
        }
    }
    // The batch before the resume point is a replay.
    if k > 0 {
        let replay = client
            .publish_batch(batch(&blocks, k - 1))
            .await
            .unwrap()
            .into_inner();
        assert!(replay.duplicate, "{replay:?}");
    }
    let after = a.source_sequence(SOURCE).await.unwrap();
    assert_eq!(
        (after.known, after.last_applied, after.next_sequence),
        (true, end as u64, Some(end as u64 + 1)),
        "{after:?}"
    );
    assert_eq!(a.member_blocks(2).await.unwrap(), held(&blocks, end));
    assert_eq!(a.stats().await.unwrap().unique_blocks, 1);
    a.model.store(2, &held(&blocks, end));
    wait_converged(&indexer, &a).await;
}

/// Writes `token` (with a trailing newline, as `echo` would) to `<dir>/<name>.token`.
fn token_file(dir: &TestDir, name: &str, token: &str) -> PathBuf {
    let path = dir.path().join(format!("{name}.token"));
    std::fs::write(&path, format!("{token}\n")).expect("write token file");
    path
}

fn ask(source: &str, token: Option<&str>) -> Request<v1::GetSourceSequenceRequest> {
    let mut request = Request::new(v1::GetSourceSequenceRequest {
        source_id: source.to_owned(),
    });
    if let Some(token) = token {
        let value = format!("Bearer {token}").parse().expect("header value");
        request.metadata_mut().insert("authorization", value);
    }
    request
}

fn stored(worker: u64, hash: u64) -> v1::KvEvent {
    event(
        worker,
        Kind::Stored(v1::Stored {
            block_hashes: vec![hash],
            parent_hash: None,
        }),
    )
}

/// `(known, last_applied, next_sequence)` of `source`, asked as router-1.
async fn sequence_of(client: &mut IngestClient<Channel>, source: &str) -> (bool, u64, Option<u64>) {
    let a = client
        .get_source_sequence(ask(source, Some("r1-secret.0123456789")))
        .await
        .expect("a granted source")
        .into_inner();
    (a.known, a.last_applied, a.next_sequence)
}

/// Runs `ckf source-sequence` against `producer`: exit code, stdout, stderr.
fn cli(producer: &Producer, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(ckf_e2e::binary("ckf"))
        .arg("source-sequence")
        .arg("--producer")
        .arg(format!("http://{}", producer.addr))
        .args(args)
        .output()
        .expect("run ckf");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_evicted_bad_and_foreign_sources() {
    let dir = TestDir::new("source-sequence-rules");
    let router = token_file(&dir, "router-1", "r1-secret.0123456789");
    let ops = token_file(&dir, "ops", "ops-secret.0123456789");
    let indexer = Indexer::start(&dir, &IndexerSpec::default());
    let spec = ProducerSpec {
        extra_toml: format!(
            "[limits]\nmax_tracked_sources = 2\n\
             [ingest_auth]\nrequired = true\n\
             [[ingest_auth.sources]]\nname = \"router-1\"\ntoken_file = {router:?}\n\
             source_ids = [\"router-1\", \"router-1b\", \"router-1c\"]\nworkers = [1]\n\
             [[ingest_auth.sources]]\nname = \"ops\"\ntoken_file = {ops:?}\n"
        ),
        ..ProducerSpec::new("dc-a")
    };
    let producer = Producer::start(&dir, "producer-a", &spec, &[indexer.url()]);
    let mut client = IngestClient::new(channel(producer.addr).await.expect("channel"));
    let r1 = Some("r1-secret.0123456789");
    let mut pool = HashPool::new(&format(), 32);
    let hashes = pool.take(8);

    // Never seen: not an error.
    let answer = client
        .get_source_sequence(ask("router-1", r1))
        .await
        .expect("a granted source")
        .into_inner();
    assert_eq!(
        (
            answer.source_id.as_str(),
            answer.known,
            answer.last_applied,
            answer.next_sequence
        ),
        ("router-1", false, 0, None),
        "{answer:?}"
    );
    assert_ne!(answer.incarnation, 0);

    // Sequence 0 is a valid first batch; then each batch moves the answer on.
    let publish = |source: &str, sequence: u64, hash: u64| {
        let mut request = Request::new(v1::KvEventBatch {
            source_id: source.to_owned(),
            sequence,
            events: vec![stored(1, hash)],
        });
        let value = "Bearer r1-secret.0123456789".parse().expect("header value");
        request.metadata_mut().insert("authorization", value);
        request
    };
    let mut ingest = IngestClient::new(channel(producer.addr).await.expect("channel"));
    ingest
        .publish_batch(publish("router-1", 0, hashes[0]))
        .await
        .unwrap();
    assert_eq!(
        sequence_of(&mut client, "router-1").await,
        (true, 0, Some(1))
    );
    ingest
        .publish_batch(publish("router-1", 1, hashes[1]))
        .await
        .unwrap();
    assert_eq!(
        sequence_of(&mut client, "router-1").await,
        (true, 1, Some(2))
    );

    // Eviction: two sources tracked at most. Reading router-1 is not a use, so admitting a
    // third source evicts router-1 (admitted before router-1b), not router-1b.
    ingest
        .publish_batch(publish("router-1b", 5, hashes[2]))
        .await
        .unwrap();
    assert_eq!(
        sequence_of(&mut client, "router-1").await,
        (true, 1, Some(2))
    );
    ingest
        .publish_batch(publish("router-1c", 9, hashes[3]))
        .await
        .unwrap();
    assert_eq!(sequence_of(&mut client, "router-1").await, (false, 0, None));
    assert_eq!(
        sequence_of(&mut client, "router-1b").await,
        (true, 5, Some(6))
    );
    assert_eq!(
        sequence_of(&mut client, "router-1c").await,
        (true, 9, Some(10))
    );

    // Bad ids: the KvEventBatch rules, naming the request's field.
    let long = "x".repeat(129);
    for (bad, needle) in [
        ("", "GetSourceSequenceRequest.source_id is required"),
        (long.as_str(), "129 bytes; at most 128"),
        ("new\nline", "U+000A"),
    ] {
        let status = client
            .get_source_sequence(ask(bad, r1))
            .await
            .expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(
            status
                .message()
                .starts_with("GetSourceSequenceRequest.source_id")
                && status.message().contains(needle),
            "{needle:?} not in {status:?}"
        );
    }

    // Foreign sources; no credentials.
    for (source, token, principal) in [
        ("router-2", r1, "\"router-1\""),
        ("router-1b", Some("ops-secret.0123456789"), "\"ops\""),
    ] {
        let status = client
            .get_source_sequence(ask(source, token))
            .await
            .expect_err("refused");
        assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
        assert!(
            status.message().contains(principal)
                && status.message().contains(&format!("source {source:?}")),
            "{status:?}"
        );
    }
    let status = client
        .get_source_sequence(ask("router-1b", None))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    let text = producer.metrics().expect("metrics");
    let refused = |code| {
        metrics::value(
            &text,
            "ckf_producer_auth_refused_total",
            &[("rpc", "get_source_sequence"), ("code", code)],
        )
    };
    assert_eq!(refused("permission_denied"), Some(2.0), "{text}");
    assert_eq!(refused("unauthenticated"), Some(1.0), "{text}");

    // The CLI: one line, or the producer's refusal.
    let token = router.display().to_string();
    let (code, stdout, stderr) = cli(
        &producer,
        &["--source", "router-1b", "--token-file", &token],
    );
    assert_eq!(code, Some(0), "{stderr}");
    let incarnation = client
        .get_source_sequence(ask("router-1b", r1))
        .await
        .unwrap()
        .into_inner()
        .incarnation;
    assert_eq!(
        stdout,
        format!(
            "source \"router-1b\": last applied 5, next 6; producer incarnation {incarnation:#018x}\n"
        )
    );
    let (code, stdout, _) = cli(
        &producer,
        &["--source", "router-1", "--token-file", &token, "--json"],
    );
    assert_eq!(code, Some(0));
    let json: serde_json::Value = serde_json::from_str(&stdout).expect("one JSON object");
    assert_eq!(json["known"], false, "{json}");
    assert_eq!(json["next_sequence"], serde_json::Value::Null, "{json}");
    let (code, _, stderr) = cli(&producer, &["--source", "router-2", "--token-file", &token]);
    assert_eq!(code, Some(1), "{stderr}");
    // (The status message is quoted in the error, its quotes escaped.)
    assert!(
        stderr.contains("GetSourceSequence")
            && stderr.contains("may not read the sequence of source")
            && stderr.contains("router-2"),
        "{stderr}"
    );
}
