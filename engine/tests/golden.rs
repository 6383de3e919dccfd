//! Golden payloads encoded by the real msgspec encoder with vLLM's and SGLang's own structs
//! (`fixtures/gen_fixtures.py`), decoded and translated here.

use ckf_core::dc::{KvEventKind, MemberId};
use ckf_core::tokens::{self, BlockSeed, MultimodalSpan};
use ckf_engine::event::{BlockExtras, EngineEvent, RemovedBlocks};
use ckf_engine::filters::{EngineFilters, Skip};
use ckf_engine::lineage::{Lineage, SkipReason};
use ckf_engine::wire::{DecodeLimits, decode_batch};

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
