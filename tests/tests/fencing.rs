//! E2E 4: a second producer attaching for the same pool fences the first. The lane moves to the
//! newer producer's lease (higher epoch, its incarnation), queries reflect only the newer
//! producer's content, and the older producer is told why (`Retired(SUPERSEDED)`, visible in its
//! log and its detachment metric).
//!
//! The older producer then stands by: it retries `IF_VACANT` (refused while the newer one is
//! live), so it never fences the newer one back. Its recovery once the newer one is gone is in
//! `supersession.rs`.

use ckf_e2e::check::wait_converged;
use ckf_e2e::cluster::{Indexer, IndexerSpec, Producer, ProducerSpec, TestDir, format};
use ckf_e2e::hashes::HashPool;
use ckf_e2e::metrics;
use ckf_e2e::relay::{self, RawTable, attach};
use ckf_e2e::wait::{DEADLINE, eventually};
use ckf_proto::v1::RetireReason;
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn newer_attachment_for_the_same_pool_fences_the_older_one() {
    let dir = TestDir::new("fencing");
    let indexer = Indexer::start(&dir, &IndexerSpec::default());
    let endpoints = [indexer.url()];
    let mut old = Producer::start(
        &dir,
        "producer-a-old",
        &ProducerSpec::new("dc-a"),
        &endpoints,
    );
    let mut b = Producer::start_dc(&dir, "dc-b", &endpoints);
    let mut pool = HashPool::new(&format(), 4);
    let shared = pool.take(8);
    let old_only = pool.take(40);
    old.store(1, &shared).await;
    old.store(1, &old_only).await;
    b.store(1, &pool.take(30)).await;
    let old_lane = wait_converged(&indexer, &old).await;
    wait_converged(&indexer, &b).await;

    let mut new = Producer::start(
        &dir,
        "producer-a-new",
        &ProducerSpec::new("dc-a"),
        &endpoints,
    );
    let new_only = pool.take(25);
    new.store(5, &shared).await;
    new.store(6, &new_only).await;
    // Queries reflect only the newer producer: its content, and none of the older's own.
    new.model.expect_absent(&old_only);
    let lane = wait_converged(&indexer, &new).await;
    assert_ne!(lane.incarnation, old_lane.incarnation);
    assert!(
        lane.lease_epoch > old_lane.lease_epoch,
        "{old_lane:?} -> {lane:?}"
    );
    let depths = indexer.depths(&shared).await.expect("FindMatches");
    assert_eq!(
        depths.get("dc-a"),
        Some(&(shared.len() as u32)),
        "{depths:?}"
    );

    // The older producer was told it was superseded, and says so; then it stands by.
    let url = indexer.url();
    eventually("the older producer's standby state", DEADLINE, || async {
        let text = old.metrics()?;
        let labels = [("indexer", url.as_str()), ("state", "standby")];
        match metrics::value(&text, "ckf_producer_attachment_state", &labels) {
            Some(1.0) => Ok(text),
            other => Err(format!("attachment_state{{state=standby}} = {other:?}")),
        }
    })
    .await;
    let text = old.metrics().expect("metrics");
    let labels = [("indexer", url.as_str()), ("reason", "retired_superseded")];
    let superseded = metrics::value(&text, "ckf_producer_detachments_total", &labels);
    assert_eq!(superseded, Some(1.0), "{text}");
    let records = old.log_records("another producer holds this pool");
    assert_eq!(records.len(), 1, "older producer's log: {}", old.log());
    let detail = records[0]["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("RETIRE_REASON_SUPERSEDED") && detail.contains("lease epoch"),
        "{detail}"
    );

    // No ping-pong: the newer producer keeps its lease while it publishes more, never fenced.
    let more = pool.take(15);
    new.store(7, &more).await;
    let later = wait_converged(&indexer, &new).await;
    assert_eq!(later.lease_epoch, lane.lease_epoch, "{lane:?} -> {later:?}");
    let text = new.metrics().expect("metrics");
    let fenced = metrics::value(
        &text,
        "ckf_producer_detachments_total",
        &[("indexer", &url)],
    );
    assert_eq!(fenced.unwrap_or(0.0), 0.0, "{text}");
    // The older producer keeps asking (IF_VACANT) and is refused, which changes nothing.
    let text = old.metrics().expect("metrics");
    let refusals = metrics::value(
        &text,
        "ckf_producer_standby_refusals_total",
        &[("indexer", &url)],
    );
    assert!(refusals.unwrap_or(0.0) >= 1.0, "{text}");
    let superseded = metrics::value(&text, "ckf_producer_detachments_total", &labels);
    assert_eq!(
        superseded,
        Some(1.0),
        "refusals are not detachments: {text}"
    );

    // The superseded producer's shutdown is clean and leaves the newer producer's lane alone.
    let status = old.terminate();
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert!(
        old.log_records("drain marker sent").is_empty(),
        "{}",
        old.log()
    );
    let lane = wait_converged(&indexer, &new).await;
    assert_eq!(lane.lease_epoch, later.lease_epoch, "{lane:?}");
    assert!(!lane.drained, "{lane:?}");

    // The other pool's lane is untouched by all of it.
    let lane_b = wait_converged(&indexer, &b).await;
    assert_eq!(lane_b.retirements, 0, "{lane_b:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superseded_raw_stream_is_aborted_naming_both_epochs() {
    let dir = TestDir::new("fencing-raw");
    let indexer = Indexer::start(&dir, &IndexerSpec::default());
    let mut pool = HashPool::new(&format(), 10);
    let (old_hash, new_hash) = (pool.take(1)[0], pool.take(1)[0]);

    let mut old = relay::open(&indexer, attach("dc-b", 11, format()))
        .await
        .expect("attach accepted");
    let mut table = RawTable::new(&format());
    table.place(old_hash);
    assert!(old.snapshot(3, &table.words, 256).await.ready);
    let depths = indexer.depths(&[old_hash]).await.expect("FindMatches");
    assert_eq!(depths.get("dc-b"), Some(&1), "{depths:?}");

    let mut new = relay::open(&indexer, attach("dc-b", 12, format()))
        .await
        .expect("attach accepted");
    assert!(new.lease.epoch > old.lease.epoch);
    let (retired, status) = old.expect_retired().await;
    assert_eq!(retired.reason(), RetireReason::Superseded, "{retired:?}");
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    let named = format!(
        "lease epoch {} replaced epoch {}",
        new.lease.epoch, old.lease.epoch
    );
    assert!(
        status.message().contains(&named),
        "{named:?} not in {status:?}"
    );
    assert!(status.message().contains("e2e/dc-b"), "{status:?}");

    // Only the newer attachment's content answers.
    let mut table = RawTable::new(&format());
    table.place(new_hash);
    let ack = new.snapshot(0, &table.words, 256).await;
    assert!(ack.ready, "{ack:?}");
    let lane = indexer.lane("dc-b").await.expect("ListLanes");
    assert_eq!(
        (lane.incarnation, lane.lease_epoch),
        (12, new.lease.epoch),
        "{lane:?}"
    );
    let depths = indexer.depths(&[new_hash]).await.expect("FindMatches");
    assert_eq!(depths.get("dc-b"), Some(&1), "{depths:?}");
    let depths = indexer.depths(&[old_hash]).await.expect("FindMatches");
    assert_eq!(depths.get("dc-b"), Some(&0), "{depths:?}");
}
