//! A producer restart does not blind its DC. With `[durability] data_dir`, the exact
//! state survives `kill -9` (up to the last group-commit window), SIGTERM (nothing lost), and
//! a full disk (the producer keeps serving from memory and heals with a checkpoint); damaged
//! or foreign state is refused by name, or set aside on request.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ckf_e2e::check::wait_converged;
use ckf_e2e::cluster::{
    Indexer, IndexerSpec, Producer, ProducerSpec, TestDir, channel, event, format, removed, stored,
};
use ckf_e2e::hashes::HashPool;
use ckf_e2e::metrics;
use ckf_e2e::wait::{DEADLINE, eventually, flood_acknowledged_for};
use ckf_proto::v1;
use ckf_proto::v1::ingest_client::IngestClient;

/// The group-commit window the tests run with; what `kill -9` may lose.
const COMMIT_MS: u64 = 50;

fn durable_spec(dc: &str, data_dir: &Path, extra: &str) -> ProducerSpec {
    ProducerSpec::durable(dc, data_dir, COMMIT_MS, extra)
}

async fn exact_state_matches(producer: &Producer) -> Result<(), String> {
    for (&worker, blocks) in producer.model.owned() {
        let found = producer.member_blocks(worker).await?;
        let expected: Vec<u64> = blocks.iter().copied().collect();
        if found != expected {
            return Err(format!(
                "worker {worker}: {} blocks recovered, {} expected",
                found.len(),
                expected.len()
            ));
        }
    }
    Ok(())
}

fn metric(producer: &Producer, name: &str) -> Option<f64> {
    metrics::value(&producer.metrics().ok()?, name, &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_and_restart_lose_nothing_and_the_source_sequence_resumes() {
    let dir = TestDir::new("durability-sigterm");
    let indexer = Indexer::start(&dir, &IndexerSpec::default());
    let endpoints = [indexer.url()];
    let state = dir.path().join("state-a");
    let mut a = Producer::start(
        &dir,
        "producer-a",
        &durable_spec("dc-a", &state, ""),
        &endpoints,
    );
    let mut pool = HashPool::new(&format(), 11);
    let (w1, w2, w3) = (pool.take(400), pool.take(300), pool.take(200));
    a.store(1, &w1).await;
    a.store(2, &w2).await;
    a.store(3, &w3).await;
    a.remove(1, &w1[..100]).await;
    a.clear(3).await;
    a.store(2, &w1[100..150]).await; // shared with worker 1: refcount 2
    let before = wait_converged(&indexer, &a).await;

    assert!(a.terminate().success());
    a.restart();
    let after = wait_converged(&indexer, &a).await;
    assert_ne!(
        after.incarnation, before.incarnation,
        "a restart is a new incarnation"
    );
    exact_state_matches(&a).await.unwrap();
    assert_eq!(metric(&a, "ckf_producer_recovered_edges"), Some(650.0));

    // The source sequence was restored: the next batch is in order, an old one a duplicate.
    let more = pool.take(50);
    a.store(4, &more).await; // publish() asserts no gap and no duplicate
    let old = a
        .publish_batch(v1::KvEventBatch {
            source_id: "e2e".into(),
            sequence: 3,
            events: vec![event(9, stored(&pool.take(5)))],
        })
        .await
        .unwrap();
    assert!(
        old.duplicate,
        "sequence 3 replayed after the restart: {old:?}"
    );
    wait_converged(&indexer, &a).await;
    // A second clean restart reads the final checkpoint alone.
    assert!(a.terminate().success());
    a.restart();
    wait_converged(&indexer, &a).await;
    exact_state_matches(&a).await.unwrap();
    assert_eq!(metric(&a, "ckf_producer_recovered_records"), Some(0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_under_load_loses_at_most_the_last_commit_window() {
    kill9_under_load("durability-kill9", "", 0).await;
}

/// The same with a checkpoint every MiB of log: checkpoints are captured (in slices between
/// the flood's batches) and written while the flood goes on, and the kill comes after at least
/// two of them; the restart reads the newest checkpoint and the log after its capture began.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_under_load_with_checkpoints_during_the_flood_loses_at_most_the_last_commit_window() {
    kill9_under_load(
        "durability-kill9-checkpoints",
        "min_checkpoint_mib = 1\n",
        2,
    )
    .await;
}

/// Floods worker 2 with churn, kills the producer (`kill -9`) once `checkpoints` checkpoints
/// were written during the flood (and the flood ran 1.5 s), restarts it on the same state and
/// checks it lost at most the last commit windows.
async fn kill9_under_load(name: &str, extra: &str, checkpoints: u64) {
    let dir = TestDir::new(name);
    let indexer = Indexer::start(&dir, &IndexerSpec::default());
    let endpoints = [indexer.url()];
    let state = dir.path().join("state-a");
    let mut a = Producer::start(
        &dir,
        "producer-a",
        &durable_spec("dc-a", &state, extra),
        &endpoints,
    );
    let mut pool = HashPool::new(&format(), 12);
    let base = pool.take(1500);
    for chunk in base.chunks(100) {
        a.store(1, chunk).await;
    }
    // Churn on worker 2, one batch after another, until the kill: batch i stores set(i) and
    // removes set(i - 1), so after batch k worker 2 owns exactly set(k - 1), where
    // set(i) = sets[i % SETS] (more sets than the batches of the last second, so k is unique).
    const SETS: usize = 5000;
    let sets: Vec<Vec<u64>> = (0..SETS).map(|_| pool.take(10)).collect();
    let acks: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let flood = {
        let (addr, sets, acks) = (a.addr, sets.clone(), Arc::clone(&acks));
        let first_sequence = a.next_sequence();
        tokio::spawn(async move {
            let mut client = IngestClient::new(channel(addr).await.expect("channel"));
            for i in 0.. {
                let mut events = vec![event(2, stored(&sets[i % SETS]))];
                if i > 0 {
                    events.push(event(2, removed(&sets[(i - 1) % SETS])));
                }
                let batch = v1::KvEventBatch {
                    source_id: "e2e".into(),
                    sequence: first_sequence + i as u64,
                    events,
                };
                if client.publish_batch(batch).await.is_err() {
                    return; // killed
                }
                acks.lock().unwrap().push(Instant::now());
            }
        })
    };
    // Let the flood run for a while (many commit windows), then kill the producer in the
    // middle of it.
    flood_acknowledged_for(&acks, Duration::from_millis(1500)).await;
    if checkpoints > 0 {
        eventually("checkpoints written during the flood", DEADLINE, || async {
            let written = metric(&a, "ckf_producer_journal_checkpoints_total").unwrap_or(0.0);
            if written >= checkpoints as f64 {
                Ok(())
            } else {
                Err(format!("{written} checkpoints"))
            }
        })
        .await;
    }
    // Before the kill: kill9() waits for the exit, which a slow disk can delay.
    let killed_at = Instant::now();
    a.kill9();
    flood.await.unwrap();
    let acked: Vec<Instant> = acks.lock().unwrap().clone();
    // Every batch acknowledged more than ten commit windows before the kill must be back.
    let margin = Duration::from_millis(10 * COMMIT_MS);
    let must_have = acked.iter().filter(|&&t| t + margin < killed_at).count();
    assert!(
        must_have > 0,
        "no batch was acknowledged early enough to count"
    );

    a.restart();
    let recovered = a.member_blocks(2).await.unwrap();
    // The batch in flight at the kill may have been applied (and journaled) unacknowledged.
    let k = (must_have.max(1)..=acked.len() + 1)
        .find(|&k| {
            let mut expected = sets[(k - 1) % SETS].clone();
            expected.sort_unstable();
            expected == recovered
        })
        .unwrap_or_else(|| {
            panic!(
                "worker 2's {} recovered blocks are not the state after any batch from {must_have} \
                 (acknowledged >{margin:?} before the kill) to {} (the last sent)",
                recovered.len(),
                acked.len() + 1
            )
        });
    // The rebuilt lane: worker 1 whole, worker 2 as of batch k, nothing else.
    a.model.store(1, &base);
    a.model.store(2, &sets[(k - 1) % SETS]);
    for (i, set) in sets.iter().enumerate() {
        if i != (k - 1) % SETS {
            a.model.expect_absent(set);
        }
    }
    wait_converged(&indexer, &a).await;
    exact_state_matches(&a).await.unwrap();
    let log = a.log();
    assert!(log.contains("state recovered from the journal"), "{log}");
}

/// Runs `ckf-producer --config <config> <args>` to its exit (it must not start): status code
/// and stderr.
fn run_to_exit(config: &Path, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(ckf_e2e::binary("ckf-producer"))
        .arg("--config")
        .arg(config)
        .args(args)
        .output()
        .expect("run ckf-producer");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn checkpoint_file(state: &Path) -> PathBuf {
    std::fs::read_dir(state)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "ckpt"))
        .expect("a checkpoint after a clean stop")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_or_foreign_state_is_refused_by_name_or_set_aside_on_request() {
    let dir = TestDir::new("durability-invalid");
    let indexer = Indexer::start(&dir, &IndexerSpec::default());
    let endpoints = [indexer.url()];
    let state = dir.path().join("state-a");
    let mut a = Producer::start(
        &dir,
        "producer-a",
        &durable_spec("dc-a", &state, ""),
        &endpoints,
    );
    let mut pool = HashPool::new(&format(), 13);
    a.store(1, &pool.take(500)).await;
    wait_converged(&indexer, &a).await;
    assert!(a.terminate().success());
    let config = dir.path().join("producer-a.toml");
    let ckpt = checkpoint_file(&state);
    let good = std::fs::read(&ckpt).unwrap();

    // One flipped bit in the middle of the checkpoint.
    let mut bad = good.clone();
    bad[good.len() / 2] ^= 0x10;
    std::fs::write(&ckpt, &bad).unwrap();
    let (code, stderr) = run_to_exit(&config, &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains(&ckpt.display().to_string()) && stderr.contains("checksum"),
        "the refusal names the file and the fault: {stderr}"
    );
    assert!(
        stderr.contains("durability.on_invalid_state = \"set-aside\"")
            && stderr.contains("--on-invalid-state set-aside"),
        "and the way out, as a setting and as a flag: {stderr}"
    );
    assert_eq!(
        std::fs::read(&ckpt).unwrap(),
        bad,
        "a refusal changes nothing"
    );

    // Intact, but another pool's state.
    std::fs::write(&ckpt, &good).unwrap();
    let (code, stderr) = run_to_exit(&config, &["--dc", "dc-b"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("holds the state of pool"), "{stderr}");
    // Another table format (bucket count).
    let (code, stderr) = run_to_exit(&config, &["--bucket-count", "2048"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("was written for table format"), "{stderr}");

    // Damaged again, and set aside on request: the producer starts empty, the files are kept.
    std::fs::write(&ckpt, &bad).unwrap();
    a.restart_with(&["--on-invalid-state", "set-aside"]);
    let stats = a.stats().await.unwrap();
    assert_eq!(stats.unique_blocks, 0, "{stats:?}");
    let aside: Vec<PathBuf> = std::fs::read_dir(&state)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("invalid-")
        })
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    let kept = aside[0].join(ckpt.file_name().unwrap());
    assert_eq!(std::fs::read(kept).unwrap(), bad);
}

/// Waits until `producer`'s journal reports healthy again (a checkpoint retry succeeded).
async fn wait_journal_healthy(producer: &Producer) {
    eventually("the journal to be healthy", DEADLINE, || async {
        match metric(producer, "ckf_producer_journal_healthy") {
            Some(1.0) => Ok(()),
            other => Err(format!("healthy = {other:?}")),
        }
    })
    .await;
}

/// A tmpfs of `bytes` mounted at `at`, unmounted on drop.
struct Tmpfs(PathBuf);

/// Why the full-disk tests are `#[ignore]`d: mounting a tmpfs needs root. `scripts/test.sh` runs
/// them (`--ignored`) when it runs as root, as CI does.
const NEEDS_ROOT: &str = "mounts a tmpfs: needs root (scripts/test.sh runs it as root)";

impl Tmpfs {
    /// Mounts the tmpfs.
    ///
    /// # Panics
    /// When the mount fails: a full-disk test never passes without having filled a disk.
    fn mount(at: &Path, bytes: u64) -> Self {
        std::fs::create_dir_all(at).unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(at)
            .output();
        match mounted {
            Ok(out) if out.status.success() => Self(at.to_owned()),
            Ok(out) => panic!(
                "cannot mount a tmpfs at {} ({NEEDS_ROOT}): mount exited {}: {}",
                at.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            Err(e) => panic!(
                "cannot mount a tmpfs at {}: mount did not run: {e}",
                at.display()
            ),
        }
    }
}

impl Tmpfs {
    /// Writes `filler` so that about `leave` bytes stay free; returns its path.
    fn fill(&self, leave: u64) -> PathBuf {
        let out = Command::new("df")
            .args(["-B1", "--output=avail"])
            .arg(&self.0)
            .output()
            .unwrap();
        let free: u64 = String::from_utf8_lossy(&out.stdout)
            .lines()
            .nth(1)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let filler = self.0.join("filler");
        std::fs::write(&filler, vec![1u8; free.saturating_sub(leave) as usize]).unwrap();
        filler
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "mounts a tmpfs: needs root (scripts/test.sh runs it as root)"]
async fn a_full_disk_fails_the_journal_not_the_producer_and_a_checkpoint_heals_it() {
    let dir = TestDir::new("durability-disk-full");
    let disk = Tmpfs::mount(&dir.path().join("disk"), 4 << 20);
    let indexer = Indexer::start(&dir, &IndexerSpec::default());
    let endpoints = [indexer.url()];
    let state = disk.0.join("state-a");
    let spec = durable_spec(
        "dc-a",
        &state,
        "min_checkpoint_mib = 1\ncheckpoint_retry_ms = 200\n",
    );
    let mut a = Producer::start(&dir, "producer-a", &spec, &endpoints);
    let mut pool = HashPool::new(&format(), 14);
    let base = pool.take(300);
    a.store(1, &base).await;
    // Leave about 64 KiB free.
    let filler = disk.fill(64 << 10);
    // Churn until the journal runs out of space.
    let churn = pool.take(200);
    let deadline = Instant::now() + DEADLINE;
    loop {
        a.store(2, &churn).await;
        a.remove(2, &churn).await;
        if metric(&a, "ckf_producer_journal_healthy") == Some(0.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the journal never failed on the full disk"
        );
    }
    assert!(a.log().contains("journal failed"), "the failure is logged");
    // The producer goes on serving from memory.
    let during = pool.take(100);
    a.store(3, &during).await;
    wait_converged(&indexer, &a).await;
    // The gauges are refreshed once a second.
    eventually("the dropped records to be counted", DEADLINE, || async {
        match metric(&a, "ckf_producer_journal_dropped_records") {
            Some(n) if n > 0.0 => Ok(()),
            other => Err(format!("dropped records = {other:?}")),
        }
    })
    .await;
    assert_eq!(
        metric(&a, "ckf_producer_journal_healthy"),
        Some(0.0),
        "still failed"
    );

    // Space again: the next checkpoint retry heals the journal, holding all of the state.
    std::fs::remove_file(&filler).unwrap();
    wait_journal_healthy(&a).await;
    a.kill9();
    a.restart();
    wait_converged(&indexer, &a).await;
    exact_state_matches(&a).await.unwrap();
    drop(a);
    drop(indexer);
}

/// A producer stopped while its disk is full (its final checkpoint fails too) starts again on
/// the same full disk: from the state as of the failure, serving from memory, not refusing to
/// start (the first version left a segment with a cut header behind, which the next start
/// tried to create again, and exited 2 on the full disk).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "mounts a tmpfs: needs root (scripts/test.sh runs it as root)"]
async fn a_producer_restarted_on_a_full_disk_starts_and_serves_from_memory() {
    let dir = TestDir::new("durability-restart-disk-full");
    let disk = Tmpfs::mount(&dir.path().join("disk"), 4 << 20);
    let indexer = Indexer::start(&dir, &IndexerSpec::default());
    let endpoints = [indexer.url()];
    let state = disk.0.join("state-a");
    let spec = durable_spec("dc-a", &state, "checkpoint_retry_ms = 200\n");
    let mut a = Producer::start(&dir, "producer-a", &spec, &endpoints);
    let mut pool = HashPool::new(&format(), 15);
    let base = pool.take(300);
    a.store(1, &base).await;
    // Committed (written and fdatasynced) before the disk fills up.
    eventually("a group commit", DEADLINE, || async {
        match metric(&a, "ckf_producer_journal_commit_seconds_count") {
            Some(n) if n >= 1.0 => Ok(()),
            other => Err(format!("commits = {other:?}")),
        }
    })
    .await;
    let filler = disk.fill(0);
    let churn = pool.take(200);
    let deadline = Instant::now() + DEADLINE;
    while metric(&a, "ckf_producer_journal_healthy") != Some(0.0) {
        a.store(2, &churn).await;
        a.remove(2, &churn).await;
        assert!(
            Instant::now() < deadline,
            "the journal never failed on the full disk"
        );
    }
    // SIGTERM: the final checkpoint fails on the full disk; the process still exits cleanly.
    let status = a.terminate();
    assert!(status.success(), "SIGTERM on a full disk: {status}");
    assert!(a.log().contains("journal failed"), "the failure is logged");
    // Start again on the still-full disk: it must come up with the state as of the failure.
    a.restart();
    let mut expected = base.clone();
    expected.sort_unstable();
    assert_eq!(a.member_blocks(1).await.unwrap(), expected);
    let after = pool.take(50);
    let mut client = IngestClient::new(ckf_e2e::cluster::channel(a.addr).await.unwrap());
    let result = client
        .publish_batch(v1::KvEventBatch {
            source_id: "after-restart".into(),
            sequence: 1,
            events: vec![v1::KvEvent {
                member: Some(v1::MemberId {
                    worker_id: 3,
                    dp_rank: 0,
                }),
                kind: Some(stored(&after)),
            }],
        })
        .await
        .expect("ingest is served on the full disk");
    assert!(result.into_inner().gap.is_none());
    let mut expected = after.clone();
    expected.sort_unstable();
    assert_eq!(a.member_blocks(3).await.unwrap(), expected);
    // Space again: a checkpoint retry makes the journal whole, holding what came meanwhile.
    std::fs::remove_file(&filler).unwrap();
    wait_journal_healthy(&a).await;
    a.kill9();
    a.restart();
    assert_eq!(a.member_blocks(3).await.unwrap(), expected);
    drop(a);
    drop(indexer);
}
