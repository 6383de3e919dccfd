//! Untrusted Ingest batches: raw bytes through prost's `KvEventBatch` decoding and then the
//! producer's wire conversion (`ingest::convert::batch_from_wire`), and generated batches
//! (valid to malformed) encoded, mutated and decoded again. Nothing panics; a batch is refused
//! whole only with a typed [`RequestError`]; an accepted batch keeps every event, each decoded
//! or refused alone exactly when its member or kind is missing. Inputs are bounded.

use ckf_core::dc::Quotas;
use ckf_core::identity::{SourceIdError, check_source_id};
use ckf_proto::v1;
use ckf_proto::v1::kv_event::Kind;
use producer_svc::error::{MAX_SOURCE_ID_BYTES, RequestError};
use producer_svc::events::EventError;
use producer_svc::ingest::convert::batch_from_wire;
use proptest::prelude::*;
use prost::Message;

/// `batch_from_wire` under a small and the default event limit (and small and default block
/// quotas), checked against its rules.
fn exercise(batch: &v1::KvEventBatch) {
    let small = Quotas {
        max_blocks_per_event: 3,
        max_blocks_per_batch: 8,
        ..Quotas::UNLIMITED
    };
    for (max_events, quotas) in [(4, small), (65_536, Quotas::default())] {
        match batch_from_wire(batch.clone(), max_events, &quotas) {
            Ok(decoded) => {
                assert_eq!(check_source_id(&batch.source_id), Ok(()));
                assert!(batch.source_id.len() <= MAX_SOURCE_ID_BYTES);
                assert!(batch.events.len() <= max_events);
                assert_eq!(decoded.source_id.as_str(), batch.source_id);
                assert_eq!(decoded.sequence, batch.sequence);
                assert_eq!(decoded.events.len(), batch.events.len());
                for (i, (wire, event)) in batch.events.iter().zip(&decoded.events).enumerate() {
                    match event {
                        Ok(_) => assert!(wire.member.is_some() && wire.kind.is_some(), "{i}"),
                        Err(EventError::MissingMember { index }) => {
                            assert_eq!((*index, wire.member), (i, None));
                        }
                        Err(EventError::MissingKind { index }) => {
                            assert_eq!(*index, i);
                            assert!(wire.member.is_some() && wire.kind.is_none());
                        }
                    }
                }
            }
            Err(error) => {
                assert!(!error.to_string().is_empty());
                match error {
                    RequestError::BadSourceId(SourceIdError::Empty) => {
                        assert!(batch.source_id.is_empty());
                    }
                    RequestError::BadSourceId(SourceIdError::TooLong { len, .. }) => {
                        assert!(len > MAX_SOURCE_ID_BYTES);
                    }
                    RequestError::BadSourceId(SourceIdError::BadCharacter { .. }) => {
                        assert!(check_source_id(&batch.source_id).is_err());
                    }
                    RequestError::TooManyEvents { count, max } => {
                        assert!(count > max && max == max_events);
                    }
                    // other batch-level refusals (e.g. identity rules) name their reason
                    _ => {}
                }
            }
        }
    }
}

fn decode_and_exercise(bytes: &[u8]) {
    if let Ok(batch) = v1::KvEventBatch::decode(bytes) {
        exercise(&batch);
    }
    let _ = v1::GetMemberBlocksRequest::decode(bytes);
}

fn event() -> impl Strategy<Value = v1::KvEvent> {
    let hashes = || prop::collection::vec(any::<u64>(), 0..6);
    let kind = prop_oneof![
        (hashes(), prop::option::of(any::<u64>())).prop_map(|(block_hashes, parent_hash)| {
            Kind::Stored(v1::Stored {
                block_hashes,
                parent_hash,
            })
        }),
        hashes().prop_map(|block_hashes| Kind::Removed(v1::Removed { block_hashes })),
        Just(Kind::Cleared(v1::Cleared {})),
        Just(Kind::WorkerRemoved(v1::WorkerRemoved {})),
    ];
    (
        prop::option::weighted(0.9, (any::<u64>(), any::<u32>())),
        prop::option::weighted(0.9, kind),
    )
        .prop_map(|(member, kind)| v1::KvEvent {
            member: member.map(|(worker_id, dp_rank)| v1::MemberId { worker_id, dp_rank }),
            kind,
        })
}

fn batch() -> impl Strategy<Value = v1::KvEventBatch> {
    (
        prop_oneof![
            "[a-z0-9-]{1,20}",
            Just(String::new()),
            "[a-z]{129,140}",
            ".{0,10}"
        ],
        any::<u64>(),
        prop::collection::vec(event(), 0..7),
    )
        .prop_map(|(source_id, sequence, events)| v1::KvEventBatch {
            source_id,
            sequence,
            events,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_bytes_never_panic_the_ingest_decoder(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        decode_and_exercise(&bytes);
    }

    #[test]
    fn generated_batches_convert_by_their_rules(batch in batch()) {
        let decoded = v1::KvEventBatch::decode(batch.encode_to_vec().as_slice()).unwrap();
        prop_assert_eq!(&decoded, &batch);
        exercise(&decoded);
    }

    #[test]
    fn mutated_batches_never_panic_the_ingest_decoder(
        batch in batch(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        cut in any::<prop::sample::Index>(),
        tail in prop::collection::vec(any::<u8>(), 0..12),
    ) {
        let mut bytes = batch.encode_to_vec();
        if !bytes.is_empty() {
            for (at, byte) in &flips {
                let i = at.index(bytes.len());
                bytes[i] ^= byte;
            }
        }
        bytes.truncate(cut.index(bytes.len() + 1));
        bytes.extend_from_slice(&tail);
        decode_and_exercise(&bytes);
    }
}
