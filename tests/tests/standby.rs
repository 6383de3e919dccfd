//! A hot standby. Two producers of one pool, both fed every event and both
//! started with `publication.start_mode = "if-vacant"`: the first to attach holds the lane,
//! the other stands by without ever taking it while the holder lives; when the holder dies,
//! the standby's lane is active with every tracked block, with no replay from any source.

use std::time::{Duration, Instant};

use ckf_e2e::check::{lane_matches, wait_converged};
use ckf_e2e::cluster::{Indexer, IndexerSpec, Producer, ProducerSpec, TestDir, format, is_active};
use ckf_e2e::hashes::HashPool;
use ckf_e2e::metrics;
use ckf_e2e::wait::{DEADLINE, eventually};

const HEARTBEAT_DEADLINE_MS: u64 = 1_500;

fn standby_spec(dir: &TestDir, name: &str) -> ProducerSpec {
    let state = dir.path().join(format!("{name}-state"));
    ProducerSpec {
        args: vec!["--start-mode".into(), "if-vacant".into()],
        // The producer's default group-commit window.
        ..ProducerSpec::durable("dc-a", &state, 50, "")
    }
}

/// `ckf_producer_attachment_state{indexer, state} == 1`.
fn in_state(producer: &Producer, indexer: &Indexer, state: &str) -> bool {
    let url = indexer.url();
    producer.metrics().is_ok_and(|text| {
        metrics::value(
            &text,
            "ckf_producer_attachment_state",
            &[("indexer", url.as_str()), ("state", state)],
        ) == Some(1.0)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standby_takes_the_lane_complete_when_the_holder_dies_and_never_while_it_lives() {
    let dir = TestDir::new("standby");
    let spec = IndexerSpec {
        heartbeat_deadline_ms: HEARTBEAT_DEADLINE_MS,
        ..IndexerSpec::default()
    };
    let indexer = Indexer::start(&dir, &spec);
    let endpoints = [indexer.url()];
    let mut holder = Producer::start(&dir, "producer-a1", &standby_spec(&dir, "a1"), &endpoints);
    let holder_incarnation = holder.stats().await.unwrap().incarnation;
    // if-vacant on a vacant lane is granted at once.
    indexer
        .wait_lane("dc-a", "held by the first producer", |l| {
            is_active(l) && l.incarnation == holder_incarnation
        })
        .await;
    let mut standby = Producer::start(&dir, "producer-a2", &standby_spec(&dir, "a2"), &endpoints);
    let standby_incarnation = standby.stats().await.unwrap().incarnation;

    // Both are fed every event (as two subscribers of the same engine publishers would be).
    let mut pool = HashPool::new(&format(), 21);
    for (worker, n) in [(1, 300), (2, 200), (3, 100)] {
        let blocks = pool.take(n);
        holder.store(worker, &blocks).await;
        standby.store(worker, &blocks).await;
    }
    let removed = holder.model.tracked()[..50].to_vec();
    holder.remove(1, &removed).await;
    standby.remove(1, &removed).await;
    let held = wait_converged(&indexer, &holder).await;

    // While both live: the standby stands by; for several heartbeat deadlines the lane keeps
    // its holder and its lease.
    eventually("the second producer to stand by", DEADLINE, || async {
        if in_state(&standby, &indexer, "standby") {
            Ok(())
        } else {
            Err("not standby".to_owned())
        }
    })
    .await;
    let until = Instant::now() + Duration::from_millis(3 * HEARTBEAT_DEADLINE_MS);
    while Instant::now() < until {
        let lane = indexer.lane("dc-a").await.unwrap();
        assert!(is_active(&lane), "{lane:?}");
        assert_eq!(
            (lane.incarnation, lane.lease_epoch),
            (holder_incarnation, held.lease_epoch),
            "the lane changed hands while its holder lived: {lane:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(in_state(&holder, &indexer, "streaming"));

    // The holder dies: the standby takes the lane, complete.
    holder.kill9();
    let killed = Instant::now();
    let lane = indexer
        .wait_lane("dc-a", "taken by the standby", |l| {
            is_active(l) && l.incarnation == standby_incarnation
        })
        .await;
    assert!(lane.lease_epoch > held.lease_epoch, "{lane:?}");
    // About the heartbeat deadline plus its own reconnect backoff (max 500 ms) and the
    // snapshot: printed, not asserted (a loaded machine is slower; the wait above is bounded).
    eprintln!(
        "the standby took the lane {:?} after the kill (heartbeat deadline {HEARTBEAT_DEADLINE_MS} ms)",
        killed.elapsed()
    );
    lane_matches(&indexer, "dc-a", &standby.model)
        .await
        .unwrap_or_else(|e| panic!("the standby's lane is not complete: {e}"));
    assert_eq!(
        standby.model.tracked(),
        holder.model.tracked(),
        "both were fed the same"
    );

    // The old holder comes back (durable state, if-vacant): it stands by in turn.
    holder.restart();
    eventually("the restarted producer to stand by", DEADLINE, || async {
        if in_state(&holder, &indexer, "standby") {
            Ok(())
        } else {
            Err("not standby".to_owned())
        }
    })
    .await;
    let lane = indexer.lane("dc-a").await.unwrap();
    assert_eq!(lane.incarnation, standby_incarnation, "{lane:?}");
}
