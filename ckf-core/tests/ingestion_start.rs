//! A lease granted while `IngestionWorkers` is still starting (its deadline keeper already
//! asleep, no lane having had a lease, and the lanes' workers not all spawned) is timed by the
//! keeper: the pool registers its consumer, whose grants then wake the keeper, before it starts
//! the workers. Its own test binary, so that no other test's threads share the names it looks
//! for. Linux only: it finds the threads in `/proc/self/task`.
#![cfg(target_os = "linux")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use ckf_core::addressing::TableFormat;
use ckf_core::global::{GlobalCkfIndexer, Manifest};
use ckf_core::identity::{IndexerDomainId, PoolId, ProducerIdentity, ProducerIncarnation};
use ckf_core::ingestion::{IngestionWorkers, IngestionWorkersConfig};
use ckf_core::lane::{LagPolicy, LaneState};

const LANES: usize = 64;

fn pool(dc: &str) -> PoolId {
    PoolId::new("prod", dc).unwrap()
}

fn format() -> TableFormat {
    TableFormat::new(64, 7).unwrap()
}

/// The id of this process's thread named `name`, if one runs.
fn thread_named(name: &str) -> Option<String> {
    std::fs::read_dir("/proc/self/task")
        .ok()?
        .flatten()
        .find_map(|t| {
            let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
            (comm.trim_end() == name).then(|| t.file_name().to_string_lossy().into_owned())
        })
}

/// Whether thread `tid` of this process is asleep (state `S`).
fn thread_sleeps(tid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.starts_with('S')))
        .unwrap_or(false)
}

/// Polls `found` until it gives a value (a bounded wait: panics naming `what` after 10 s).
fn wait_for<T>(what: &str, mut found: impl FnMut() -> Option<T>) -> T {
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(value) = found() {
            return value;
        }
        assert!(Instant::now() < give_up, "waited 10 s for {what}");
    }
}

#[test]
fn a_lease_granted_while_the_workers_start_is_timed() {
    let policy = LagPolicy {
        heartbeat_deadline: Some(Duration::from_millis(50)),
        apply_deadline: None,
        drain_grace: None,
    };
    let manifest = Manifest {
        domain: IndexerDomainId::new("prod").unwrap(),
        format: format(),
        lanes: (0..LANES).map(|i| pool(&format!("dc-{i}"))).collect(),
    };
    let producer = |incarnation| ProducerIdentity {
        pool: pool("dc-0"),
        incarnation: ProducerIncarnation(incarnation),
        format: format(),
    };
    let mut during_start = 0;
    for round in 0..20 {
        let ix =
            Arc::new(GlobalCkfIndexer::with_policy(manifest.clone(), 0xC0FFEE, policy).unwrap());
        let granter = {
            let ix = Arc::clone(&ix);
            std::thread::spawn(move || {
                // The keeper is spawned first: grant once it sleeps (no lease to time), while
                // the lanes' workers are still being spawned.
                let tid = wait_for("the keeper to start", || thread_named("ckf-deadlines"));
                wait_for("the keeper to sleep", || thread_sleeps(&tid).then_some(()));
                let last_not_spawned = thread_named(&format!("ckf-lane-{}", LANES - 1)).is_none();
                let lease = ix.grant_lease(&producer(round + 1)).unwrap();
                (lease, last_not_spawned)
            })
        };
        let workers = IngestionWorkers::new(
            Arc::clone(&ix),
            IngestionWorkersConfig {
                queue_capacity: 8,
                tick: Duration::from_millis(10),
            },
        );
        let (lease, last_not_spawned) = granter.join().unwrap();
        during_start += usize::from(last_not_spawned);
        // Far past the heartbeat deadline (50 ms) and many ticks (10 ms).
        std::thread::sleep(Duration::from_millis(300));
        let status = ix.lane_status(0).unwrap();
        assert_eq!(
            status.state,
            LaneState::Retired,
            "round {round}: lease {lease:?} granted while the workers started (the last one \
             not spawned yet: {last_not_spawned}) was never timed"
        );
        drop(workers);
    }
    // The race was provoked at least once (else the test proved nothing).
    assert!(
        during_start > 0,
        "no grant landed while the workers started"
    );
}
