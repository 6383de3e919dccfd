//! One `DeadlineKeeper` shared by the pools of several consumers (an indexer's domains): one
//! thread times them all, a grant in any of them wakes it, so does a pool that registers with a
//! lease granted already, a pool that stops leaves it (and its grants no longer wake it), and
//! the thread stops with the last handle. Its own test binary, so that no other test's keepers
//! share the thread name it counts. Linux only: it finds the threads in `/proc/self/task`.
#![cfg(target_os = "linux")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use ckf_core::addressing::TableFormat;
use ckf_core::global::{GlobalCkfIndexer, Manifest};
use ckf_core::identity::{IndexerDomainId, PoolId, ProducerIdentity, ProducerIncarnation};
use ckf_core::ingestion::{DeadlineKeeper, IngestionWorkers, IngestionWorkersConfig};
use ckf_core::lane::{LagPolicy, LaneEventKind, LaneState, RetireReason};

const KEEPER: &str = "ckf-deadlines";

fn format() -> TableFormat {
    TableFormat::new(64, 7).unwrap()
}

/// A consumer of domain `domain` with two lanes (`dc-0`, `dc-1`) and a 50 ms heartbeat
/// deadline.
fn consumer(domain: &str) -> Arc<GlobalCkfIndexer> {
    let manifest = Manifest {
        domain: IndexerDomainId::new(domain).unwrap(),
        format: format(),
        lanes: ["dc-0", "dc-1"]
            .iter()
            .map(|dc| PoolId::new(domain, dc).unwrap())
            .collect(),
    };
    let policy = LagPolicy {
        heartbeat_deadline: Some(Duration::from_millis(50)),
        apply_deadline: None,
        drain_grace: None,
    };
    Arc::new(GlobalCkfIndexer::with_policy(manifest, 0xC0FFEE, policy).unwrap())
}

fn producer(domain: &str, incarnation: u64) -> ProducerIdentity {
    ProducerIdentity {
        pool: PoolId::new(domain, "dc-1").unwrap(),
        incarnation: ProducerIncarnation(incarnation),
        format: format(),
    }
}

/// The ids of this process's threads named `name`.
fn threads_named(name: &str) -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter_map(|t| {
            let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
            (comm.trim_end() == name).then(|| t.file_name().to_string_lossy().into_owned())
        })
        .collect()
}

/// Whether thread `tid` of this process is asleep (state `S`).
fn thread_sleeps(tid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.starts_with('S')))
        .unwrap_or(false)
}

/// How many times thread `tid` of this process was scheduled (`schedstat`'s third field).
fn times_run(tid: &str) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).unwrap();
    stat.split_whitespace().nth(2).unwrap().parse().unwrap()
}

/// Polls `done` until it holds (a bounded wait: panics naming `what` after 10 s).
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let give_up = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < give_up, "waited 10 s for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn one_keeper_times_the_lanes_of_every_pool_it_is_given() {
    let keeper = DeadlineKeeper::start(Duration::from_millis(10)).unwrap();
    let config = IngestionWorkersConfig {
        queue_capacity: 8,
        ..IngestionWorkersConfig::default()
    };
    let domains = ["alpha", "beta", "gamma"];
    let consumers: Vec<_> = domains.iter().map(|d| consumer(d)).collect();
    let pools: Vec<_> = consumers
        .iter()
        .map(|c| IngestionWorkers::start_on(Arc::clone(c), config, &keeper).unwrap())
        .collect();
    assert_eq!(keeper.consumers(), 3);
    // A spawned thread names itself once it runs.
    wait_until("the keeper's thread to be named", || {
        !threads_named(KEEPER).is_empty()
    });
    let keepers = threads_named(KEEPER);
    assert_eq!(keepers.len(), 1, "one keeper thread for three pools");
    let events: Vec<_> = pools.iter().map(|p| p.subscribe(1).unwrap()).collect();

    // No lease anywhere: the keeper sleeps. Each silent producer's grant alone must wake it
    // (whichever consumer granted), and it retires that lease one deadline later, then sleeps
    // again before the next consumer's grant.
    for (i, domain) in domains.iter().enumerate() {
        wait_until("the keeper to sleep", || thread_sleeps(&keepers[0]));
        std::thread::sleep(Duration::from_millis(50));
        assert!(thread_sleeps(&keepers[0]), "the keeper ticks with no lease");
        let lease = consumers[i].grant_lease(&producer(domain, 1)).unwrap();
        let ev = events[i].recv_timeout(Duration::from_secs(30)).unwrap();
        assert_eq!(ev.lease, lease, "{domain}");
        assert!(
            matches!(
                ev.kind,
                LaneEventKind::Retired(RetireReason::HeartbeatTimeout { .. })
            ),
            "{domain}: {ev:?}"
        );
        for (j, other) in consumers.iter().enumerate().skip(i + 1) {
            assert_eq!(
                other.lane_status(1).unwrap().state,
                LaneState::Unassigned,
                "{}: a later domain's lane moved",
                domains[j]
            );
        }
    }

    // A lease granted before its consumer's pool registers (nothing to wake then), the keeper
    // asleep: the registration wakes it, and the lease is retired one deadline later.
    let mut pools = pools;
    wait_until("the keeper to sleep", || thread_sleeps(&keepers[0]));
    let late = consumer("delta");
    let late_events = late.subscribe(1).unwrap();
    let lease = late.grant_lease(&producer("delta", 1)).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        thread_sleeps(&keepers[0]),
        "woken before any pool had the lease"
    );
    pools.push(IngestionWorkers::start_on(Arc::clone(&late), config, &keeper).unwrap());
    let ev = late_events.recv_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(ev.lease, lease);
    assert!(
        matches!(
            ev.kind,
            LaneEventKind::Retired(RetireReason::HeartbeatTimeout { .. })
        ),
        "delta: {ev:?}"
    );

    // A pool that stops leaves the keeper (which no longer holds its consumer); the others
    // stay timed.
    drop(pools.remove(0));
    assert_eq!(keeper.consumers(), 3);
    assert_eq!(
        Arc::strong_count(&consumers[0]),
        1,
        "the keeper still holds the stopped pool's consumer"
    );
    let lease = consumers[2].grant_lease(&producer("gamma", 2)).unwrap();
    let ev = events[2].recv_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(ev.lease, lease);
    // Nor do the stopped pool's grants wake it (the keeper's sender left that consumer).
    wait_until("the keeper to sleep", || thread_sleeps(&keepers[0]));
    std::thread::sleep(Duration::from_millis(50));
    let runs = times_run(&keepers[0]);
    consumers[0].grant_lease(&producer("alpha", 2)).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        times_run(&keepers[0]),
        runs,
        "woken by a stopped pool's grant"
    );

    // The thread lives while a pool or a handle does, and stops with the last.
    drop(keeper);
    assert_eq!(
        threads_named(KEEPER).len(),
        1,
        "stopped under running pools"
    );
    drop(pools);
    wait_until("the keeper's thread to end", || {
        threads_named(KEEPER).is_empty()
    });
}
