//! Unit tests of the decoding rules, on payloads built with `rmpv`.

use ckf_core::tokens::mm_identifier_hash;
use rmpv::Value as V;

use super::*;
use crate::event::{BlockExtras, EngineBatch, EngineEvent, RemovedBlocks, StoredBlocks};

fn enc(v: &V) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, v).unwrap();
    out
}

fn s(x: &str) -> V {
    V::from(x)
}

fn arr(items: Vec<V>) -> V {
    V::Array(items)
}

fn map(items: Vec<(&str, V)>) -> V {
    V::Map(items.into_iter().map(|(k, v)| (s(k), v)).collect())
}

fn stored_map(hashes: Vec<V>, extra: Vec<(&str, V)>) -> V {
    stored_with_tokens(hashes, vec![V::from(1), V::from(2)], extra)
}

/// A tagged-map `BlockStored` of `tokens` with the fields every engine sends (`lora_name`
/// nil), then `extra`.
fn stored_with_tokens(hashes: Vec<V>, tokens: Vec<V>, extra: Vec<(&str, V)>) -> V {
    let mut m = vec![
        ("type", s("BlockStored")),
        ("block_hashes", arr(hashes)),
        ("parent_block_hash", V::Nil),
        ("token_ids", arr(tokens)),
        ("block_size", V::from(2)),
        ("lora_id", V::Nil),
        ("medium", s("GPU")),
        ("lora_name", V::Nil),
    ];
    m.extend(extra);
    map(m)
}

fn batch(events: Vec<V>) -> Vec<u8> {
    enc(&arr(vec![V::F64(1.0), arr(events)]))
}

fn one(events: Vec<V>) -> EngineBatch {
    decode_batch(&batch(events), &DecodeLimits::default()).unwrap()
}

fn hashes_of(b: &EngineBatch) -> Vec<u64> {
    match &b.events[0] {
        EngineEvent::Stored(s) => s.block_hashes.clone(),
        EngineEvent::Removed(r) => r.block_hashes.clone(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn batch_envelopes() {
    let l = DecodeLimits::default();
    // [ts, events]: no rank; integer ts.
    let b = decode_batch(&enc(&arr(vec![V::from(3), arr(vec![])])), &l).unwrap();
    assert_eq!((b.ts, b.dp_rank, b.events.len()), (3.0, None, 0));
    // [ts, events, rank]
    let b = decode_batch(&enc(&arr(vec![V::F32(0.5), arr(vec![]), V::from(4)])), &l);
    assert_eq!(b.unwrap().dp_rank, Some(4));
    // longer envelope: extra element counted, not fatal.
    let b = decode_batch(
        &enc(&arr(vec![V::F64(1.0), arr(vec![]), V::Nil, s("x")])),
        &l,
    )
    .unwrap();
    assert_eq!(b.notes.unknown_fields, 1);
    // map with data_parallel_rank, unknown key counted.
    let m = map(vec![
        ("events", arr(vec![])),
        ("data_parallel_rank", V::from(2)),
        ("ts", V::F64(9.0)),
        ("other", map(vec![("a", V::from(1))])),
    ]);
    let b = decode_batch(&enc(&m), &l).unwrap();
    assert_eq!((b.ts, b.dp_rank, b.notes.unknown_fields), (9.0, Some(2), 1));
}

#[test]
fn bad_envelopes_are_errors_with_labels() {
    let l = DecodeLimits::default();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (vec![], "truncated"),
        (enc(&V::from(5)), "type"),
        (enc(&arr(vec![V::F64(1.0)])), "type"),
        (enc(&arr(vec![s("x"), arr(vec![])])), "type"),
        (enc(&arr(vec![V::F64(1.0), s("x")])), "type"),
        (enc(&arr(vec![V::F64(1.0), arr(vec![]), s("r")])), "type"),
        (enc(&map(vec![("ts", V::F64(1.0))])), "type"),
        (enc(&map(vec![("events", arr(vec![]))])), "type"),
        (vec![0xc1], "syntax"),
        ([batch(vec![]), vec![0]].concat(), "trailing"),
    ];
    for (payload, label) in cases {
        let err = decode_batch(&payload, &l).unwrap_err();
        assert_eq!(err.kind_label(), label, "{payload:02x?}: {err}");
    }
    // A dp rank outside u32 is no envelope error: it reads as u32::MAX, for the caller's bound.
    for rank in [V::from(-1), V::from(1_u64 << 40)] {
        let payload = enc(&arr(vec![V::F64(1.0), arr(vec![]), rank]));
        assert_eq!(decode_batch(&payload, &l).unwrap().dp_rank, Some(u32::MAX));
    }
    let full = batch(vec![stored_map(vec![V::from(1)], vec![])]);
    for cut in 0..full.len() {
        let err = decode_batch(&full[..cut], &l).unwrap_err();
        assert_eq!(err.kind_label(), "truncated", "cut at {cut}");
    }
}

#[test]
fn block_hash_forms() {
    let bin = |b: Vec<u8>| V::Binary(b);
    let mut h32 = vec![0xff; 24];
    h32.extend(0x0102_0304_0506_0708u64.to_be_bytes());
    let b = one(vec![stored_map(
        vec![
            V::from(u64::MAX),
            V::from(-1),
            bin(h32),
            bin((1..=16).collect()),
            bin((1..=8).collect()),
        ],
        vec![],
    )]);
    assert_eq!(
        hashes_of(&b),
        vec![
            u64::MAX,
            u64::MAX,
            0x0102_0304_0506_0708,
            u64::from_be_bytes([9, 10, 11, 12, 13, 14, 15, 16]),
            u64::from_be_bytes([1, 2, 3, 4, 5, 6, 7, 8]),
        ]
    );
    // 7 bytes, a string, a float: the event is malformed, the next one still decodes.
    for bad in [bin(vec![1; 7]), s("1"), V::F64(1.0)] {
        let b = one(vec![
            stored_map(vec![bad], vec![]),
            arr(vec![s("BlockRemoved"), arr(vec![V::from(5)])]),
        ]);
        assert_eq!(b.notes.malformed_events, 1);
        assert_eq!(b.events.len(), 1);
        assert_eq!(hashes_of(&b), vec![5]);
    }
}

#[test]
fn token_ids_must_fit_u32() {
    let ev = |t: V| {
        map(vec![
            ("type", s("BlockStored")),
            ("block_hashes", arr(vec![V::from(1)])),
            ("token_ids", arr(vec![V::from(0), t])),
            ("block_size", V::from(2)),
        ])
    };
    let b = one(vec![ev(V::from(u64::from(u32::MAX)))]);
    let EngineEvent::Stored(st) = &b.events[0] else {
        panic!()
    };
    assert_eq!(st.token_ids, vec![0, u32::MAX]);
    // absent optional fields are None.
    assert_eq!(
        (st.parent, st.medium.clone(), st.group_idx),
        (None, None, None)
    );
    for bad in [V::from(u64::from(u32::MAX) + 1), V::from(-1), V::Nil] {
        let b = one(vec![ev(bad)]);
        assert_eq!((b.events.len(), b.notes.malformed_events), (0, 1));
    }
}

#[test]
fn wrong_types_in_known_fields_skip_the_event_only() {
    let cases = vec![
        ("block_size", s("16")),
        ("block_size", V::Nil),
        ("medium", V::from(1)),
        ("lora_name", arr(vec![])),
        ("group_idx", V::from(-3)),
        ("kv_cache_spec_sliding_window", s("x")),
        ("kv_cache_spec_kind", V::from(1)),
        ("lora_id", s("x")),
        ("parent_block_hash", s("x")),
        ("cache_salt", V::from(1)),
        ("extra_keys", s("x")),
        ("extra_keys", arr(vec![V::from(1)])),
    ];
    for (field, value) in cases {
        let mut m = stored_map(vec![V::from(1)], vec![]);
        if let V::Map(items) = &mut m {
            items.retain(|(k, _)| k.as_str() != Some(field));
            items.push((s(field), value.clone()));
        }
        let b = one(vec![m, arr(vec![s("AllBlocksCleared")])]);
        assert_eq!(b.notes.malformed_events, 1, "{field} = {value}");
        assert_eq!(b.events, vec![EngineEvent::AllCleared], "{field} = {value}");
        assert!(b.notes.first_malformed.unwrap().contains(field));
    }
    // missing required fields
    for field in ["block_hashes", "token_ids", "block_size", "type"] {
        let mut m = stored_map(vec![V::from(1)], vec![]);
        if let V::Map(items) = &mut m {
            items.retain(|(k, _)| k.as_str() != Some(field));
        }
        let b = one(vec![m]);
        assert_eq!(
            (b.events.len(), b.notes.malformed_events),
            (0, 1),
            "{field}"
        );
    }
    // an event that is neither map nor array; an array without a string tag
    let b = one(vec![
        V::from(1),
        arr(vec![]),
        arr(vec![V::from(1), V::from(2)]),
    ]);
    assert_eq!((b.events.len(), b.notes.malformed_events), (0, 3));
}

#[test]
fn positional_tails() {
    let b = one(vec![
        arr(vec![s("BlockRemoved"), arr(vec![V::from(1)])]),
        arr(vec![
            s("BlockRemoved"),
            arr(vec![V::from(2)]),
            s("GPU"),
            V::from(0),
            V::Nil,
            V::Nil,
            s("future"),
        ]),
        arr(vec![s("AllBlocksCleared"), V::from(1)]),
        arr(vec![
            s("BlockStored"),
            arr(vec![V::from(3)]),
            V::Nil,
            arr(vec![V::from(1), V::from(2)]),
            V::from(2),
        ]),
        arr(vec![s("BlockStored"), arr(vec![V::from(3)]), V::Nil]),
        arr(vec![s("NewThing"), V::from(1), V::from(2)]),
    ]);
    assert_eq!(b.notes.unknown_fields, 2);
    assert_eq!(b.notes.unknown_events, 1);
    assert_eq!(b.notes.malformed_events, 1);
    assert_eq!(
        b.events[1],
        EngineEvent::Removed(RemovedBlocks {
            block_hashes: vec![2],
            medium: Some("GPU".into()),
            group_idx: Some(0),
        })
    );
    assert_eq!(b.events[2], EngineEvent::AllCleared);
    assert!(matches!(&b.events[3], EngineEvent::Stored(s) if s.block_size == 2));
    assert_eq!(b.events.len(), 5);
}

#[test]
fn extra_keys_are_sorted_by_meaning() {
    let blob = V::Binary(vec![1, 2, 3]);
    let b = one(vec![stored_map(
        vec![V::from(1), V::from(2), V::from(3)],
        vec![
            ("lora_name", s("lo")),
            (
                "extra_keys",
                arr(vec![
                    arr(vec![
                        s("lo"),
                        arr(vec![s("img"), V::from(0)]),
                        s("salt"),
                        blob.clone(),
                    ]),
                    V::Nil,
                    arr(vec![arr(vec![s("img"), s("not-an-offset")]), s("salt")]),
                ]),
            ),
        ],
    )]);
    assert!(b.notes.is_clean(), "{:?}", b.notes);
    let EngineEvent::Stored(st) = &b.events[0] else {
        panic!()
    };
    let img = mm_identifier_hash("img").unwrap();
    assert_eq!(
        st.block_extras[0],
        BlockExtras {
            mm_hashes: vec![img],
            salt: Some("salt".into()),
            lora_name: Some("lo".into()),
            other: vec![xxhash_rust::xxh3::xxh3_64(&enc(&blob))],
        }
    );
    assert_eq!(st.block_extras[1], BlockExtras::default());
    let odd = arr(vec![s("img"), s("not-an-offset")]);
    assert_eq!(
        st.block_extras[2],
        BlockExtras {
            salt: Some("salt".into()),
            other: vec![xxhash_rust::xxh3::xxh3_64(&enc(&odd))],
            ..BlockExtras::default()
        }
    );
}

#[test]
fn limits_bind() {
    let l = DecodeLimits {
        max_events: 2,
        max_blocks_per_event: 2,
        max_tokens_per_event: 4,
        max_depth: 6,
    };
    let clear = || arr(vec![s("AllBlocksCleared")]);
    let err = decode_batch(&batch(vec![clear(), clear(), clear()]), &l).unwrap_err();
    assert_eq!(err.kind_label(), "limit");
    let b = decode_batch(&batch(vec![clear(), clear()]), &l).unwrap();
    assert_eq!(b.events.len(), 2);
    // too many blocks / tokens: the event is skipped, the batch decodes.
    let many = stored_map(vec![V::from(1), V::from(2), V::from(3)], vec![]);
    let b = decode_batch(&batch(vec![many, clear()]), &l).unwrap();
    assert_eq!((b.events.len(), b.notes.malformed_events), (1, 1));
    let mut toks = stored_map(vec![V::from(1)], vec![]);
    if let V::Map(items) = &mut toks {
        items.push((s("token_ids"), arr(vec![V::from(1); 5])));
    }
    let b = decode_batch(&batch(vec![toks]), &l).unwrap();
    assert_eq!(b.notes.malformed_events, 1);
    // nesting: an unknown field nested deeper than max_depth refuses the batch.
    let mut deep = V::from(1);
    for _ in 0..8 {
        deep = arr(vec![deep]);
    }
    let ev = stored_map(vec![V::from(1)], vec![("future", deep)]);
    let err = decode_batch(&batch(vec![ev]), &l).unwrap_err();
    assert_eq!(err.kind_label(), "limit");
    // the boundary: a store's lists are depth 4 (envelope 1, events 2, event 3)
    let payload = batch(vec![stored_map(vec![V::from(1)], vec![])]);
    for (max_depth, ok) in [(4, true), (3, false)] {
        let l = DecodeLimits {
            max_depth,
            ..DecodeLimits::default()
        };
        let r = decode_batch(&payload, &l);
        assert_eq!(r.is_ok(), ok, "max_depth {max_depth}: {r:?}");
        if let Err(e) = r {
            assert_eq!(e.kind_label(), "limit");
        }
    }
    // an unknown batch-map key nested one level too deep
    let l = DecodeLimits {
        max_depth: 3,
        ..DecodeLimits::default()
    };
    let m = |inner: V| {
        enc(&map(vec![
            ("ts", V::F64(1.0)),
            ("events", arr(vec![])),
            ("x", inner),
        ]))
    };
    assert!(decode_batch(&m(arr(vec![arr(vec![])])), &l).is_ok());
    let err = decode_batch(&m(arr(vec![arr(vec![arr(vec![])])])), &l).unwrap_err();
    assert_eq!(err.kind_label(), "limit");
    // a lying array header does not allocate: it is simply truncated.
    let mut lie = vec![0x92, 0xcb];
    lie.extend(1.0f64.to_be_bytes());
    lie.extend([0xdd, 0xff, 0xff, 0xff, 0xff]);
    let err = decode_batch(&lie, &DecodeLimits::default()).unwrap_err();
    assert_eq!(err.kind_label(), "limit");
    let mut lie = vec![0x92, 0xcb];
    lie.extend(1.0f64.to_be_bytes());
    lie.extend([0xdc, 0x00, 0x10]);
    let err = decode_batch(&lie, &DecodeLimits::default()).unwrap_err();
    assert_eq!(err.kind_label(), "truncated");
}

#[test]
fn unknown_kinds_are_bounded_and_their_fields_not_counted() {
    let long = "é".repeat(100);
    let b = one(vec![
        map(vec![("type", s(&long)), ("x", V::from(1))]),
        map(vec![("type", s("Short")), ("y", V::from(1))]),
    ]);
    assert_eq!((b.notes.unknown_events, b.notes.unknown_fields), (2, 0));
    let EngineEvent::Unknown { kind } = &b.events[0] else {
        panic!()
    };
    assert_eq!(kind, &"é".repeat(MAX_KIND_BYTES / 2));
    assert_eq!(
        b.events[1],
        EngineEvent::Unknown {
            kind: "Short".into()
        }
    );
}

/// TensorRT-LLM's wire form: tagged-map events, `mm_keys`, `lora_id`, string token ids.
mod trtllm;
