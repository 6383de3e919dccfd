//! The producer service in-process against fake indexers (`common::fake_relay`): ingest over
//! gRPC, publication over Relay, re-attachment, drain, per-source sequences, malformed input.

mod common;

use std::collections::HashSet;

use ckf_core::addressing::TableFormat;
use ckf_proto::v1;
use common::fake_relay::{FakeRelay, GrantConfig};
use common::*;
use producer_svc::DrainOutcome;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Deterministic, well-spread block hashes: worker `w`'s `i`-th block.
fn h(w: u64, i: u64) -> u64 {
    ckf_core::addressing::fmix64((w << 32) | i)
}

fn chain(w: u64, range: std::ops::Range<u64>) -> Vec<u64> {
    range.map(|i| h(w, i)).collect()
}

/// A churn workload: stores with shared prefixes, removals (some unknown), a clear and a worker
/// removal. Returns the events in order.
fn workload() -> Vec<Vec<v1::KvEvent>> {
    vec![
        vec![
            stored(1, 0, &chain(1, 0..120)),
            stored(2, 0, &chain(1, 0..40)),
        ],
        vec![
            stored(2, 1, &chain(2, 0..90)),
            stored(3, 0, &chain(3, 0..60)),
        ],
        vec![
            removed(1, 0, &chain(1, 100..130)), // 10 unknown (120..130)
            stored(3, 1, &chain(1, 20..60)),
        ],
        vec![cleared(2, 1), stored(4, 0, &chain(4, 0..50))],
        vec![worker_removed(3), stored(1, 0, &chain(5, 0..30))],
    ]
}

async fn metrics_text(p: &producer_svc::RunningProducer) -> String {
    let mut s = tokio::net::TcpStream::connect(p.metrics_addr)
        .await
        .unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

/// Polls `/metrics` until it contains `needle` (the producer handles a reply asynchronously).
async fn eventually_in_metrics(p: &producer_svc::RunningProducer, needle: &str) {
    for _ in 0..300 {
        if metrics_text(p).await.contains(needle) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("metrics never showed {needle}:\n{}", metrics_text(p).await);
}

/// A publication cadence whose delay (60 s) outlasts any test and that does not cut when idle:
/// a batch is cut only at `batch_threshold` dirty buckets or at shutdown.
fn held_until(batch_threshold: u32) -> impl FnOnce(&mut producer_svc::ProducerConfig) {
    move |c| {
        c.publication.max_delay_ms = 60_000;
        c.publication.cut_when_idle = false;
        c.publication.batch_threshold = batch_threshold;
    }
}

fn format_of(p: &producer_svc::RunningProducer) -> TableFormat {
    p.identity.format
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_and_deltas_rebuild_the_filter() {
    let (fake, producer) = attached_producer(|_| {}).await;

    let mut client = ingest_client(&producer).await;
    let mut model = Model::default();
    for (i, events) in workload().into_iter().enumerate() {
        for e in &events {
            model.apply(e);
        }
        let result = client
            .publish_batch(batch("src", i as u64, events.clone()))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(result.events.len(), events.len());
        for r in &result.events {
            assert_eq!(r.status(), v1::EventStatus::Applied, "{r:?}");
        }
    }
    let tracked = model.tracked();
    let table = producer.table().await.unwrap();
    fake.wait_converged(0, &table, "the fake's table equals the producer's")
        .await;

    let (rebuilt, deltas, chunks, largest, errors) = fake.with(|s| {
        let a = &s.attachments[0];
        (
            a.table.clone(),
            a.deltas.clone(),
            a.snapshot_chunks,
            a.largest_frame,
            a.errors.clone(),
        )
    });
    assert!(errors.is_empty(), "{errors:?}");
    assert_all_present(format_of(&producer), &rebuilt, &tracked);
    assert_eq!(resident(&rebuilt), tracked.len() as u64);
    // 1024 buckets = 8 KiB of words against a 4 KiB grant: the snapshot was chunked, and every
    // frame stayed at or under half the grant (checked frame by frame by the fake).
    assert!(chunks >= 4, "{chunks} chunks");
    assert!(largest <= 2048, "largest frame {largest}");
    // Batches of more than 8 images were split into consecutive deltas.
    let batches = producer.metrics.batches.get();
    assert!(
        deltas.len() as u64 > batches,
        "{} deltas for {batches} batches",
        deltas.len()
    );
    assert!(deltas.iter().all(|d| d.buckets.len() <= 8));
    for w in deltas.windows(2) {
        assert_eq!(w[1].base_sequence, w[0].sequence);
    }

    let stats = client
        .get_stats(v1::GetStatsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.unique_blocks, tracked.len() as u64);
    assert_eq!(stats.resident_fingerprints, tracked.len() as u64);
    assert_eq!(stats.pool.unwrap().dc, "dc-a");
    assert_eq!(stats.incarnation, producer.identity.incarnation.0);
    assert_eq!(stats.format.unwrap().bucket_count, 1024);

    // Idle attachments heartbeat with the last sequence sent.
    let last = deltas.last().unwrap().sequence;
    fake.wait_for("two heartbeats after the last delta", |s| {
        s.attachments[0]
            .heartbeats
            .iter()
            .filter(|&&q| q == last)
            .count()
            >= 2
    })
    .await;

    let text = metrics_text(&producer).await;
    for needle in [
        "ckf_producer_events_total{kind=\"stored\"} 7",
        "ckf_producer_events_total{kind=\"worker_removed\"} 1",
        "ckf_producer_unknown_removals_total 10",
        "ckf_producer_deltas_sent_total{indexer=",
        "ckf_producer_attachment_state{indexer=",
        "ckf_producer_batch_images_bucket",
    ] {
        assert!(text.contains(needle), "metrics lack {needle}:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_gaps_and_replays_are_reported() {
    let fake = FakeRelay::start(GrantConfig::default(), 7).await;
    let producer = start_producer(vec![fake.url()]).await;
    let mut client = ingest_client(&producer).await;
    let mut send = async |source: &str, seq: u64, hashes: &[u64]| {
        store_one(&mut client, source, seq, hashes).await
    };
    let r = send("a", 10, &[h(9, 1)]).await;
    assert_eq!((r.gap, r.duplicate, r.events.len()), (None, false, 1));
    let r = send("a", 11, &[h(9, 2)]).await;
    assert_eq!((r.gap, r.duplicate), (None, false));
    let r = send("a", 14, &[h(9, 3)]).await;
    assert_eq!(
        r.gap,
        Some(v1::SourceGap {
            expected: 12,
            received: 14
        })
    );
    assert_eq!(r.events[0].status(), v1::EventStatus::Applied);
    // A replay is refused whole: its new block is not tracked.
    let r = send("a", 14, &[h(9, 4)]).await;
    assert!(r.duplicate);
    assert!(r.events.is_empty());
    assert_eq!((r.source_id.as_str(), r.sequence), ("a", 14));
    // Sources are independent.
    let r = send("b", 0, &[h(9, 5)]).await;
    assert_eq!((r.gap, r.duplicate), (None, false));

    let stats = producer.stats().await.unwrap();
    assert_eq!(stats.unique_blocks, 4);
    assert_eq!(producer.metrics.source_gaps.get(), 1);
    assert_eq!(producer.metrics.duplicate_batches.get(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_source_tracker_forgets_the_least_recently_used_source() {
    let fake = FakeRelay::start(GrantConfig::default(), 7).await;
    let mut config = fast_config(vec![fake.url()]);
    config.limits.max_tracked_sources = 2;
    let producer = start_with(config).await;
    let mut client = ingest_client(&producer).await;
    let mut send = async |source: &str, seq: u64, hashes: &[u64]| {
        store_one(&mut client, source, seq, hashes).await
    };
    send("a", 1, &[h(8, 1)]).await;
    send("b", 1, &[h(8, 2)]).await;
    assert!(send("a", 1, &[h(8, 3)]).await.duplicate, "a is tracked");
    // "c" evicts "b", the least recently used; b's replay is then applied as a first batch.
    send("c", 1, &[h(8, 4)]).await;
    let r = send("b", 1, &[h(8, 5)]).await;
    assert_eq!((r.gap, r.duplicate, r.events.len()), (None, false, 1));
    assert_eq!(producer.metrics.source_evictions.get(), 2);
    assert_eq!(producer.stats().await.unwrap().unique_blocks, 4);
    assert_eq!(producer.metrics.tracked_sources.get(), 2);
    assert!(producer.metrics.tracked_source_bytes.get() > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_events_are_rejected_precisely() {
    let fake = FakeRelay::start(GrantConfig::default(), 7).await;
    let producer = start_producer(vec![fake.url()]).await;
    let mut client = ingest_client(&producer).await;

    let (a, b, c) = (h(1, 1), h(1, 2), h(1, 3));
    let events = vec![
        stored(1, 0, &[a, b]),
        v1::KvEvent {
            member: None,
            kind: Some(v1::kv_event::Kind::Stored(v1::Stored {
                block_hashes: vec![c],
                parent_hash: None,
            })),
        },
        v1::KvEvent {
            member: member(1, 0),
            kind: None,
        },
        removed(1, 0, &[a]),
    ];
    let r = client
        .publish_batch(batch("s", 1, events))
        .await
        .unwrap()
        .into_inner();
    let statuses: Vec<_> = r.events.iter().map(|e| e.status()).collect();
    assert_eq!(
        statuses,
        [
            v1::EventStatus::Applied,
            v1::EventStatus::Rejected,
            v1::EventStatus::Rejected,
            v1::EventStatus::Applied
        ]
    );
    assert_eq!(r.events[0].applied_blocks, 2);
    assert_eq!(r.events[1].error, "event 1: KvEvent.member is required");
    assert!(
        r.events[2]
            .error
            .starts_with("event 2: KvEvent.kind is required"),
        "{}",
        r.events[2].error
    );
    assert_eq!(
        (r.events[1].applied_blocks, r.events[2].applied_blocks),
        (0, 0)
    );
    assert_eq!(r.events[3].applied_blocks, 1);
    // Only b is left: the rejected store of c left no trace.
    let stats = producer.stats().await.unwrap();
    assert_eq!(stats.unique_blocks, 1);
    assert_eq!(producer.metrics.events_rejected.get(), 2);

    // A hash repeated within one store event is one block: the repeats are applied no-ops,
    // reported as redundant, and the block's refcount stays 1 (one remove frees it).
    let r = client
        .publish_batch(batch("s", 2, vec![stored(1, 0, &[c, c, c])]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (r.events[0].applied_blocks, r.events[0].redundant_blocks),
        (3, 2)
    );
    assert_eq!(producer.stats().await.unwrap().unique_blocks, 2);
    let r = client
        .publish_batch(batch("s", 3, vec![removed(1, 0, &[c])]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.events[0].redundant_blocks, 0);
    assert_eq!(producer.stats().await.unwrap().unique_blocks, 1);

    // A batch without a source is refused whole with a precise status.
    let status = client
        .publish_batch(batch("", 2, vec![stored(2, 0, &[c])]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status
            .message()
            .contains("KvEventBatch.source_id is required"),
        "{}",
        status.message()
    );
    assert_eq!(producer.stats().await.unwrap().unique_blocks, 1);

    // The bidi stream answers in order; a batch refused whole gets its refusal in its result
    // and the stream goes on with the next batch.
    let requests = tokio_stream::iter(vec![
        batch("t", 1, vec![stored(3, 0, &[h(3, 1)])]),
        batch("t", 2, vec![stored(3, 0, &[h(3, 2)])]),
        batch("", 3, vec![stored(3, 0, &[h(3, 3)])]),
        batch("t", 4, vec![stored(3, 0, &[h(3, 4)])]),
    ]);
    let mut results = client.publish(requests).await.unwrap().into_inner();
    assert_eq!(results.message().await.unwrap().unwrap().sequence, 1);
    assert_eq!(results.message().await.unwrap().unwrap().sequence, 2);
    let refused = results.message().await.unwrap().unwrap();
    assert_eq!(refused.sequence, 3);
    let why = refused.refused.expect("refused whole");
    assert_eq!(why.code, tonic::Code::InvalidArgument as i32);
    assert!(
        why.message.contains("KvEventBatch.source_id is required"),
        "{}",
        why.message
    );
    let after = results.message().await.unwrap().unwrap();
    assert_eq!((after.sequence, after.refused), (4, None));
    assert!(results.message().await.unwrap().is_none());
    assert_eq!(producer.stats().await.unwrap().unique_blocks, 4);

    // Health and reflection are served next to Ingest.
    let channel =
        tonic::transport::Channel::from_shared(format!("http://{}", producer.ingest_addr))
            .unwrap()
            .connect()
            .await
            .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let serving = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "ckf.v1.Ingest".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        serving.status(),
        tonic_health::pb::health_check_response::ServingStatus::Serving
    );
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let mut reflection = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = reflection
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .unwrap()
        .into_inner();
    let Some(MessageResponse::ListServicesResponse(list)) =
        answers.message().await.unwrap().unwrap().message_response
    else {
        panic!("no service list");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for expected in ["ckf.v1.Ingest", "grpc.health.v1.Health"] {
        assert!(names.iter().any(|n| n == expected), "{names:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retired_lane_is_reattached_with_a_new_snapshot() {
    let fake = FakeRelay::start(GrantConfig::default(), 7).await;
    let producer = start_producer(vec![fake.url()]).await;
    let mut client = ingest_client(&producer).await;
    let mut model = Model::default();
    let events = vec![stored(1, 0, &chain(1, 0..100))];
    publish_tracked(&mut client, &mut model, "s", 0, events).await;
    let table = producer.table().await.unwrap();
    fake.wait_converged(0, &table, "first attachment converged")
        .await;

    fake.retire(0, v1::RetireReason::Gap, "injected by the test")
        .await;
    fake.wait_installed(1, "second attachment installed its snapshot")
        .await;
    let (first, second) = fake.with(|s| {
        (
            s.attachments[0].lease.unwrap(),
            s.attachments[1].lease.unwrap(),
        )
    });
    assert!(second.epoch > first.epoch);
    // The new barrier snapshot alone carries everything tracked so far.
    let snapshot_only = fake.with(|s| {
        let a = &s.attachments[1];
        (a.deltas.is_empty()).then(|| a.table.clone())
    });
    if let Some(t) = snapshot_only {
        assert_eq!(t, table);
    }

    let events = vec![
        stored(2, 0, &chain(2, 0..80)),
        removed(1, 0, &chain(1, 0..50)),
    ];
    publish_tracked(&mut client, &mut model, "s", 1, events).await;
    let table = producer.table().await.unwrap();
    fake.wait_converged(1, &table, "second attachment converged")
        .await;
    let errors = fake.errors();
    let (rebuilt, snapshot_sequence, deltas) = fake.with(|s| {
        let a = &s.attachments[1];
        (
            a.table.clone(),
            a.snapshot_sequence.unwrap(),
            a.deltas.clone(),
        )
    });
    assert!(errors.is_empty(), "{errors:?}");
    assert_all_present(format_of(&producer), &rebuilt, &model.tracked());
    assert_eq!(deltas.first().unwrap().base_sequence, snapshot_sequence);
    let text = metrics_text(&producer).await;
    assert!(
        text.contains("reason=\"retired_gap\"} 1"),
        "no retired_gap detachment in:\n{text}"
    );
    assert!(
        text.contains("ckf_producer_reconnects_total{indexer="),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_publishes_the_tail_and_sends_the_exact_drain_marker() {
    // A long cadence: the last batch is still pending when shutdown starts.
    let (fake, producer) = attached_producer(held_until(100_000)).await;
    let mut client = ingest_client(&producer).await;
    let mut model = Model::default();
    let events = vec![
        stored(1, 0, &chain(1, 0..60)),
        stored(2, 3, &chain(2, 0..10)),
    ];
    publish_tracked(&mut client, &mut model, "s", 0, events).await;
    let table = producer.table().await.unwrap();
    assert_eq!(
        fake.with(|s| s.attachments[0].deltas.len()),
        0,
        "the tail is still pending"
    );

    producer.shutdown();
    let report = producer.wait().await.unwrap();
    assert_eq!(report.exit_code(), 0);
    assert!(report.all_drained(), "{:?}", report.drains);
    let (errors, rebuilt, last_delta, marker, drained) = fake.with(|s| {
        let a = &s.attachments[0];
        (
            a.errors.clone(),
            a.table.clone(),
            a.deltas.last().map(|d| d.sequence),
            a.drain_marker,
            a.drained,
        )
    });
    assert!(errors.is_empty(), "{errors:?}");
    assert!(drained);
    let last_delta = last_delta.expect("the pending tail was published before the marker");
    assert_eq!(marker, Some(last_delta));
    assert_eq!(
        report.drains[0].1,
        DrainOutcome::Drained {
            sequence: last_delta
        }
    );
    assert_eq!(rebuilt, table);
    assert_all_present(
        TableFormat::new(1024, 0x5eed).unwrap(),
        &rebuilt,
        &model.tracked(),
    );
    // Ingest is closed after shutdown.
    assert!(client.publish_batch(batch("s", 1, vec![])).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_indexers_each_get_their_own_continuous_sequence() {
    let a = FakeRelay::start(GrantConfig::default(), 1).await;
    let b = FakeRelay::start(
        GrantConfig {
            max_message_bytes: 8192,
            max_images_per_delta: 3,
            heartbeat_deadline_ms: 3_000,
            ..GrantConfig::default()
        },
        2,
    )
    .await;
    let producer = start_producer(vec![a.url(), b.url()]).await;
    let mut client = ingest_client(&producer).await;
    let mut model = Model::default();
    for (i, events) in workload().into_iter().take(3).enumerate() {
        publish_tracked(&mut client, &mut model, "s", i as u64, events).await;
    }
    let table = producer.table().await.unwrap();
    for fake in [&a, &b] {
        fake.wait_converged(0, &table, "converged").await;
    }
    // Retire only A: A re-attaches, B's stream continues untouched.
    a.retire(0, v1::RetireReason::LagExceeded, "test").await;
    a.wait_installed(1, "A re-attached").await;
    for (i, events) in workload().into_iter().enumerate().skip(3) {
        publish_tracked(&mut client, &mut model, "s", i as u64, events).await;
    }
    let table = producer.table().await.unwrap();
    a.wait_converged(1, &table, "A converged again").await;
    b.wait_converged(0, &table, "B converged again").await;
    assert_eq!(
        b.with(|s| s.attachments.len()),
        1,
        "B was never re-attached"
    );

    producer.shutdown();
    let report = producer.wait().await.unwrap();
    assert!(report.all_drained(), "{:?}", report.drains);
    let tracked: HashSet<u64> = model.tracked();
    for (fake, index) in [(&a, 1usize), (&b, 0usize)] {
        let errors = fake.errors();
        let (deltas, snapshot, marker, rebuilt) = fake.with(|s| {
            let x = &s.attachments[index];
            (
                x.deltas.clone(),
                x.snapshot_sequence.unwrap(),
                x.drain_marker.unwrap(),
                x.table.clone(),
            )
        });
        assert!(errors.is_empty(), "{errors:?}");
        let mut expected = snapshot;
        for d in &deltas {
            assert_eq!(d.base_sequence, expected);
            expected = d.sequence;
        }
        assert_eq!(marker, expected);
        assert_all_present(TableFormat::new(1024, 0x5eed).unwrap(), &rebuilt, &tracked);
    }
    // B's grant of 3 images per delta was honoured.
    assert!(b.with(|s| s.attachments[0].deltas.iter().all(|d| d.buckets.len() <= 3)));
    let b_deltas = b.with(|s| s.attachments[0].deltas.len());
    let a_deltas = a.with(|s| s.attachments.iter().map(|x| x.deltas.len()).sum::<usize>());
    assert!(
        b_deltas > a_deltas,
        "B's smaller grant needs more deltas ({b_deltas} vs {a_deltas})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_indexer_is_fenced_and_reattached_with_a_snapshot() {
    let fake = FakeRelay::start(
        GrantConfig {
            stall_first: true,
            ..GrantConfig::default()
        },
        7,
    )
    .await;
    let mut config = fast_config(vec![fake.url()]);
    config.table.expected_blocks = 30_146; // 8192 buckets (30,146 / 3.68)
    config.publication.attachment_queue = 2;
    config.reconnect.connect_timeout_ms = 300;
    let producer = start_with(config).await;
    fake.wait_for("the first attachment was granted", |s| {
        s.attachments.len() == 1
    })
    .await;
    let mut client = ingest_client(&producer).await;
    let mut model = Model::default();
    // Thousands of dirty buckets: far more delta frames than the stalled stream's windows, the
    // request buffer and the attachment queue can hold.
    for round in 0..4u64 {
        let events = vec![stored(round, 0, &chain(round, 0..2_000))];
        publish_tracked(&mut client, &mut model, "s", round, events).await;
    }
    fake.wait_for("a second attachment installed its snapshot", |s| {
        s.attachments.len() >= 2 && s.attachments.last().unwrap().installed.is_some()
    })
    .await;
    let table = producer.table().await.unwrap();
    fake.wait_for("the new attachment converged", |s| {
        s.attachments.last().unwrap().table == table
    })
    .await;
    let errors = fake.errors();
    let rebuilt = fake.with(|s| s.attachments.last().unwrap().table.clone());
    assert!(errors.is_empty(), "{errors:?}");
    assert_all_present(format_of(&producer), &rebuilt, &model.tracked());
    let text = metrics_text(&producer).await;
    assert!(
        text.contains("reason=\"send_stalled\"") || text.contains("reason=\"fenced_by_producer\""),
        "no stall detachment in:\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superseded_producer_stands_by_and_recovers_its_lane_when_vacant() {
    let a = FakeRelay::start(GrantConfig::default(), 1).await;
    let b = FakeRelay::start(GrantConfig::default(), 2).await;
    let producer = start_producer(vec![a.url(), b.url()]).await;
    for fake in [&a, &b] {
        fake.wait_installed(0, "snapshot installed").await;
    }
    // The first attach is a fresh start: TAKEOVER.
    let mode = a.with(|s| s.attachments[0].attach.as_ref().unwrap().mode);
    assert_eq!(mode, v1::AttachMode::Takeover as i32);
    a.set_occupied(true);
    a.retire(
        0,
        v1::RetireReason::Superseded,
        "lease epoch 2 replaced epoch 1 (held by incarnation 0x0000000000000009)",
    )
    .await;
    a.wait_for("the superseded stream ended", |s| {
        s.attachments.first().is_some_and(|a| a.ended)
    })
    .await;
    // It keeps asking IF_VACANT under the backoff; each refusal changes nothing.
    a.wait_for("two IF_VACANT refusals", |s| s.refused >= 2)
        .await;
    let needle = format!(
        "ckf_producer_attachment_state{{indexer=\"{}\",state=\"standby\"}} 1",
        a.url()
    );
    eventually_in_metrics(&producer, &needle).await;
    let text = metrics_text(&producer).await;
    let counted = format!(
        "ckf_producer_standby_refusals_total{{indexer=\"{}\"}}",
        a.url()
    );
    assert!(text.contains(&counted), "{text}");
    assert_eq!(
        a.with(|s| s.attachments.len()),
        1,
        "refusals are not attachments"
    );
    // Ingest and the other indexer carry on while it stands by.
    let mut client = ingest_client(&producer).await;
    store_one(&mut client, "s", 0, &chain(1, 0..30)).await;
    let table = producer.table().await.unwrap();
    b.wait_converged(0, &table, "B converged").await;

    // The other producer is gone: the next IF_VACANT attach is granted and the lane rebuilt.
    a.set_occupied(false);
    a.wait_installed(1, "re-attached").await;
    let mode = a.with(|s| s.attachments[1].attach.as_ref().unwrap().mode);
    assert_eq!(mode, v1::AttachMode::IfVacant as i32);
    a.wait_converged(1, &table, "A converged again").await;
    assert!(a.errors().is_empty(), "{:?}", a.errors());

    producer.shutdown();
    let report = producer.wait().await.unwrap();
    assert!(report.all_drained(), "{:?}", report.drains);
    assert_eq!(report.exit_code(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_standing_by_at_shutdown_reports_it_superseded() {
    let a = FakeRelay::start(GrantConfig::default(), 1).await;
    let producer = start_producer(vec![a.url()]).await;
    a.wait_installed(0, "snapshot installed").await;
    a.set_occupied(true);
    a.retire(
        0,
        v1::RetireReason::Superseded,
        "lease epoch 2 replaced epoch 1",
    )
    .await;
    a.wait_for("a refusal", |s| s.refused >= 1).await;
    producer.shutdown();
    let report = producer.wait().await.unwrap();
    assert!(
        matches!(&report.drains[0].1, DrainOutcome::Superseded { detail } if detail.contains("epoch 2")),
        "{:?}",
        report.drains
    );
    assert_eq!(report.exit_code(), 0);
}

/// A hot standby (`start_mode = if-vacant`) refused from its first attach never held the lane:
/// at shutdown it says it was standing by, not that it was superseded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_standby_that_never_held_the_lane_reports_standing_by() {
    let a = FakeRelay::start(GrantConfig::default(), 1).await;
    a.set_occupied(true);
    let mut config = fast_config(vec![a.url()]);
    config.publication.start_mode = producer_svc::config::StartMode::IfVacant;
    let producer = start_with(config).await;
    a.wait_for("two refusals", |s| s.refused >= 2).await;
    producer.shutdown();
    let report = producer.wait().await.unwrap();
    assert!(
        matches!(&report.drains[0].1, DrainOutcome::StandingBy { .. }),
        "{:?}",
        report.drains
    );
    assert_eq!(a.with(|s| s.attachments.len()), 0, "never granted a lease");
    assert_eq!(report.exit_code(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_an_invalid_config_and_a_busy_port() {
    /// `serve`'s error for `fast_config` changed by `edit`, as text with its causes.
    async fn refusal(edit: impl FnOnce(&mut producer_svc::ProducerConfig)) -> String {
        let mut config = fast_config(vec!["http://127.0.0.1:1".into()]);
        edit(&mut config);
        let err = producer_svc::serve(config, std::future::pending())
            .await
            .err()
            .expect("refused");
        format!("{err:#}")
    }
    let err = refusal(|c| c.publication.batch_threshold = 0).await;
    assert!(err.contains("publication.batch_threshold = 0"), "{err}");

    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let err = refusal(|c| c.listen = busy.local_addr().unwrap()).await;
    assert!(err.contains("binding the ingest listener"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_open_ingest_streams_with_unavailable() {
    let (_fake, producer) = attached_producer(|_| {}).await;
    let mut client = ingest_client(&producer).await;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(batch("w", 1, vec![stored(1, 0, &[h(1, 1)])]))
        .await
        .unwrap();
    let mut results = client
        .publish(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(results.message().await.unwrap().unwrap().sequence, 1);

    // The client keeps its request stream open; shutdown must still complete.
    producer.shutdown();
    let status = results.message().await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(
        status.message().contains("shutting down"),
        "{}",
        status.message()
    );
    let report = tokio::time::timeout(std::time::Duration::from_secs(30), producer.wait())
        .await
        .expect("shutdown completes with an ingest stream still open")
        .unwrap();
    assert!(report.all_drained(), "{:?}", report.drains);
    assert_eq!(report.final_stats.unique_blocks, 1);
    drop(tx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_batch_threshold_cuts_a_batch_without_waiting_for_the_delay() {
    // The delay alone would hold the batch for longer than the fake's patience.
    let (fake, producer) = attached_producer(held_until(16)).await;
    let mut client = ingest_client(&producer).await;
    // Below the threshold: stays pending.
    store_one(&mut client, "s", 0, &[h(1, 0)]).await;
    assert_eq!(producer.stats().await.unwrap().pending_dirty, 1);
    // At the threshold: cut and published at once, the pending store included.
    store_one(&mut client, "s", 1, &chain(1, 1..40)).await;
    let table = producer.table().await.unwrap();
    fake.wait_converged(0, &table, "the batch arrived").await;
    assert_eq!(producer.stats().await.unwrap().pending_dirty, 0);
}

/// The block map's rehashes (each a pause of ingest) show on `/metrics`, and
/// `table.reserve_blocks` takes the growths away below the reservation: one rehash (the
/// reservation's own, at start) for 3,000 blocks, where an unreserved producer rehashes as its
/// map grows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_map_rehashes_are_exported_and_a_reservation_avoids_them() {
    let rehashes = |reserve: Option<u64>| async move {
        let fake = FakeRelay::start(GrantConfig::default(), 7).await;
        let mut config = fast_config(vec![fake.url()]);
        config.table.reserve_blocks = reserve;
        let producer = start_with(config).await;
        let mut client = ingest_client(&producer).await;
        let hashes = chain(9, 0..3_000);
        let result = store_one(&mut client, "src", 1, &hashes).await;
        assert_eq!(result.events.len(), 1);
        let stats = client
            .get_stats(v1::GetStatsRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(stats.unique_blocks, 3_000);
        let text = metrics_text(&producer).await;
        let value = |name: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
                .unwrap_or_else(|| panic!("no {name} in\n{text}"))
        };
        (
            value("ckf_producer_block_map_rebuilds_total"),
            value("ckf_producer_block_map_rebuild_seconds_total"),
            value("ckf_producer_block_map_longest_rebuild_seconds"),
        )
    };
    let (count, seconds, longest) = rehashes(None).await;
    assert!(count >= 5.0, "{count} rehashes growing to 3,000 blocks");
    assert!(
        seconds >= longest && longest > 0.0,
        "{seconds} s, longest {longest} s"
    );
    let (count, _, _) = rehashes(Some(3_000)).await;
    assert_eq!(count, 1.0, "a map reserved for 3,000 blocks grew");
}
