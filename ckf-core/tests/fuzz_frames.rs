//! Untrusted frames through the consumer: every field of a decoded Relay frame is the peer's
//! choice (the wire conversion checks only well-formedness, `ckf-proto`'s `convert`), so the
//! lane ingestor is the decoder of their meaning: snapshot chunk bytes (any length, any first
//! bucket), whole snapshots of any length, deltas with any buckets, sequences and images,
//! drains and heartbeats, under the current lease or forged ones (stale epoch, other consumer
//! instance, other incarnation, lanes beyond the manifest). Sequences of such frames never
//! panic, a frame that is ignored or rejected changes no word of the table, and no frame sent
//! on lane 0's stream (or forged) changes another lane's words or state.

use ckf_core::addressing::TableFormat;
use ckf_core::global::GlobalCkfIndexer;
use ckf_core::identity::{LaneLease, ProducerIncarnation, StreamTag};
use ckf_core::lane::{Frame, IngestOutcome, LaneState};
use ckf_core::testing::{self, TestStream};
use proptest::prelude::*;

const BUCKETS: u64 = 64;
const INSTANCE: u64 = 0xC0FFEE;

fn indexer() -> GlobalCkfIndexer {
    // lag deadlines disabled: tests drive time
    testing::indexer("prod", TableFormat::new(BUCKETS, 7).unwrap(), 2, INSTANCE)
}

/// Which envelope a generated frame carries.
#[derive(Debug, Clone)]
enum Envelope {
    /// Lane 0's current stream.
    Current,
    /// Lane 0's lease with another epoch.
    Epoch(u64),
    /// Another consumer instance.
    Instance(u64),
    /// Another producer incarnation.
    Incarnation(u64),
    /// Any lane index (beyond the manifest too) other than lane 1's current lease.
    Lane(u8, u64),
}

#[derive(Debug, Clone)]
enum Kind {
    Chunk {
        sequence: u64,
        first_bucket: u64,
        bytes: Vec<u8>,
    },
    Snapshot {
        sequence: u64,
        buckets: Vec<u64>,
    },
    Delta {
        base: u64,
        sequence: u64,
        images: Vec<(u32, u64)>,
    },
    Drain(u64),
    Heartbeat(u64),
}

fn sequence() -> impl Strategy<Value = u64> {
    prop_oneof![0..6u64, Just(u64::MAX), any::<u64>()]
}

fn envelope() -> impl Strategy<Value = Envelope> {
    prop_oneof![
        4 => Just(Envelope::Current),
        1 => any::<u64>().prop_map(Envelope::Epoch),
        1 => any::<u64>().prop_map(Envelope::Instance),
        1 => any::<u64>().prop_map(Envelope::Incarnation),
        1 => (0..20u8, any::<u64>()).prop_map(|(l, e)| Envelope::Lane(l, e)),
    ]
}

fn kind() -> impl Strategy<Value = Kind> {
    let bucket = prop_oneof![0..BUCKETS as u32, any::<u32>()];
    prop_oneof![
        (
            sequence(),
            prop_oneof![Just(0u64), 0..BUCKETS + 2, any::<u64>()],
            prop::collection::vec(any::<u8>(), 0..(8 * BUCKETS as usize + 16)),
        )
            .prop_map(|(sequence, first_bucket, bytes)| Kind::Chunk {
                sequence,
                first_bucket,
                bytes
            }),
        (
            sequence(),
            prop_oneof![
                prop::collection::vec(any::<u64>(), BUCKETS as usize),
                prop::collection::vec(any::<u64>(), 0..(BUCKETS as usize + 4)),
            ],
        )
            .prop_map(|(sequence, buckets)| Kind::Snapshot { sequence, buckets }),
        (
            sequence(),
            sequence(),
            prop::collection::vec((bucket, any::<u64>()), 0..10)
        )
            .prop_map(|(base, sequence, images)| Kind::Delta {
                base,
                sequence,
                images
            }),
        sequence().prop_map(Kind::Drain),
        sequence().prop_map(Kind::Heartbeat),
    ]
}

fn frame(stream: &TestStream, lane1: &LaneLease, envelope: &Envelope, kind: &Kind) -> Frame {
    let mut tag: StreamTag = stream.tag;
    match *envelope {
        Envelope::Current => {}
        Envelope::Epoch(epoch) => tag.lease.epoch = epoch,
        Envelope::Instance(instance) => tag.lease.consumer_instance = instance,
        Envelope::Incarnation(incarnation) => tag.incarnation = ProducerIncarnation(incarnation),
        Envelope::Lane(lane, epoch) => {
            tag.lease.lane = lane;
            tag.lease.epoch = epoch;
            if tag.lease == *lane1 {
                tag.lease.epoch = epoch.wrapping_add(1); // never lane 1's real lease
            }
        }
    }
    let forged = TestStream { tag };
    match kind {
        Kind::Chunk {
            sequence,
            first_bucket,
            bytes,
        } => forged.chunk_bytes(*sequence, *first_bucket, bytes.clone()),
        Kind::Snapshot { sequence, buckets } => forged.snapshot(*sequence, buckets.clone()),
        Kind::Delta {
            base,
            sequence,
            images,
        } => forged.delta(*base, *sequence, images),
        Kind::Drain(sequence) => forged.drain(*sequence),
        Kind::Heartbeat(sequence) => forged.heartbeat(*sequence),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_frames_never_panic_nor_touch_another_lane(
        activate_lane0 in any::<bool>(),
        frames in prop::collection::vec((envelope(), kind()), 1..24),
    ) {
        let ix = indexer();
        let lane1_words: Vec<u64> = (0..BUCKETS).map(|b| b * 0x0001_0001 + 1).collect();
        let lane1 = testing::activate(&ix, 1, 11, 3, lane1_words.clone());
        let stream = if activate_lane0 {
            testing::activate(&ix, 0, 10, 5, vec![0; BUCKETS as usize])
        } else {
            TestStream::on_lane(&ix, 0, 10)
        };
        for (envelope, kind) in &frames {
            let before = ix.table().lane_words(0);
            let outcome = ix.ingest_now(&frame(&stream, &lane1.tag.lease, envelope, kind));
            if matches!(outcome, IngestOutcome::Ignored(_) | IngestOutcome::Rejected(_)) {
                prop_assert_eq!(ix.table().lane_words(0), before, "{:?} changed lane 0", outcome);
            }
            prop_assert_eq!(ix.table().lane_words(1), lane1_words.clone());
            prop_assert_eq!(ix.lane_status(1).unwrap().state, LaneState::Active);
        }
    }
}
