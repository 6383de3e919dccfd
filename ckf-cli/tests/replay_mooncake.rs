//! The first 2,000 requests of the Mooncake conversation trace through three real producers and
//! a real indexer (in-process, loopback ephemeral ports), routed by the deepest-prefix policy;
//! and the whole trace on the serving model, every policy compared.
//!
//! The trace is the public Mooncake FAST'25 conversation trace
//! (`FAST25-release/traces/conversation_trace.jsonl` in the Mooncake repository), not part of
//! this repository: `CKF_TRACE` names its path (`scripts/test.sh` sets it when it finds the
//! trace, and runs this `#[ignore]`d test only then).

use std::path::PathBuf;
use std::time::Duration;

use ckf_cli::bench::fleet::FleetShape;
use ckf_cli::bench::live::{Feed, LiveConfig, replay};
use ckf_cli::bench::policy::Policy;
use ckf_cli::bench::replay::load_workload;
use ckf_cli::bench::report::ServingComparison;
use ckf_cli::bench::sim::ServingModel;
use ckf_cli::connect::connect;
use ckf_cli::demo::Services;

#[test]
#[ignore = "needs the Mooncake trace (not in the repository); scripts/test.sh runs it when the file is there"]
fn mooncake_whole_trace_expected_ttft_meets_its_targets_on_the_serving_model() {
    // As `ckf simulate --trace <trace> --speed 2 --capacity 16384`: twice the trace's rate, a
    // KV tier of 8 M tokens per engine (the trace comes from a system with a host-memory KV
    // pool), the default unequal-capacity, one-far-DC model.
    let workload = load_workload(Some(&trace()), None, 42).expect("the shared trace");
    assert_eq!(workload.requests.len(), 12_031);
    let shape = FleetShape {
        dcs: 3,
        workers_per_dc: 2,
        ranks_per_worker: 2,
        capacity_blocks: 16_384,
    };
    let mut model = ServingModel::unequal(3);
    model.speed = 2.0;
    model.queued_request_tokens = workload
        .requests
        .iter()
        .map(|r| r.input_length as f64)
        .sum::<f64>()
        / workload.requests.len() as f64;
    let hashes: Vec<Vec<u64>> = workload
        .requests
        .iter()
        .map(|r| ckf_cli::hashing::block_hashes(&r.hash_ids))
        .collect();
    let comparison = ServingComparison::run(&workload.requests, &hashes, shape, &model, 42);
    let mut text = String::new();
    comparison.write_text(&mut text).unwrap();
    println!("{text}");
    let targets = comparison.targets();
    assert_eq!(targets.len(), 4);
    assert!(targets.iter().all(|(_, met)| *met), "{targets:?}");
}

/// The trace named by `CKF_TRACE`.
fn trace() -> PathBuf {
    PathBuf::from(std::env::var_os("CKF_TRACE").expect("CKF_TRACE names the Mooncake trace"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Mooncake trace (not in the repository); scripts/test.sh runs it when the file is there"]
async fn mooncake_first_2000_requests_through_three_dcs() {
    let workload = load_workload(Some(&trace()), Some(2_000), 42).expect("the shared trace");
    assert_eq!(workload.requests.len(), 2_000);
    let shape = FleetShape {
        dcs: 3,
        workers_per_dc: 2,
        ranks_per_worker: 2,
        capacity_blocks: 1_024,
    };
    let services = Services::start(shape).await.expect("services start");
    let config = LiveConfig {
        shape,
        policy: Policy::DeepestPrefix,
        seed: 42,
        serving: ServingModel::unequal(3),
        progress: false,
        ready_timeout: Duration::from_secs(60),
        probe_timeout: Duration::from_secs(5),
        settle_timeout: Duration::from_secs(60),
        engines: None,
    };
    let indexer = ckf_svc_kit::access::authed(connect(&services.indexer_url).await.unwrap(), None);
    let targets = services.targets().await.unwrap();
    let report = replay(&workload, indexer, targets, &config, &mut Feed::Grpc).await;
    services.shutdown().await.expect("graceful shutdown");
    let report = report.expect("replay");
    println!("{report}");

    // Counts add up and every section is filled.
    assert!(report.consistent(), "{report:#?}");
    assert_eq!(report.workload.requests, 2_000);
    assert_eq!(report.throughput.queries, 2_000);
    assert!(report.throughput.events > 0 && report.throughput.blocks >= report.throughput.events);
    assert!(report.throughput.events_per_s > 0.0 && report.throughput.queries_per_s > 0.0);
    assert_eq!(report.query_latency_us.count, 2_000);
    assert!(report.query_latency_us.p50 <= report.query_latency_us.p99);
    assert!(report.query_latency_us.p99 <= report.query_latency_us.max);
    assert!(
        report.visibility_lag_ms.count > 0,
        "some stores were seen becoming visible"
    );
    assert!(report.cost.wire_bytes_per_event > 0.0);
    assert!(
        report
            .cost
            .relay_wire_bytes_per_event
            .is_some_and(|b| b > 0.0)
    );
    assert_eq!(report.cost.dcs.len(), 3);
    for dc in &report.cost.dcs {
        assert_eq!(dc.omissions, 0, "{dc:?}");
        assert_eq!(
            dc.tracked_blocks, dc.oracle_blocks,
            "producer tracks exactly the DC's blocks: {dc:?}"
        );
        assert!(dc.exact_state_bytes_per_block > 0.0 && dc.consumer_table_bytes_per_block > 0.0);
    }

    // Accuracy against the exact oracle.
    let a = &report.accuracy;
    assert!(a.best_dc_agreement >= 0.995, "best-DC agreement {a:?}");
    assert_eq!(a.under_estimates.unexplained, 0, "{a:?}");
    assert!(report.final_check.settled);
    let f = &report.final_check.accuracy;
    assert_eq!(
        f.under_estimates.total, f.under_estimates.omission,
        "nothing in flight after the drain: {f:?}"
    );
    assert_eq!(f.under_estimates.unexplained, 0, "{f:?}");
    assert_eq!(f.lanes_not_ready, 0);
    assert!(f.queries > 1_900, "distinct requests re-queried: {f:?}");

    // What routing buys: the live ckf run beats random on the same trace and fleet.
    let live = &report.routing[0];
    assert_eq!(
        (live.policy, live.index),
        (Policy::DeepestPrefix, "indexer")
    );
    let random = report
        .routing
        .iter()
        .find(|r| r.policy == Policy::Random)
        .unwrap();
    assert!(live.hit_rate > random.hit_rate, "{:?}", report.routing);

    // The JSON form carries the same sections.
    let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    for key in [
        "workload",
        "fleet",
        "throughput",
        "query_latency_us",
        "visibility_lag_ms",
        "accuracy",
        "final_check",
        "routing",
        "cost",
    ] {
        assert!(json.get(key).is_some(), "JSON lacks {key}");
    }
}
