//! E2E 5: a raw Relay client (tonic `RelayClient`, hand-built frames) sending a gap, a
//! non-contiguous delta, an out-of-range bucket, a duplicate bucket, too many images, an
//! oversized message, an unknown pool or the wrong table format gets a precise gRPC status
//! (code, and a message naming the reason), and only its own lane is affected: the real
//! producer's lane keeps its lease and answers with exactly its content throughout.
//!
//! The indexer runs with the smallest message limit (4 KiB, so snapshots are chunked and an
//! oversized frame is cheap to build) and at most 200 images per delta.

use ckf_core::addressing::TableFormat;
use ckf_e2e::check::wait_converged;
use ckf_e2e::cluster::{
    Indexer, IndexerSpec, Producer, ProducerSpec, SEED, TestDir, format, is_active,
};
use ckf_e2e::hashes::HashPool;
use ckf_e2e::metrics;
use ckf_e2e::relay::{self, RawStream, RawTable, attach};
use ckf_e2e::wait::{DEADLINE, eventually};
use ckf_proto::v1::{self, LaneState, RetireReason, relay_frame::Frame};
use tonic::Code;

/// The lane the raw client publishes to (no real producer serves it).
const RAW_DC: &str = "dc-b";
const MAX_IMAGES: u32 = 200;

/// One broken frame and the refusal it must get.
struct Case {
    name: &'static str,
    frame: Box<dyn Fn(&RawStream) -> Frame>,
    reason: RetireReason,
    code: Code,
    needles: Vec<&'static str>,
}

/// The real producer's lane still holds exactly its content under the same lease, never retired.
async fn real_lane_untouched(indexer: &Indexer, a: &Producer, epoch: u64) {
    let lane = wait_converged(indexer, a).await;
    assert_eq!(
        lane.lease_epoch, epoch,
        "the real producer's lease moved: {lane:?}"
    );
    assert_eq!(lane.retirements, 0, "{lane:?}");
}

/// Attaches a raw producer for [`RAW_DC`], installs a barrier snapshot tagged 10 holding
/// `hashes[0]`, then delta 10 -> 11 adding `hashes[1]`; checks both are visible.
async fn ready_raw_lane(indexer: &Indexer, incarnation: u64, hashes: &[u64]) -> RawStream {
    let mut stream = relay::open(indexer, attach(RAW_DC, incarnation, format()))
        .await
        .expect("attach accepted");
    assert_eq!(stream.granted.max_images_per_delta, MAX_IMAGES);
    assert_eq!(stream.granted.max_message_bytes, 4096);
    let mut table = RawTable::new(&format());
    table.place(hashes[0]);
    // 256 buckets = 2 KiB per chunk, under the 4 KiB limit.
    let ack = stream.snapshot(10, &table.words, 256).await;
    assert!(ack.ready && ack.installed_sequence == 10, "{ack:?}");
    let image = table.place(hashes[1]);
    stream.send(stream.delta(10, 11, &[image])).await;
    let ack = stream.expect_ack().await;
    assert_eq!(ack.installed_sequence, 11, "{ack:?}");
    let depths = indexer.depths(&hashes[..2]).await.expect("FindMatches");
    assert_eq!(depths.get(RAW_DC), Some(&2), "{depths:?}");
    stream
}

/// Sends `frame`, expects `Retired(reason)` and a status with `code` whose message contains
/// every needle; checks `ListLanes` shows the raw lane retired for that reason.
async fn expect_refusal(
    indexer: &Indexer,
    stream: &mut RawStream,
    frame: Frame,
    reason: RetireReason,
    code: Code,
    needles: &[&str],
) {
    stream.send(frame).await;
    let (retired, status) = stream.expect_retired().await;
    assert_eq!(retired.reason(), reason, "{retired:?} / {status:?}");
    assert_eq!(status.code(), code, "{status:?}");
    for needle in needles {
        assert!(
            status.message().contains(needle),
            "{needle:?} not in {status:?}"
        );
    }
    let epoch = stream.lease.epoch;
    let lane = indexer
        .wait_lane(RAW_DC, "retired", |l| {
            l.lease_epoch == epoch && l.state() == LaneState::Retired
        })
        .await;
    assert_eq!(lane.last_retire_reason(), reason, "{lane:?}");
    let depths = indexer.depths(&[1, 2, 3]).await.expect("FindMatches");
    assert!(
        !depths.contains_key(RAW_DC),
        "a retired lane answered: {depths:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_relay_traffic_gets_precise_statuses_and_affects_only_its_lane() {
    let dir = TestDir::new("relay-errors");
    let spec = IndexerSpec {
        heartbeat_deadline_ms: 30_000,
        max_message_bytes: 4096,
        max_images_per_delta: MAX_IMAGES,
        ..IndexerSpec::default()
    };
    let indexer = Indexer::start(&dir, &spec);
    let mut a = Producer::start_dc(&dir, "dc-a", &[indexer.url()]);
    let mut pool = HashPool::new(&format(), 5);
    a.store(1, &pool.take(60)).await;
    let epoch = wait_converged(&indexer, &a).await.lease_epoch;

    // Refused attachments: no lease, nothing changes.
    let status = relay::open(&indexer, attach("dc-z", 1, format()))
        .await
        .expect_err("unknown pool refused");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert!(
        status.message().contains("e2e/dc-z") && status.message().contains("not a lane"),
        "{status:?}"
    );
    let wrong = TableFormat::new(2048, SEED).expect("format");
    let status = relay::open(&indexer, attach(RAW_DC, 1, wrong))
        .await
        .expect_err("wrong format refused");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    for needle in [
        "format mismatch",
        "buckets=1024",
        "buckets=2048",
        "table.expected_blocks",
    ] {
        assert!(
            status.message().contains(needle),
            "{needle:?} not in {status:?}"
        );
    }
    let raw_lane = indexer.lane(RAW_DC).await.expect("ListLanes");
    assert_eq!(raw_lane.state(), LaneState::Unassigned, "{raw_lane:?}");
    real_lane_untouched(&indexer, &a, epoch).await;

    let hashes = pool.take(2);
    let oversized: Vec<(u32, u64)> = (0..600).map(|b| (b, 1)).collect();
    let too_many: Vec<(u32, u64)> = (0..MAX_IMAGES + 50).map(|b| (b, 1)).collect();
    let cases: Vec<Case> = vec![
        Case {
            name: "gap",
            frame: Box::new(|s| s.delta(12, 13, &[(0, 0)])),
            reason: RetireReason::Gap,
            code: Code::FailedPrecondition,
            needles: vec!["gap", "delta base 12", "installed sequence is 11"],
        },
        Case {
            name: "non-contiguous",
            frame: Box::new(|s| s.delta(11, 13, &[(0, 0)])),
            reason: RetireReason::Gap,
            code: Code::InvalidArgument,
            needles: vec!["non-contiguous delta 11 -> 13"],
        },
        Case {
            name: "out-of-range bucket",
            frame: Box::new(|s| s.delta(11, 12, &[(3, 0), (1024, 0)])),
            reason: RetireReason::MalformedFrame,
            code: Code::InvalidArgument,
            needles: vec!["bucket 1024 is outside the table of 1024 buckets"],
        },
        Case {
            name: "duplicate bucket",
            frame: Box::new(|s| s.delta(11, 12, &[(5, 0), (6, 0), (5, 0)])),
            reason: RetireReason::MalformedFrame,
            code: Code::InvalidArgument,
            needles: vec!["bucket 5 appears more than once"],
        },
        Case {
            name: "empty delta",
            frame: Box::new(|s| s.delta(11, 12, &[])),
            reason: RetireReason::MalformedFrame,
            code: Code::InvalidArgument,
            needles: vec!["no bucket image"],
        },
        Case {
            name: "drain marker past the installed sequence",
            frame: Box::new(|s| {
                Frame::DrainMarker(v1::DrainMarker {
                    lease: Some(s.lease),
                    sequence: 12,
                })
            }),
            reason: RetireReason::LostFinalDelta,
            code: Code::FailedPrecondition,
            needles: vec!["drain marker says 12 but installed sequence is 11"],
        },
        Case {
            name: "foreign lease",
            frame: Box::new(|s| {
                let mut frame = s.delta(11, 12, &[(0, 0)]);
                if let Frame::Delta(d) = &mut frame {
                    d.lease = Some(v1::LaneLease {
                        epoch: s.lease.epoch + 100,
                        ..s.lease
                    });
                }
                frame
            }),
            reason: RetireReason::StreamLost,
            code: Code::InvalidArgument,
            needles: vec!["carries", "but this stream holds"],
        },
        Case {
            name: "too many images",
            frame: Box::new(move |s| s.delta(11, 12, &too_many)),
            reason: RetireReason::StreamLost,
            code: Code::InvalidArgument,
            needles: vec!["250 images", "max_images_per_delta = 200"],
        },
        Case {
            name: "oversized message",
            frame: Box::new(move |s| s.delta(11, 12, &oversized)),
            reason: RetireReason::StreamLost,
            code: Code::ResourceExhausted,
            needles: vec![
                "decoded message length too large",
                "the limit is: 4096 bytes",
            ],
        },
    ];
    let mut last_epoch = 0;
    for (i, case) in cases.iter().enumerate() {
        let name = case.name;
        eprintln!("case: {name}");
        let mut stream = ready_raw_lane(&indexer, 100 + i as u64, &hashes).await;
        assert!(
            stream.lease.epoch > last_epoch,
            "{name}: epochs strictly increase"
        );
        last_epoch = stream.lease.epoch;
        let frame = (case.frame)(&stream);
        expect_refusal(
            &indexer,
            &mut stream,
            frame,
            case.reason,
            case.code,
            &case.needles,
        )
        .await;
        let lane = indexer.lane(RAW_DC).await.expect("ListLanes");
        assert_eq!(lane.retirements, i as u64 + 1, "{name}: {lane:?}");
        real_lane_untouched(&indexer, &a, epoch).await;
    }

    // Broken barrier snapshots and a delta before the snapshot completed.
    let mut table = RawTable::new(&format());
    table.place(hashes[0]);
    let chunk = |s: &RawStream, first: usize| {
        Frame::SnapshotChunk(v1::SnapshotChunk {
            lease: Some(s.lease),
            sequence: 10,
            first_bucket: first as u64,
            words: table.words[first..first + 256]
                .iter()
                .flat_map(|w| w.to_le_bytes())
                .collect(),
        })
    };
    let early = [
        (
            "delta before the snapshot",
            RetireReason::MalformedFrame,
            Code::FailedPrecondition,
            "delta before the barrier snapshot completed",
        ),
        (
            "snapshot chunk out of order",
            RetireReason::MalformedFrame,
            Code::InvalidArgument,
            "snapshot chunk starts at bucket 512, expected 256",
        ),
        (
            "snapshot chunk not whole words",
            RetireReason::MalformedFrame,
            Code::InvalidArgument,
            "has 2047 bytes, not a multiple of 8",
        ),
    ];
    for (k, (name, reason, code, needle)) in early.into_iter().enumerate() {
        eprintln!("case: {name}");
        let mut stream = relay::open(&indexer, attach(RAW_DC, 600 + k as u64, format()))
            .await
            .expect("attach accepted");
        match k {
            0 => stream.send(stream.delta(0, 1, &[(0, 1)])).await,
            1 => {
                stream.send(chunk(&stream, 0)).await;
                stream.send(chunk(&stream, 512)).await;
            }
            _ => {
                let mut frame = chunk(&stream, 0);
                if let Frame::SnapshotChunk(c) = &mut frame {
                    c.words.pop();
                }
                stream.send(frame).await;
            }
        }
        let (retired, status) = stream.expect_retired().await;
        assert_eq!(retired.reason(), reason, "{name}: {retired:?} / {status:?}");
        assert_eq!(status.code(), code, "{name}: {status:?}");
        assert!(
            status.message().contains(needle),
            "{name}: {needle:?} not in {status:?}"
        );
        let retirements = (cases.len() + k + 1) as u64;
        let lane = indexer
            .wait_lane(RAW_DC, "retired", |l| l.retirements == retirements)
            .await;
        assert_eq!(lane.state(), LaneState::Retired, "{name}: {lane:?}");
        real_lane_untouched(&indexer, &a, epoch).await;
    }

    // The lane is not poisoned: a well-behaved attachment makes it ready and drains it.
    let mut stream = ready_raw_lane(&indexer, 999, &hashes).await;
    stream
        .send(Frame::DrainMarker(v1::DrainMarker {
            lease: Some(stream.lease),
            sequence: 11,
        }))
        .await;
    let ack = stream.expect_ack().await;
    assert!(ack.drained && ack.installed_sequence == 11, "{ack:?}");
    assert!(
        matches!(stream.next().await, Ok(None)),
        "a drained stream ends with OK"
    );
    let lane = indexer.lane(RAW_DC).await.expect("ListLanes");
    assert!(is_active(&lane) && lane.drained, "{lane:?}");
    real_lane_untouched(&indexer, &a, epoch).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_producer_with_the_wrong_format_is_refused_and_keeps_retrying() {
    let dir = TestDir::new("wrong-format");
    let indexer = Indexer::start(&dir, &IndexerSpec::default());
    let endpoints = [indexer.url()];
    let mut a = Producer::start_dc(&dir, "dc-a", &endpoints);
    let wrong = ProducerSpec {
        bucket_count: 2048,
        ..ProducerSpec::new(RAW_DC)
    };
    let b = Producer::start(&dir, "producer-b-wrong-format", &wrong, &endpoints);
    let mut pool = HashPool::new(&format(), 11);
    a.store(1, &pool.take(30)).await;
    let epoch = wait_converged(&indexer, &a).await.lease_epoch;

    // The producer is told why, and retries (an operator may fix the indexer's manifest).
    let url = indexer.url();
    eventually("two refused attachments", DEADLINE, || async {
        let text = b.metrics()?;
        let labels = [("indexer", url.as_str()), ("reason", "attach_refused")];
        match metrics::value(&text, "ckf_producer_detachments_total", &labels) {
            Some(n) if n >= 2.0 => Ok(()),
            other => Err(format!("detachments{{reason=attach_refused}} = {other:?}")),
        }
    })
    .await;
    let records = b.log_records("attachment ended");
    let refusal = records
        .iter()
        .find(|r| {
            r["detail"]
                .as_str()
                .is_some_and(|d| d.contains("FailedPrecondition"))
        })
        .unwrap_or_else(|| panic!("no refusal in the producer's log: {records:?}"));
    let detail = refusal["detail"].as_str().unwrap_or_default();
    for needle in ["format mismatch", "buckets=1024", "buckets=2048"] {
        assert!(detail.contains(needle), "{needle:?} not in {detail:?}");
    }
    // A refused attach never had a lease: nothing was fenced.
    let message = refusal["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("before a lease was granted; nothing to fence"),
        "{refusal}"
    );
    let text = indexer.metrics().expect("indexer metrics");
    let refused = metrics::value(
        &text,
        "ckf_indexer_attach_refused_total",
        &[("code", "failed_precondition")],
    );
    assert!(refused.unwrap_or(0.0) >= 2.0, "{text}");
    let lane = indexer.lane(RAW_DC).await.expect("ListLanes");
    assert_eq!(lane.state(), LaneState::Unassigned, "{lane:?}");
    real_lane_untouched(&indexer, &a, epoch).await;
}
