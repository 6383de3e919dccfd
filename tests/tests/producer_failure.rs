//! E2E 3: a producer that stops publishing loses its lane and only its lane.
//!
//! - Frozen (SIGSTOP): its connection stays open but silent, so the indexer retires the lane on
//!   the heartbeat deadline (`HEARTBEAT_TIMEOUT`); after SIGCONT the same incarnation re-attaches.
//! - Killed (`kill -9`): the lane is retired (the kernel closes the connection, so the stream is
//!   lost at once; a silent peer would hit the heartbeat deadline instead).
//! - Restarted: a new incarnation with new content makes the lane ready again.
//!
//! The other DC's lane keeps answering throughout.

use ckf_e2e::check::{lane_matches, wait_converged};
use ckf_e2e::cluster::{Indexer, IndexerSpec, Producer, ProducerSpec, TestDir, format};
use ckf_e2e::hashes::HashPool;
use ckf_e2e::wait::{DEADLINE, eventually};
use ckf_proto::v1::{LaneState, RetireReason};

/// The lane of `dc` is not ready (absent from `FindMatches` and its ready mask) while `other`
/// still answers with exactly its content.
async fn only_other_lane_answers(indexer: &Indexer, dc: &str, other: &Producer) {
    let tracked = other.model.tracked();
    let response = indexer.find(&tracked).await.expect("FindMatches");
    let mask_bit = 1 << indexer.lane_index(dc);
    assert_eq!(
        response.ready_lanes() & mask_bit,
        0,
        "{dc} still ready: {response:?}"
    );
    let depths = indexer.depths(&tracked).await.expect("FindMatches");
    assert!(!depths.contains_key(dc), "{dc} answered: {depths:?}");
    assert_eq!(
        depths.get(other.dc.as_str()),
        Some(&(tracked.len() as u32)),
        "{depths:?}"
    );
    lane_matches(indexer, &other.dc, &other.model)
        .await
        .unwrap_or_else(|e| panic!("the other lane was affected: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_stop_and_kill9_retire_only_its_lane_and_a_restart_recovers_it() {
    let dir = TestDir::new("producer-failure");
    let spec = IndexerSpec {
        // Producers heartbeat every 200 ms: a wide margin for live ones on a busy machine.
        heartbeat_deadline_ms: 2_500,
        ..IndexerSpec::default()
    };
    let indexer = Indexer::start(&dir, &spec);
    let endpoints = [indexer.url()];
    let (mut a, mut b) = Producer::start_ab(&dir, &endpoints);
    let mut pool = HashPool::new(&format(), 3);
    a.store(1, &pool.take(60)).await;
    b.store(1, &pool.take(60)).await;
    let first = wait_converged(&indexer, &a).await;
    wait_converged(&indexer, &b).await;

    // Frozen producer: silent but connected -> heartbeat deadline.
    a.signal(libc::SIGSTOP);
    let retired = indexer
        .wait_lane("dc-a", "retired", |l| l.state() == LaneState::Retired)
        .await;
    only_other_lane_answers(&indexer, "dc-a", &b).await;
    a.signal(libc::SIGCONT);
    assert_eq!(
        retired.last_retire_reason(),
        RetireReason::HeartbeatTimeout,
        "{retired:?}"
    );
    assert!(
        retired
            .last_retire_detail
            .contains("heartbeat deadline 2500 ms"),
        "{retired:?}"
    );
    assert_eq!(retired.retirements, 1, "{retired:?}");
    // Woken up, the same incarnation re-attaches under a newer lease.
    let back = wait_converged(&indexer, &a).await;
    assert_eq!(back.incarnation, first.incarnation);
    assert!(
        back.lease_epoch > first.lease_epoch,
        "{first:?} -> {back:?}"
    );

    // Killed producer.
    let old_model = a.model.clone();
    a.kill9();
    let retired = indexer
        .wait_lane("dc-a", "retired again", |l| l.retirements == 2)
        .await;
    assert_eq!(retired.state(), LaneState::Retired, "{retired:?}");
    assert!(
        matches!(
            retired.last_retire_reason(),
            RetireReason::StreamLost | RetireReason::HeartbeatTimeout
        ),
        "{retired:?}"
    );
    only_other_lane_answers(&indexer, "dc-a", &b).await;
    // The other lane keeps taking changes meanwhile.
    b.store(2, &pool.take(10)).await;
    wait_converged(&indexer, &b).await;

    // Restarted: a new incarnation (empty exact state) with new content.
    let mut a2 = Producer::start(&dir, "producer-a2", &ProducerSpec::new("dc-a"), &endpoints);
    a2.store(1, &pool.take(25)).await;
    let lane = wait_converged(&indexer, &a2).await;
    assert_ne!(
        lane.incarnation, first.incarnation,
        "a restart is a new incarnation"
    );
    assert!(lane.lease_epoch > back.lease_epoch, "{back:?} -> {lane:?}");
    // Nothing of the killed incarnation's content survives in the lane.
    let mut expected = a2.model.clone();
    expected.expect_absent(&old_model.tracked());
    eventually(
        "the old incarnation's blocks are gone",
        DEADLINE,
        || async { lane_matches(&indexer, "dc-a", &expected).await },
    )
    .await;
    wait_converged(&indexer, &b).await;
}
