//! One principal's worker with 10^5 dp ranks, removed by one `WorkerRemoved`, against the real
//! `ckf-producer` and `ckf-indexer`: the ranks share 1,000 blocks (about a hundred owners each,
//! most of them spilled), where a removal that tested every block against every rank's tag
//! held the actor for seconds. Now its cost does not multiply by the ranks: another source's
//! batches keep being applied and the lane's deltas keep flowing (its lease is never retired),
//! and the ranks quota refuses one rank past its limit. (The test table is small enough to be
//! swept inside the removal; slices are `ckf-core`'s `dc/release` tests and `removal` bench.)

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use ckf_e2e::check::wait_converged;
use ckf_e2e::cluster::{
    Indexer, IndexerSpec, Producer, ProducerSpec, TestDir, batch, channel, format, is_active,
    rank_event, stored,
};
use ckf_e2e::hashes::HashPool;
use ckf_e2e::wait::{DEADLINE, eventually};
use ckf_proto::v1::{self, ingest_client::IngestClient, kv_event::Kind};

const RANKS: u32 = 100_000;
/// Distinct blocks the ranks share (the test table holds 4,096 slots).
const SHARED: usize = 1_000;

fn all_applied(r: &v1::KvEventBatchResult) -> bool {
    r.refused.is_none()
        && r.events
            .iter()
            .all(|e| e.status() == v1::EventStatus::Applied)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_of_many_ranks_is_removed_while_the_pool_keeps_flowing() {
    let dir = TestDir::new("worker-ranks");
    let indexer = Indexer::start(
        &dir,
        &IndexerSpec {
            lanes: vec!["dc-a".into()],
            ..IndexerSpec::default()
        },
    );
    let spec = ProducerSpec {
        extra_toml: format!("[quotas]\nmax_ranks_per_worker = {RANKS}\n"),
        ..ProducerSpec::new("dc-a")
    };
    let mut p = Producer::start(&dir, "producer-a", &spec, &[indexer.url()]);
    let lane = indexer.wait_lane("dc-a", "active", is_active).await;
    let mut pool = HashPool::new(&format(), 1);
    let kept = pool.take(8);
    p.store(2, &kept).await;
    let shared = pool.take(SHARED);

    // 10^5 ranks of worker 1 from source "greedy", each owning one of the shared blocks.
    let mut greedy = IngestClient::new(channel(p.addr).await.expect("ingest channel"));
    let ranks: Vec<u32> = (0..RANKS).collect();
    let mut sequence = 0;
    for chunk in ranks.chunks(10_000) {
        sequence += 1;
        let events = chunk
            .iter()
            .map(|&r| rank_event(1, r, stored(&[shared[r as usize % SHARED]])))
            .collect();
        let r = greedy
            .publish_batch(batch("greedy", sequence, events))
            .await
            .expect("PublishBatch")
            .into_inner();
        assert!(all_applied(&r), "{:?}", r.events.first());
    }
    // One rank more: refused with RESOURCE_EXHAUSTED naming the limit; nothing applied.
    sequence += 1;
    let r = greedy
        .publish_batch(batch(
            "greedy",
            sequence,
            vec![rank_event(1, RANKS, stored(&pool.take(1)))],
        ))
        .await
        .expect("PublishBatch")
        .into_inner();
    let refused = &r.events[0];
    assert_eq!(refused.status(), v1::EventStatus::Refused, "{r:?}");
    assert_eq!(refused.code, tonic::Code::ResourceExhausted as i32, "{r:?}");
    assert!(
        refused
            .error
            .contains(&format!("limit max_ranks_per_worker is {RANKS}")),
        "{}",
        refused.error
    );
    let stats = p.stats().await.expect("GetStats");
    assert_eq!(stats.members, u64::from(RANKS) + 1, "{stats:?}");
    assert_eq!(
        stats.unique_blocks,
        (SHARED + kept.len()) as u64,
        "{stats:?}"
    );
    eventually("the shared blocks at the indexer", DEADLINE, || async {
        let depths = indexer.depths(&shared[..16]).await?;
        (depths.get("dc-a") == Some(&16))
            .then_some(())
            .ok_or(format!("{depths:?}"))
    })
    .await;

    // Another source keeps publishing while worker 1 is removed.
    let stop = Arc::new(AtomicBool::new(false));
    // Batches of the other source answered so far (the removal waits for the first).
    let flowing = Arc::new(AtomicUsize::new(0));
    let flow = {
        let stop = stop.clone();
        let flowing = flowing.clone();
        let mut polite = IngestClient::new(channel(p.addr).await.expect("ingest channel"));
        let blocks = pool.take(400);
        tokio::spawn(async move {
            let mut sent = Vec::new();
            for (i, &h) in blocks.iter().enumerate() {
                if stop.load(Ordering::Relaxed) && i >= 20 {
                    break;
                }
                let r = polite
                    .publish_batch(batch(
                        "polite",
                        i as u64 + 1,
                        vec![rank_event(3, 0, stored(&[h]))],
                    ))
                    .await
                    .expect("PublishBatch of the other source")
                    .into_inner();
                assert!(all_applied(&r), "{r:?}");
                sent.push(h);
                flowing.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            sent
        })
    };
    eventually("the other source to publish", DEADLINE, || {
        let n = flowing.load(Ordering::Relaxed);
        async move { (n > 0).then_some(()).ok_or(format!("{n} batches")) }
    })
    .await;
    sequence += 1;
    let r = greedy
        .publish_batch(batch(
            "greedy",
            sequence,
            vec![rank_event(1, 0, Kind::WorkerRemoved(v1::WorkerRemoved {}))],
        ))
        .await
        .expect("PublishBatch")
        .into_inner();
    assert!(all_applied(&r), "{r:?}");
    assert_eq!(r.events[0].applied_blocks, RANKS, "{r:?}");
    eventually(
        "worker 1's blocks gone at the indexer",
        DEADLINE,
        || async {
            let depths = indexer.depths(&shared[..16]).await?;
            (depths.get("dc-a") == Some(&0))
                .then_some(())
                .ok_or(format!("{depths:?}"))
        },
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let sent = flow.await.expect("the other source's flow");
    p.model.store(3, &sent);

    // The lane equals the producer's exact content, under the lease it had from the start.
    let after = wait_converged(&indexer, &p).await;
    assert_eq!(after.lease_epoch, lane.lease_epoch, "{after:?}");
    assert_eq!(after.retirements, 0, "{after:?}");
    let stats = p.stats().await.expect("GetStats");
    assert_eq!(stats.members, 2, "{stats:?}");
    // No unit of actor work came near the 10.9 s the old removal took (a bound far from the
    // few milliseconds measured, not a benchmark).
    let text = p.metrics().expect("metrics");
    // Histogram buckets, read from the exposition lines (the scrape helper reads `_count`s).
    let sample = |series: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    for command in ["ingest", "publish"] {
        let all = sample(&format!(
            "ckf_producer_actor_command_seconds_count{{command=\"{command}\"}}"
        ));
        let quick = sample(&format!(
            "ckf_producer_actor_command_seconds_bucket{{command=\"{command}\",le=\"1.6\"}}"
        ));
        assert!(all > 0.0, "no {command} timed:\n{text}");
        assert_eq!(all, quick, "a {command} took over 1.6 s");
    }
}
