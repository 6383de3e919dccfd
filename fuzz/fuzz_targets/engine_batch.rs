//! Raw bytes -> `ckf_engine::wire::decode_batch` (msgpack `EventBatch`, default and small
//! limits) -> the lineage translation of every decoded event.
#![no_main]

use ckf_core::dc::MemberId;
use ckf_engine::filters::EngineFilters;
use ckf_engine::lineage::Lineage;
use ckf_engine::wire::{DecodeLimits, decode_batch};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let small = DecodeLimits {
        max_events: 3,
        max_blocks_per_event: 2,
        max_tokens_per_event: 8,
        max_depth: 5,
    };
    for limits in [DecodeLimits::default(), small] {
        if let Ok(batch) = decode_batch(data, &limits) {
            assert!(batch.events.len() <= limits.max_events);
            let mut lineage = Lineage::new();
            let member = MemberId::new(1, batch.dp_rank.unwrap_or(0));
            for block_size in [2, 16] {
                let filters = EngineFilters {
                    block_size,
                    ..EngineFilters::default()
                };
                for event in &batch.events {
                    let _ = lineage.translate(member, event, &filters);
                }
            }
        }
    }
});
