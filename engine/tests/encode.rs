//! The vLLM encoding against golden payloads from the real msgspec encoder
//! (`tests/fixtures/gen_encode.py`), byte for byte.

use ckf_engine::encode::{
    Batch, BlockRemoved, BlockStored, Event, Layout, encode_batch, encode_event,
};
use proptest::prelude::*;
use rmpv::Value;

const BIG: u64 = 0xFEDC_BA98_7654_3210;
const TOKENS: [u32; 9] = [0, 1, 127, 128, 255, 256, 65535, 65536, 151_643];

fn golden(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/tests/fixtures/encode_{name}.msgpack",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn s(v: &str) -> Option<String> {
    Some(v.to_string())
}

fn assert_bytes(name: &str, batch: &Batch, layout: Layout) {
    let ours = encode_batch(batch, layout);
    let theirs = golden(name);
    assert_eq!(
        ours,
        theirs,
        "{name}: ours {} vs msgspec {}",
        hex(&ours),
        hex(&theirs)
    );
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn stored_minimal_matches_msgspec() {
    let mut tokens = TOKENS.to_vec();
    tokens.extend([3; 7]);
    let batch = Batch {
        ts: 1_700_000_000.25,
        events: vec![Event::Stored(BlockStored {
            block_hashes: vec![BIG, 7],
            parent_block_hash: None,
            token_ids: tokens,
            block_size: 8,
            medium: s("GPU"),
            ..BlockStored::default()
        })],
        data_parallel_rank: Some(0),
    };
    assert_bytes("stored_minimal", &batch, Layout::Tagged);
}

#[test]
fn stored_with_every_field_matches_msgspec() {
    let batch = Batch {
        ts: 0.5,
        events: vec![Event::Stored(BlockStored {
            block_hashes: vec![1 << 40, 2],
            parent_block_hash: Some(BIG),
            token_ids: (0..8).collect(),
            block_size: 4,
            lora_id: Some(3),
            medium: s("CPU"),
            lora_name: s("my-lora"),
            extra_keys: Some(vec![
                Some(vec![
                    Value::from("my-lora"),
                    Value::Array(vec![Value::from("mm-abc"), Value::from(0u64)]),
                    Value::from("salt"),
                ]),
                None,
            ]),
            group_idx: Some(1),
            kv_cache_spec_kind: s("sliding_window"),
            kv_cache_spec_sliding_window: Some(4096),
            locality: s("LOCAL"),
            ownership: s("tier-2"),
            session_id: s("s-1"),
            lookahead_token_ids: Some(vec![vec![8, 9], vec![10]]),
        })],
        data_parallel_rank: Some(3),
    };
    assert_bytes("stored_full", &batch, Layout::Tagged);
}

#[test]
fn removed_and_cleared_without_rank_match_msgspec() {
    let batch = Batch {
        ts: -1.0,
        events: vec![
            Event::Removed(BlockRemoved {
                block_hashes: vec![BIG, 1, 300],
                medium: s("GPU"),
                ..BlockRemoved::default()
            }),
            Event::Removed(BlockRemoved {
                block_hashes: vec![5],
                medium: None,
                group_idx: Some(2),
                ..BlockRemoved::default()
            }),
            Event::AllCleared,
        ],
        data_parallel_rank: None,
    };
    assert_bytes("removed_cleared", &batch, Layout::Tagged);
}

#[test]
fn long_arrays_and_empty_batches_match_msgspec() {
    let batch = Batch {
        ts: 12.0,
        events: vec![Event::Removed(BlockRemoved {
            block_hashes: ((1 << 20)..(1 << 20) + 40).collect(),
            medium: s("GPU"),
            ..BlockRemoved::default()
        })],
        data_parallel_rank: Some(70_000),
    };
    assert_bytes("many_hashes", &batch, Layout::Tagged);
    let empty = Batch {
        ts: 3.0,
        events: vec![],
        data_parallel_rank: Some(1),
    };
    assert_bytes("empty", &empty, Layout::Tagged);
    assert_bytes("empty", &empty, Layout::Positional);
}

#[test]
fn positional_layout_matches_msgspec() {
    let batch = Batch {
        ts: 42.125,
        events: vec![
            Event::Stored(BlockStored {
                block_hashes: vec![BIG],
                parent_block_hash: Some(9),
                token_ids: vec![1, 2, 3, 4],
                block_size: 4,
                medium: s("GPU"),
                // Not part of the positional layout: dropped.
                lora_name: s("ignored"),
                group_idx: Some(9),
                ..BlockStored::default()
            }),
            Event::Stored(BlockStored {
                block_hashes: vec![11, 12],
                token_ids: (0..8).collect(),
                block_size: 4,
                lora_id: Some(5),
                ..BlockStored::default()
            }),
            Event::Removed(BlockRemoved {
                block_hashes: vec![BIG, 11],
                medium: s("GPU"),
                ..BlockRemoved::default()
            }),
            Event::AllCleared,
        ],
        data_parallel_rank: Some(0),
    };
    assert_bytes("positional", &batch, Layout::Positional);
}

fn stored() -> impl Strategy<Value = BlockStored> {
    (
        prop::collection::vec(any::<u64>(), 0..40),
        prop::option::of(any::<u64>()),
        prop::collection::vec(any::<u32>(), 0..70),
        any::<u32>(),
        prop::option::of(any::<i64>()),
        prop::option::of("[A-Z]{0,40}"),
        prop::option::of(any::<i64>()),
    )
        .prop_map(
            |(block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, group)| {
                BlockStored {
                    block_hashes,
                    parent_block_hash,
                    token_ids,
                    block_size,
                    lora_id,
                    medium,
                    group_idx: group,
                    ..BlockStored::default()
                }
            },
        )
}

fn uints(value: &Value) -> Vec<u64> {
    value
        .as_array()
        .expect("array")
        .iter()
        .map(|v| v.as_u64().expect("uint"))
        .collect()
}

fn int(value: &Value) -> Option<i64> {
    if value.is_nil() {
        None
    } else {
        Some(value.as_i64().expect("int"))
    }
}

proptest! {
    // Exact model: a generic msgpack decoder (rmpv) reads back every field as written, and the
    // event bytes sit verbatim inside the batch.
    #[test]
    fn any_stored_event_reads_back(event in stored(), ts in any::<f64>(), rank in prop::option::of(any::<i64>())) {
        let batch = Batch { ts, events: vec![Event::Stored(event.clone())], data_parallel_rank: rank };
        let bytes = encode_batch(&batch, Layout::Tagged);
        let event_bytes = encode_event(&batch.events[0], Layout::Tagged);
        prop_assert!(bytes.windows(event_bytes.len()).any(|w| w == event_bytes.as_slice()));
        let value = rmpv::decode::read_value(&mut bytes.as_slice()).unwrap();
        let top = value.as_array().unwrap();
        prop_assert_eq!(top.len(), 3);
        let got_ts = top[0].as_f64().unwrap();
        prop_assert!(got_ts == ts || (got_ts.is_nan() && ts.is_nan()));
        prop_assert_eq!(int(&top[2]), rank);
        let map = top[1].as_array().unwrap()[0].as_map().unwrap();
        let get = |k: &str| map.iter().find(|(key, _)| key.as_str() == Some(k)).map(|(_, v)| v.clone());
        prop_assert_eq!(map[0].0.as_str(), Some("type"));
        prop_assert_eq!(get("type").unwrap().as_str().map(String::from), Some("BlockStored".to_string()));
        prop_assert_eq!(uints(&get("block_hashes").unwrap()), event.block_hashes.clone());
        let parent = get("parent_block_hash").unwrap();
        prop_assert_eq!(parent.as_u64(), event.parent_block_hash);
        let tokens: Vec<u32> = uints(&get("token_ids").unwrap()).into_iter().map(|t| t as u32).collect();
        prop_assert_eq!(tokens, event.token_ids.clone());
        prop_assert_eq!(get("block_size").unwrap().as_u64(), Some(u64::from(event.block_size)));
        prop_assert_eq!(int(&get("lora_id").unwrap()), event.lora_id);
        prop_assert_eq!(get("medium").unwrap().as_str().map(String::from), event.medium.clone());
        prop_assert!(get("lora_name").unwrap().is_nil());
        prop_assert_eq!(get("group_idx").map(|v| v.as_i64().unwrap()), event.group_idx);
        prop_assert_eq!(map.len(), 8 + usize::from(event.group_idx.is_some()));
    }
}
