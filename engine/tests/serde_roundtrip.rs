//! Feature `serde`: decoded batches (every golden fixture, and one batch with every field and
//! event kind set), KV events and lineage images survive a postcard round trip unchanged
//! (postcard is what the producer's journal uses; it is not self-describing, so every field
//! must serialize in a fixed order).
#![cfg(feature = "serde")]

use ckf_core::dc::{KvEvent, KvEventKind, MemberId};
use ckf_engine::event::{
    BlockExtras, DecodeNotes, EngineBatch, EngineEvent, RemovedBlocks, StoredBlocks,
};
use ckf_engine::lineage::{Lineage, LineageEntry, MemberLineageImage};
use ckf_engine::wire::{DecodeLimits, decode_batch};

mod common;
use common::fixture;

fn round_trip<T>(value: &T) -> T
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    let bytes = postcard::to_allocvec(value).expect("serialize");
    postcard::from_bytes(&bytes).expect("deserialize")
}

#[test]
fn golden_batches_round_trip() {
    for name in [
        "positional_events",
        "sglang_batch",
        "sglang_no_rank",
        "tolerance",
        "trtllm_groups",
        "trtllm_lora_id",
        "trtllm_stored_mm",
        "trtllm_token_strings",
        "vllm_removed_cleared",
        "vllm_sliding_window",
        "vllm_stored_basic",
        "vllm_stored_extras",
    ] {
        let batch = decode_batch(&fixture(name), &DecodeLimits::default()).expect(name);
        assert!(!batch.events.is_empty(), "{name}");
        assert_eq!(round_trip(&batch), batch, "{name}");
    }
}

#[test]
fn a_batch_with_every_field_set_round_trips() {
    let batch = EngineBatch {
        ts: 1_717_000_000.123_456_7,
        dp_rank: Some(3),
        events: vec![
            EngineEvent::Stored(StoredBlocks {
                block_hashes: vec![1, u64::MAX],
                parent: Some(7),
                token_ids: vec![1, 2, 3, 4],
                block_size: 2,
                lora_name: Some("lora".into()),
                cache_salt: Some("salt".into()),
                medium: Some("GPU".into()),
                group_idx: Some(0),
                sliding_window: Some(128),
                spec_kind: Some("full_attention".into()),
                block_extras: vec![
                    BlockExtras {
                        mm_hashes: vec![9, 10],
                        salt: Some("s".into()),
                        lora_name: Some("lora".into()),
                        other: vec![11],
                    },
                    BlockExtras::default(),
                ],
            }),
            EngineEvent::Stored(StoredBlocks::default()),
            EngineEvent::Removed(RemovedBlocks {
                block_hashes: vec![1],
                medium: Some("CPU".into()),
                group_idx: Some(1),
            }),
            EngineEvent::AllCleared,
            EngineEvent::Unknown {
                kind: "Future".into(),
            },
        ],
        notes: DecodeNotes {
            unknown_fields: 1,
            unknown_events: 1,
            malformed_events: 2,
            first_malformed: Some("block_hashes: not an array".into()),
        },
    };
    assert_eq!(round_trip(&batch), batch);
    assert_eq!(round_trip(&EngineBatch::default()), EngineBatch::default());
}

#[test]
fn kv_events_and_lineage_images_round_trip() {
    let member = MemberId::new(u64::MAX, 7);
    for kind in [
        KvEventKind::Stored {
            block_hashes: vec![3, 4],
            parent_hash: Some(2),
        },
        KvEventKind::Stored {
            block_hashes: vec![],
            parent_hash: None,
        },
        KvEventKind::Removed {
            block_hashes: vec![5],
        },
        KvEventKind::Cleared,
    ] {
        let event = KvEvent { member, kind };
        assert_eq!(round_trip(&event), event);
    }
    let images = vec![MemberLineageImage {
        member,
        blocks: vec![LineageEntry {
            engine_hash: 1,
            canonical: 2,
            seed: 1337,
        }],
    }];
    assert_eq!(round_trip(&images), images);
    // Through the journal and back into a lineage.
    let mut l = Lineage::new();
    l.restore(round_trip(&images));
    assert_eq!(l.export(), images);
}
