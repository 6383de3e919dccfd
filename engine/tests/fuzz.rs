//! Random bytes, truncations and byte flips of the golden payloads never panic the decoder
//! or the lineage; a strict prefix of a valid payload is always `truncated`.

use ckf_core::dc::MemberId;
use ckf_engine::filters::EngineFilters;
use ckf_engine::frame::EngineFrame;
use ckf_engine::lineage::Lineage;
use ckf_engine::wire::{DecodeLimits, decode_batch};
use proptest::prelude::*;

const FIXTURES: [&str; 8] = [
    "vllm_stored_basic",
    "vllm_stored_extras",
    "vllm_removed_cleared",
    "vllm_sliding_window",
    "sglang_batch",
    "sglang_no_rank",
    "positional_events",
    "tolerance",
];

fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/fixtures/{name}.hex", env!("CARGO_MANIFEST_DIR"));
    let hex = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let hex = hex.trim();
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect()
}

/// Decodes with small limits too (so the limit paths run), then translates every event.
fn exercise(payload: &[u8]) {
    let small = DecodeLimits {
        max_events: 3,
        max_blocks_per_event: 2,
        max_tokens_per_event: 8,
        max_depth: 5,
    };
    for limits in [DecodeLimits::default(), small] {
        if let Ok(batch) = decode_batch(payload, &limits) {
            let mut lineage = Lineage::new();
            let member = MemberId::new(1, batch.dp_rank.unwrap_or(0));
            for bs in [2, 4, 16] {
                let filters = EngineFilters {
                    block_size: bs,
                    ..EngineFilters::default()
                };
                for ev in &batch.events {
                    let _ = lineage.translate(member, ev, &filters);
                }
            }
            let _ = lineage.bytes_used();
        }
    }
}

#[test]
fn every_strict_prefix_of_every_fixture_is_truncated() {
    for name in FIXTURES {
        let full = fixture(name);
        assert!(
            decode_batch(&full, &DecodeLimits::default()).is_ok(),
            "{name}"
        );
        for cut in 0..full.len() {
            let err = decode_batch(&full[..cut], &DecodeLimits::default()).unwrap_err();
            assert_eq!(err.kind_label(), "truncated", "{name} cut at {cut}: {err}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        exercise(&bytes);
        let _ = EngineFrame::parse(&[&bytes[..bytes.len().min(8)], &bytes]);
    }

    #[test]
    fn flipped_and_spliced_fixtures_never_panic(
        which in 0..FIXTURES.len(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
        tail in prop::collection::vec(any::<u8>(), 0..16),
    ) {
        let mut payload = fixture(FIXTURES[which]);
        for (at, byte) in flips {
            let i = at.index(payload.len());
            payload[i] = byte;
        }
        exercise(&payload);
        let keep = cut.index(payload.len() + 1);
        payload.truncate(keep);
        payload.extend(tail);
        exercise(&payload);
    }
}
