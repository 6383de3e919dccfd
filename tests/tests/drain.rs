//! E2E 6: SIGTERM on a producer publishes its pending tail, sends the drain marker and exits 0;
//! the indexer accepts the marker (lane drained, still ready) and its installed sequence is
//! exactly the final sequence the producer logged.

use ckf_e2e::check::{lane_matches, wait_converged};
use ckf_e2e::cluster::{Indexer, IndexerSpec, Producer, TestDir, format, is_active};
use ckf_e2e::hashes::HashPool;
use ckf_e2e::metrics;

/// The `sequence` field of the producer's only log record containing `message`.
fn logged_sequence(producer: &Producer, message: &str) -> u64 {
    let records = producer.log_records(message);
    assert_eq!(records.len(), 1, "{}: {records:?}", producer.name);
    records[0]["sequence"]
        .as_u64()
        .unwrap_or_else(|| panic!("no sequence in {:?}", records[0]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_with_the_exact_final_sequence() {
    let dir = TestDir::new("drain");
    let indexer = Indexer::start(&dir, &IndexerSpec::default());
    let endpoints = [indexer.url()];
    let (mut a, mut b) = Producer::start_ab(&dir, &endpoints);
    let mut pool = HashPool::new(&format(), 6);
    b.store(1, &pool.take(20)).await;
    for w in 0..10 {
        a.store(w, &pool.take(30)).await;
    }
    wait_converged(&indexer, &a).await;
    // A tail that may still be pending when the signal arrives: it must be published first.
    let tail = pool.take(50);
    a.store(42, &tail).await;
    let evicted = a.model.tracked()[..5].to_vec();
    a.remove(0, &evicted).await;

    let status = a.terminate();
    assert_eq!(status.code(), Some(0), "{status:?}");
    let sent = logged_sequence(&a, "drain marker sent");
    let acked = logged_sequence(&a, "drained: the indexer acknowledged the final sequence");
    assert_eq!(sent, acked, "the acknowledged sequence is the marker's");
    assert!(acked > 0);

    let lane = indexer.lane("dc-a").await.expect("ListLanes");
    assert!(lane.drained, "{lane:?}");
    assert!(is_active(&lane), "a drained lane keeps answering: {lane:?}");
    assert_eq!(lane.installed_sequence, acked, "{lane:?}");
    assert_eq!(lane.retirements, 0, "{lane:?}");
    lane_matches(&indexer, "dc-a", &a.model)
        .await
        .unwrap_or_else(|e| panic!("drained lane differs from the producer's final table: {e}"));
    let text = indexer.metrics().expect("indexer metrics");
    let drains = metrics::value(
        &text,
        "ckf_indexer_drain_markers_accepted_total",
        &[("dc", "dc-a")],
    );
    assert_eq!(drains, Some(1.0), "{text}");

    // The other lane is unaffected and not drained.
    let lane_b = wait_converged(&indexer, &b).await;
    assert!(!lane_b.drained, "{lane_b:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_one_of_two_indexers_down_drains_the_other_and_exits_0() {
    let dir = TestDir::new("drain-one-down");
    let mut down = Indexer::start_named(&dir, "indexer-down", &IndexerSpec::default());
    let up = Indexer::start_named(&dir, "indexer-up", &IndexerSpec::default());
    let endpoints = [down.url(), up.url()];
    let mut a = Producer::start_dc(&dir, "dc-a", &endpoints);
    let mut pool = HashPool::new(&format(), 9);
    a.store(1, &pool.take(10)).await;
    wait_converged(&down, &a).await;
    wait_converged(&up, &a).await;
    down.kill9();
    a.store(1, &pool.take(10)).await;

    let status = a.terminate();
    assert_eq!(status.code(), Some(0), "{status:?}");
    // Only the reachable indexer acknowledged a drain, with the exact final sequence.
    let drained = a.log_records("drained: the indexer acknowledged the final sequence");
    assert_eq!(drained.len(), 1, "{drained:?}");
    assert_eq!(drained[0]["indexer"], up.url().as_str(), "{drained:?}");
    let lane = up.lane("dc-a").await.expect("ListLanes");
    assert!(lane.drained && is_active(&lane), "{lane:?}");
    assert_eq!(
        Some(lane.installed_sequence),
        drained[0]["sequence"].as_u64()
    );
    lane_matches(&up, "dc-a", &a.model)
        .await
        .unwrap_or_else(|e| panic!("drained lane differs: {e}"));
}
