//! `Ingest/ReportLoad`: a worker's pushed load enters the pool's load the producer reports over
//! the Relay (observed at a fake indexer that takes load reports) and exports
//! (`ckf_producer_pool_*`); refusals (outside the caller's grant, values out of range, a
//! scraped engine, no room for another worker) change nothing; a share not renewed becomes
//! unknown, never zero.

mod common;

use ckf_proto::v1;
use common::fake_relay::{FakeRelay, GrantConfig};
use common::{eventually, metric};
use producer_svc::config::ingest_auth::{IngestAuthConfig, SourceAuth, WorkerEntry};
use producer_svc::engines::config::EngineSpec;
use producer_svc::{ProducerConfig, RunningProducer};
use tonic::{Code, Request};

fn pushes(p: &RunningProducer, outcome: &str) -> f64 {
    metric(p, "ckf_producer_load_pushes_total", &[("outcome", outcome)])
}

/// `(reporting, configured, running, waiting)` of the pool gauges.
fn gauges(p: &RunningProducer) -> (f64, f64, f64, f64) {
    (
        metric(p, "ckf_producer_pool_engines_reporting", &[]),
        metric(p, "ckf_producer_pool_engines_configured", &[]),
        metric(p, "ckf_producer_pool_requests", &[("state", "running")]),
        metric(p, "ckf_producer_pool_requests", &[("state", "waiting")]),
    )
}

/// Engine `worker_id` over ZMQ (nothing listens: its events never come, its load is what
/// this test pushes or scrapes).
fn engine(worker_id: u64, capacity: u64, metrics_url: Option<&str>) -> EngineSpec {
    let mut spec: EngineSpec = format!(
        "worker_id={worker_id},endpoint=tcp://127.0.0.1:{}",
        10 + worker_id
    )
    .parse()
    .expect("spec");
    spec.prefill_tokens_per_s = capacity;
    spec.metrics_url = metrics_url.map(str::to_owned);
    spec
}

/// A producer publishing to `indexers`, load every 100 ms, with `engines`, changed by `edit`.
async fn producer(
    indexers: Vec<String>,
    engines: Vec<EngineSpec>,
    edit: impl FnOnce(&mut ProducerConfig),
) -> RunningProducer {
    let mut config = common::fast_config(indexers);
    config.engines = engines;
    config.engine.load_interval_ms = 100;
    config.engine.load_timeout_ms = 100;
    config.engine.pushed_load_ttl_ms = 60_000;
    edit(&mut config);
    common::start_with(config).await
}

fn report(source: &str, worker_id: u64, running: u32, waiting: u32) -> v1::ReportLoadRequest {
    v1::ReportLoadRequest {
        source_id: source.into(),
        worker_id,
        running,
        waiting,
        kv_usage: 0.5,
        prefill_tokens_per_s: None,
        age_ms: 0,
    }
}

fn bearer<T>(message: T, token: Option<&str>) -> Request<T> {
    let mut request = Request::new(message);
    if let Some(token) = token {
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("ascii"),
        );
    }
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accepted_push_is_in_the_next_relay_load_report_and_the_gauges() {
    let relay = FakeRelay::start(
        GrantConfig {
            accepts_load: true,
            ..GrantConfig::default()
        },
        8,
    )
    .await;
    // Engine 7 is configured without a metrics_url: unknown until pushed.
    let p = producer(vec![relay.url()], vec![engine(7, 8_000, None)], |_| {}).await;
    relay
        .wait_installed(0, "the first barrier snapshot installed")
        .await;
    assert_eq!(gauges(&p), (0.0, 1.0, 0.0, 0.0), "nothing known yet");
    let mut client = common::ingest_client(&p).await;
    let answer = client
        .report_load(v1::ReportLoadRequest {
            prefill_tokens_per_s: Some(1_000.0),
            ..report("w7", 7, 3, 2)
        })
        .await
        .expect("accepted")
        .into_inner();
    assert_eq!(
        answer.prefill_tokens_per_s, 8_000.0,
        "the configured capacity wins"
    );
    assert_eq!(answer.expires_in_ms, 60_000);
    eventually("the pool gauges at (1.0, 1.0, 3.0, 2.0)", || async {
        gauges(&p) == (1.0, 1.0, 3.0, 2.0)
    })
    .await;
    let loads = || {
        relay.with(|s| {
            s.attachments
                .iter()
                .flat_map(|a| a.loads.clone())
                .collect::<Vec<_>>()
        })
    };
    eventually("a load report with engine 7's pushed load", || async {
        !loads().is_empty()
    })
    .await;
    let first = loads()[0];
    assert_eq!(
        (
            first.engines_reporting,
            first.engines_configured,
            first.running,
            first.waiting
        ),
        (1, 1, 3, 2),
        "{first:?}"
    );
    assert_eq!((first.kv_usage, first.prefill_tokens_per_s), (0.5, 8_000.0));
    // A worker not configured joins the pool with its own capacity.
    let answer = client
        .report_load(v1::ReportLoadRequest {
            prefill_tokens_per_s: Some(2_000.0),
            kv_usage: 1.0,
            ..report("w42", 42, 4, 1)
        })
        .await
        .expect("accepted")
        .into_inner();
    assert_eq!(answer.prefill_tokens_per_s, 2_000.0);
    eventually("the pool gauges at (2.0, 2.0, 7.0, 3.0)", || async {
        gauges(&p) == (2.0, 2.0, 7.0, 3.0)
    })
    .await;
    assert_eq!(
        metric(&p, "ckf_producer_pool_prefill_tokens_per_second", &[]),
        10_000.0
    );
    eventually("a load report with both workers", || async {
        loads().iter().any(|l| l.engines_reporting == 2)
    })
    .await;
    let both = loads()
        .into_iter()
        .find(|l| l.engines_reporting == 2)
        .expect("found");
    assert_eq!(
        (both.engines_configured, both.running, both.waiting),
        (2, 7, 3),
        "{both:?}"
    );
    assert_eq!((both.kv_usage, both.prefill_tokens_per_s), (0.75, 10_000.0));
    assert_eq!(pushes(&p, "accepted"), 2.0);
    assert!(relay.errors().is_empty(), "{:?}", relay.errors());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_principal_without_the_right_is_refused_and_the_load_is_unchanged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let token = |name: &str, secret: &str| {
        let path = dir.path().join(format!("{name}.token"));
        std::fs::write(&path, format!("{secret}\n")).expect("write token");
        path
    };
    let principal =
        |name: &str, secret: &str, sources: &[&str], workers: Vec<WorkerEntry>| SourceAuth {
            name: name.into(),
            cert_names: vec![],
            token_file: Some(token(name, secret)),
            source_ids: sources.iter().map(|&s| s.to_owned()).collect(),
            workers,
        };
    let relay = FakeRelay::start(
        GrantConfig {
            accepts_load: true,
            ..GrantConfig::default()
        },
        8,
    )
    .await;
    let p = producer(vec![relay.url()], vec![engine(7, 8_000, None)], |c| {
        c.ingest_auth = IngestAuthConfig {
            required: true,
            sources: vec![
                principal(
                    "router-1",
                    "r1-secret.0123456789",
                    &["router-1"],
                    vec![WorkerEntry::Id(7)],
                ),
                principal("ops", "ops-secret.0123456789", &[], vec![]),
            ],
        };
    })
    .await;
    let mut client = common::ingest_client(&p).await;
    let refused = [
        // Anonymous, under `required`.
        (
            report("router-1", 7, 50, 50),
            None,
            Code::Unauthenticated,
            vec![],
        ),
        // Another principal's worker; another source id; a principal with no right at all.
        (
            report("router-1", 8, 50, 50),
            Some("r1-secret.0123456789"),
            Code::PermissionDenied,
            vec!["\"router-1\"", "worker 8"],
        ),
        (
            report("router-9", 7, 50, 50),
            Some("r1-secret.0123456789"),
            Code::PermissionDenied,
            vec!["source \"router-9\""],
        ),
        (
            report("router-1", 7, 50, 50),
            Some("ops-secret.0123456789"),
            Code::PermissionDenied,
            vec!["\"ops\""],
        ),
    ];
    for (request, token, code, needles) in refused {
        let status = client
            .report_load(bearer(request, token))
            .await
            .expect_err("refused");
        assert_eq!(status.code(), code, "{status:?}");
        for needle in needles {
            assert!(
                status.message().contains(needle),
                "{needle:?} not in {status:?}"
            );
        }
    }
    assert_eq!(gauges(&p), (0.0, 1.0, 0.0, 0.0), "the load is unchanged");
    assert_eq!(pushes(&p, "denied"), 4.0);
    assert_eq!(pushes(&p, "accepted"), 0.0);
    assert_eq!(
        metric(
            &p,
            "ckf_producer_auth_refused_total",
            &[("rpc", "report_load"), ("code", "permission_denied")]
        ),
        3.0
    );
    // The allowed principal's push is the only one in the pool's load.
    client
        .report_load(bearer(
            report("router-1", 7, 3, 2),
            Some("r1-secret.0123456789"),
        ))
        .await
        .expect("allowed");
    eventually("the pool gauges at (1.0, 1.0, 3.0, 2.0)", || async {
        gauges(&p) == (1.0, 1.0, 3.0, 2.0)
    })
    .await;
    let loads = || {
        relay.with(|s| {
            s.attachments
                .iter()
                .flat_map(|a| a.loads.clone())
                .collect::<Vec<_>>()
        })
    };
    eventually("a load report", || async { !loads().is_empty() }).await;
    assert!(
        loads().iter().all(|l| (l.running, l.waiting) == (3, 2)),
        "no refused push reached a report: {:?}",
        loads()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_values_are_refused_naming_the_field_and_change_nothing() {
    // Engine 7's load is scraped (nothing answers there: unknown); engine 8 is pushed.
    let p = producer(
        vec!["http://127.0.0.1:9".into()],
        vec![
            engine(7, 8_000, Some("http://127.0.0.1:9/metrics")),
            engine(8, 8_000, None),
        ],
        |_| {},
    )
    .await;
    let mut client = common::ingest_client(&p).await;
    let ok = report("w8", 8, 1, 1);
    let cases = [
        (
            v1::ReportLoadRequest {
                kv_usage: 1.5,
                ..ok.clone()
            },
            "ReportLoadRequest.kv_usage",
        ),
        (
            v1::ReportLoadRequest {
                kv_usage: f64::NAN,
                ..ok.clone()
            },
            "ReportLoadRequest.kv_usage",
        ),
        (
            v1::ReportLoadRequest {
                prefill_tokens_per_s: Some(0.5),
                ..ok.clone()
            },
            "ReportLoadRequest.prefill_tokens_per_s",
        ),
        (
            v1::ReportLoadRequest {
                age_ms: 60_000,
                ..ok.clone()
            },
            "ReportLoadRequest.age_ms",
        ),
        (
            v1::ReportLoadRequest {
                source_id: String::new(),
                ..ok.clone()
            },
            "ReportLoadRequest.source_id",
        ),
        (
            report("w7", 7, 1, 1),
            "ReportLoadRequest.worker_id: worker 7",
        ),
    ];
    let n = cases.len();
    for (request, prefix) in cases {
        let status = client.report_load(request).await.expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(
            status.message().starts_with(prefix),
            "{prefix:?}: {status:?}"
        );
    }
    assert_eq!(gauges(&p), (0.0, 2.0, 0.0, 0.0), "the load is unchanged");
    assert_eq!(pushes(&p, "invalid"), n as f64);
    assert_eq!(pushes(&p, "accepted"), 0.0);
    client.report_load(ok).await.expect("valid");
    eventually("the pool gauges at (1.0, 2.0, 1.0, 1.0)", || async {
        gauges(&p) == (1.0, 2.0, 1.0, 1.0)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_not_renewed_becomes_unknown_never_zero() {
    let p = producer(
        vec!["http://127.0.0.1:9".into()],
        vec![engine(7, 8_000, None)],
        |_| {},
    )
    .await;
    let mut client = common::ingest_client(&p).await;
    // Both observed 59.999 s before they were sent (the TTL is 60 s): they expire 1 ms after.
    for (worker, source) in [(7, "w7"), (42, "w42")] {
        let answer = client
            .report_load(v1::ReportLoadRequest {
                age_ms: 59_999,
                ..report(source, worker, 3, 2)
            })
            .await
            .expect("accepted")
            .into_inner();
        assert_eq!(answer.expires_in_ms, 1);
    }
    eventually("both shares unknown", || async {
        metric(&p, "ckf_producer_pool_engines_reporting", &[]) == 0.0
    })
    .await;
    // Unknown, not zero: both still count among the configured (worker 42 until forgotten,
    // ten TTLs after its observation).
    eventually("the pool gauges at (0.0, 2.0, 0.0, 0.0)", || async {
        gauges(&p) == (0.0, 2.0, 0.0, 0.0)
    })
    .await;
    // A fresh push makes the worker known again.
    client
        .report_load(report("w42", 42, 1, 0))
        .await
        .expect("accepted");
    eventually("the pool gauges at (1.0, 2.0, 1.0, 0.0)", || async {
        gauges(&p) == (1.0, 2.0, 1.0, 0.0)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_pushed_workers_are_bounded() {
    let p = producer(
        vec!["http://127.0.0.1:9".into()],
        vec![engine(7, 8_000, None)],
        |c| c.engine.max_pushed_workers = 2,
    )
    .await;
    let mut client = common::ingest_client(&p).await;
    for worker in [100, 101] {
        client
            .report_load(report("w", worker, 1, 0))
            .await
            .expect("room");
    }
    for worker in 102..110 {
        let status = client
            .report_load(report("w", worker, 1, 0))
            .await
            .expect_err("no room");
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        assert!(
            status.message().contains("engine.max_pushed_workers")
                && status.message().contains(&format!("worker {worker}")),
            "{status:?}"
        );
    }
    // The held workers renew, and a configured engine needs no room.
    client
        .report_load(report("w", 100, 5, 0))
        .await
        .expect("renewed");
    client
        .report_load(report("w", 7, 1, 0))
        .await
        .expect("configured");
    eventually("the pool gauges at (3.0, 3.0, 7.0, 0.0)", || async {
        gauges(&p) == (3.0, 3.0, 7.0, 0.0)
    })
    .await;
    assert_eq!(pushes(&p, "full"), 8.0);
    assert_eq!(pushes(&p, "accepted"), 4.0);
}
