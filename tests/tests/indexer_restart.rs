//! E2E 2: `kill -9` the indexer and start it again on the same ports. The producers re-attach by
//! themselves (new consumer instance, new leases, new barrier snapshots) and the lanes return to
//! ready holding exactly the producers' tables, including changes made while the indexer was
//! down. A graceful indexer restart (SIGTERM) recovers the same way, and a second indexer replica
//! fed by the same producers is not disturbed by the first one's crash.

use ckf_e2e::check::wait_converged;
use ckf_e2e::cluster::{Indexer, IndexerSpec, Producer, TestDir, format, is_active};
use ckf_e2e::hashes::HashPool;
use ckf_e2e::metrics;
use ckf_e2e::wait::{DEADLINE, eventually};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn indexer_kill9_and_restart_recovers_every_lane() {
    let dir = TestDir::new("indexer-restart");
    let mut indexer = Indexer::start(&dir, &IndexerSpec::default());
    let endpoints = [indexer.url()];
    let (mut a, mut b) = Producer::start_ab(&dir, &endpoints);
    let mut pool = HashPool::new(&format(), 2);

    let a_blocks = pool.take(120);
    let b_blocks = pool.take(120);
    a.store(1, &a_blocks[..80]).await;
    a.store(2, &a_blocks[60..]).await;
    a.remove(1, &a_blocks[..10]).await;
    b.store(1, &b_blocks).await;
    b.remove(1, &b_blocks[100..]).await;
    wait_converged(&indexer, &a).await;
    wait_converged(&indexer, &b).await;
    let before = indexer.list_lanes().await.expect("ListLanes");

    indexer.kill9();
    // Changes while the indexer is gone must arrive with the new barrier snapshots.
    let late = pool.take(30);
    a.store(3, &late).await;
    a.clear(2).await;
    b.remove(1, &b_blocks[..50]).await;
    indexer.restart();

    let lane_a = wait_converged(&indexer, &a).await;
    let lane_b = wait_converged(&indexer, &b).await;
    let after = indexer.list_lanes().await.expect("ListLanes");
    assert_ne!(
        after.consumer_instance, before.consumer_instance,
        "a restarted indexer is a new consumer instance"
    );
    for lane in [&lane_a, &lane_b] {
        assert!(is_active(lane) && lane.lease_epoch >= 1, "{lane:?}");
        assert_eq!(lane.retirements, 0, "fresh indexer state: {lane:?}");
    }

    // Each producer saw its attachment end and re-attached on its own.
    for producer in [&a, &b] {
        let text = producer.metrics().expect("producer metrics");
        let url = indexer.url();
        for (metric, at_least) in [
            ("ckf_producer_detachments_total", 1.0),
            ("ckf_producer_snapshots_sent_total", 2.0),
        ] {
            let value = metrics::value(&text, metric, &[("indexer", &url)]);
            assert!(
                value.unwrap_or(0.0) >= at_least,
                "{}: {metric} {value:?}",
                producer.name
            );
        }
    }

    // And publication continues on the new leases.
    let more = pool.take(20);
    a.store(4, &more).await;
    b.store(4, &more[..7]).await;
    wait_converged(&indexer, &a).await;
    wait_converged(&indexer, &b).await;
    eventually(
        "both lanes still on the post-restart leases",
        DEADLINE,
        || async {
            let lanes = indexer.list_lanes().await?;
            let same = lanes.consumer_instance == after.consumer_instance
                && lanes
                    .lanes
                    .iter()
                    .all(|l| l.retirements == 0 && is_active(l));
            if same {
                Ok(())
            } else {
                Err(format!("{lanes:?}"))
            }
        },
    )
    .await;

    // A graceful restart: SIGTERM exits 0, the producers are told (Retired(SHUTDOWN) or the
    // stream ending) and re-attach to the next instance with changes made meanwhile.
    let status = indexer.terminate();
    assert_eq!(status.code(), Some(0), "{status:?}");
    a.remove(4, &more[..10]).await;
    indexer.restart();
    wait_converged(&indexer, &a).await;
    wait_converged(&indexer, &b).await;
    let third = indexer.list_lanes().await.expect("ListLanes");
    assert_ne!(third.consumer_instance, after.consumer_instance);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_indexer_replica_is_unaffected_by_the_first_ones_crash() {
    let dir = TestDir::new("indexer-replicas");
    let mut first = Indexer::start_named(&dir, "indexer-1", &IndexerSpec::default());
    let second = Indexer::start_named(&dir, "indexer-2", &IndexerSpec::default());
    let endpoints = [first.url(), second.url()];
    let (mut a, mut b) = Producer::start_ab(&dir, &endpoints);
    let mut pool = HashPool::new(&format(), 8);
    a.store(1, &pool.take(50)).await;
    b.store(1, &pool.take(50)).await;
    for indexer in [&first, &second] {
        wait_converged(indexer, &a).await;
        wait_converged(indexer, &b).await;
    }
    let before = second.list_lanes().await.expect("ListLanes");

    first.kill9();
    a.store(2, &pool.take(20)).await;
    b.clear(1).await;
    // The surviving replica keeps its leases and follows every change.
    for producer in [&a, &b] {
        let lane = wait_converged(&second, producer).await;
        let old = &before.lanes[lane.lane as usize];
        assert_eq!(lane.lease_epoch, old.lease_epoch, "{old:?} -> {lane:?}");
        assert_eq!(lane.retirements, 0, "{lane:?}");
    }

    first.restart();
    for indexer in [&first, &second] {
        wait_converged(indexer, &a).await;
        wait_converged(indexer, &b).await;
    }
    let lanes = second.list_lanes().await.expect("ListLanes");
    assert_eq!(lanes.consumer_instance, before.consumer_instance);
    assert!(lanes.lanes.iter().all(|l| l.retirements == 0), "{lanes:?}");
}
