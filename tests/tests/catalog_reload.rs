//! Catalog reloads against the real binaries: a `ckf-indexer` adds a domain on SIGHUP (its
//! producer, refused until then, attaches and is answered, and one deadline keeper thread times
//! both domains), removes it on the next (its producer's stream ends `REMOVED` and its attaches
//! are refused again), adds it back as a new consumer whose first lease the producer takes, and
//! the primary domain's lane keeps its lease, readiness and answers throughout; after `kill -9`
//! the indexer starts with the file's catalog.

use std::time::Duration;

use ckf_e2e::cluster::{
    DOMAIN, Indexer, IndexerSpec, Producer, ProducerSpec, TestDir, channel, format,
};
use ckf_e2e::hashes::HashPool;
use ckf_e2e::wait::{DEADLINE, eventually};
use ckf_proto::v1::{self, query_client::QueryClient};

/// The added domain: its producers must use the same table format as the primary's (the
/// entry has no table of its own).
const QWEN: &str = "\n[[domains]]\ndomain = \"qwen\"\nlanes = [\"dc-a\"]\n";

/// `ListLanes` of `domain` at `indexer`, or the status text.
async fn lanes_of(indexer: &Indexer, domain: &str) -> Result<v1::ListLanesResponse, String> {
    let mut client = QueryClient::new(channel(indexer.addr).await?);
    let mut request = tonic::Request::new(v1::ListLanesRequest {});
    request
        .metadata_mut()
        .insert(ckf_proto::metadata::DOMAIN_KEY, domain.parse().unwrap());
    client
        .list_lanes(request)
        .await
        .map(tonic::Response::into_inner)
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
}

/// Depth of lane 0 of `domain` for `hashes`, if that lane is ready.
async fn depth_in(indexer: &Indexer, domain: &str, hashes: &[u64]) -> Result<Option<u32>, String> {
    let mut client = QueryClient::new(channel(indexer.addr).await?);
    let mut request = tonic::Request::new(v1::FindMatchesRequest {
        block_hashes: hashes.to_vec(),
    });
    request
        .metadata_mut()
        .insert(ckf_proto::metadata::DOMAIN_KEY, domain.parse().unwrap());
    let answer = client
        .find_matches(request)
        .await
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?
        .into_inner();
    Ok(answer.matches.iter().find(|m| m.lane == 0).map(|m| m.depth))
}

async fn qwen_lane_active(indexer: &Indexer) -> Result<(), String> {
    let lanes = lanes_of(indexer, "qwen").await?;
    match lanes.lanes[0].state() {
        v1::LaneState::Active => Ok(()),
        state => Err(format!("qwen/dc-a is {state:?}")),
    }
}

async fn qwen_removed(indexer: &Indexer) -> Result<(), String> {
    match lanes_of(indexer, "qwen").await {
        Err(refused) if refused.contains("NotFound") => Ok(()),
        other => Err(format!("{other:?}")),
    }
}

/// How many threads of process `pid` are named `name` (Linux: `/proc/PID/task/*/comm`).
fn threads_named(pid: u32, name: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim_end() == name)
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_adds_and_removes_a_domain_and_the_primary_lane_is_untouched() {
    let dir = TestDir::new("catalog_reload");
    let mut indexer = Indexer::start(
        &dir,
        &IndexerSpec {
            lanes: vec!["dc-a".into()],
            // SIGHUP only: the file watch would reload as soon as the file changes.
            extra_toml: "config_watch_interval_ms = 0\n".into(),
            ..IndexerSpec::default()
        },
    );
    let mut primary = Producer::start_dc(&dir, "dc-a", &[indexer.url()]);
    let qwen_spec = ProducerSpec {
        args: vec!["--domain".into(), "qwen".into()],
        ..ProducerSpec::new("dc-a")
    };
    let mut qwen = Producer::start(&dir, "producer-qwen", &qwen_spec, &[indexer.url()]);
    let mut pool = HashPool::new(&format(), 1);
    let shared = pool.take(8);
    let more = pool.take(4);
    primary.store(1, &shared).await;
    qwen.store(1, &shared[..3]).await;
    let lane = indexer
        .wait_lane("dc-a", "active with its 8 blocks", |l| {
            l.state() == v1::LaneState::Active && l.installed_sequence >= 1
        })
        .await;
    assert_eq!(indexer.depths(&shared).await.unwrap()["dc-a"], 8);
    // Not served yet: its producer is refused (and keeps retrying).
    let refused = lanes_of(&indexer, "qwen").await.unwrap_err();
    assert!(refused.contains("NotFound"), "{refused}");

    // Added on SIGHUP: the producer's next attach is granted and its snapshot answered.
    let config = indexer.config_path().to_owned();
    let original = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("{original}{QWEN}")).unwrap();
    indexer.signal(libc::SIGHUP);
    eventually("qwen/dc-a active after SIGHUP", DEADLINE, || {
        qwen_lane_active(&indexer)
    })
    .await;
    assert_eq!(depth_in(&indexer, "qwen", &shared).await.unwrap(), Some(3));
    assert_eq!(depth_in(&indexer, DOMAIN, &shared).await.unwrap(), Some(8));
    // Both domains' leased lanes are timed by the process's one deadline keeper.
    assert_eq!(threads_named(indexer.pid(), "ckf-deadlines"), 1);
    let first_qwen = lanes_of(&indexer, "qwen").await.unwrap().consumer_instance;

    // Removed on the next SIGHUP: qwen's calls are refused, its producer retired as REMOVED.
    std::fs::write(&config, &original).unwrap();
    indexer.signal(libc::SIGHUP);
    eventually("qwen removed after SIGHUP", DEADLINE, || {
        qwen_removed(&indexer)
    })
    .await;
    eventually("producer-qwen told REMOVED", DEADLINE, || async {
        let text = qwen.metrics()?;
        text.contains("retired_removed")
            .then_some(())
            .ok_or_else(|| "no retired_removed failure counted yet".to_owned())
    })
    .await;

    // Added back: a new consumer (its lease epochs start again), whose first lease the
    // producer takes at once, although it still holds the removed domain's.
    std::fs::write(&config, format!("{original}{QWEN}")).unwrap();
    indexer.signal(libc::SIGHUP);
    eventually("qwen/dc-a active after it was added back", DEADLINE, || {
        qwen_lane_active(&indexer)
    })
    .await;
    assert_ne!(
        lanes_of(&indexer, "qwen").await.unwrap().consumer_instance,
        first_qwen
    );
    let log = qwen.log();
    assert!(!log.contains("refused the lease"), "{log}");
    std::fs::write(&config, &original).unwrap();
    indexer.signal(libc::SIGHUP);
    eventually("qwen removed again", DEADLINE, || qwen_removed(&indexer)).await;

    // The primary's lane: same lease, never retired, still answering, still taking deltas.
    let after = indexer.lane("dc-a").await.unwrap();
    assert_eq!(
        (after.lease_epoch, after.retirements, after.state()),
        (lane.lease_epoch, 0, v1::LaneState::Active)
    );
    primary.store(2, &more).await;
    eventually("the primary's next delta applied", DEADLINE, || async {
        let depths = indexer.depths(&more).await?;
        (depths.get("dc-a") == Some(&4))
            .then_some(())
            .ok_or_else(|| format!("{depths:?}"))
    })
    .await;
    let log = indexer.log();
    assert!(log.contains("catalog reloaded"), "{log}");

    // kill -9 with qwen in the file: the restarted indexer serves both from the start.
    std::fs::write(&config, format!("{original}{QWEN}")).unwrap();
    indexer.kill9();
    indexer.restart();
    eventually("qwen/dc-a active after restart", DEADLINE, || {
        qwen_lane_active(&indexer)
    })
    .await;
    indexer
        .wait_lane("dc-a", "active after restart", |l| {
            l.state() == v1::LaneState::Active
        })
        .await;
    tokio::time::sleep(Duration::from_millis(10)).await;
}
