//! Service-level behaviour: health, reflection, metrics, limits and graceful shutdown.

mod common;

use ckf_proto::v1::{self, relay_frame::Frame as WireFrame};
use common::*;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

#[tokio::test]
async fn health_is_serving_for_both_services() {
    let indexer = Indexer::start(config(&["dc-a"])).await;
    let mut health = HealthClient::new(indexer.channel.clone());
    for service in ["", "ckf.v1.Relay", "ckf.v1.Query"] {
        let response = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            response.status(),
            tonic_health::pb::health_check_response::ServingStatus::Serving,
            "{service:?}"
        );
    }
}

#[tokio::test]
async fn reflection_lists_the_ckf_services() {
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let indexer = Indexer::start(config(&["dc-a"])).await;
    let mut client = ServerReflectionClient::new(indexer.channel.clone());
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let response = responses.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("unexpected reflection response {response:?}");
    };
    let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
    for expected in ["ckf.v1.Relay", "ckf.v1.Query", "grpc.health.v1.Health"] {
        assert!(names.contains(&expected), "{names:?}");
    }
}

/// `search.kernel` picks the kernel queries run with; the metric names it, queries answer the
/// same with every kernel this CPU runs, and a bad name refuses to start.
#[tokio::test]
async fn search_kernel_is_configurable_and_exported() {
    let mut answers = Vec::new();
    for kernel in ["auto", "portable", "avx2", "avx512", "neon"] {
        let forced: ckf_core::search::SearchKernel = kernel.parse().unwrap();
        let mut c = config(&["dc-a", "dc-b"]);
        c.search.kernel = kernel.into();
        if !forced.is_available() {
            // A kernel this CPU lacks refuses to start (NEON on x86-64, AVX on aarch64).
            let Err(err) = indexer_svc::serve(c, std::future::pending()).await else {
                panic!("{kernel} started on a CPU without it");
            };
            let text = err.to_string();
            assert!(
                text.contains(&format!("search.kernel = {kernel}: is not available")),
                "{text}"
            );
            continue;
        }
        let indexer = Indexer::start(c).await;
        let in_use = forced.resolve().unwrap().name();
        let text = http_get(indexer.running.metrics_addr, "/metrics").await;
        for k in ["portable", "avx2", "avx512", "neon"] {
            let line = format!(
                "ckf_indexer_search_kernel{{kernel=\"{k}\"}} {}",
                i32::from(k == in_use)
            );
            assert!(text.contains(&line), "missing {line:?} in\n{text}");
        }
        let mut a = Producer::attach(&indexer, "dc-a", 1).await;
        a.store(1, &hashes(40, 10));
        a.snapshot(2048).await;
        let mut q = hashes(40, 6);
        q.extend(hashes(99, 3));
        answers.push((kernel, indexer.find(&q).await));
    }
    // Lane 0 holds the first 6 blocks; every kernel says so.
    for (kernel, answer) in &answers {
        assert_eq!(answer, &answers[0].1, "{kernel}");
        assert!(answer.0.contains(&(0, 6)), "{kernel}: {answer:?}");
    }
    let mut c = config(&["dc-a"]);
    c.search.kernel = "neon".into();
    let Err(err) = indexer_svc::serve(c, std::future::pending()).await else {
        panic!("an unknown kernel started");
    };
    let text = err.to_string();
    assert!(text.contains("search.kernel = neon"), "{text}");
}

#[tokio::test]
async fn metrics_count_frames_deltas_queries_and_lane_state() {
    let indexer = Indexer::start(config(&["dc-a", "dc-b"])).await;
    let mut a = Producer::attach(&indexer, "dc-a", 1).await;
    a.store(1, &hashes(40, 10));
    a.snapshot(2048).await; // 4 chunks
    a.store(1, &hashes(41, 10));
    a.publish().await;
    a.stream
        .send(WireFrame::Heartbeat(v1::Heartbeat {
            lease: a.wire_lease(),
            sequence: 1,
        }))
        .await;
    a.drain().await;
    indexer.find(&hashes(40, 10)).await;
    indexer.find(&hashes(41, 3)).await;
    // One token query (2 full blocks of 16) and one refused (other block size).
    let tokens = v1::FindMatchesByTokensRequest {
        token_ids: (0..40).collect(),
        ..Default::default()
    };
    indexer.find_by_tokens(tokens.clone()).await.unwrap();
    let other_size = v1::FindMatchesByTokensRequest {
        block_size: 32,
        ..tokens
    };
    indexer.find_by_tokens(other_size).await.unwrap_err();
    // The lane gauges are read from the lanes at the scrape: exact as soon as the frames are
    // acknowledged (the installed sequence too, which no lane event announces).
    let text = http_get(indexer.running.metrics_addr, "/metrics").await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    for line in [
        r#"ckf_indexer_relay_frames_received_total{kind="attach"} 1"#,
        r#"ckf_indexer_relay_frames_received_total{kind="snapshot_chunk"} 4"#,
        r#"ckf_indexer_relay_frames_received_total{kind="delta"} 1"#,
        r#"ckf_indexer_relay_frames_received_total{kind="heartbeat"} 1"#,
        r#"ckf_indexer_relay_frames_received_total{kind="drain_marker"} 1"#,
        r#"ckf_indexer_snapshots_installed_total{dc="dc-a",domain="test",lane="0"} 1"#,
        r#"ckf_indexer_deltas_applied_total{dc="dc-a",domain="test",lane="0"} 1"#,
        r#"ckf_indexer_drain_markers_accepted_total{dc="dc-a",domain="test",lane="0"} 1"#,
        r#"ckf_indexer_leases_granted_total{dc="dc-a",domain="test",lane="0"} 1"#,
        r#"ckf_indexer_event_to_applied_lag_seconds_count{dc="dc-a",domain="test",lane="0"} 1"#,
        r#"ckf_indexer_queries_total{domain="test",method="find_matches"} 2"#,
        r#"ckf_indexer_query_blocks_total{domain="test",method="find_matches"} 13"#,
        r#"ckf_indexer_queries_total{domain="test",method="find_matches_by_tokens"} 1"#,
        r#"ckf_indexer_query_blocks_total{domain="test",method="find_matches_by_tokens"} 2"#,
        r#"ckf_indexer_queries_refused_total{domain="test",method="find_matches_by_tokens"} 1"#,
        r#"ckf_indexer_queries_refused_total{domain="test",method="find_matches"} 0"#,
        "ckf_indexer_query_duration_seconds_count 3",
        r#"ckf_indexer_query_duration_seconds_bucket{le="0.0000001"}"#,
        r#"ckf_indexer_lane_state{dc="dc-a",domain="test",lane="0",state="active"} 1"#,
        r#"ckf_indexer_lane_state{dc="dc-b",domain="test",lane="1",state="unassigned"} 1"#,
        r#"ckf_indexer_lane_ready{dc="dc-a",domain="test",lane="0"} 1"#,
        r#"ckf_indexer_lane_ready{dc="dc-b",domain="test",lane="1"} 0"#,
        r#"ckf_indexer_lane_installed_sequence{dc="dc-a",domain="test",lane="0"} 1"#,
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    // The images applied equal the delta's images.
    let images = a_images_line(&text);
    assert!(images > 0, "{text}");
    let received = text
        .lines()
        .find_map(|l| l.strip_prefix("ckf_indexer_relay_received_bytes_total "))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap();
    assert!(received > 8 * BUCKETS, "snapshot bytes counted: {received}");
}

fn a_images_line(text: &str) -> u64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(r#"ckf_indexer_images_applied_total{dc="dc-a",domain="test",lane="0"} "#)
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn retirements_are_counted_by_reason() {
    let indexer = Indexer::start(config(&["dc-a"])).await;
    let mut a = Producer::attach(&indexer, "dc-a", 1).await;
    a.snapshot(8192).await;
    a.stream.send_raw(raw_delta(&a, 7, 8, vec![1])).await;
    a.stream
        .expect_retired_as(v1::RetireReason::Gap, Code::FailedPrecondition)
        .await;
    let line =
        r#"ckf_indexer_lane_retirements_total{dc="dc-a",domain="test",lane="0",reason="gap"} 1"#;
    let mut text = String::new();
    for _ in 0..500 {
        text = http_get(indexer.running.metrics_addr, "/metrics").await;
        if text.contains(line) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("missing {line:?} in\n{text}");
}

#[tokio::test]
async fn too_many_relay_streams_is_resource_exhausted() {
    let mut cfg = config(&["dc-a", "dc-b"]);
    cfg.limits.max_relay_streams = 1;
    let indexer = Indexer::start(cfg).await;
    let _a = Producer::attach(&indexer, "dc-a", 1).await;
    let status = refused(&indexer, (&identity("dc-b", 2, format())).into()).await;
    assert_status(&status, Code::ResourceExhausted, &["max_relay_streams = 1"]);
    // Nothing was leased for dc-b.
    assert_eq!(indexer.lane(1).await.state(), v1::LaneState::Unassigned);
}

#[tokio::test]
async fn query_longer_than_the_limit_is_invalid_argument() {
    let mut cfg = config(&["dc-a"]);
    cfg.limits.max_query_blocks = 4;
    let indexer = Indexer::start(cfg).await;
    assert_eq!(indexer.find(&hashes(1, 4)).await, (vec![], 0));
    let status = indexer
        .query()
        .find_matches(v1::FindMatchesRequest {
            block_hashes: hashes(1, 5),
        })
        .await
        .unwrap_err();
    assert_status(
        &status,
        Code::InvalidArgument,
        &["carries 5 block hashes (limits.max_query_blocks = 4)"],
    );
}

#[tokio::test]
async fn a_call_naming_another_domain_is_not_found_and_its_own_or_none_is_answered() {
    let indexer = Indexer::start(config(&["dc-a"])).await;
    let call = |domain: Option<&'static str>| {
        let mut client = indexer.query();
        async move {
            let mut request = tonic::Request::new(v1::ListLanesRequest {});
            if let Some(domain) = domain {
                request
                    .metadata_mut()
                    .insert(ckf_proto::metadata::DOMAIN_KEY, domain.parse().unwrap());
            }
            client.list_lanes(request).await
        }
    };
    assert_eq!(call(None).await.unwrap().into_inner().domain, DOMAIN);
    assert_eq!(
        call(Some(DOMAIN)).await.unwrap().into_inner().domain,
        DOMAIN
    );
    let status = call(Some("qwen-7b")).await.unwrap_err();
    assert_status(
        &status,
        Code::NotFound,
        &["domain qwen-7b is not served here: this indexer serves test"],
    );
    let status = call(Some("a/b")).await.unwrap_err();
    assert_status(&status, Code::InvalidArgument, &["domain name", "a/b"]);
    // Every Query RPC is checked, not only ListLanes.
    let mut client = indexer.query();
    let mut request = tonic::Request::new(v1::FindMatchesRequest {
        block_hashes: hashes(1, 2),
    });
    request
        .metadata_mut()
        .insert(ckf_proto::metadata::DOMAIN_KEY, "qwen-7b".parse().unwrap());
    let status = client.find_matches(request).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    let metrics = metrics_text(&indexer).await;
    assert!(
        metrics.contains("ckf_indexer_query_domain_refused_total 3"),
        "{metrics}"
    );
}

#[tokio::test]
async fn credentials_are_checked_before_the_domain() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("query.token");
    std::fs::write(&token, "query.0123456789abcdef\n").unwrap();
    let mut cfg = config(&["dc-a"]);
    cfg.auth.query_token_file = Some(token);
    let indexer = Indexer::start(cfg).await;
    let mut request = tonic::Request::new(v1::ListLanesRequest {});
    request
        .metadata_mut()
        .insert(ckf_proto::metadata::DOMAIN_KEY, "qwen-7b".parse().unwrap());
    // No token: refused for that, not told which domain is served.
    let status = indexer.query().list_lanes(request).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(!status.message().contains("serves"), "{status:?}");
}

#[tokio::test]
async fn shutdown_ends_streams_with_retired_shutdown_and_stops() {
    let indexer = Indexer::start(config(&["dc-a"])).await;
    let mut a = Producer::attach(&indexer, "dc-a", 1).await;
    a.snapshot(8192).await;
    let Indexer { running, channel } = indexer;
    let stopping = tokio::spawn(running.stop());
    let status = a
        .stream
        .expect_retired_as(v1::RetireReason::Shutdown, Code::Unavailable)
        .await;
    assert_status(&status, Code::Unavailable, &["shutting down"]);
    stopping.await.unwrap().expect("clean stop");
    // The listener is gone: new calls fail.
    let mut health = HealthClient::new(channel);
    assert!(health.check(HealthCheckRequest::default()).await.is_err());
}

#[tokio::test]
async fn streams_that_never_attach_do_not_use_up_the_stream_limit() {
    let mut cfg = config(&["dc-a"]);
    cfg.limits.max_relay_streams = 1;
    let indexer = Indexer::start(cfg).await;
    // An idle connection: opens a Relay stream and never sends Attach.
    let (idle_tx, idle_rx) = mpsc::channel::<v1::RelayFrame>(1);
    let mut relay = indexer.relay();
    let idle = tokio::spawn(async move { relay.publish(ReceiverStream::new(idle_rx)).await });
    // Nothing observable marks a stream that reached the indexer and waits for Attach (it holds
    // no permit and no metric counts it): this gives it 300 ms to get there, and is a negative
    // too, the indexer neither refuses nor ends it meanwhile.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        !idle.is_finished(),
        "the idle stream is still waiting for Attach"
    );
    // An honest producer still gets its lease.
    let stream = open(&indexer, (&identity("dc-a", 1, format())).into())
        .await
        .expect("an honest attach is not locked out by an idle stream");
    assert_eq!(stream.lease.epoch, 1);
    assert!(
        !idle.is_finished(),
        "the idle stream was still open when the honest one attached"
    );
    drop(idle_tx);
    idle.abort();
}
