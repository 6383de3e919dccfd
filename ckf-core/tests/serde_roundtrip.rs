//! Feature `serde`: member ids, KV events, block seeds and ownership images survive a postcard
//! round trip (the producer journal's format) and a JSON one; a state's image restored from
//! the decoded bytes is the same state.
#![cfg(feature = "serde")]

use ckf_core::TableFormat;
use ckf_core::dc::{DcCkfConfig, DcCkfState, KvEvent, KvEventKind, MemberId, MemberImage};
use ckf_core::tokens::BlockSeed;

fn postcard_trip<T>(value: &T) -> T
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    let bytes = postcard::to_allocvec(value).expect("serialize");
    postcard::from_bytes(&bytes).expect("deserialize")
}

fn json_trip<T>(value: &T) -> T
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    serde_json::from_str(&serde_json::to_string(value).expect("serialize")).expect("deserialize")
}

#[test]
fn events_seeds_and_ids_round_trip() {
    let member = MemberId::new(u64::MAX, u32::MAX);
    let events = vec![
        KvEvent {
            member,
            kind: KvEventKind::Stored {
                block_hashes: vec![0, 1, u64::MAX],
                parent_hash: Some(42),
            },
        },
        KvEvent {
            member: MemberId::new(0, 0),
            kind: KvEventKind::Stored {
                block_hashes: vec![],
                parent_hash: None,
            },
        },
        KvEvent {
            member,
            kind: KvEventKind::Removed {
                block_hashes: vec![7],
            },
        },
        KvEvent {
            member,
            kind: KvEventKind::Cleared,
        },
    ];
    assert_eq!(postcard_trip(&events), events);
    assert_eq!(json_trip(&events), events);
    let seed = BlockSeed::new(Some("salt"), Some("lora"));
    assert_eq!(postcard_trip(&seed), seed);
    assert_eq!(json_trip(&seed), seed);
}

#[test]
fn a_state_image_restores_from_its_bytes() {
    let config = DcCkfConfig::new(TableFormat::new(1 << 10, 3).unwrap());
    let mut s = DcCkfState::new(config).unwrap();
    for (i, source) in ["a", "b"].into_iter().enumerate() {
        let event = KvEvent {
            member: MemberId::new(i as u64, 0),
            kind: KvEventKind::Stored {
                block_hashes: (0..20).map(|h| h * 31 + i as u64).collect(),
                parent_hash: None,
            },
        };
        s.apply_from(source, &event).unwrap();
    }
    s.store(MemberId::new(9, 1), &[1, 2, 3]);
    let image = s.ownership_image();
    assert_eq!(image.len(), 3);
    let bytes = postcard::to_allocvec(&image).unwrap();
    let decoded: Vec<MemberImage> = postcard::from_bytes(&bytes).unwrap();
    assert_eq!(json_trip(&image), image);
    let mut restored = DcCkfState::new(config).unwrap();
    for m in &decoded {
        restored.restore_member(m);
    }
    assert_eq!(restored.ownership_image(), image);
    assert_eq!(
        (restored.source_held("a"), restored.source_held("b")),
        (20, 20)
    );
}
