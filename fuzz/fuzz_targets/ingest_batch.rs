//! Raw bytes -> `ckf.v1.KvEventBatch` (prost) -> the producer's `batch_from_wire`.
#![no_main]

use ckf_core::dc::Quotas;
use ckf_proto::v1;
use libfuzzer_sys::fuzz_target;
use producer_svc::ingest::convert::batch_from_wire;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    if let Ok(batch) = v1::KvEventBatch::decode(data) {
        let _ = batch_from_wire(batch.clone(), 4, &Quotas::default());
        let _ = batch_from_wire(batch.clone(), 65_536, &Quotas::UNLIMITED);
        let tight = Quotas {
            max_blocks_per_event: 2,
            max_blocks_per_batch: 3,
            ..Quotas::default()
        };
        let _ = batch_from_wire(batch, 65_536, &tight);
    }
    let _ = v1::GetMemberBlocksRequest::decode(data);
});
