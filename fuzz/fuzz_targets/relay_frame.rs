//! Raw bytes -> `ckf.v1.RelayFrame` / `RelayReply` / Query requests (prost) -> every wire ->
//! core conversion the indexer and the producer run on them (a load report into the indexer's
//! `LaneLoads`).
#![no_main]

use ckf_core::identity::{LaneLease, ProducerIdentity, ProducerIncarnation};
use ckf_proto::convert;
use ckf_proto::v1::{self, relay_frame::Frame, relay_reply::Reply};
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let incarnation = ProducerIncarnation(7);
    if let Ok(frame) = v1::RelayFrame::decode(data) {
        match frame.frame {
            Some(Frame::Attach(a)) => {
                let _ = convert::attach_pool(&a);
                let _ = ProducerIdentity::try_from(a);
            }
            Some(Frame::SnapshotChunk(c)) => {
                let _ = convert::snapshot_chunk_from_wire(c, incarnation);
            }
            Some(Frame::Delta(d)) => {
                let _ = convert::delta_from_wire(d, incarnation);
            }
            Some(Frame::Heartbeat(h)) => {
                let _ = convert::heartbeat_from_wire(h, incarnation);
            }
            Some(Frame::DrainMarker(m)) => {
                let _ = convert::drain_marker_from_wire(m, incarnation);
            }
            Some(Frame::Load(l)) => {
                if let Ok(load) = convert::load_from_wire(l, incarnation) {
                    let lease = load.tag.lease;
                    let now = std::time::Instant::now();
                    let mut loads = ckf_core::route::LaneLoads::default();
                    if loads
                        .report(
                            lease.lane,
                            lease.epoch,
                            load.sequence,
                            load.load,
                            load.age,
                            now,
                        )
                        .is_ok()
                    {
                        assert_eq!(
                            loads.latest(lease.lane, now).map(|(l, _)| l),
                            Some(load.load)
                        );
                    }
                }
            }
            None => {}
        }
    }
    if let Ok(reply) = v1::RelayReply::decode(data) {
        match reply.reply {
            Some(Reply::LeaseGranted(g)) => {
                if let Some(lease) = g.lease {
                    let _ = LaneLease::try_from(lease);
                }
            }
            Some(Reply::Retired(r)) => {
                let _ = ckf_core::publication::FenceReason::from(r.reason());
            }
            _ => {}
        }
    }
    if let Ok(q) = v1::FindMatchesByTokensRequest::decode(data) {
        let _ = ckf_core::tokens::TokenQuery::from(q);
    }
    let _ = v1::FindMatchesRequest::decode(data);
    if let Ok(batch) = v1::RouteBatchRequest::decode(data) {
        for request in batch.requests {
            if let Some(v1::route_request::Query::Tokens(t)) = request.query {
                let _ = ckf_core::tokens::TokenQuery::from(t);
            }
        }
    }
});
