//! Random bytes, truncations and byte flips of the golden payloads never panic the decoder
//! or the lineage; a strict prefix of a valid payload is always `truncated`.

use ckf_core::dc::MemberId;
use ckf_engine::filters::EngineFilters;
use ckf_engine::lineage::Lineage;
use ckf_engine::message::EngineMessage;
use ckf_engine::wire::{DecodeLimits, decode_batch};
use proptest::prelude::*;

const FIXTURES: [&str; 12] = [
    "vllm_stored_basic",
    "vllm_stored_extras",
    "vllm_removed_cleared",
    "vllm_sliding_window",
    "sglang_batch",
    "sglang_no_rank",
    "positional_events",
    "tolerance",
    "trtllm_stored_mm",
    "trtllm_lora_id",
    "trtllm_token_strings",
    "trtllm_groups",
];

mod common;
use common::fixture;

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
        let _ = EngineMessage::parse(&[&bytes[..bytes.len().min(8)], &bytes]);
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

/// Any msgpack value, small.
fn any_value() -> impl Strategy<Value = rmpv::Value> {
    use rmpv::Value as V;
    let leaf = prop_oneof![
        Just(V::Nil),
        any::<bool>().prop_map(V::from),
        any::<u64>().prop_map(V::from),
        any::<i64>().prop_map(V::from),
        (0..70_000u64).prop_map(V::from),
        any::<f64>().prop_map(V::from),
        "[a-zA-Z_]{0,12}".prop_map(V::from),
        prop::collection::vec(any::<u8>(), 0..40).prop_map(V::Binary),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(V::Array),
            prop::collection::vec(("[a-z_]{1,8}".prop_map(V::from), inner), 0..4).prop_map(V::Map),
        ]
    })
}

/// An event-like value: a map or positional array with a known or unknown type and fields of
/// the right or wrong types.
fn any_event() -> impl Strategy<Value = rmpv::Value> {
    use rmpv::Value as V;
    const KEYS: [&str; 16] = [
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
        "cache_salt",
        "extra_keys",
        "group_idx",
        "kv_cache_spec_kind",
        "kv_cache_spec_sliding_window",
        "session_id",
        "mm_keys",
        "locality",
        "unknown_x",
    ];
    let kind = prop::sample::select(vec![
        "BlockStored",
        "BlockRemoved",
        "AllBlocksCleared",
        "Other",
    ]);
    let good_list = prop::collection::vec((0..4u64).prop_map(V::from), 0..6).prop_map(V::Array);
    let field = prop_oneof![any_value(), good_list];
    (
        kind,
        any::<bool>(),
        prop::collection::vec((prop::sample::select(KEYS.to_vec()), field), 0..10),
    )
        .prop_map(|(kind, positional, fields)| {
            if positional {
                let mut items = vec![V::from(kind)];
                items.extend(fields.into_iter().map(|(_, v)| v));
                V::Array(items)
            } else {
                let mut items = vec![(V::from("type"), V::from(kind))];
                items.extend(fields.into_iter().map(|(k, v)| (V::from(k), v)));
                V::Map(items)
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Every event of a well-formed envelope is accounted for: decoded or counted malformed.
    #[test]
    fn structured_random_events_are_all_accounted_for(
        events in prop::collection::vec(any_event(), 0..8),
        rank in prop::option::of(0..4u32),
    ) {
        use rmpv::Value as V;
        let n = events.len();
        let mut batch = vec![V::F64(1.0), V::Array(events)];
        if let Some(r) = rank {
            batch.push(V::from(r));
        }
        let mut payload = Vec::new();
        rmpv::encode::write_value(&mut payload, &V::Array(batch)).unwrap();
        let decoded = decode_batch(&payload, &DecodeLimits::default());
        // fields nest at most 4 + 4 levels deep here: always within the default depth
        let decoded = decoded.expect("a well-formed envelope decodes");
        prop_assert_eq!(decoded.dp_rank, rank);
        prop_assert_eq!(decoded.events.len() + decoded.notes.malformed_events as usize, n);
        prop_assert_eq!(
            decoded.notes.first_malformed.is_some(),
            decoded.notes.malformed_events > 0
        );
        exercise(&payload);
    }
}
