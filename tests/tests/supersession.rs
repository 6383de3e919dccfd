//! Supersession that recovers and does not flap, and stale lanes that end, with the
//! real binaries:
//! * a superseded producer stands by (`IF_VACANT` retries, refused while the newer producer is
//!   live) and gets its lane back, with its own content, once the newer holder is killed
//!   (SIGKILL) or drains (SIGTERM);
//! * two live producers for one pool do not take the lane from each other: the lease epoch
//!   moves once, and the contention is counted (metric, `ListLanes`);
//! * a holder that stalled (SIGSTOP) past the heartbeat deadline, while the standby recovered
//!   the lane, comes back as the standby (`IF_VACANT`), not as a second takeover;
//! * a drained lane leaves the ready set after `lag.drain_grace_ms`, unless a new lease arrives
//!   within it;
//! * a heartbeat claiming another sequence than the installed one retires the lane as a gap,
//!   and an `IF_VACANT` raw attach is refused naming the live holder.

use std::time::Duration;

use ckf_e2e::check::wait_converged;
use ckf_e2e::cluster::{Indexer, IndexerSpec, Producer, ProducerSpec, TestDir, format, is_active};
use ckf_e2e::hashes::HashPool;
use ckf_e2e::metrics;
use ckf_e2e::relay::{self, RawTable, attach};
use ckf_e2e::wait::{DEADLINE, eventually};
use ckf_proto::v1::{self, ContentionKind, LaneState, RetireReason};
use tonic::Code;

/// A producer of dc-a named `name` (quick reconnects, 50..=500 ms).
fn producer_a(dir: &TestDir, name: &str, indexer: &Indexer) -> Producer {
    Producer::start(dir, name, &ProducerSpec::new("dc-a"), &[indexer.url()])
}

/// Waits until `producer` exports `state` (1) for `indexer`.
async fn wait_state(producer: &Producer, indexer: &Indexer, states: &[&str]) {
    let url = indexer.url();
    let what = format!("{} attachment state in {states:?}", producer.name);
    eventually(&what, DEADLINE, || async {
        let text = producer.metrics()?;
        for state in states {
            let labels = [("indexer", url.as_str()), ("state", *state)];
            if metrics::value(&text, "ckf_producer_attachment_state", &labels) == Some(1.0) {
                return Ok(());
            }
        }
        Err(text)
    })
    .await;
}

/// `ckf_indexer_lane_contention_total{dc, kind}`.
fn contention(indexer: &Indexer, dc: &str, kind: &str) -> f64 {
    let text = indexer.metrics().expect("indexer metrics");
    metrics::value(
        &text,
        "ckf_indexer_lane_contention_total",
        &[("dc", dc), ("kind", kind)],
    )
    .unwrap_or_else(|| panic!("no contention sample for {dc}/{kind}: {text}"))
}

/// Starts the older producer (stores `old_only`), then the newer one for the same pool (stores
/// `new_only`), and waits until the lane is the newer producer's. Returns both and the old and
/// new lane.
async fn superseded_setup(
    dir: &TestDir,
    indexer: &Indexer,
    pool: &mut HashPool,
) -> (Producer, Producer, v1::LaneInfo, v1::LaneInfo) {
    let mut old = producer_a(dir, "producer-a-old", indexer);
    old.store(1, &pool.take(30)).await;
    let old_lane = wait_converged(indexer, &old).await;
    let mut new = producer_a(dir, "producer-a-new", indexer);
    new.store(2, &pool.take(20)).await;
    let new_lane = wait_converged(indexer, &new).await;
    assert_ne!(new_lane.incarnation, old_lane.incarnation);
    assert!(new_lane.lease_epoch > old_lane.lease_epoch);
    // The older producer was told, says so once, and stands by.
    wait_state(&old, indexer, &["superseded", "standby"]).await;
    let records = old.log_records("another producer holds this pool");
    assert_eq!(records.len(), 1, "{}", old.log());
    assert_eq!(records[0]["level"], "ERROR", "{}", records[0]);
    let detail = records[0]["fields"]["detail"]
        .as_str()
        .or_else(|| records[0]["detail"].as_str())
        .unwrap_or_default()
        .to_owned();
    let holder = format!("incarnation {:#018x}", new_lane.incarnation);
    assert!(
        detail.contains("RETIRE_REASON_SUPERSEDED") && detail.contains(&holder),
        "{holder} not in {detail}"
    );
    (old, new, old_lane, new_lane)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_live_producers_for_one_pool_do_not_flap() {
    let dir = TestDir::new("supersession-no-flap");
    let indexer = Indexer::start(&dir, &IndexerSpec::default());
    let mut pool = HashPool::new(&format(), 21);
    let (old, mut new, old_lane, new_lane) = superseded_setup(&dir, &indexer, &mut pool).await;

    // Over a few seconds (several of the older producer's retries, at most 500 ms apart) the
    // lane keeps the newer producer's lease.
    for _ in 0..15 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let lane = indexer.lane("dc-a").await.expect("ListLanes");
        assert_eq!(
            (lane.lease_epoch, lane.incarnation),
            (new_lane.lease_epoch, new_lane.incarnation),
            "the lane flapped: {lane:?}"
        );
        assert!(is_active(&lane), "{lane:?}");
    }
    wait_state(&old, &indexer, &["standby"]).await;
    // It keeps publishing, never fenced.
    new.store(3, &pool.take(10)).await;
    let lane = wait_converged(&indexer, &new).await;
    assert_eq!(lane.lease_epoch, new_lane.lease_epoch);

    // Counted and shown: one takeover of a live holder, then the older producer's refusals.
    assert_eq!(contention(&indexer, "dc-a", "takeover"), 1.0);
    let refused = contention(&indexer, "dc-a", "if_vacant_refused");
    assert!(refused >= 2.0, "{refused}");
    assert_eq!(contention(&indexer, "dc-b", "takeover"), 0.0);
    assert!(lane.contention_count >= 3, "{lane:?}");
    assert_eq!(lane.last_contender_incarnation, old_lane.incarnation);
    assert_eq!(
        lane.last_contention_holder_incarnation,
        new_lane.incarnation
    );
    assert_eq!(
        lane.last_contention_kind(),
        ContentionKind::IfVacantRefused,
        "{lane:?}"
    );
    assert!(lane.last_contention_age_ms.is_some(), "{lane:?}");
    let text = old.metrics().expect("metrics");
    let refusals = metrics::value(
        &text,
        "ckf_producer_standby_refusals_total",
        &[("indexer", &indexer.url())],
    )
    .unwrap_or(0.0);
    assert!(refusals >= 2.0, "{text}");
    // Refusals are counted, not logged each time (at most once a minute).
    let logged = old.log_records("standing by: the lane is held by another live producer");
    assert_eq!(logged.len(), 1, "{}", old.log());
    // The indexer said it loudly, once.
    let takeovers = indexer_log_records(&indexer, "a live attachment was taken over");
    assert_eq!(takeovers.len(), 1, "{}", indexer.log());
    assert_eq!(takeovers[0]["level"], "ERROR");
}

/// The indexer's JSON log records whose message contains `needle`.
fn indexer_log_records(indexer: &Indexer, needle: &str) -> Vec<serde_json::Value> {
    indexer
        .log()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|r| {
            r["fields"]["message"]
                .as_str()
                .or_else(|| r["message"].as_str())
                .is_some_and(|m| m.contains(needle))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superseded_producer_recovers_its_lane_after_the_newer_holder_is_killed() {
    let dir = TestDir::new("supersession-kill");
    let indexer = Indexer::start(&dir, &IndexerSpec::default());
    let mut pool = HashPool::new(&format(), 22);
    let (mut old, mut new, old_lane, new_lane) = superseded_setup(&dir, &indexer, &mut pool).await;
    // Changes while standing by are part of the exact state it publishes when it is back.
    old.store(4, &pool.take(12)).await;
    new.kill9();
    let lane = wait_converged(&indexer, &old).await;
    assert_eq!(lane.incarnation, old_lane.incarnation, "{lane:?}");
    assert!(lane.lease_epoch > new_lane.lease_epoch, "{lane:?}");
    wait_state(&old, &indexer, &["streaming"]).await;
    assert_eq!(
        old.log_records("the lane is vacant: attached IF_VACANT")
            .len(),
        1,
        "{}",
        old.log()
    );
    // Still its own producer afterwards: more changes arrive.
    old.store(5, &pool.take(8)).await;
    let later = wait_converged(&indexer, &old).await;
    assert_eq!(later.lease_epoch, lane.lease_epoch);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superseded_producer_recovers_its_lane_after_the_newer_holder_drains() {
    let dir = TestDir::new("supersession-drain");
    let indexer = Indexer::start(&dir, &IndexerSpec::default());
    let mut pool = HashPool::new(&format(), 23);
    let (old, mut new, old_lane, new_lane) = superseded_setup(&dir, &indexer, &mut pool).await;
    let status = new.terminate();
    assert!(status.success(), "{status:?}");
    assert!(
        !new.log_records("drain marker sent").is_empty(),
        "{}",
        new.log()
    );
    // A drained lane inside its grace is vacant: the standby producer takes it back.
    let lane = wait_converged(&indexer, &old).await;
    assert_eq!(lane.incarnation, old_lane.incarnation, "{lane:?}");
    assert!(lane.lease_epoch > new_lane.lease_epoch, "{lane:?}");
    assert!(!lane.drained, "{lane:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_stalled_past_the_heartbeat_deadline_does_not_take_the_lane_back() {
    let dir = TestDir::new("supersession-stall");
    let spec = IndexerSpec {
        heartbeat_deadline_ms: 1_500,
        ..IndexerSpec::default()
    };
    let indexer = Indexer::start(&dir, &spec);
    let mut pool = HashPool::new(&format(), 27);
    let (old, new, old_lane, new_lane) = superseded_setup(&dir, &indexer, &mut pool).await;
    // The holder stalls (SIGSTOP) past the heartbeat deadline: the indexer retires its
    // attachment and the standby producer recovers the lane.
    new.signal(libc::SIGSTOP);
    let recovered = wait_converged(&indexer, &old).await;
    assert_eq!(recovered.incarnation, old_lane.incarnation, "{recovered:?}");
    assert!(
        recovered.lease_epoch > new_lane.lease_epoch,
        "{recovered:?}"
    );
    new.signal(libc::SIGCONT);
    // Back, it learns it was retired for silence and re-attaches IF_VACANT: refused while the
    // recovered holder is live, so it stands by instead of swapping the lane a second time.
    wait_state(&new, &indexer, &["standby"]).await;
    assert_eq!(
        new.log_records("silent past the indexer's heartbeat deadline")
            .len(),
        1,
        "{}",
        new.log()
    );
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let lane = indexer.lane("dc-a").await.expect("ListLanes");
        assert_eq!(
            (lane.lease_epoch, lane.incarnation),
            (recovered.lease_epoch, recovered.incarnation),
            "the stalled producer took the lane back: {lane:?}"
        );
        assert!(is_active(&lane), "{lane:?}");
    }
    wait_state(&old, &indexer, &["streaming"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_lane_leaves_the_ready_set_after_its_grace() {
    let dir = TestDir::new("supersession-grace");
    let spec = IndexerSpec {
        drain_grace_ms: 1_500,
        ..IndexerSpec::default()
    };
    let indexer = Indexer::start(&dir, &spec);
    let mut pool = HashPool::new(&format(), 24);
    let mut a = producer_a(&dir, "producer-a", &indexer);
    let mut b = Producer::start_dc(&dir, "dc-b", &[indexer.url()]);
    let held = pool.take(20);
    a.store(1, &held).await;
    b.store(1, &pool.take(5)).await;
    wait_converged(&indexer, &a).await;
    wait_converged(&indexer, &b).await;
    assert!(a.terminate().success());
    let lane = indexer.wait_lane("dc-a", "drained", |l| l.drained).await;
    // Ready during the grace, with the time left shown.
    if is_active(&lane) {
        let left = lane.drain_grace_remaining_ms.expect("grace remaining");
        assert!(left <= 1_500, "{lane:?}");
    }
    let lane = indexer
        .wait_lane("dc-a", "retired after the grace", |l| {
            l.state() == LaneState::Retired
        })
        .await;
    assert_eq!(
        lane.last_retire_reason(),
        RetireReason::DrainGraceExpired,
        "{lane:?}"
    );
    assert_eq!(lane.drain_grace_remaining_ms, None, "{lane:?}");
    // Queries no longer see it; the other DC is untouched.
    let depths = indexer.depths(&held).await.expect("FindMatches");
    assert_eq!(depths.get("dc-a"), None, "{depths:?}");
    assert!(depths.contains_key("dc-b"), "{depths:?}");
    let text = indexer.metrics().expect("metrics");
    let retired = metrics::value(
        &text,
        "ckf_indexer_lane_retirements_total",
        &[("dc", "dc-a"), ("reason", "drain_grace_expired")],
    );
    assert_eq!(retired, Some(1.0), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_lease_within_the_grace_keeps_the_lane() {
    let dir = TestDir::new("supersession-rolling");
    let spec = IndexerSpec {
        drain_grace_ms: 2_500,
        ..IndexerSpec::default()
    };
    let indexer = Indexer::start(&dir, &spec);
    let mut pool = HashPool::new(&format(), 25);
    let mut first = producer_a(&dir, "producer-a-1", &indexer);
    first.store(1, &pool.take(20)).await;
    wait_converged(&indexer, &first).await;
    assert!(first.terminate().success());
    let drained = indexer.wait_lane("dc-a", "drained", |l| l.drained).await;
    // When the first producer's grace would retire the lane (read after the indexer answered,
    // so at or after the real moment).
    let remaining = drained
        .drain_grace_remaining_ms
        .unwrap_or_else(|| panic!("a drained lane has a grace deadline: {drained:?}"));
    let grace_ends = tokio::time::Instant::now() + Duration::from_millis(remaining);
    // A rolling restart: the next producer attaches within the grace.
    let mut second = producer_a(&dir, "producer-a-2", &indexer);
    second.store(1, &pool.take(15)).await;
    let lane = wait_converged(&indexer, &second).await;
    assert_eq!(
        lane.drain_grace_remaining_ms, None,
        "the new lease ends the first one's grace: {lane:?}"
    );
    // A negative: the first producer's grace ending must not retire the second one's lane. No
    // event marks that nothing happened, so wait a second past the moment and look again.
    tokio::time::sleep_until(grace_ends + Duration::from_secs(1)).await;
    let later = wait_converged(&indexer, &second).await;
    assert_eq!(later.lease_epoch, lane.lease_epoch, "{later:?}");
    assert_eq!(later.retirements, 0, "{later:?}");
    assert_eq!(
        later.contention_count, 0,
        "a drained lane is vacant: {later:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_claiming_another_sequence_retires_the_lane_as_a_gap() {
    let dir = TestDir::new("supersession-heartbeat");
    let indexer = Indexer::start(&dir, &IndexerSpec::default());
    let mut pool = HashPool::new(&format(), 26);
    let hash = pool.take(1)[0];
    let mut s = relay::open(&indexer, attach("dc-b", 31, format()))
        .await
        .expect("attach accepted");
    let mut table = RawTable::new(&format());
    table.place(hash);
    assert!(s.snapshot(3, &table.words, 256).await.ready);
    // The right claim is fine. A stream's frames are handled one after the other, each to the
    // lane's verdict before the next is read: once the indexer has received the second of two
    // right claims, the first was accepted, and the lane is still active.
    let heartbeats = || {
        let text = indexer.metrics()?;
        Ok::<_, String>(
            metrics::value(
                &text,
                "ckf_indexer_relay_frames_received_total",
                &[("kind", "heartbeat")],
            )
            .unwrap_or(0.0),
        )
    };
    let before = heartbeats().expect("metrics");
    s.send(s.heartbeat_claiming(3)).await;
    s.send(s.heartbeat_claiming(3)).await;
    eventually("the second heartbeat received", DEADLINE, || async {
        let n = heartbeats()?;
        (n >= before + 2.0)
            .then_some(())
            .ok_or(format!("{} heartbeats received", n - before))
    })
    .await;
    assert!(is_active(&indexer.lane("dc-b").await.unwrap()));
    s.send(s.heartbeat_claiming(9)).await;
    let status = s
        .expect_retired_as(RetireReason::Gap, Code::FailedPrecondition)
        .await;
    assert!(
        status
            .message()
            .contains("heartbeat claims sequence 9 but installed sequence is 3"),
        "{status:?}"
    );
    let lane = indexer.lane("dc-b").await.unwrap();
    assert_eq!(lane.state(), LaneState::Retired, "{lane:?}");
    let depths = indexer.depths(&[hash]).await.expect("FindMatches");
    assert_eq!(depths.get("dc-b"), None, "{depths:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_if_vacant_attach_is_refused_naming_the_live_holder() {
    let dir = TestDir::new("supersession-if-vacant");
    let indexer = Indexer::start(&dir, &IndexerSpec::default());
    let mut pool = HashPool::new(&format(), 27);
    let hash = pool.take(1)[0];
    let mut holder = relay::open(&indexer, attach("dc-b", 41, format()))
        .await
        .expect("attach accepted");
    let mut table = RawTable::new(&format());
    table.place(hash);
    assert!(holder.snapshot(0, &table.words, 256).await.ready);
    let mut contender = attach("dc-b", 42, format());
    contender.mode = v1::AttachMode::IfVacant as i32;
    let status = relay::open(&indexer, contender.clone())
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    let named = format!(
        "incarnation {:#018x}, lease epoch {}",
        41, holder.lease.epoch
    );
    assert!(
        status.message().contains(&named),
        "{named} not in {status:?}"
    );
    assert_eq!(
        status
            .metadata()
            .get("ckf-attach-refused")
            .and_then(|v| v.to_str().ok()),
        Some("occupied"),
        "{status:?}"
    );
    // Nothing changed: the holder's lease and content answer, its stream goes on.
    let lane = indexer.lane("dc-b").await.unwrap();
    assert_eq!(
        (lane.incarnation, lane.lease_epoch),
        (41, holder.lease.epoch)
    );
    assert!(is_active(&lane), "{lane:?}");
    assert_eq!(lane.contention_count, 1, "{lane:?}");
    assert_eq!(lane.last_contender_incarnation, 42, "{lane:?}");
    let depths = indexer.depths(&[hash]).await.expect("FindMatches");
    assert_eq!(depths.get("dc-b"), Some(&1), "{depths:?}");
    holder.send(holder.heartbeat_claiming(0)).await;
    // Once the holder drains, the same attach is granted.
    holder.send(holder.drain(0)).await;
    assert!(holder.expect_ack().await.drained);
    let granted = relay::open(&indexer, contender).await.expect("vacant now");
    assert_eq!(granted.lease.epoch, holder.lease.epoch + 1);
}
