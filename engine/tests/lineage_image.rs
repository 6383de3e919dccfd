//! `Lineage::export` / `restore`: random engine stores (chained on known or unknown parents,
//! two salts, a small engine-hash universe so conflicts, duplicate stores and several engine
//! hashes per canonical block all happen), removals and clears over three members; export at a
//! random point, restore into a fresh lineage, then the same further events translate
//! identically on both (every `Translation` equal, the exports equal after each event).

use ckf_core::dc::MemberId;
use ckf_engine::event::{EngineEvent, RemovedBlocks, StoredBlocks};
use ckf_engine::filters::EngineFilters;
use ckf_engine::lineage::{Lineage, LineageEntry, MemberLineageImage};
use proptest::prelude::*;

const BS: u32 = 2;
/// Engine hashes are drawn from `0..ENGINE_HASHES`.
const ENGINE_HASHES: u64 = 24;

fn member(i: usize) -> MemberId {
    MemberId::new(5, i as u32)
}

fn event() -> impl Strategy<Value = (usize, EngineEvent)> {
    let stored = (
        prop::collection::vec(0..ENGINE_HASHES, 1..4),
        prop::option::weighted(0.6, 0..ENGINE_HASHES),
        any::<bool>(),
    )
        .prop_flat_map(|(hashes, parent, salted)| {
            let tokens = prop::collection::vec(0..2u32, hashes.len() * BS as usize);
            (Just(hashes), Just(parent), Just(salted), tokens)
        })
        .prop_map(|(block_hashes, parent, salted, token_ids)| {
            EngineEvent::Stored(StoredBlocks {
                block_hashes,
                parent,
                token_ids,
                block_size: BS,
                cache_salt: salted.then(|| "salt".to_owned()),
                ..StoredBlocks::default()
            })
        });
    let removed = prop::collection::vec(0..ENGINE_HASHES, 1..5).prop_map(|block_hashes| {
        EngineEvent::Removed(RemovedBlocks {
            block_hashes,
            ..RemovedBlocks::default()
        })
    });
    (
        0..3usize,
        prop_oneof![6 => stored, 3 => removed, 1 => Just(EngineEvent::AllCleared)],
    )
}

fn filters() -> EngineFilters {
    EngineFilters {
        block_size: BS,
        ..EngineFilters::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_restored_lineage_translates_the_same(
        before in prop::collection::vec(event(), 0..60),
        after in prop::collection::vec(event(), 1..40),
    ) {
        let f = filters();
        let mut original = Lineage::new();
        for (m, e) in &before {
            original.translate(member(*m), e, &f);
        }
        let image = original.export();
        // The export is sorted and complete.
        prop_assert!(image.windows(2).all(|w| w[0].member < w[1].member));
        for m in &image {
            prop_assert!(m.blocks.windows(2).all(|w| w[0].engine_hash < w[1].engine_hash));
            prop_assert_eq!(m.blocks.len(), original.len(m.member));
            for e in &m.blocks {
                let (canonical, seed) = original.lookup(m.member, e.engine_hash).unwrap();
                prop_assert_eq!((canonical, seed.0), (e.canonical, e.seed));
            }
        }
        prop_assert_eq!(original.members(), image.iter().map(|m| m.member).collect::<Vec<_>>());

        let mut restored = Lineage::new();
        restored.restore(image.clone());
        prop_assert_eq!(restored.export(), image);
        prop_assert_eq!(restored.members(), original.members());
        for (m, e) in &after {
            let a = original.translate(member(*m), e, &f);
            let b = restored.translate(member(*m), e, &f);
            prop_assert_eq!(a, b, "{:?}", e);
            prop_assert_eq!(original.export(), restored.export());
        }
    }
}

#[test]
fn restore_rebuilds_canonical_refcounts_and_keeps_first_mappings() {
    let m = MemberId::new(1, 0);
    // Engine hashes 10 and 20 map to one canonical block: it leaves only with the second.
    let image = MemberLineageImage {
        member: m,
        blocks: vec![
            LineageEntry {
                engine_hash: 10,
                canonical: 111,
                seed: 1337,
            },
            LineageEntry {
                engine_hash: 20,
                canonical: 111,
                seed: 1337,
            },
        ],
    };
    let mut l = Lineage::new();
    l.restore([
        image,
        MemberLineageImage {
            member: MemberId::new(2, 0),
            blocks: vec![],
        },
        // A second mapping of engine hash 10 is ignored; 30 is added.
        MemberLineageImage {
            member: m,
            blocks: vec![
                LineageEntry {
                    engine_hash: 10,
                    canonical: 999,
                    seed: 1,
                },
                LineageEntry {
                    engine_hash: 30,
                    canonical: 333,
                    seed: 1337,
                },
            ],
        },
    ]);
    assert_eq!(l.members(), vec![m]);
    assert_eq!(l.len(m), 3);
    assert_eq!(l.lookup(m, 10).map(|(c, s)| (c, s.0)), Some((111, 1337)));
    let remove = |h: Vec<u64>| {
        EngineEvent::Removed(RemovedBlocks {
            block_hashes: h,
            ..RemovedBlocks::default()
        })
    };
    let t = l.translate(m, &remove(vec![10]), &filters());
    assert_eq!(t.kv_event, None);
    let t = l.translate(m, &remove(vec![20, 30]), &filters());
    let kind = t.kv_event.expect("removal").kind;
    assert_eq!(
        kind,
        ckf_core::dc::KvEventKind::Removed {
            block_hashes: vec![111, 333]
        }
    );
    assert!(l.members().is_empty());
}
