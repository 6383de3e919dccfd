//! Relay + Query against an in-process indexer on 127.0.0.1:0, driven by the generated client
//! and ckf-core's producer types.

mod common;

use ckf_proto::v1::{self, relay_frame::Frame as WireFrame};
use common::*;
use tonic::Code;

#[tokio::test]
async fn attach_snapshot_delta_then_find_matches_sees_the_blocks() {
    let indexer = Indexer::start(config(&["dc-a", "dc-b"])).await;
    let seq = hashes(1, 12);

    let mut a = Producer::attach(&indexer, "dc-a", 11).await;
    assert_eq!(a.lease.lane, 0);
    assert_eq!(a.lease.epoch, 1);
    assert_eq!(a.granted.max_message_bytes, 64 << 10);
    // Blocks stored before the snapshot travel in it; 2 KiB chunks = 4 chunks.
    a.store(1, &seq[..4]);
    let ack = a.snapshot(2048).await;
    assert!(ack.ready);
    assert_eq!(ack.installed_sequence, 0);
    assert_eq!(indexer.find(&seq).await, (vec![(0, 4)], 0b01));

    // Blocks stored after it travel in a delta.
    a.store(1, &seq[4..9]);
    let ack = a.publish().await;
    assert_eq!(ack.installed_sequence, 1);
    assert_eq!(indexer.find(&seq).await, (vec![(0, 9)], 0b01));

    // A second lane answers independently, with its own depth.
    let mut b = Producer::attach(&indexer, "dc-b", 22).await;
    b.store(7, &seq[..2]);
    b.snapshot(64 << 10).await;
    assert_eq!(indexer.find(&seq).await, (vec![(0, 9), (1, 2)], 0b11));

    // Removals disappear.
    a.remove(1, &seq[3..9]);
    assert_eq!(a.publish().await.installed_sequence, 2);
    assert_eq!(indexer.find(&seq).await, (vec![(0, 3), (1, 2)], 0b11));

    // The consumer lane equals the producer's table word for word.
    let table = indexer.running.indexer().table();
    assert_eq!(table.lane_words(0), a.state.buckets());
    assert_eq!(table.lane_words(1), b.state.buckets());
}

#[tokio::test]
async fn list_lanes_reports_state_lease_sequence_load_and_drain() {
    let indexer = Indexer::start(config(&["dc-a", "dc-b"])).await;
    let listing = indexer.lanes().await;
    assert_eq!(listing.domain, DOMAIN);
    assert_eq!(listing.format, Some(format().into()));
    assert_eq!(listing.consumer_instance, indexer.running.consumer_instance);
    assert_eq!(listing.lanes.len(), 2);
    let idle = &listing.lanes[1];
    assert_eq!(idle.state(), v1::LaneState::Unassigned);
    assert_eq!(idle.pool.as_ref().unwrap().dc, "dc-b");
    assert_eq!((idle.lease_epoch, idle.incarnation), (0, 0));
    assert_eq!(idle.last_update_age_ms, None);

    let mut a = Producer::attach(&indexer, "dc-a", 0xabc).await;
    let awaiting = indexer.lane(0).await;
    assert_eq!(awaiting.state(), v1::LaneState::AwaitingSnapshot);
    assert_eq!((awaiting.lease_epoch, awaiting.incarnation), (1, 0xabc));

    a.store(1, &hashes(2, 300));
    a.snapshot(4096).await;
    a.store(2, &hashes(3, 100));
    a.publish().await;
    a.publish_nothing_check();
    let active = indexer.lane(0).await;
    assert_eq!(active.state(), v1::LaneState::Active);
    assert_eq!(active.installed_sequence, 1);
    assert!(active.last_update_age_ms.is_some());
    let resident = a.state.stats().resident_fingerprints as f64;
    assert_eq!(active.load_factor, resident / (BUCKETS * 4) as f64);
    assert!(active.load_factor > 0.0);
    assert!(!active.drained);

    let ack = a.drain().await;
    assert!(ack.drained);
    assert_eq!(ack.installed_sequence, 1);
    // After the drained Ack the indexer ends the stream with OK.
    assert!(a.stream.next().await.unwrap().is_none());
    let drained = indexer.lane(0).await;
    assert!(drained.drained);
    assert_eq!(
        drained.state(),
        v1::LaneState::Active,
        "a drained lane keeps answering"
    );
    assert_eq!(drained.retirements, 0);
}

#[tokio::test]
async fn unknown_pool_is_not_found_naming_the_configured_pools() {
    let indexer = Indexer::start(config(&["dc-a", "dc-b"])).await;
    let status = refused(&indexer, (&identity("dc-z", 1, format())).into()).await;
    assert_status(
        &status,
        Code::NotFound,
        &["test/dc-z", "test/dc-a, test/dc-b"],
    );
}

#[tokio::test]
async fn format_mismatch_is_failed_precondition_naming_both_formats() {
    let indexer = Indexer::start(config(&["dc-a"])).await;
    let other = ckf_core::addressing::TableFormat::new(2048, 5).unwrap();
    let status = refused(&indexer, (&identity("dc-a", 1, other)).into()).await;
    assert_status(
        &status,
        Code::FailedPrecondition,
        &[
            &format!("indexer has [{}]", format()),
            &format!("producer has [{other}]"),
        ],
    );

    // A format this build cannot even decode is named too.
    let mut attach: v1::Attach = (&identity("dc-a", 1, format())).into();
    attach.format.as_mut().unwrap().bucket_count = 1001;
    let status = refused(&indexer, attach).await;
    assert_status(
        &status,
        Code::FailedPrecondition,
        &["bucket_count: 1001", "odd (it must be even)"],
    );
    // A producer still on table format v1 (power-of-two XOR addressing) is refused, never
    // mixed with v2 tables, and told which version this build speaks.
    let mut attach: v1::Attach = (&identity("dc-a", 1, format())).into();
    attach.format.as_mut().unwrap().version = 1;
    let status = refused(&indexer, attach).await;
    assert_status(
        &status,
        Code::FailedPrecondition,
        &["version 1 (this build supports 2)"],
    );
    // Nothing was leased.
    assert_eq!(indexer.lane(0).await.state(), v1::LaneState::Unassigned);
}

#[tokio::test]
async fn first_frame_must_be_attach() {
    let indexer = Indexer::start(config(&["dc-a"])).await;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(WireFrame::Heartbeat(v1::Heartbeat::default()).into())
        .await
        .unwrap();
    let status = indexer
        .relay()
        .publish(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect_err("refused");
    assert_status(
        &status,
        Code::InvalidArgument,
        &["must be Attach, got heartbeat"],
    );
}

/// The images limit of the refusal table's indexer (small, so a delta over it is cheap).
const MAX_IMAGES: u32 = 100;

/// Starts an indexer with lanes dc-a and dc-b, both active with the same 8 blocks.
async fn two_ready_lanes() -> (Indexer, Producer, Producer, Vec<u64>) {
    let mut cfg = config(&["dc-a", "dc-b"]);
    cfg.limits.max_images_per_delta = MAX_IMAGES;
    let indexer = Indexer::start(cfg).await;
    let seq = hashes(9, 8);
    let mut a = Producer::attach(&indexer, "dc-a", 1).await;
    a.store(1, &seq);
    a.snapshot(8192).await;
    let mut b = Producer::attach(&indexer, "dc-b", 2).await;
    b.store(1, &seq);
    b.snapshot(8192).await;
    assert_eq!(indexer.find(&seq).await, (vec![(0, 8), (1, 8)], 0b11));
    (indexer, a, b, seq)
}

/// After lane 0 was retired: lane 1 still answers, lane 0 is out of the ready set, and
/// ListLanes names the reason.
async fn only_lane_0_affected(
    indexer: &Indexer,
    b: &mut Producer,
    seq: &[u64],
    reason: v1::RetireReason,
) {
    assert_eq!(indexer.find(seq).await, (vec![(1, 8)], 0b10));
    let lane0 = indexer.lane(0).await;
    assert_eq!(lane0.state(), v1::LaneState::Retired);
    assert_eq!(lane0.retirements, 1);
    assert_eq!(lane0.last_retire_reason(), reason);
    assert!(!lane0.last_retire_detail.is_empty());
    let lane1 = indexer.lane(1).await;
    assert_eq!(lane1.state(), v1::LaneState::Active);
    assert_eq!(lane1.retirements, 0);
    // ... and lane 1's stream still applies deltas.
    b.store(2, &hashes(10, 3));
    assert_eq!(b.publish().await.installed_sequence, 1);
}

/// One frame an active lane must refuse (lane 0 installed at 0), and how.
struct Refusal {
    name: &'static str,
    /// Builds the bad frame (it may advance the producer, e.g. take a real delta).
    frame: fn(&mut Producer) -> v1::RelayFrame,
    reason: v1::RetireReason,
    code: Code,
    needle: &'static str,
}

fn refusals() -> Vec<Refusal> {
    use v1::RetireReason as R;
    vec![
        Refusal {
            name: "gap",
            frame: |a| {
                a.store(3, &hashes(4, 2));
                let mut delta = a.next_delta();
                delta.base_sequence += 1;
                delta.sequence += 1;
                WireFrame::Delta(delta).into()
            },
            reason: R::Gap,
            code: Code::FailedPrecondition,
            needle: "delta base 1 but installed sequence is 0",
        },
        Refusal {
            name: "non-contiguous delta",
            frame: |a| raw_delta(a, 0, 2, vec![3]),
            reason: R::Gap,
            code: Code::InvalidArgument,
            needle: "non-contiguous delta 0 -> 2",
        },
        Refusal {
            name: "out-of-range bucket",
            frame: |a| raw_delta(a, 0, 1, vec![3, BUCKETS as u32]),
            reason: R::MalformedFrame,
            code: Code::InvalidArgument,
            needle: "bucket 1024 is outside the table of 1024",
        },
        Refusal {
            name: "duplicate bucket",
            frame: |a| raw_delta(a, 0, 1, vec![5, 6, 5]),
            reason: R::MalformedFrame,
            code: Code::InvalidArgument,
            needle: "bucket 5 appears more than once",
        },
        Refusal {
            name: "empty delta",
            frame: |a| raw_delta(a, 0, 1, vec![]),
            reason: R::MalformedFrame,
            code: Code::InvalidArgument,
            needle: "delta carries no bucket image",
        },
        Refusal {
            name: "drain marker past the installed sequence (lost final delta)",
            frame: |a| {
                a.store(5, &hashes(11, 4));
                let _lost = a.next_delta(); // never sent
                let marker = a.publisher.drain_marker().unwrap();
                WireFrame::DrainMarker((&marker).into()).into()
            },
            reason: R::LostFinalDelta,
            code: Code::FailedPrecondition,
            needle: "drain marker says 1 but installed sequence is 0",
        },
        Refusal {
            name: "delta older than the dirty-to-applied deadline",
            frame: |a| {
                a.store(3, &hashes(50, 2));
                let mut delta = a.next_delta();
                delta.oldest_change_age_ms = 120_000; // the test deadline is 60 s
                WireFrame::Delta(delta).into()
            },
            reason: R::LagExceeded,
            code: Code::DeadlineExceeded,
            needle: "exceeds the dirty-to-applied deadline 60000 ms",
        },
        Refusal {
            name: "foreign lease",
            frame: |a| {
                let mut lease = a.lease;
                lease.epoch += 5;
                WireFrame::Heartbeat(v1::Heartbeat {
                    lease: Some(lease.into()),
                    sequence: 0,
                })
                .into()
            },
            reason: R::StreamLost,
            code: Code::InvalidArgument,
            needle: "heartbeat frame carries lane 0 epoch 6",
        },
        Refusal {
            name: "too many images",
            frame: |a| raw_delta(a, 0, 1, (0..=MAX_IMAGES).collect()),
            reason: R::StreamLost,
            code: Code::InvalidArgument,
            needle: "delta carries 101 images (limits.max_images_per_delta = 100)",
        },
        Refusal {
            // A re-barrier chunk of the whole 8 KiB table... times 9: over the 64 KiB limit.
            name: "oversized message",
            frame: |a| {
                WireFrame::SnapshotChunk(v1::SnapshotChunk {
                    lease: a.wire_lease(),
                    sequence: 0,
                    first_bucket: 0,
                    words: vec![0; 72 << 10],
                })
                .into()
            },
            reason: R::StreamLost,
            code: Code::ResourceExhausted,
            needle: "the limit is: 65536 bytes",
        },
        Refusal {
            name: "undecodable delta (buckets and images differ)",
            frame: |a| {
                let mut frame = raw_delta(a, 0, 1, vec![1, 2]);
                if let Some(WireFrame::Delta(d)) = &mut frame.frame {
                    d.images.pop();
                }
                frame
            },
            reason: R::StreamLost,
            code: Code::InvalidArgument,
            needle: "malformed delta frame: Delta has 2 buckets but 1 images",
        },
        Refusal {
            name: "empty RelayFrame",
            frame: |_| v1::RelayFrame { frame: None },
            reason: R::StreamLost,
            code: Code::InvalidArgument,
            needle: "empty RelayFrame (no frame set)",
        },
        Refusal {
            name: "second Attach",
            frame: |_| WireFrame::Attach(v1::Attach::from(&identity("dc-a", 1, format()))).into(),
            reason: R::StreamLost,
            code: Code::InvalidArgument,
            needle: "second Attach on an attached stream",
        },
    ]
}

/// Every refusal of an active lane: the precise `Retired` reason, status code and message; no
/// word of the lane changed; only that lane is retired, the other keeps answering and applying.
#[tokio::test]
async fn each_refusal_retires_only_its_lane_with_a_precise_status() {
    for row in refusals() {
        let name = row.name;
        eprintln!("case: {name}");
        let (indexer, mut a, mut b, seq) = two_ready_lanes().await;
        let words = indexer.running.indexer().table().lane_words(0);
        let frame = (row.frame)(&mut a);
        a.stream.send_raw(frame).await;
        let (retired, status) = a.stream.expect_retired().await;
        assert_eq!(retired.reason(), row.reason, "{name}: {retired:?}");
        assert!(!retired.detail.is_empty(), "{name}");
        assert_status(&status, row.code, &[row.needle]);
        assert_eq!(
            indexer.running.indexer().table().lane_words(0),
            words,
            "{name}: a refused frame changes no word"
        );
        only_lane_0_affected(&indexer, &mut b, &seq, row.reason).await;
    }
}

#[tokio::test]
async fn stream_closed_without_drain_retires_the_lane_as_stream_lost() {
    let (indexer, a, mut b, seq) = two_ready_lanes().await;
    drop(a); // closes the producer's side without a drain marker
    let lane0 = indexer
        .wait_lane(0, |l| l.state() == v1::LaneState::Retired)
        .await;
    assert_eq!(lane0.last_retire_reason(), v1::RetireReason::StreamLost);
    only_lane_0_affected(&indexer, &mut b, &seq, v1::RetireReason::StreamLost).await;
}

#[tokio::test]
async fn newer_attachment_fences_the_older_stream() {
    let indexer = Indexer::start(config(&["dc-a"])).await;
    let old_blocks = hashes(20, 6);
    let new_blocks = hashes(21, 5);
    let mut old = Producer::attach(&indexer, "dc-a", 100).await;
    old.store(1, &old_blocks);
    old.snapshot(8192).await;
    assert_eq!(indexer.find(&old_blocks).await, (vec![(0, 6)], 1));

    // A second producer for the same pool (new incarnation) attaches: epoch 2.
    let mut new = Producer::attach(&indexer, "dc-a", 200).await;
    assert_eq!(new.lease.epoch, 2);
    let status = old
        .stream
        .expect_retired_as(v1::RetireReason::Superseded, Code::Aborted)
        .await;
    assert_status(&status, Code::Aborted, &["lease epoch 2 replaced epoch 1"]);
    // Fenced at grant time: the lane is not ready until the newer snapshot.
    assert_eq!(indexer.find(&old_blocks).await, (vec![], 0));

    new.store(1, &new_blocks);
    new.snapshot(8192).await;
    assert_eq!(indexer.find(&new_blocks).await, (vec![(0, 5)], 1));
    assert_eq!(indexer.find(&old_blocks).await, (vec![(0, 0)], 1));
    let lane = indexer.lane(0).await;
    assert_eq!((lane.lease_epoch, lane.incarnation), (2, 200));
    assert_eq!(lane.retirements, 0, "supersession is not a retirement");

    // A frame the old producer sends now changes nothing.
    old.store(1, &hashes(22, 3));
    let delta = old.next_delta();
    old.stream.send(WireFrame::Delta(delta)).await;
    new.store(2, &hashes(23, 2));
    assert_eq!(new.publish().await.installed_sequence, 1);
    assert_eq!(indexer.find(&old_blocks).await, (vec![(0, 0)], 1));
}

#[tokio::test]
async fn heartbeat_deadline_retires_a_silent_lane() {
    let mut cfg = config(&["dc-a", "dc-b"]);
    cfg.lag.heartbeat_deadline_ms = 500;
    let indexer = Indexer::start(cfg).await;
    let mut a = Producer::attach(&indexer, "dc-a", 1).await;
    assert_eq!(a.granted.heartbeat_deadline_ms, 500);
    a.snapshot(8192).await;
    // Silence: the indexer retires the lane and ends the stream.
    a.stream
        .expect_retired_as(v1::RetireReason::HeartbeatTimeout, Code::DeadlineExceeded)
        .await;
    let lane = indexer.lane(0).await;
    assert_eq!(lane.state(), v1::LaneState::Retired);
    assert_eq!(
        lane.last_retire_reason(),
        v1::RetireReason::HeartbeatTimeout
    );
}

#[tokio::test]
async fn heartbeats_keep_a_lane_alive() {
    let mut cfg = config(&["dc-a"]);
    // Heartbeats every 100 ms against a 1 s deadline: a 10x margin for a loaded machine.
    cfg.lag.heartbeat_deadline_ms = 1_000;
    let indexer = Indexer::start(cfg).await;
    let mut a = Producer::attach(&indexer, "dc-a", 1).await;
    a.store(1, &hashes(30, 3));
    a.snapshot(8192).await;
    for _ in 0..15 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        a.stream
            .send(WireFrame::Heartbeat(v1::Heartbeat {
                lease: a.wire_lease(),
                sequence: 0,
            }))
            .await;
    }
    // Well past the deadline in total, never silent for it: still active, and a delta applies.
    a.store(1, &hashes(31, 2));
    assert_eq!(a.publish().await.installed_sequence, 1);
    assert_eq!(indexer.lane(0).await.state(), v1::LaneState::Active);
}

trait NothingCheck {
    fn publish_nothing_check(&mut self);
}

impl NothingCheck for Producer {
    /// No pending change is left unpublished.
    fn publish_nothing_check(&mut self) {
        assert!(self.state.take_batch().is_none());
    }
}

#[tokio::test]
async fn delta_before_the_snapshot_completes_is_failed_precondition() {
    let indexer = Indexer::start(config(&["dc-a"])).await;
    let mut a = Producer::attach(&indexer, "dc-a", 1).await;
    // Half a snapshot, then a delta.
    a.stream
        .send(WireFrame::SnapshotChunk(v1::SnapshotChunk {
            lease: a.wire_lease(),
            sequence: 0,
            first_bucket: 0,
            words: vec![0; 4096],
        }))
        .await;
    a.stream.send_raw(raw_delta(&a, 0, 1, vec![1])).await;
    let status = a
        .stream
        .expect_retired_as(v1::RetireReason::MalformedFrame, Code::FailedPrecondition)
        .await;
    assert_status(
        &status,
        Code::FailedPrecondition,
        &["delta before the barrier snapshot completed"],
    );
    assert_eq!(indexer.find(&hashes(1, 3)).await, (vec![], 0));
}

#[tokio::test]
async fn retired_lane_recovers_with_a_new_attachment_and_snapshot() {
    let (indexer, mut a, _b, seq) = two_ready_lanes().await;
    let mut delta = {
        a.store(3, &hashes(60, 2));
        a.next_delta()
    };
    delta.base_sequence = 5;
    delta.sequence = 6;
    a.stream.send(WireFrame::Delta(delta)).await;
    a.stream
        .expect_retired_as(v1::RetireReason::Gap, Code::FailedPrecondition)
        .await;
    assert_eq!(indexer.find(&seq).await.1, 0b10);

    // The same producer state re-attaches (new lease, new barrier snapshot).
    let mut again = Producer::attach(&indexer, "dc-a", 1).await;
    assert_eq!(again.lease.epoch, 2);
    again.state = a.state.clone();
    again.snapshot(8192).await;
    assert_eq!(indexer.find(&seq).await, (vec![(0, 8), (1, 8)], 0b11));
    let lane = indexer.lane(0).await;
    assert_eq!(lane.state(), v1::LaneState::Active);
    assert_eq!(lane.retirements, 1);
    assert_eq!(lane.last_retire_reason(), v1::RetireReason::Gap);
    assert_eq!(
        indexer.running.indexer().table().lane_words(0),
        again.state.buckets()
    );
}

/// The value of the sample of `name` with exactly these `labels` in `text`, or 0.
fn sample(text: &str, name: &str, labels: &str) -> f64 {
    let prefix = format!("{name}{{{labels}}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

fn load_report(a: &Producer, sequence: u64, running: u32, kv_usage: f64) -> WireFrame {
    WireFrame::Load(v1::LoadReport {
        lease: a.wire_lease(),
        sequence,
        age_ms: 250,
        engines_reporting: 2,
        engines_configured: 3,
        running,
        waiting: 4,
        kv_usage,
        prefill_tokens_per_s: 12_000.0,
    })
}

#[tokio::test]
async fn load_reports_are_kept_per_lane_and_bad_ones_dropped_without_costing_the_stream() {
    let indexer = Indexer::start(config(&["dc-a", "dc-b"])).await;
    let mut a = Producer::attach(&indexer, "dc-a", 1).await;
    assert!(a.granted.accepts_load, "this indexer takes load reports");
    a.store(1, &hashes(40, 3));
    a.snapshot(8192).await;
    a.stream.send(load_report(&a, 2, 7, 0.5)).await;
    // An older report (lower sequence) and an invalid one (usage 1.5) are dropped.
    a.stream.send(load_report(&a, 1, 99, 0.1)).await;
    a.stream.send(load_report(&a, 3, 99, 1.5)).await;
    // The stream goes on: a delta after them applies.
    a.store(1, &hashes(41, 2));
    assert_eq!(a.publish().await.installed_sequence, 1);
    let text = metrics_text(&indexer).await;
    let outcome = |o: &str| {
        sample(
            &text,
            "ckf_indexer_load_reports_total",
            &format!("dc=\"dc-a\",domain=\"test\",outcome=\"{o}\""),
        )
    };
    assert_eq!(
        (outcome("kept"), outcome("older"), outcome("invalid")),
        (1.0, 1.0, 1.0)
    );
    let requests = |state: &str| {
        sample(
            &text,
            "ckf_indexer_lane_load_requests",
            &format!("dc=\"dc-a\",domain=\"test\",state=\"{state}\""),
        )
    };
    assert_eq!((requests("running"), requests("waiting")), (7.0, 4.0));
    assert_eq!(
        sample(
            &text,
            "ckf_indexer_lane_load_kv_usage",
            "dc=\"dc-a\",domain=\"test\""
        ),
        0.5
    );
    assert_eq!(
        sample(
            &text,
            "ckf_indexer_lane_load_prefill_tokens_per_second",
            "dc=\"dc-a\",domain=\"test\""
        ),
        12_000.0
    );
    assert_eq!(
        sample(
            &text,
            "ckf_indexer_lane_load_engines_reporting",
            "dc=\"dc-b\",domain=\"test\""
        ),
        0.0,
        "the other lane has no report"
    );
    assert_eq!(indexer.lane(0).await.state(), v1::LaneState::Active);
}

#[tokio::test]
async fn a_load_report_under_a_foreign_lease_ends_the_stream_like_any_stray_frame() {
    let indexer = Indexer::start(config(&["dc-a"])).await;
    let mut a = Producer::attach(&indexer, "dc-a", 1).await;
    a.snapshot(8192).await;
    let mut stray = a.lease;
    stray.epoch += 7;
    a.stream
        .send(WireFrame::Load(v1::LoadReport {
            lease: Some(stray.into()),
            sequence: 1,
            ..v1::LoadReport::default()
        }))
        .await;
    let (retired, status) = a.stream.expect_retired().await;
    assert_eq!(
        retired.reason(),
        v1::RetireReason::StreamLost,
        "{retired:?}"
    );
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("load"), "{status:?}");
}
