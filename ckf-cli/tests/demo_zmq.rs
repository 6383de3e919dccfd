//! `ckf demo --feed zmq` end to end: built-in vLLM publishers (tokens, engine hashes) ->
//! producers subscribed over ZMQ (decode, lineage translation to canonical hashes) -> indexer,
//! queried by tokens; the report is judged against the exact oracle in the canonical space.

use std::time::Duration;

use ckf_cli::bench::args::FeedKind;
use ckf_cli::bench::fleet::FleetShape;
use ckf_cli::bench::live::{Feed, LiveConfig, replay};
use ckf_cli::bench::policy::Policy;
use ckf_cli::bench::replay::load_workload;
use ckf_cli::bench::sim::ServingModel;
use ckf_cli::connect::connect;
use ckf_cli::demo::start_feed;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zmq_feed_has_no_false_negatives_against_the_exact_model() {
    let workload = load_workload(None, Some(800), 7).expect("synthetic workload");
    // Small ranks: many evictions, so BlockRemoved travels the ZMQ path too.
    let shape = FleetShape {
        dcs: 2,
        workers_per_dc: 2,
        ranks_per_worker: 2,
        capacity_blocks: 48,
    };
    let (services, mut feed) = start_feed(shape, FeedKind::Zmq, None).await.expect("start");
    assert!(matches!(feed, Feed::Zmq(_)));
    let config = LiveConfig {
        shape,
        policy: Policy::DeepestPrefix,
        seed: 7,
        serving: ServingModel::unequal(2),
        progress: false,
        ready_timeout: Duration::from_secs(60),
        probe_timeout: Duration::from_secs(5),
        settle_timeout: Duration::from_secs(60),
        engines: None,
    };
    let indexer = ckf_svc_kit::access::authed(connect(&services.indexer_url).await.unwrap(), None);
    let targets = services.targets().await.unwrap();
    let report = replay(&workload, indexer, targets, &config, &mut feed).await;
    services.shutdown().await.expect("graceful shutdown");
    let report = report.expect("replay");
    println!("{report}");

    assert!(report.consistent(), "{report:#?}");
    assert_eq!(report.throughput.queries, 800);
    assert!(report.throughput.events > 0);
    let capacity = (shape.dcs * shape.ranks_per_dc() * shape.capacity_blocks) as u64;
    assert!(
        report.workload.distinct_blocks > 2 * capacity,
        "the workload must force evictions: {:?}",
        report.workload
    );
    // The producers hold exactly the DC's blocks, in the canonical space.
    for dc in &report.cost.dcs {
        assert_eq!(dc.omissions, 0, "{dc:?}");
        assert!(dc.tracked_blocks > 0, "{dc:?}");
        assert_eq!(dc.tracked_blocks, dc.oracle_blocks, "{dc:?}");
    }
    // During the replay, an under-estimate is only ever a batch still in flight.
    let a = &report.accuracy;
    assert_eq!(a.under_estimates.unexplained, 0, "{a:?}");
    assert_eq!(a.under_estimates.omission, 0, "{a:?}");
    assert_eq!(a.lanes_not_ready, 0, "{a:?}");
    // After the drain: every answer exact (no false negatives, no false positives here).
    assert!(report.final_check.settled);
    let f = &report.final_check.accuracy;
    assert_eq!(f.under_estimates.total, 0, "no false negatives: {f:?}");
    assert_eq!(f.over_estimates.total, 0, "{f:?}");
    assert_eq!(f.exact, f.lane_answers, "{f:?}");
    assert!(f.queries > 0 && f.best_dc_agreement == 1.0, "{f:?}");
    assert!(
        report.visibility_lag_ms.count > 0,
        "stores seen becoming visible"
    );
}
