//! E2E 1: two producers and one indexer, as real processes. Stores become visible with the right
//! prefix depth per DC, removes and clears disappear, and after quiescence and after a drain
//! each lane holds exactly its producer's table.

use std::collections::BTreeMap;

use ckf_e2e::check::{lane_matches, wait_converged};
use ckf_e2e::cluster::{Indexer, IndexerSpec, Producer, TestDir, format, is_active};
use ckf_e2e::hashes::HashPool;
use ckf_e2e::metrics;
use ckf_e2e::wait::{DEADLINE, eventually};

/// Waits until `FindMatches(hashes)` answers exactly `expected` (dc -> depth, every ready lane).
async fn wait_depths(indexer: &Indexer, hashes: &[u64], expected: &[(&str, u32)]) {
    let expected: BTreeMap<String, u32> =
        expected.iter().map(|&(dc, d)| (dc.to_owned(), d)).collect();
    eventually(&format!("depths {expected:?}"), DEADLINE, || async {
        let depths = indexer.depths(hashes).await?;
        if depths == expected {
            Ok(())
        } else {
            Err(format!("{depths:?}"))
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_producers_stores_removes_clears_and_drain() {
    let dir = TestDir::new("two-producers");
    let indexer = Indexer::start(&dir, &IndexerSpec::default());
    let endpoints = [indexer.url()];
    let (mut a, mut b) = Producer::start_ab(&dir, &endpoints);
    indexer.wait_lane("dc-a", "active", is_active).await;
    indexer.wait_lane("dc-b", "active", is_active).await;
    let mut pool = HashPool::new(&format(), 1);

    // One shared prefix: dc-a caches 12 blocks of it, dc-b the first 5.
    let prefix = pool.take(12);
    a.store(1, &prefix).await;
    b.store(7, &prefix[..5]).await;
    wait_depths(&indexer, &prefix, &[("dc-a", 12), ("dc-b", 5)]).await;

    // Evicting blocks 8.. shortens dc-a's match to 8.
    a.remove(1, &prefix[8..]).await;
    wait_depths(&indexer, &prefix, &[("dc-a", 8), ("dc-b", 5)]).await;

    // Refcounts: worker 2 also holds the first 4 blocks, so clearing worker 1 leaves depth 4.
    a.store(2, &prefix[..4]).await;
    a.clear(1).await;
    wait_depths(&indexer, &prefix, &[("dc-a", 4), ("dc-b", 5)]).await;
    b.clear(7).await;
    wait_depths(&indexer, &prefix, &[("dc-a", 4), ("dc-b", 0)]).await;

    // Churn on both: several workers, overlapping stores, removals and a clear.
    for (producer, first_worker) in [(&mut a, 10), (&mut b, 20)] {
        let mut held = Vec::new();
        for w in first_worker..first_worker + 6 {
            let blocks = pool.take(40);
            producer.store(w, &blocks).await;
            held.push((w, blocks));
        }
        // A second owner for some blocks, then evictions of part of each worker's set.
        producer.store(first_worker + 100, &held[0].1[..10]).await;
        for (w, blocks) in &held {
            producer.remove(*w, &blocks[30..]).await;
        }
        producer.remove(first_worker, &held[0].1[..15]).await;
        producer.clear(first_worker + 1).await;
    }
    assert!(a.model.tracked().len() > 100 && !a.model.gone().is_empty());

    // Quiescence: each lane equals its producer, and the lane's installed sequence is the
    // sequence the producer last had acknowledged.
    for producer in [&a, &b] {
        wait_converged(&indexer, producer).await;
        let what = format!(
            "{}: lane installed sequence == producer's acked sequence",
            producer.dc
        );
        eventually(&what, DEADLINE, || async {
            let lane = indexer.lane(&producer.dc).await?;
            let text = producer.metrics()?;
            let acked = metrics::value(
                &text,
                "ckf_producer_acked_sequence",
                &[("indexer", &indexer.url())],
            )
            .ok_or("no ckf_producer_acked_sequence sample")?;
            if acked as u64 == lane.installed_sequence && lane.installed_sequence > 0 {
                Ok(())
            } else {
                Err(format!("acked {acked}, lane {lane:?}"))
            }
        })
        .await;
    }

    // Drain both: the lanes stay ready, marked drained, and still equal the producers' tables.
    for producer in [&mut a, &mut b] {
        let status = producer.terminate();
        assert!(status.success(), "{} exited with {status:?}", producer.name);
        let lane = indexer
            .wait_lane(&producer.dc, "drained", |l| l.drained)
            .await;
        assert!(is_active(&lane), "{lane:?}");
        lane_matches(&indexer, &producer.dc, &producer.model)
            .await
            .unwrap_or_else(|e| panic!("after the drain: {e}"));
    }
}
