//! Catalog reloads: an indexer started from a configuration file adds and removes whole
//! domains while it runs (`Admin/ReloadCatalog`, the file watch), refuses a change that breaks a
//! rule whole, and never touches the lanes or answers of the domains it keeps.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use ckf_core::addressing::TableFormat;
use ckf_core::identity::{PoolId, ProducerIdentity, ProducerIncarnation};
use ckf_proto::v1::{self, admin_client::AdminClient};
use clap::Parser;
use common::*;
use indexer_svc::router::RouteQuery;
use tonic::Code;

const TOKEN: &str = "admin.0123456789abcdef";

/// A configuration file of the primary domain `test` (dc-a, dc-b) plus `extra` TOML, with the
/// admin token of `dir` and the file watch every `watch_ms` (0: off).
struct Files {
    dir: tempfile::TempDir,
    watch_ms: u64,
    /// `manifest.spare_lanes`.
    spare: u32,
}

impl Files {
    fn new(watch_ms: u64) -> Self {
        Self::with_spare(watch_ms, 0)
    }

    fn with_spare(watch_ms: u64, spare: u32) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("admin.token"), format!("{TOKEN}\n")).unwrap();
        Self {
            dir,
            watch_ms,
            spare,
        }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("indexer.toml")
    }

    /// Writes the file with `extra` appended (a `[[domains]]` entry, a changed key).
    fn write(&self, extra: &str) {
        self.write_lanes(&["dc-a", "dc-b"], extra);
    }

    /// Writes the file with the primary domain's `lanes` and `extra` appended.
    fn write_lanes(&self, lanes: &[&str], extra: &str) {
        let token = self.dir.path().join("admin.token");
        let lanes = lanes
            .iter()
            .map(|l| format!("{l:?}"))
            .collect::<Vec<_>>()
            .join(", ");
        let text = format!(
            "listen = \"127.0.0.1:0\"\nmetrics_listen = \"127.0.0.1:0\"\n\
             config_watch_interval_ms = {}\n\
             [manifest]\ndomain = \"{DOMAIN}\"\nlanes = [{lanes}]\nspare_lanes = {}\n\
             [table]\nbucket_count = {BUCKETS}\n\
             [lag]\nheartbeat_deadline_ms = 60000\ndirty_to_applied_deadline_ms = 60000\n\
             [limits]\nmax_message_bytes = 65536\n\
             [auth]\nadmin_token_file = {token:?}\n{extra}",
            self.watch_ms, self.spare
        );
        // Written whole then renamed: the watch never reads half a file.
        let staging = self.dir.path().join("indexer.toml.new");
        std::fs::write(&staging, text).unwrap();
        std::fs::rename(&staging, self.path()).unwrap();
    }

    fn cli(&self) -> indexer_svc::Cli {
        indexer_svc::Cli::parse_from(["ckf-indexer", "--config", self.path().to_str().unwrap()])
    }
}

/// The `qwen` domain (dc-a, dc-c; 2,048 buckets) as a `[[domains]]` entry.
const QWEN: &str = "[[domains]]\ndomain = \"qwen\"\nlanes = [\"dc-a\", \"dc-c\"]\n\
                    [domains.table]\nbucket_count = 2048\n";

fn qwen(dc: &str, incarnation: u64) -> ProducerIdentity {
    ProducerIdentity {
        pool: PoolId::new("qwen", dc).unwrap(),
        incarnation: ProducerIncarnation(incarnation),
        format: TableFormat::new(2048, 0).unwrap(),
    }
}

fn with_token<T>(request: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(request);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
}

async fn reload(
    indexer: &Indexer,
    dry_run: bool,
) -> Result<v1::ReloadCatalogResponse, tonic::Status> {
    AdminClient::new(indexer.channel.clone())
        .reload_catalog(with_token(v1::ReloadCatalogRequest { dry_run }, TOKEN))
        .await
        .map(tonic::Response::into_inner)
}

/// `ListLanes` of `domain`, or its status.
async fn lanes_of(indexer: &Indexer, domain: &str) -> Result<v1::ListLanesResponse, tonic::Status> {
    let mut request = tonic::Request::new(v1::ListLanesRequest {});
    request
        .metadata_mut()
        .insert(ckf_proto::metadata::DOMAIN_KEY, domain.parse().unwrap());
    indexer
        .query()
        .list_lanes(request)
        .await
        .map(tonic::Response::into_inner)
}

/// `(lane, depth)` per ready lane of `domain` for `hashes`, or the status.
async fn find_in(
    indexer: &Indexer,
    domain: &str,
    hashes: &[u64],
) -> Result<Vec<(u32, u32)>, tonic::Status> {
    let mut request = tonic::Request::new(v1::FindMatchesRequest {
        block_hashes: hashes.to_vec(),
    });
    request
        .metadata_mut()
        .insert(ckf_proto::metadata::DOMAIN_KEY, domain.parse().unwrap());
    let answer = indexer.query().find_matches(request).await?.into_inner();
    Ok(answer.matches.iter().map(|m| (m.lane, m.depth)).collect())
}

fn names(list: &[String]) -> Vec<&str> {
    list.iter().map(String::as_str).collect()
}

#[tokio::test]
async fn domains_are_added_and_removed_while_the_kept_ones_answer_unchanged() {
    let files = Files::new(0);
    files.write("");
    let indexer = Arc::new(Indexer::start_from(files.cli()).await);
    let shared = hashes(1, 6);
    let mut a = Producer::attach(&indexer, "dc-a", 1).await;
    a.store(1, &shared);
    a.snapshot(8192).await;
    let before = indexer.lane(0).await;

    // Query load on the kept domain during every reload below: every answer must be its own.
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let load = tokio::spawn({
        let (indexer, stop, answered, shared) = (
            Arc::clone(&indexer),
            Arc::clone(&stop),
            Arc::clone(&answered),
            shared.clone(),
        );
        async move {
            while !stop.load(Ordering::Relaxed) {
                assert_eq!(indexer.find(&shared).await, (vec![(0, 6)], 0b01));
                assert_eq!(find_in(&indexer, DOMAIN, &shared).await.unwrap(), [(0, 6)]);
                answered.fetch_add(1, Ordering::Relaxed);
            }
        }
    });

    // A dry run plans and changes nothing.
    files.write(QWEN);
    let planned = reload(&indexer, true).await.unwrap();
    assert_eq!(
        (names(&planned.added), names(&planned.kept), planned.applied),
        (vec!["qwen"], vec![DOMAIN], false)
    );
    let status = lanes_of(&indexer, "qwen").await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");

    // Added: its lanes wait for their producers; a producer attaches and is answered.
    let added = reload(&indexer, false).await.unwrap();
    assert_eq!((names(&added.added), added.applied), (vec!["qwen"], true));
    let listed = lanes_of(&indexer, "qwen").await.unwrap();
    assert_eq!(listed.format.unwrap().bucket_count, 2048);
    assert_eq!(listed.lanes[1].pool.as_ref().unwrap().dc, "dc-c");
    assert!(
        listed
            .lanes
            .iter()
            .all(|l| !matches!(l.state(), v1::LaneState::Active))
    );
    let mut q = Producer::attach_as(&indexer, qwen("dc-c", 2)).await;
    q.store(1, &shared[..2]);
    q.snapshot(8192).await;
    assert_eq!(find_in(&indexer, "qwen", &shared).await.unwrap(), [(1, 2)]);
    // The same list again: nothing to do.
    let same = reload(&indexer, false).await.unwrap();
    assert!(!same.applied && same.added.is_empty() && same.removed.is_empty());

    // Removed: its producer's stream ends REMOVED + NOT_FOUND, its calls are refused.
    files.write("");
    let removed = reload(&indexer, false).await.unwrap();
    assert_eq!(
        (names(&removed.removed), names(&removed.kept)),
        (vec!["qwen"], vec![DOMAIN])
    );
    let status = q
        .stream
        .expect_retired_as(v1::RetireReason::Removed, Code::NotFound)
        .await;
    assert_status(&status, Code::NotFound, &["domain qwen was removed"]);
    let status = find_in(&indexer, "qwen", &shared).await.unwrap_err();
    assert_status(&status, Code::NotFound, &["domain qwen is not served here"]);
    let status = refused(&indexer, (&qwen("dc-a", 3)).into()).await;
    assert_status(&status, Code::NotFound, &["pool qwen/dc-a"]);

    // The kept domain: same lease, sequence, state and retirements; its stream goes on.
    stop.store(true, Ordering::Relaxed);
    load.await
        .expect("every answer of the kept domain was its own");
    assert!(answered.load(Ordering::Relaxed) > 0);
    let after = indexer.lane(0).await;
    assert_eq!(
        (
            after.lease_epoch,
            after.installed_sequence,
            after.retirements,
            after.state()
        ),
        (
            before.lease_epoch,
            before.installed_sequence,
            0,
            v1::LaneState::Active
        )
    );
    a.store(2, &hashes(2, 3));
    assert_eq!(a.publish().await.installed_sequence, 1);

    let metrics = wait_metrics(
        &indexer,
        &[
            r#"ckf_indexer_catalog_reloads_total{result="applied"} 2"#,
            r#"ckf_indexer_catalog_reloads_total{result="dry_run"} 1"#,
            r#"ckf_indexer_catalog_reloads_total{result="unchanged"} 1"#,
            "ckf_indexer_domains 1",
            r#"ckf_indexer_lane_ready{dc="dc-a",domain="test",lane="0"} 1"#,
        ],
    )
    .await;
    assert!(
        !metrics.contains(r#"ckf_indexer_lane_ready{dc="dc-c",domain="qwen""#),
        "a removed domain's lane gauges are withdrawn:\n{metrics}"
    );
}

#[tokio::test]
async fn a_change_breaking_a_rule_is_refused_whole_and_names_it() {
    let files = Files::new(0);
    files.write("");
    let indexer = Indexer::start_from(files.cli()).await;
    let refused_with = |extra: &str| {
        files.write(extra);
        reload(&indexer, false)
    };
    for (extra, says) in [
        // One good domain and one bad: neither is added.
        (
            format!("{QWEN}[[domains]]\ndomain = \"bad\"\nlanes = [\"dc a\"]\n"),
            "domains[1].lanes[0] = dc a",
        ),
        (
            "[[domains]]\ndomain = \"test\"\nlanes = [\"dc-z\"]\n".to_owned(),
            "domains[0].domain = test: is configured twice",
        ),
        (
            "[route]\ndefault_rtt_ms = 7.0\n".to_owned(),
            "route changed, and it takes a restart",
        ),
    ] {
        let status = refused_with(&extra).await.unwrap_err();
        assert_status(
            &status,
            Code::FailedPrecondition,
            &["nothing changed", says],
        );
    }
    // A new DC needs a spare lane slot (none reserved here); the primary's table, block size
    // and spare slots stay; so does its name.
    files.write_lanes(&["dc-a", "dc-b", "dc-x"], "");
    let status = reload(&indexer, false).await.unwrap_err();
    assert_status(
        &status,
        Code::FailedPrecondition,
        &[
            "domain test is served",
            "lanes [dc-a, dc-b] -> [dc-a, dc-b, dc-x]: 1 new lane(s) but 0 spare lane slot(s) left",
        ],
    );
    let path = files.path();
    let rewrite = |from: &str, to: &str| {
        let text = std::fs::read_to_string(&path).unwrap().replace(from, to);
        std::fs::write(&path, text).unwrap();
    };
    for ((from, to), says) in [
        (("spare_lanes = 0", "spare_lanes = 2"), "spare_lanes 0 -> 2"),
        (
            ("[manifest]", "block_size = 32\n[manifest]"),
            "block_size 16 -> 32",
        ),
        (("bucket_count = 1024", "bucket_count = 2048"), "table ["),
        (
            ("domain = \"test\"", "domain = \"other\""),
            "the primary domain is test",
        ),
    ] {
        files.write("");
        rewrite(from, to);
        let status = reload(&indexer, false).await.unwrap_err();
        assert_status(&status, Code::FailedPrecondition, &[says]);
    }
    // A file that is not TOML.
    std::fs::write(&path, "[manifest\n").unwrap();
    let status = reload(&indexer, false).await.unwrap_err();
    assert_status(
        &status,
        Code::FailedPrecondition,
        &["the configuration is refused"],
    );

    // Nothing changed: one domain, its lanes as configured at start.
    files.write("");
    assert_eq!(indexer.lanes().await.lanes.len(), 2);
    assert_eq!(
        lanes_of(&indexer, "qwen").await.unwrap_err().code(),
        Code::NotFound
    );
    let metrics = metrics_text(&indexer).await;
    assert!(
        metrics.contains(r#"ckf_indexer_catalog_reloads_total{result="refused"} 9"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn the_admin_service_needs_its_token_and_a_configuration_source() {
    let files = Files::new(0);
    files.write("");
    let indexer = Indexer::start_from(files.cli()).await;
    let status = AdminClient::new(indexer.channel.clone())
        .reload_catalog(with_token(
            v1::ReloadCatalogRequest::default(),
            "wrong.0123456789abcdef",
        ))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    let status = AdminClient::new(indexer.channel.clone())
        .reload_catalog(v1::ReloadCatalogRequest::default())
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");

    // Without auth.admin_token_file the service is off.
    let off = Indexer::start(config(&["dc-a"])).await;
    let status = reload(&off, false).await.unwrap_err();
    assert_status(
        &status,
        Code::PermissionDenied,
        &["set auth.admin_token_file"],
    );

    // Started with a configuration value: nothing to re-read.
    let mut cfg = config(&["dc-a"]);
    cfg.auth.admin_token_file = Some(files.dir.path().join("admin.token"));
    let value = Indexer::start(cfg).await;
    let status = reload(&value, false).await.unwrap_err();
    assert_status(&status, Code::Unimplemented, &["nothing to reload"]);
}

#[tokio::test]
async fn a_changed_file_is_reloaded_by_the_watch() {
    let files = Files::new(100);
    files.write("");
    let indexer = Indexer::start_from(files.cli()).await;
    files.write(QWEN);
    wait_for(&indexer, "qwen", true).await;
    files.write("");
    wait_for(&indexer, "qwen", false).await;
}

/// Polls until `domain` is served (or not), bounded (not a timing assertion).
async fn wait_for(indexer: &Indexer, domain: &str, served: bool) {
    for _ in 0..500 {
        if lanes_of(indexer, domain).await.is_ok() == served {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("domain {domain} never became served = {served}");
}

#[tokio::test]
async fn lanes_are_removed_and_added_in_a_kept_domain_while_the_others_answer_unchanged() {
    let files = Files::with_spare(0, 1);
    files.write("");
    let indexer = Arc::new(Indexer::start_from(files.cli()).await);
    assert_eq!(
        indexer.lanes().await.lanes.len(),
        2,
        "a spare slot is not listed"
    );
    let shared = hashes(1, 6);
    let mut a = Producer::attach(&indexer, "dc-a", 1).await;
    a.store(1, &shared);
    a.snapshot(8192).await;
    let mut b = Producer::attach(&indexer, "dc-b", 2).await;
    b.store(1, &shared[..2]);
    b.snapshot(8192).await;
    let before = indexer.lane(0).await;

    // Query load: dc-a answers its 6 blocks in every answer, whatever happens to the others,
    // and no query sent after dc-b's removal returned (until it is added back) answers lane 1.
    let stop = Arc::new(AtomicBool::new(false));
    let b_removed = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn({
        let (indexer, stop, b_removed, shared) = (
            Arc::clone(&indexer),
            Arc::clone(&stop),
            Arc::clone(&b_removed),
            shared.clone(),
        );
        async move {
            let mut answered = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let removed_before = b_removed.load(Ordering::SeqCst);
                let (found, mask) = indexer.find(&shared).await;
                assert_eq!(found.first(), Some(&(0, 6)), "{found:?}");
                if removed_before && b_removed.load(Ordering::SeqCst) {
                    assert_eq!(mask & 0b010, 0, "a removed lane answered: {found:?}");
                }
                answered += 1;
            }
            answered
        }
    });

    // dc-b out, dc-c in (on the spare slot, lane 2).
    files.write_lanes(&["dc-a", "dc-c"], "");
    let changed = reload(&indexer, false).await.unwrap();
    assert_eq!(
        (
            names(&changed.lanes_removed),
            names(&changed.lanes_added),
            changed.applied
        ),
        (vec!["test/dc-b"], vec!["test/dc-c"], true)
    );
    b_removed.store(true, Ordering::SeqCst);
    let status = b
        .stream
        .expect_retired_as(v1::RetireReason::Removed, Code::NotFound)
        .await;
    assert_status(&status, Code::NotFound, &["removed"]);
    assert_eq!(indexer.find(&shared).await, (vec![(0, 6)], 0b001));
    let status = refused(&indexer, (&identity("dc-b", 3, format())).into()).await;
    assert_status(&status, Code::NotFound, &["test/dc-b is not a lane"]);
    let mut c = Producer::attach(&indexer, "dc-c", 4).await;
    assert_eq!(c.lease.lane, 2);
    c.store(1, &shared[..4]);
    c.snapshot(8192).await;
    assert_eq!(indexer.find(&shared).await, (vec![(0, 6), (2, 4)], 0b101));
    let listed: Vec<(u32, String)> = indexer
        .lanes()
        .await
        .lanes
        .iter()
        .map(|l| (l.lane, l.pool.as_ref().unwrap().dc.clone()))
        .collect();
    assert_eq!(listed, [(0, "dc-a".to_owned()), (2, "dc-c".to_owned())]);

    // dc-b back: on its own lane 1 (no spare slot needed), ready after its new snapshot.
    b_removed.store(false, Ordering::SeqCst);
    files.write_lanes(&["dc-a", "dc-b", "dc-c"], "");
    let back = reload(&indexer, false).await.unwrap();
    assert_eq!(names(&back.lanes_added), ["test/dc-b"]);
    let mut b = Producer::attach(&indexer, "dc-b", 5).await;
    assert_eq!(b.lease.lane, 1);
    b.store(1, &shared[..1]);
    b.snapshot(8192).await;
    assert_eq!(
        indexer.find(&shared).await,
        (vec![(0, 6), (1, 1), (2, 4)], 0b111)
    );
    // Every slot used: a fourth DC is refused whole.
    files.write_lanes(&["dc-a", "dc-b", "dc-c", "dc-d"], "");
    let status = reload(&indexer, false).await.unwrap_err();
    assert_status(
        &status,
        Code::FailedPrecondition,
        &["0 spare lane slot(s) left"],
    );

    stop.store(true, Ordering::Relaxed);
    assert!(load.await.expect("dc-a answered in every answer") > 0);
    let after = indexer.lane(0).await;
    assert_eq!(
        (after.lease_epoch, after.retirements, after.state()),
        (before.lease_epoch, 0, v1::LaneState::Active)
    );
    // The lane watchers count the retirement asynchronously.
    wait_metrics(
        &indexer,
        &[
            r#"ckf_indexer_lane_retirements_total{dc="dc-b",domain="test",lane="1",reason="removed"} 1"#,
            r#"ckf_indexer_lane_ready{dc="dc-b",domain="test",lane="1"} 1"#,
            r#"ckf_indexer_lane_ready{dc="dc-c",domain="test",lane="2"} 1"#,
        ],
    )
    .await;
}

#[tokio::test]
async fn a_grant_taken_away_by_a_reload_ends_the_attached_stream_and_retires_its_lane() {
    let files = Files::new(0);
    let token = files.dir.path().join("dc-a.token");
    std::fs::write(&token, "producer.a.0123456789\n").unwrap();
    let grant = |pools: &str| {
        format!(
            "required = true\n[[auth.producers]]\nname = \"dc-a\"\npools = [{pools}]\n\
             token_file = {token:?}\n"
        )
    };
    // The [auth] keys follow `admin_token_file` in the [auth] section the file ends with.
    files.write(&grant("\"dc-a\", \"dc-b\""));
    let indexer = Indexer::start_from(files.cli()).await;
    let mut a = Producer::attach_with_token(
        &indexer,
        identity("dc-a", 1, format()),
        Some("producer.a.0123456789"),
    )
    .await;
    a.store(1, &hashes(1, 3));
    a.snapshot(8192).await;
    let mut b = Producer::attach_with_token(
        &indexer,
        identity("dc-b", 2, format()),
        Some("producer.a.0123456789"),
    )
    .await;
    b.store(1, &hashes(1, 2));
    b.snapshot(8192).await;
    assert_eq!(
        indexer.find(&hashes(1, 3)).await,
        (vec![(0, 3), (1, 2)], 0b11)
    );

    // dc-b's grant goes: its stream ends PERMISSION_DENIED and its lane leaves the ready set;
    // dc-a, still granted, goes on.
    files.write(&grant("\"dc-a\""));
    reload(&indexer, false).await.unwrap();
    let (retired, status) = b.stream.expect_retired().await;
    assert_eq!(
        retired.reason(),
        v1::RetireReason::StreamLost,
        "{retired:?}"
    );
    assert_status(
        &status,
        Code::PermissionDenied,
        &["revoked by a catalog reload", "dc-b"],
    );
    assert_eq!(indexer.find(&hashes(1, 3)).await, (vec![(0, 3)], 0b01));
    a.store(2, &hashes(2, 2));
    assert_eq!(a.publish().await.installed_sequence, 1);
    let status = refused(&indexer, (&identity("dc-b", 3, format())).into()).await;
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
}

#[tokio::test]
async fn a_domain_added_and_removed_at_once_leaves_no_series_behind() {
    let files = Files::new(0);
    files.write("");
    let indexer = Indexer::start_from(files.cli()).await;
    let ghost = "[[domains]]\ndomain = \"ghost\"\nlanes = [\"dc-a\", \"dc-b\", \"dc-c\"]\n";
    files.write(ghost);
    let with_ghost = files.cli().load().unwrap();
    files.write("");
    let without = files.cli().load().unwrap();
    for _ in 0..30 {
        // Added and removed with no await between: the new lane watchers first run after the
        // removal (this test's runtime has one thread).
        let running = &indexer.running;
        assert!(
            running
                .apply_catalog(with_ghost.clone(), false)
                .unwrap()
                .applied
        );
        assert!(
            running
                .apply_catalog(without.clone(), false)
                .unwrap()
                .applied
        );
        tokio::task::yield_now().await;
    }
    // Each removed domain's lane watchers withdraw its series as they end (bounded wait).
    wait_for_no_series(&indexer, "ghost").await;
}

#[tokio::test]
async fn a_removed_domain_leaves_no_counter_and_counts_again_when_added_back() {
    let files = Files::new(0);
    files.write("");
    let indexer = Indexer::start_from(files.cli()).await;
    let ghost = "[[domains]]\ndomain = \"ghost\"\nlanes = [\"dc-a\", \"dc-b\"]\n";
    let queries_of_ghost = |metrics: &str| {
        metrics
            .lines()
            .find(|l| {
                l.starts_with("ckf_indexer_queries_total{")
                    && l.contains("domain=\"ghost\"")
                    && l.contains("method=\"find_matches\"")
            })
            .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
    };
    files.write(ghost);
    reload(&indexer, false).await.unwrap();
    for _ in 0..3 {
        find_in(&indexer, "ghost", &hashes(1, 2)).await.unwrap();
    }
    let metrics = metrics_text(&indexer).await;
    assert_eq!(queries_of_ghost(&metrics), Some(3), "{metrics}");
    assert!(
        metrics.contains("ckf_indexer_lane_contention_total{dc=\"dc-a\",domain=\"ghost\""),
        "{metrics}"
    );

    files.write("");
    reload(&indexer, false).await.unwrap();
    wait_for_no_series(&indexer, "ghost").await;

    // Added back: its counters start again from 0 and count (none was left orphaned).
    files.write(ghost);
    reload(&indexer, false).await.unwrap();
    find_in(&indexer, "ghost", &hashes(1, 2)).await.unwrap();
    let metrics = metrics_text(&indexer).await;
    assert_eq!(queries_of_ghost(&metrics), Some(1), "{metrics}");
}

#[tokio::test]
async fn a_route_chosen_after_its_domain_was_removed_brings_back_no_series() {
    let files = Files::new(0);
    files.write(QWEN);
    let indexer = Indexer::start_from(files.cli()).await;
    let shared = hashes(1, 4);
    let mut q = Producer::attach_as(&indexer, qwen("dc-c", 2)).await;
    q.store(1, &shared);
    q.snapshot(8192).await;
    // Held as a request resolves its domain before it routes (or as an embedded router keeps
    // its handle): past the removal below.
    let handle = indexer.running.domain_query_handle("qwen").unwrap();
    let request = RouteQuery::by_hashes(shared.clone());
    assert_eq!(handle.route(&request).unwrap().choice.unwrap().0, 1);
    let decision = r#"ckf_indexer_route_decisions_total{dc="dc-c",domain="qwen""#;
    assert!(metrics_text(&indexer).await.contains(decision));

    files.write("");
    reload(&indexer, false).await.unwrap();
    wait_for_no_series(&indexer, "qwen").await;
    // The removed domain's last tables still answer the late request, and book it, but its
    // choice is not counted: no series of the removed domain comes back.
    let late = handle.route(&request).unwrap();
    assert_eq!(late.choice.map(|(lane, _)| lane), Some(1), "{late:?}");
    let metrics = metrics_text(&indexer).await;
    assert!(!metrics.contains("domain=\"qwen\""), "{metrics}");
}

/// Waits (bounded) until no series of `domain` is exported; panics with what is left.
async fn wait_for_no_series(indexer: &Indexer, domain: &str) {
    let label = format!("domain=\"{domain}\"");
    let mut metrics = String::new();
    for _ in 0..100 {
        metrics = metrics_text(indexer).await;
        if !metrics.contains(&label) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let left: Vec<&str> = metrics.lines().filter(|l| l.contains(&label)).collect();
    panic!(
        "series of the removed domain {domain} remain:\n{}",
        left.join("\n")
    );
}
