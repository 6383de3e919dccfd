//! Raw bytes as a Relay stream: length-delimited `RelayFrame`s, each converted and ingested
//! by a two-lane consumer (lane 0 leased to the fuzzer's stream, lane 1 active with fixed
//! content), load reports kept as the indexer keeps them (`LaneLoads`, lane 1 holding a fixed
//! report). Lane 1 must never change: neither its table nor its load.
#![no_main]

use ckf_core::addressing::TableFormat;
use std::time::Duration;

use ckf_core::lane::{Frame as CoreFrame, LaneState};
use ckf_core::route::{LaneLoads, PoolLoad};
use ckf_core::testing::{self, TestStream};
use ckf_proto::convert;
use ckf_proto::v1::{self, relay_frame::Frame};
use libfuzzer_sys::fuzz_target;
use prost::Message;

const BUCKETS: u64 = 64;

fuzz_target!(|data: &[u8]| {
    let ix = testing::indexer("prod", TableFormat::new(BUCKETS, 7).unwrap(), 2, 0xC0FFEE);
    let lane1_words: Vec<u64> = (0..BUCKETS).map(|b| b * 3 + 1).collect();
    let _lane1 = testing::activate(&ix, 1, 11, 3, lane1_words.clone());
    let stream = TestStream::on_lane(&ix, 0, 10);
    let incarnation = stream.tag.incarnation;
    let now = std::time::Instant::now();
    let lane1_load = PoolLoad {
        engines_reporting: 1,
        engines_configured: 2,
        running: 3,
        waiting: 4,
        kv_usage: 0.5,
        prefill_tokens_per_s: 8_000.0,
    };
    let mut loads = LaneLoads::default();
    loads
        .report(1, 11, u64::MAX, lane1_load, Duration::ZERO, now)
        .expect("a valid report");
    let mut buf = data;
    for _ in 0..64 {
        let Ok(frame) = v1::RelayFrame::decode_length_delimited(&mut buf) else {
            break;
        };
        let core = match frame.frame {
            Some(Frame::SnapshotChunk(c)) => convert::snapshot_chunk_from_wire(c, incarnation)
                .ok()
                .map(CoreFrame::Chunk),
            Some(Frame::Delta(d)) => convert::delta_from_wire(d, incarnation)
                .ok()
                .map(CoreFrame::Delta),
            Some(Frame::DrainMarker(m)) => convert::drain_marker_from_wire(m, incarnation)
                .ok()
                .map(CoreFrame::Drain),
            Some(Frame::Load(l)) => {
                // The indexer checks the lease against its stream's before keeping a report.
                if let Ok(load) = convert::load_from_wire(l, incarnation)
                    && load.tag.lease == stream.tag.lease
                {
                    let lease = load.tag.lease;
                    let _ = loads.report(
                        lease.lane,
                        lease.epoch,
                        load.sequence,
                        load.load,
                        load.age,
                        now,
                    );
                }
                assert_eq!(loads.latest(1, now), Some((lane1_load, Duration::ZERO)));
                None
            }
            _ => None,
        };
        if let Some(core) = core {
            let _ = ix.ingest_now(&core);
            assert_eq!(ix.table().lane_words(1), lane1_words);
            assert_eq!(ix.lane_status(1).unwrap().state, LaneState::Active);
        }
    }
});
