//! E2E 1, dense: one producer fills a small table to about 80% load (so insertions relocate
//! fingerprints by kicks) behind an indexer with the smallest message limit (4 KiB, so every
//! batch is split into several delta frames). While the table fills, every hash already seen
//! installed must stay visible after each later batch: a relocation that reached a query as
//! "left the old bucket, not yet in the new one" would show up as a missing hash. After churn
//! (evictions, clears, refills) the lane equals the producer's table exactly.

use ckf_e2e::check::{QUERY_CHUNK, wait_converged};
use ckf_e2e::cluster::{Indexer, IndexerSpec, Producer, TestDir, format};
use ckf_e2e::hashes::HashPool;
use ckf_e2e::metrics;

/// Every hash of `confirmed` is present in `dc` now (one look, no waiting).
async fn all_still_visible(indexer: &Indexer, dc: &str, confirmed: &[u64], round: usize) {
    for chunk in confirmed.chunks(QUERY_CHUNK) {
        let depths = indexer.depths(chunk).await.expect("FindMatches");
        let depth = depths.get(dc).copied().unwrap_or(0) as usize;
        assert_eq!(
            depth,
            chunk.len(),
            "round {round}: installed hash {:#x} vanished from {dc} ({depths:?})",
            chunk.get(depth).copied().unwrap_or_default()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dense_table_with_kicks_and_split_deltas_converges_without_false_negatives() {
    let dir = TestDir::new("dense-churn");
    let spec = IndexerSpec {
        lanes: vec!["dc-a".into()],
        max_message_bytes: 4096,
        ..IndexerSpec::default()
    };
    let indexer = Indexer::start(&dir, &spec);
    let mut a = Producer::start_dc(&dir, "dc-a", &[indexer.url()]);
    let mut pool = HashPool::new(&format(), 7);

    // Fill to 3,200 of 4,096 slots in 16 batches of 200 blocks over 8 workers (a batch of 200
    // dirty buckets is more than one 4 KiB frame carries).
    let mut confirmed: Vec<u64> = Vec::new();
    let mut held: Vec<Vec<u64>> = vec![Vec::new(); 8];
    for round in 0..16 {
        let blocks = pool.take(200);
        a.store(round as u64 % 8, &blocks).await;
        held[round % 8].extend(&blocks);
        // Stores never remove a tracked fingerprint: what was installed must stay visible
        // while later batches relocate it.
        all_still_visible(&indexer, "dc-a", &confirmed, round).await;
        if round % 4 == 3 {
            wait_converged(&indexer, &a).await;
            confirmed = a.model.tracked();
        }
    }
    let stats = a.stats().await.expect("GetStats");
    assert!(stats.load_factor > 0.75, "{stats:?}");
    let text = a.metrics().expect("metrics");
    let deltas = metrics::value(&text, "ckf_producer_deltas_sent_total", &[]).unwrap_or(0.0);
    let batches = metrics::value(&text, "ckf_producer_batches_total", &[]).unwrap_or(0.0);
    assert!(
        deltas > batches,
        "small frames split batches: {deltas} deltas, {batches} batches"
    );

    // Churn: evict a third of each worker's blocks, clear two workers, refill.
    for (w, blocks) in held.iter().enumerate() {
        let third = blocks.len() / 3;
        a.remove(w as u64, &blocks[..third]).await;
    }
    a.clear(3).await;
    a.clear(6).await;
    for w in [3u64, 6, 9] {
        a.store(w, &pool.take(150)).await;
    }
    let lane = wait_converged(&indexer, &a).await;
    assert_eq!(lane.retirements, 0, "{lane:?}");
}
