//! TensorRT-LLM's wire form: tagged-map events with `mm_keys`, `lora_id` without `lora_name`,
//! decimal-string token ids and item digests, int64 markers everywhere.

use super::*;

/// A TensorRT-LLM `BlockStored` map: the fields its publisher always sends (`lora_name` nil),
/// then `extra`.
fn trt_stored(hashes: Vec<V>, tokens: Vec<V>, extra: Vec<(&str, V)>) -> V {
    stored_with_tokens(hashes, tokens, extra)
}

fn mm_key(hash: &str, start_offset: i64, uuid: Option<&str>) -> V {
    let mut m = vec![
        ("type", s("mm_key")),
        ("hash", s(hash)),
        ("start_offset", V::from(start_offset)),
    ];
    if let Some(u) = uuid {
        m.push(("uuid", s(u)));
    }
    map(m)
}

fn stored_of(b: &EngineBatch, i: usize) -> &StoredBlocks {
    match &b.events[i] {
        EngineEvent::Stored(s) => s,
        other => panic!("{other:?}"),
    }
}

#[test]
fn token_ids_sent_as_decimal_strings_are_their_values() {
    let toks = |t: V| vec![V::from(5), t];
    let ok = [("7", 7), ("007", 7), ("0", 0), ("4294967295", u32::MAX)];
    for (text, want) in ok {
        let b = one(vec![trt_stored(vec![V::from(1)], toks(s(text)), vec![])]);
        assert!(b.notes.is_clean(), "{text}: {:?}", b.notes);
        assert_eq!(stored_of(&b, 0).token_ids, vec![5, want], "{text}");
    }
    // Not a decimal u32: the event is malformed, the next one still decodes.
    let digest = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
    for text in [
        "4294967296",
        "99999999999999999999",
        "-1",
        "+1",
        " 1",
        "1 ",
        "",
        "1a",
        "0x10",
        "١",
        digest,
    ] {
        let b = one(vec![
            trt_stored(vec![V::from(1)], toks(s(text)), vec![]),
            arr(vec![s("AllBlocksCleared")]),
        ]);
        assert_eq!(b.events, vec![EngineEvent::AllCleared], "{text:?}");
        assert_eq!(b.notes.malformed_events, 1, "{text:?}");
        let why = b.notes.first_malformed.unwrap();
        assert!(
            why.contains("token_ids") && why.contains("not a decimal u32"),
            "{why}"
        );
    }
    // A long string is cut in the reason.
    let long = "x".repeat(10_000);
    let b = one(vec![trt_stored(vec![V::from(1)], toks(s(&long)), vec![])]);
    assert!(b.notes.first_malformed.unwrap().len() < 200);
}

#[test]
fn lora_id_without_lora_name_names_the_adapter_in_decimal() {
    let with = |id: V, name: V| {
        let b = one(vec![trt_stored(
            vec![V::from(1)],
            vec![V::from(1), V::from(2)],
            vec![("lora_id", id), ("lora_name", name)],
        )]);
        assert!(b.notes.is_clean(), "{:?}", b.notes);
        stored_of(&b, 0).lora_name.clone()
    };
    assert_eq!(with(V::from(7), V::Nil), Some("7".into()));
    assert_eq!(with(V::from(0), V::Nil), Some("0".into()));
    assert_eq!(with(V::from(u64::MAX), V::Nil), Some(u64::MAX.to_string()));
    assert_eq!(with(V::from(-2), V::Nil), Some("-2".into()));
    assert_eq!(with(V::from(7), s("")), Some("7".into()));
    // A name, when sent, wins (vLLM, SGLang); neither: no LoRA.
    assert_eq!(with(V::from(7), s("adapter")), Some("adapter".into()));
    assert_eq!(with(V::Nil, V::Nil), None);
    assert_eq!(with(V::Nil, s("")), Some(String::new()));
    // The positional layout's lora_id (5th field) counts too.
    let b = one(vec![arr(vec![
        s("BlockStored"),
        arr(vec![V::from(3)]),
        V::Nil,
        arr(vec![V::from(1), V::from(2)]),
        V::from(2),
        V::from(12),
    ])]);
    assert_eq!(stored_of(&b, 0).lora_name.as_deref(), Some("12"));
    // An extra-key string equal to the id is still the salt: only a sent name is matched.
    let b = one(vec![trt_stored(
        vec![V::from(1)],
        vec![V::from(1), V::from(2)],
        vec![
            ("lora_id", V::from(7)),
            ("extra_keys", arr(vec![arr(vec![s("7")])])),
        ],
    )]);
    let st = stored_of(&b, 0);
    assert_eq!(st.block_extras[0].salt.as_deref(), Some("7"));
    assert_eq!(st.block_extras[0].lora_name, None);
}

#[test]
fn mm_keys_enter_each_block_s_multimodal_hashes() {
    let hex = "0123456789abcdef".repeat(4);
    let b = one(vec![trt_stored(
        vec![V::from(1), V::from(2), V::from(3)],
        (0..6).map(V::from).collect(),
        vec![
            (
                "mm_keys",
                arr(vec![
                    arr(vec![]),
                    arr(vec![
                        mm_key(&hex, 0, None),
                        mm_key("img-b", 3, Some("user-b")),
                    ]),
                    V::Nil,
                ]),
            ),
            ("locality", s("LOCAL")),
            ("group_idx", V::from(0)),
            ("kv_cache_spec_kind", s("full_attention")),
        ],
    )]);
    // mm_keys and locality are known fields.
    assert!(b.notes.is_clean(), "{:?}", b.notes);
    let st = stored_of(&b, 0);
    let item = |id: &str| mm_identifier_hash(id).unwrap();
    assert_eq!(item(&hex), 0x0123_4567_89ab_cdef);
    assert_eq!(
        st.block_extras,
        vec![
            BlockExtras::default(),
            BlockExtras {
                // the uuid, not the hash, names the second item
                mm_hashes: vec![item(&hex), item("user-b")],
                ..BlockExtras::default()
            },
            BlockExtras::default(),
        ]
    );
    assert_eq!(
        (st.group_idx, st.spec_kind.as_deref()),
        (Some(0), Some("full_attention"))
    );
    assert_eq!(st.lora_name, None);
}

#[test]
fn mm_keys_merge_with_extra_keys_and_tolerate_empty_and_other_kinds() {
    // Merged by block with vLLM-style extra keys.
    let b = one(vec![trt_stored(
        vec![V::from(1), V::from(2)],
        (0..4).map(V::from).collect(),
        vec![
            (
                "extra_keys",
                arr(vec![
                    arr(vec![arr(vec![s("vl"), V::from(0)]), s("salt")]),
                    V::Nil,
                ]),
            ),
            (
                "mm_keys",
                arr(vec![
                    arr(vec![mm_key("t", 1, Some(""))]),
                    arr(vec![mm_key("t", 0, None)]),
                ]),
            ),
        ],
    )]);
    let st = stored_of(&b, 0);
    let (vl, t) = (
        mm_identifier_hash("vl").unwrap(),
        mm_identifier_hash("t").unwrap(),
    );
    assert_eq!(st.block_extras[0].mm_hashes, vec![vl, t]);
    assert_eq!(st.block_extras[0].salt.as_deref(), Some("salt"));
    assert_eq!(st.block_extras[1].mm_hashes, vec![t]);
    // An empty list is no keys; an empty identifier is ignored; a key of another type is an
    // `other` hash over its bytes; unknown fields of a key are skipped.
    let b = one(vec![trt_stored(
        vec![V::from(1)],
        vec![V::from(1), V::from(2)],
        vec![("mm_keys", arr(vec![]))],
    )]);
    assert!(stored_of(&b, 0).block_extras.is_empty());
    let audio = map(vec![("type", s("audio_key")), ("hash", s("a"))]);
    let b = one(vec![trt_stored(
        vec![V::from(1)],
        vec![V::from(1), V::from(2)],
        vec![(
            "mm_keys",
            arr(vec![arr(vec![
                mm_key("", 0, None),
                audio.clone(),
                map(vec![("hash", s("h")), ("future", arr(vec![V::from(1)]))]),
            ])]),
        )],
    )]);
    assert!(b.notes.is_clean(), "{:?}", b.notes);
    assert_eq!(
        stored_of(&b, 0).block_extras,
        vec![BlockExtras {
            mm_hashes: vec![mm_identifier_hash("h").unwrap()],
            other: vec![xxhash_rust::xxh3::xxh3_64(&enc(&audio))],
            ..BlockExtras::default()
        }]
    );
}

#[test]
fn malformed_mm_keys_skip_the_event() {
    let cases = vec![
        s("x"),
        arr(vec![V::from(1)]),
        arr(vec![arr(vec![s("not-a-map")])]),
        arr(vec![arr(vec![map(vec![("type", s("mm_key"))])])]),
        arr(vec![arr(vec![map(vec![("hash", V::from(3))])])]),
        arr(vec![arr(vec![map(vec![
            ("hash", s("h")),
            ("uuid", V::from(1)),
        ])])]),
        arr(vec![arr(vec![map(vec![
            ("hash", s("h")),
            ("start_offset", s("0")),
        ])])]),
        arr(vec![arr(vec![map(vec![
            ("hash", s("h")),
            ("type", V::from(1)),
        ])])]),
        // one entry per block: two blocks here, one entry
        arr(vec![arr(vec![])]),
    ];
    for value in cases {
        let b = one(vec![
            trt_stored(
                vec![V::from(1), V::from(2)],
                (0..4).map(V::from).collect(),
                vec![("mm_keys", value.clone())],
            ),
            arr(vec![s("AllBlocksCleared")]),
        ]);
        assert_eq!(b.events, vec![EngineEvent::AllCleared], "{value}");
        assert!(
            b.notes.first_malformed.unwrap().contains("mm_keys"),
            "{value}"
        );
    }
    // Too many blocks or keys per block: the per-event block limit.
    let l = DecodeLimits {
        max_blocks_per_event: 2,
        ..DecodeLimits::default()
    };
    let k = || mm_key("h", 0, None);
    for value in [
        arr(vec![arr(vec![]), arr(vec![]), arr(vec![])]),
        arr(vec![arr(vec![k(), k(), k()]), arr(vec![])]),
    ] {
        let ev = trt_stored(
            vec![V::from(1), V::from(2)],
            (0..4).map(V::from).collect(),
            vec![("mm_keys", value)],
        );
        let b = decode_batch(&batch(vec![ev]), &l).unwrap();
        assert_eq!((b.events.len(), b.notes.malformed_events), (0, 1));
    }
}

/// A TensorRT-LLM store of two blocks of 2 whose token ids are `tokens` and whose `mm_keys`
/// are `keys`, then a clear (so a malformed store still leaves one event).
fn digest_store(tokens: Vec<V>, keys: V) -> EngineBatch {
    one(vec![
        trt_stored(
            vec![V::from(1), V::from(2)],
            tokens,
            vec![("mm_keys", keys)],
        ),
        arr(vec![s("AllBlocksCleared")]),
    ])
}

#[test]
fn an_item_digest_in_place_of_a_token_id_is_the_placeholder() {
    let digest = "0cf457e24a479f02fd4d34540389f720f0807dcff92a7562108165b2637ea82f";
    let img = mm_identifier_hash(digest).unwrap();
    // The image starts at position 1 (block 0) and runs on into block 1, as TensorRT-LLM
    // sends it: the digest at its first position, ints after, a key in each block it spans.
    let keys = || {
        arr(vec![
            arr(vec![mm_key(digest, 0, None)]),
            arr(vec![mm_key(digest, 1, None)]),
        ])
    };
    let toks = |first: &str| vec![V::from(5), s(first), V::from(1001), V::from(6)];
    let b = digest_store(toks(digest), keys());
    assert!(b.notes.is_clean(), "{:?}", b.notes);
    let st = stored_of(&b, 0);
    assert_eq!(st.token_ids, vec![5, IMAGE_DIGEST_TOKEN, 1001, 6]);
    assert_eq!(IMAGE_DIGEST_TOKEN, u32::MAX);
    // The image still enters both blocks through mm_hashes.
    let with = BlockExtras {
        mm_hashes: vec![img],
        ..BlockExtras::default()
    };
    assert_eq!(st.block_extras, vec![with.clone(), with.clone()]);

    // Hex case does not matter, either side.
    let upper = digest.to_ascii_uppercase();
    let b = digest_store(toks(&upper), keys());
    assert!(b.notes.is_clean(), "{:?}", b.notes);
    assert_eq!(stored_of(&b, 0).token_ids[1], IMAGE_DIGEST_TOKEN);
    let b = digest_store(
        toks(digest),
        arr(vec![arr(vec![mm_key(&upper, 0, None)]), arr(vec![])]),
    );
    assert!(b.notes.is_clean(), "{:?}", b.notes);
    assert_eq!(stored_of(&b, 0).token_ids[1], IMAGE_DIGEST_TOKEN);

    // Any block of the event may list the key; a uuid naming the item does not matter.
    let b = digest_store(
        toks(digest),
        arr(vec![
            arr(vec![]),
            arr(vec![mm_key(digest, 1, Some("user-img"))]),
        ]),
    );
    assert!(b.notes.is_clean(), "{:?}", b.notes);
    let st = stored_of(&b, 0);
    assert_eq!(st.token_ids[1], IMAGE_DIGEST_TOKEN);
    assert_eq!(
        st.block_extras[1].mm_hashes,
        vec![mm_identifier_hash("user-img").unwrap()]
    );

    // mm_keys before token_ids in the map: the same.
    let ev = map(vec![
        ("type", s("BlockStored")),
        ("mm_keys", keys()),
        ("block_hashes", arr(vec![V::from(1), V::from(2)])),
        ("parent_block_hash", V::Nil),
        ("token_ids", arr(toks(digest))),
        ("block_size", V::from(2)),
    ]);
    let b = one(vec![ev]);
    assert!(b.notes.is_clean(), "{:?}", b.notes);
    assert_eq!(stored_of(&b, 0).token_ids[1], IMAGE_DIGEST_TOKEN);

    // A decimal string stays its value even when it equals a key's hash.
    let b = digest_store(
        toks("7"),
        arr(vec![arr(vec![mm_key("7", 0, None)]), arr(vec![])]),
    );
    assert!(b.notes.is_clean(), "{:?}", b.notes);
    assert_eq!(stored_of(&b, 0).token_ids[1], 7);
}

#[test]
fn a_string_token_naming_no_mm_key_of_the_event_is_malformed() {
    let digest = "0cf457e24a479f02fd4d34540389f720f0807dcff92a7562108165b2637ea82f";
    // sha256("image-2"): well-formed hex, but not this event's item.
    let other = "5a0717cb6596468ea1dffa86011f9b0f497348d80421835b51799f9aeb455642";
    let toks = |first: &str| vec![V::from(5), s(first), V::from(1001), V::from(6)];
    let audio = map(vec![("type", s("audio_key")), ("hash", s(digest))]);
    let cases = vec![
        // an unrelated digest
        (
            toks(other),
            arr(vec![arr(vec![mm_key(digest, 0, None)]), arr(vec![])]),
        ),
        // the digest with no mm_keys at all (nil, empty)
        (toks(digest), V::Nil),
        (toks(digest), arr(vec![])),
        // a key of another type carrying the same hash
        (toks(digest), arr(vec![arr(vec![audio]), arr(vec![])])),
        // an empty string and an empty hash
        (
            toks(""),
            arr(vec![arr(vec![mm_key("", 0, None)]), arr(vec![])]),
        ),
        // a prefix of the digest
        (
            toks(&digest[..16]),
            arr(vec![arr(vec![mm_key(digest, 0, None)]), arr(vec![])]),
        ),
        // the right digest, but a second string that is not
        (
            vec![s(digest), s(other), V::from(1), V::from(2)],
            arr(vec![arr(vec![mm_key(digest, 0, None)]), arr(vec![])]),
        ),
    ];
    for (tokens, keys) in cases {
        let b = digest_store(tokens.clone(), keys.clone());
        assert_eq!(b.events, vec![EngineEvent::AllCleared], "{tokens:?} {keys}");
        assert_eq!(b.notes.malformed_events, 1);
        let why = b.notes.first_malformed.unwrap();
        assert!(
            why.starts_with("BlockStored: token_ids: ")
                && why.contains("not a decimal u32 nor an mm_keys hash"),
            "{why}"
        );
    }
    // A positional (vLLM) store has no mm_keys: a digest there is malformed.
    let b = one(vec![arr(vec![
        s("BlockStored"),
        arr(vec![V::from(1)]),
        V::Nil,
        arr(vec![V::from(1), s(digest)]),
        V::from(2),
    ])]);
    assert_eq!((b.events.len(), b.notes.malformed_events), (0, 1));
    // Another bad field is still the reason given.
    let b = one(vec![trt_stored(
        vec![s("oops")],
        vec![V::from(1), s(other)],
        vec![],
    )]);
    assert!(b.notes.first_malformed.unwrap().contains("block_hashes"),);
}

#[test]
fn trt_removal_with_group_and_locality() {
    let b = one(vec![map(vec![
        ("type", s("BlockRemoved")),
        ("block_hashes", arr(vec![V::from(-5), V::from(6)])),
        ("medium", s("GPU")),
        ("group_idx", V::from(2)),
        ("locality", s("REMOTE")),
    ])]);
    assert!(b.notes.is_clean(), "{:?}", b.notes);
    assert_eq!(
        b.events,
        vec![EngineEvent::Removed(RemovedBlocks {
            block_hashes: vec![(-5i64) as u64, 6],
            medium: Some("GPU".into()),
            group_idx: Some(2),
        })]
    );
}

/// TensorRT-LLM's native serializer writes every int with the 9-byte int64 marker (the
/// envelope's rank, hashes, token ids, block size).
#[test]
fn int64_markers_everywhere_decode() {
    use rmp::encode as e;
    let mut p = Vec::new();
    e::write_array_len(&mut p, 3).unwrap();
    e::write_f64(&mut p, 12.5).unwrap();
    e::write_array_len(&mut p, 2).unwrap();
    e::write_map_len(&mut p, 8).unwrap();
    let key = |p: &mut Vec<u8>, k: &str| e::write_str(p, k).unwrap();
    key(&mut p, "type");
    key(&mut p, "BlockStored");
    key(&mut p, "block_hashes");
    e::write_array_len(&mut p, 1).unwrap();
    e::write_i64(&mut p, -9).unwrap();
    key(&mut p, "parent_block_hash");
    e::write_i64(&mut p, 4).unwrap();
    key(&mut p, "token_ids");
    e::write_array_len(&mut p, 2).unwrap();
    e::write_i64(&mut p, 70_000).unwrap();
    e::write_i64(&mut p, 1).unwrap();
    key(&mut p, "block_size");
    e::write_i64(&mut p, 2).unwrap();
    key(&mut p, "lora_id");
    e::write_nil(&mut p).unwrap();
    key(&mut p, "medium");
    key(&mut p, "GPU");
    key(&mut p, "lora_name");
    e::write_nil(&mut p).unwrap();
    e::write_map_len(&mut p, 3).unwrap();
    key(&mut p, "type");
    key(&mut p, "BlockRemoved");
    key(&mut p, "block_hashes");
    e::write_array_len(&mut p, 1).unwrap();
    e::write_i64(&mut p, -9).unwrap();
    key(&mut p, "medium");
    key(&mut p, "GPU");
    e::write_i64(&mut p, 3).unwrap();
    assert_eq!(p[p.len() - 9], 0xd3);
    let b = decode_batch(&p, &DecodeLimits::default()).unwrap();
    assert!(b.notes.is_clean(), "{:?}", b.notes);
    assert_eq!((b.ts, b.dp_rank), (12.5, Some(3)));
    let st = stored_of(&b, 0);
    assert_eq!(
        (
            st.block_hashes.clone(),
            st.parent,
            st.token_ids.clone(),
            st.block_size
        ),
        (vec![(-9i64) as u64], Some(4), vec![70_000, 1], 2)
    );
    assert_eq!(hashes_of(&b), vec![(-9i64) as u64]);
}
