//! Golden payloads encoded by the real msgspec encoder with vLLM's and SGLang's own structs,
//! and with TensorRT-LLM's wire schema restated field by field (`fixtures/gen_fixtures.py`),
//! decoded and translated here.

use ckf_core::dc::{KvEventKind, MemberId};
use ckf_core::tokens::{
    self, BlockSeed, MultimodalItem, MultimodalSpan, TokenQuery, TokenQueryRules,
};
use ckf_engine::event::{BlockExtras, EngineEvent, RemovedBlocks};
use ckf_engine::filters::{EngineFilters, Skip};
use ckf_engine::lineage::{Lineage, SkipReason};
use ckf_engine::message::EngineMessage;
use ckf_engine::wire::{DecodeLimits, IMAGE_DIGEST_TOKEN, decode_batch};

mod common;
use common::fixture;

fn decode(name: &str) -> ckf_engine::event::EngineBatch {
    decode_batch(&fixture(name), &DecodeLimits::default()).expect(name)
}

fn stored(ev: &EngineEvent) -> &ckf_engine::event::StoredBlocks {
    match ev {
        EngineEvent::Stored(s) => s,
        other => panic!("not a store: {other:?}"),
    }
}

const M: MemberId = MemberId::new(7, 0);

#[test]
fn vllm_stored_basic_reduces_32_byte_hashes_to_their_last_8_bytes() {
    let b = decode("vllm_stored_basic");
    assert_eq!(b.ts, 1.5);
    assert_eq!(b.dp_rank, None);
    assert!(b.notes.is_clean(), "{:?}", b.notes);
    assert_eq!(b.events.len(), 1);
    let s = stored(&b.events[0]);
    assert_eq!(s.block_hashes, vec![1, 2]);
    assert_eq!(s.parent, None);
    assert_eq!(s.token_ids, (0..32).collect::<Vec<u32>>());
    assert_eq!(s.block_size, 16);
    assert_eq!(s.medium.as_deref(), Some("GPU"));
    assert!(s.block_extras.is_empty());

    let mut lin = Lineage::new();
    let t = lin.translate(M, &b.events[0], &EngineFilters::default());
    assert!(t.skipped.is_empty());
    let want = tokens::sequence_hashes(&s.token_ids, 16, BlockSeed::DEFAULT, &[]).unwrap();
    assert_eq!(
        t.kv_event.unwrap().kind,
        KvEventKind::Stored {
            block_hashes: want,
            parent_hash: None
        }
    );
}

#[test]
fn vllm_extra_keys_give_lora_salt_and_multimodal_and_chain_across_events() {
    let b = decode("vllm_stored_extras");
    assert_eq!(b.ts, 2.25);
    assert_eq!(b.dp_rank, Some(3));
    assert!(b.notes.is_clean(), "{:?}", b.notes);
    let s0 = stored(&b.events[0]);
    assert_eq!(s0.block_hashes, vec![101, 102]);
    assert_eq!(s0.lora_name.as_deref(), Some("adapter-a"));
    assert_eq!(s0.group_idx, Some(0));
    assert_eq!(s0.spec_kind.as_deref(), Some("full_attention"));
    let abc = tokens::mm_identifier_hash("img-abc").unwrap();
    let def = tokens::mm_identifier_hash("img-def").unwrap();
    let extras = |mm: Vec<u64>| BlockExtras {
        mm_hashes: mm,
        salt: Some("salt-1".into()),
        lora_name: Some("adapter-a".into()),
        other: vec![],
    };
    assert_eq!(
        s0.block_extras,
        vec![extras(vec![abc]), extras(vec![abc, def])]
    );
    let s1 = stored(&b.events[1]);
    assert_eq!(s1.parent, Some(102));
    assert_eq!(s1.block_extras, vec![extras(vec![])]);

    // Two events chained by engine hashes give the whole request's canonical chain.
    let filters = EngineFilters {
        block_size: 4,
        ..EngineFilters::default()
    };
    let mut lin = Lineage::new();
    let mut got = Vec::new();
    for ev in &b.events {
        let t = lin.translate(M, ev, &filters);
        assert!(t.skipped.is_empty(), "{:?}", t.skipped);
        match t.kv_event.unwrap().kind {
            KvEventKind::Stored { block_hashes, .. } => got.extend(block_hashes),
            other => panic!("{other:?}"),
        }
    }
    let all: Vec<u32> = (1000..1012).collect();
    let spans = [
        MultimodalSpan {
            hash: abc,
            offset: 0,
            length: 8,
        },
        MultimodalSpan {
            hash: def,
            offset: 6,
            length: 2,
        },
    ];
    let seed = BlockSeed::new(Some("salt-1"), Some("adapter-a"));
    assert_eq!(got, tokens::sequence_hashes(&all, 4, seed, &spans).unwrap());
    assert_ne!(seed, BlockSeed::DEFAULT);
}

#[test]
fn vllm_removed_and_cleared_with_group_and_medium_filters() {
    let b = decode("vllm_removed_cleared");
    assert_eq!(b.dp_rank, Some(0));
    assert!(b.notes.is_clean());
    assert_eq!(
        b.events,
        vec![
            EngineEvent::Removed(RemovedBlocks {
                block_hashes: vec![1],
                medium: Some("GPU".into()),
                group_idx: None
            }),
            EngineEvent::Removed(RemovedBlocks {
                block_hashes: vec![2],
                medium: Some("GPU".into()),
                group_idx: Some(1)
            }),
            EngineEvent::Removed(RemovedBlocks {
                block_hashes: vec![5],
                medium: Some("CPU".into()),
                group_idx: None
            }),
            EngineEvent::AllCleared,
        ]
    );
    // Store the blocks of fixture 1, then replay these removals.
    let mut lin = Lineage::new();
    let f = EngineFilters::default();
    let basic = decode("vllm_stored_basic");
    let t = lin.translate(M, &basic.events[0], &f);
    let KvEventKind::Stored { block_hashes, .. } = t.kv_event.unwrap().kind else {
        panic!()
    };
    let t = lin.translate(M, &b.events[0], &f);
    assert_eq!(
        t.kv_event.unwrap().kind,
        KvEventKind::Removed {
            block_hashes: vec![block_hashes[0]]
        }
    );
    let t = lin.translate(M, &b.events[1], &f);
    assert_eq!(t.kv_event, None);
    assert_eq!(t.skipped, vec![(SkipReason::Filter(Skip::Group), 1)]);
    let t = lin.translate(M, &b.events[2], &f);
    assert_eq!(t.skipped, vec![(SkipReason::Filter(Skip::Medium), 1)]);
    assert_eq!(lin.len(M), 1);
    let t = lin.translate(M, &b.events[3], &f);
    assert_eq!(t.kv_event.unwrap().kind, KvEventKind::Cleared);
    assert_eq!(lin.len(M), 0);
    assert!(lin.members().is_empty());
}

#[test]
fn vllm_sliding_window_store_is_decoded_then_skipped() {
    let b = decode("vllm_sliding_window");
    // locality, session_id, lookahead_token_ids are known (ignored), not unknown.
    assert!(b.notes.is_clean(), "{:?}", b.notes);
    let s = stored(&b.events[0]);
    assert_eq!(s.sliding_window, Some(128));
    assert_eq!(s.spec_kind.as_deref(), Some("sliding_window"));
    assert_eq!(s.group_idx, Some(1));
    let f = EngineFilters {
        block_size: 4,
        main_group: 1,
        ..EngineFilters::default()
    };
    assert_eq!(f.admit_stored(s), Err(Skip::SlidingWindow));
    let mut lin = Lineage::new();
    let t = lin.translate(M, &b.events[0], &f);
    assert_eq!(t.kv_event, None);
    assert_eq!(
        t.skipped,
        vec![(SkipReason::Filter(Skip::SlidingWindow), 1)]
    );
}

#[test]
fn sglang_batch_negative_hashes_salt_and_rank() {
    let b = decode("sglang_batch");
    assert_eq!(b.ts, 5.5);
    assert_eq!(b.dp_rank, Some(1));
    assert!(b.notes.is_clean(), "{:?}", b.notes);
    let s = stored(&b.events[0]);
    assert_eq!(s.block_hashes, vec![(-2i64) as u64, i64::MAX as u64]);
    assert_eq!(s.cache_salt.as_deref(), Some("tenant-9"));
    assert_eq!(s.lora_name.as_deref(), Some("lora-x"));
    let f = EngineFilters {
        block_size: 4,
        ..EngineFilters::default()
    };
    let mut lin = Lineage::new();
    let t = lin.translate(M, &b.events[0], &f);
    let seed = BlockSeed::new(Some("tenant-9"), Some("lora-x"));
    let want = tokens::sequence_hashes(&s.token_ids, 4, seed, &[]).unwrap();
    assert_eq!(
        t.kv_event.unwrap().kind,
        KvEventKind::Stored {
            block_hashes: want.clone(),
            parent_hash: None
        }
    );
    // CPU_PINNED is not GPU; the medium-less removal enters.
    let t = lin.translate(M, &b.events[1], &f);
    assert_eq!(t.skipped, vec![(SkipReason::Filter(Skip::Medium), 1)]);
    let t = lin.translate(M, &b.events[2], &f);
    assert_eq!(
        t.kv_event.unwrap().kind,
        KvEventKind::Removed {
            block_hashes: vec![want[1]]
        }
    );
    assert_eq!(b.events[3], EngineEvent::AllCleared);

    let b = decode("sglang_no_rank");
    assert_eq!((b.ts, b.dp_rank), (6.0, None));
    assert_eq!(b.events, vec![EngineEvent::AllCleared]);
}

#[test]
fn positional_events_with_short_and_long_tails() {
    let b = decode("positional_events");
    assert_eq!(b.dp_rank, Some(2));
    assert_eq!(b.notes.unknown_events, 1);
    assert_eq!(b.notes.malformed_events, 0);
    assert_eq!(b.events.len(), 6);
    let s0 = stored(&b.events[0]);
    assert_eq!(s0.block_hashes, vec![11, 12]);
    assert_eq!((s0.medium.clone(), s0.lora_name.clone()), (None, None));
    let s1 = stored(&b.events[1]);
    assert_eq!(s1.parent, Some(12));
    assert_eq!(s1.medium.as_deref(), Some("GPU"));
    assert_eq!(s1.lora_name.as_deref(), Some("lora-p"));
    assert_eq!(
        b.events[3],
        EngineEvent::Removed(RemovedBlocks {
            block_hashes: vec![12],
            medium: Some("CPU".into()),
            group_idx: None
        })
    );
    assert_eq!(
        b.events[4],
        EngineEvent::Unknown {
            kind: "BlockOffloaded".into()
        }
    );
    assert_eq!(b.events[5], EngineEvent::AllCleared);
}

#[test]
fn tolerance_unknown_type_unknown_field_malformed_event() {
    let b = decode("tolerance");
    assert_eq!(b.ts, 8.0);
    assert_eq!(b.dp_rank, None);
    assert_eq!(b.notes.unknown_fields, 1);
    assert_eq!(b.notes.unknown_events, 1);
    assert_eq!(b.notes.malformed_events, 1);
    assert!(
        b.notes
            .first_malformed
            .as_deref()
            .unwrap()
            .contains("block_hashes"),
        "{:?}",
        b.notes.first_malformed
    );
    assert_eq!(b.events.len(), 3);
    assert_eq!(stored(&b.events[0]).block_hashes, vec![1]);
    assert_eq!(
        b.events[1],
        EngineEvent::Unknown {
            kind: "BlockEvicted".into()
        }
    );
    assert!(matches!(b.events[2], EngineEvent::Removed(_)));
}

// ---- TensorRT-LLM (`trtllm_*` fixtures) ----

/// The item digest of the TensorRT-LLM fixtures (`sha256(b"image-1")` in hex).
const IMAGE: &str = "0cf457e24a479f02fd4d34540389f720f0807dcff92a7562108165b2637ea82f";

fn bs4() -> EngineFilters {
    EngineFilters {
        block_size: 4,
        ..EngineFilters::default()
    }
}

fn stored_hashes(t: &ckf_engine::lineage::Translation) -> Vec<u64> {
    match &t.kv_event.as_ref().expect("a kv event").kind {
        KvEventKind::Stored { block_hashes, .. } => block_hashes.clone(),
        other => panic!("{other:?}"),
    }
}

const PAD: u32 = 151_655;

fn mm_tokens() -> Vec<u32> {
    vec![1, 2, 3, 4, 5, PAD, PAD, PAD, PAD, 10, 11, 12]
}

/// The image at request positions 5..9 (blocks 1 and 2 of 4 tokens).
fn image_span(hash: u64) -> MultimodalSpan {
    MultimodalSpan {
        hash,
        offset: 5,
        length: 4,
    }
}

#[test]
fn trtllm_multimodal_block_carries_its_image_into_the_canonical_hash() {
    let b = decode("trtllm_stored_mm");
    assert_eq!((b.ts, b.dp_rank), (10.5, Some(0)));
    // mm_keys is a known field now: nothing unknown, nothing malformed.
    assert!(b.notes.is_clean(), "{:?}", b.notes);
    let s0 = stored(&b.events[0]);
    assert_eq!(
        s0.block_hashes,
        [
            -2_007_973_411_963_361_932i64,
            -3_887_183_956_728_003_391,
            3_008_882_331_421_385_109
        ]
        .map(|h| h as u64)
    );
    assert_eq!(s0.token_ids, mm_tokens());
    assert_eq!(
        (s0.lora_name.clone(), s0.medium.as_deref()),
        (None, Some("GPU"))
    );
    // A 64-hex digest names the item by its first 16 hex digits.
    let img = tokens::mm_identifier_hash(IMAGE).unwrap();
    assert_eq!(img, 0x0cf4_57e2_4a47_9f02);
    let with = |h: u64| BlockExtras {
        mm_hashes: vec![h],
        ..BlockExtras::default()
    };
    assert_eq!(
        s0.block_extras,
        vec![BlockExtras::default(), with(img), with(img)]
    );

    let mut lin = Lineage::new();
    let got = stored_hashes(&lin.translate(M, &b.events[0], &bs4()));
    let want =
        tokens::sequence_hashes(&mm_tokens(), 4, BlockSeed::DEFAULT, &[image_span(img)]).unwrap();
    assert_eq!(got, want);
    // The plain-text chain of the same tokens: same first block, then different.
    let text = tokens::sequence_hashes(&mm_tokens(), 4, BlockSeed::DEFAULT, &[]).unwrap();
    assert_eq!(got[0], text[0]);
    assert_ne!(got[1], text[1]);
    assert_ne!(got[2], text[2]);

    // The same image named by a uuid: the uuid is the identifier.
    let s1 = stored(&b.events[1]);
    let user = tokens::mm_identifier_hash("user-img-7").unwrap();
    assert_eq!(
        s1.block_extras,
        vec![BlockExtras::default(), with(user), with(user)]
    );
    let by_uuid = stored_hashes(&lin.translate(M, &b.events[1], &bs4()));
    let want_uuid =
        tokens::sequence_hashes(&mm_tokens(), 4, BlockSeed::DEFAULT, &[image_span(user)]).unwrap();
    assert_eq!(by_uuid, want_uuid);
    assert_ne!(by_uuid[1], got[1]);

    // vLLM naming the item by the same identifier (its [identifier, offset] extra key) gives
    // the same canonical chain as TensorRT-LLM's uuid.
    use rmpv::Value as V;
    let key = || V::Array(vec![V::Array(vec![V::from("user-img-7"), V::from(5)])]);
    let vllm = V::Array(vec![
        V::F64(1.0),
        V::Array(vec![V::Array(vec![
            V::from("BlockStored"),
            V::Array(vec![V::from(901), V::from(902), V::from(903)]),
            V::Nil,
            V::Array(mm_tokens().into_iter().map(V::from).collect()),
            V::from(4),
            V::Nil,
            V::from("GPU"),
            V::Nil,
            V::Array(vec![V::Nil, key(), key()]),
        ])]),
    ]);
    let mut payload = Vec::new();
    rmpv::encode::write_value(&mut payload, &vllm).unwrap();
    let vb = decode_batch(&payload, &DecodeLimits::default()).unwrap();
    let from_vllm = stored_hashes(&Lineage::new().translate(M, &vb.events[0], &bs4()));
    assert_eq!(from_vllm, by_uuid);
}

#[test]
fn trtllm_lora_id_only_block_is_seeded_by_the_decimal_id() {
    let b = decode("trtllm_lora_id");
    assert_eq!((b.ts, b.dp_rank), (11.0, Some(1)));
    assert!(b.notes.is_clean(), "{:?}", b.notes);
    let lora = stored(&b.events[0]);
    assert_eq!(lora.lora_name.as_deref(), Some("7"));
    assert_eq!(lora.block_hashes, vec![5_250_005_683_188_281_740]);
    let base = stored(&b.events[1]);
    assert_eq!(base.lora_name, None);
    let child = stored(&b.events[2]);
    assert_eq!(
        (child.parent, child.lora_name.clone()),
        (Some(5_250_005_683_188_281_740), None)
    );

    let mut lin = Lineage::new();
    let seed = BlockSeed::new(None, Some("7"));
    let all: Vec<u32> = (1..=8).collect();
    let want = tokens::sequence_hashes(&all, 4, seed, &[]).unwrap();
    let got = stored_hashes(&lin.translate(M, &b.events[0], &bs4()));
    assert_eq!(got, want[..1]);
    let base_hash = stored_hashes(&lin.translate(M, &b.events[1], &bs4()));
    assert_eq!(
        base_hash,
        tokens::sequence_hashes(&all[..4], 4, BlockSeed::DEFAULT, &[]).unwrap()
    );
    assert_ne!(got, base_hash);
    // The child names no LoRA: it inherits the adapter's seed from its parent.
    let t = lin.translate(M, &b.events[2], &bs4());
    assert_eq!(
        t.kv_event.unwrap().kind,
        KvEventKind::Stored {
            block_hashes: want[1..].to_vec(),
            parent_hash: Some(want[0])
        }
    );
}

/// `sha256(b"image-2")` in hex: a digest no key of its event names (`trtllm_token_strings`).
const OTHER_IMAGE: &str = "5a0717cb6596468ea1dffa86011f9b0f497348d80421835b51799f9aeb455642";

#[test]
fn trtllm_decimal_string_token_ids_are_accepted_an_unnamed_digest_is_not() {
    let b = decode("trtllm_token_strings");
    assert_eq!((b.ts, b.dp_rank), (12.0, Some(0)));
    let s0 = stored(&b.events[0]);
    assert_eq!(s0.token_ids, vec![12, 13, 14, 15]);
    let got = stored_hashes(&Lineage::new().translate(M, &b.events[0], &bs4()));
    assert_eq!(
        got,
        tokens::sequence_hashes(&[12, 13, 14, 15], 4, BlockSeed::DEFAULT, &[]).unwrap()
    );
    // The store whose token ids hold a digest that no mm_keys entry of the event names is
    // malformed; the clear after it still decodes.
    assert_eq!(b.events.len(), 2);
    assert_eq!(b.events[1], EngineEvent::AllCleared);
    assert_eq!(b.notes.malformed_events, 1);
    let why = b.notes.first_malformed.as_deref().unwrap();
    assert!(
        why.contains("token_ids") && why.contains(&OTHER_IMAGE[..16]),
        "{why}"
    );
}

/// TensorRT-LLM's `mm_token_id_offset` in `trtllm_image_request`.
const MM_OFFSET: u32 = 1000;

/// The request of `trtllm_image_request`, `first` at the image's first position (3): the
/// image at positions 3..9, `MM_OFFSET + k` at its k-th position, then text (16 tokens, 4
/// blocks of 4).
fn image_request(first: u32) -> Vec<u32> {
    let mut t = vec![1, 2, 3, first];
    t.extend((1..=5).map(|k| MM_OFFSET + k));
    t.extend([20, 21, 22, 23, 24, 25, 26]);
    t
}

#[test]
fn trtllm_image_digest_token_is_the_placeholder_and_the_chain_goes_on() {
    let b = decode("trtllm_image_request");
    assert_eq!((b.ts, b.dp_rank), (14.0, Some(0)));
    assert!(b.notes.is_clean(), "{:?}", b.notes);
    let s0 = stored(&b.events[0]);
    // The digest string at the image's first position is the placeholder.
    assert_eq!(s0.token_ids, image_request(IMAGE_DIGEST_TOKEN)[..12]);
    let img = tokens::mm_identifier_hash(IMAGE).unwrap();
    let with_img = BlockExtras {
        mm_hashes: vec![img],
        ..BlockExtras::default()
    };
    assert_eq!(s0.block_extras, vec![with_img; 3]);
    let child = stored(&b.events[1]);
    assert_eq!(child.parent, Some(s0.block_hashes[2]));

    let all = image_request(IMAGE_DIGEST_TOKEN);
    let span = MultimodalSpan {
        hash: img,
        offset: 3,
        length: 6,
    };
    let want = tokens::sequence_hashes(&all, 4, BlockSeed::DEFAULT, &[span]).unwrap();
    let mut lin = Lineage::new();
    let t = lin.translate(M, &b.events[0], &bs4());
    assert!(t.skipped.is_empty(), "{:?}", t.skipped);
    assert_eq!(stored_hashes(&t), want[..3]);
    // The child is not an orphan: it chains on the image's blocks.
    let t = lin.translate(M, &b.events[1], &bs4());
    assert!(t.skipped.is_empty(), "{:?}", t.skipped);
    assert_eq!(
        t.kv_event.unwrap().kind,
        KvEventKind::Stored {
            block_hashes: want[3..].to_vec(),
            parent_hash: Some(want[2])
        }
    );
    assert_eq!(lin.len(M), 4);

    // A token query matches these blocks when it sends the placeholder at the image's first
    // position and names the image (its digest here, no uuid) with its span.
    let query = |first: u32, multimodal: Vec<MultimodalItem>| TokenQuery {
        token_ids: image_request(first),
        multimodal,
        ..TokenQuery::default()
    };
    let item = MultimodalItem {
        identifier: IMAGE.into(),
        offset: 3,
        length: 6,
    };
    let rules = TokenQueryRules {
        block_size: 4,
        max_blocks: 16,
    };
    assert_eq!(
        query(IMAGE_DIGEST_TOKEN, vec![item.clone()])
            .sequence_hashes(&rules)
            .unwrap(),
        want
    );
    // Another id there, or no item, names other blocks from the image's first block on.
    let pad = query(PAD, vec![item]).sequence_hashes(&rules).unwrap();
    assert_eq!((pad[0] == want[0], pad[3] == want[3]), (false, false));
    let text = query(IMAGE_DIGEST_TOKEN, vec![])
        .sequence_hashes(&rules)
        .unwrap();
    assert_eq!((text[0] == want[0], text[3] == want[3]), (false, false));
}

#[test]
fn trtllm_groups_only_the_main_group_enters() {
    let b = decode("trtllm_groups");
    // locality (and every other field sent) is known.
    assert!(b.notes.is_clean(), "{:?}", b.notes);
    let g0 = stored(&b.events[0]);
    assert_eq!(
        (g0.group_idx, g0.spec_kind.as_deref(), g0.sliding_window),
        (Some(0), Some("full_attention"), None)
    );
    assert_eq!(
        g0.block_extras,
        vec![BlockExtras {
            salt: Some("salt-x".into()),
            ..BlockExtras::default()
        }]
    );
    let g1 = stored(&b.events[1]);
    assert_eq!(g1.group_idx, Some(1));
    let g1_hash = g1.block_hashes[0];
    assert_eq!(
        b.events[2],
        EngineEvent::Removed(RemovedBlocks {
            block_hashes: vec![g1_hash],
            medium: Some("GPU".into()),
            group_idx: Some(1),
        })
    );

    let mut lin = Lineage::new();
    let f = bs4();
    let t = lin.translate(M, &b.events[0], &f);
    let want = tokens::sequence_hashes(&[1, 2, 3, 4], 4, BlockSeed::new(Some("salt-x"), None), &[])
        .unwrap();
    assert_eq!(stored_hashes(&t), want);
    for ev in &b.events[1..3] {
        let t = lin.translate(M, ev, &f);
        assert_eq!(t.kv_event, None);
        assert_eq!(t.skipped, vec![(SkipReason::Filter(Skip::Group), 1)]);
    }
    let t = lin.translate(M, &b.events[3], &f);
    assert_eq!(
        t.kv_event.unwrap().kind,
        KvEventKind::Removed { block_hashes: want }
    );
    assert_eq!(lin.len(M), 0);
}

/// TensorRT-LLM's frames: live `[topic, seq as 8 bytes big-endian, payload]` numbered from 0
/// (topic empty by default); a replay reply repeats that shape after the ROUTER envelope (a
/// DEALER client sees `["", topic, seq, payload]` and drops the empty delimiter); the end of a
/// replay is `["", -1 as 8 bytes, ""]` after the delimiter.
#[test]
fn trtllm_frames_parse() {
    let payload = fixture("trtllm_lora_id");
    let live = EngineMessage::parse(&[b"", &0u64.to_be_bytes(), &payload]).unwrap();
    assert_eq!((live.topic.len(), live.sequence), (0, 0));
    assert!(!live.is_replay_end());
    assert_eq!(
        decode_batch(&live.payload, &DecodeLimits::default())
            .unwrap()
            .dp_rank,
        Some(1)
    );
    let topic = EngineMessage::parse(&[b"kv@0", &41u64.to_be_bytes(), &payload]).unwrap();
    assert_eq!((topic.topic, topic.sequence), (b"kv@0".to_vec(), 41));
    let reply = EngineMessage::parse(&[b"kv@0", &5u64.to_be_bytes(), &payload]).unwrap();
    assert!(!reply.is_replay_end());
    let end = EngineMessage::parse(&[b"", &(-1i64).to_be_bytes(), b""]).unwrap();
    assert_eq!(end.sequence, -1);
    assert!(end.is_replay_end());
}
