//! Unit tests of the conversions between the proto messages and ckf-core types, and of
//! [`super::WIRE_BYTES_PER_IMAGE`] against prost's encoded sizes.

use super::*;

fn format() -> TableFormat {
    TableFormat::new(1024, 7).unwrap()
}

#[test]
fn table_format_round_trips_and_rejects_bad_values() {
    let wire = v1::TableFormat::from(format());
    assert_eq!(TableFormat::try_from(wire).unwrap(), format());

    let mut bad = wire;
    bad.bucket_count = 1001;
    assert_eq!(
        TableFormat::try_from(bad),
        Err(WireError::BadFormat(FormatError::Odd(1001)))
    );
    let mut bad = wire;
    bad.version = 1;
    assert!(matches!(
        TableFormat::try_from(bad),
        Err(WireError::BadFormat(FormatError::Unsupported(_)))
    ));
    let mut bad = wire;
    bad.fingerprint_bits = 300;
    assert!(matches!(
        TableFormat::try_from(bad),
        Err(WireError::OutOfRange {
            field: "TableFormat.fingerprint_bits",
            value: 300,
            ..
        })
    ));
    let mut bad = wire;
    bad.version = 3;
    assert!(matches!(
        TableFormat::try_from(bad),
        Err(WireError::BadFormat(FormatError::Unsupported(_)))
    ));
}

#[test]
fn pool_and_lease_are_validated() {
    let pool = PoolId::new("prod", "dc-a").unwrap();
    assert_eq!(PoolId::try_from(v1::PoolId::from(&pool)).unwrap(), pool);
    let err = PoolId::try_from(v1::PoolId {
        domain: "prod".into(),
        dc: "dc a".into(),
    })
    .unwrap_err();
    assert!(
        matches!(
            err,
            WireError::BadName {
                field: "PoolId.dc",
                ..
            }
        ),
        "{err}"
    );

    let lease = LaneLease {
        consumer_instance: 9,
        lane: 63,
        epoch: 3,
    };
    assert_eq!(
        LaneLease::try_from(v1::LaneLease::from(lease)).unwrap(),
        lease
    );
    let err = LaneLease::try_from(v1::LaneLease {
        consumer_instance: 9,
        lane: 64,
        epoch: 1,
    })
    .unwrap_err();
    assert_eq!(
        err,
        WireError::OutOfRange {
            field: "LaneLease.lane",
            value: 64,
            max: 63
        }
    );
}

#[test]
fn attach_requires_pool_and_format() {
    let id = ProducerIdentity {
        pool: PoolId::new("prod", "dc-b").unwrap(),
        incarnation: ProducerIncarnation(42),
        format: format(),
    };
    let wire = v1::Attach::from(&id);
    assert_eq!(ProducerIdentity::try_from(wire.clone()).unwrap(), id);
    let mut no_format = wire.clone();
    no_format.format = None;
    assert_eq!(
        ProducerIdentity::try_from(no_format),
        Err(WireError::MissingField {
            message: "Attach",
            field: "format"
        })
    );
    let mut no_pool = wire;
    no_pool.pool = None;
    assert_eq!(
        attach_pool(&no_pool),
        Err(WireError::MissingField {
            message: "Attach",
            field: "pool"
        })
    );
}

#[test]
fn delta_round_trips_and_length_mismatch_is_refused() {
    let tag = StreamTag {
        incarnation: ProducerIncarnation(5),
        lease: LaneLease {
            consumer_instance: 1,
            lane: 2,
            epoch: 4,
        },
    };
    let delta = DcCkfDelta {
        tag,
        base_sequence: 10,
        sequence: 11,
        images: vec![
            BucketImage {
                bucket: 3,
                image: 0xdead,
            },
            BucketImage {
                bucket: 1,
                image: 0xbeef,
            },
        ],
        oldest_change_age_ms: 12,
    };
    let wire = v1::Delta::from(&delta);
    assert_eq!(
        delta_from_wire(wire.clone(), tag.incarnation).unwrap(),
        delta
    );
    let mut bad = wire.clone();
    bad.images.pop();
    assert_eq!(
        delta_from_wire(bad, tag.incarnation),
        Err(WireError::LengthMismatch {
            buckets: 2,
            images: 1
        })
    );
    let mut no_lease = wire;
    no_lease.lease = None;
    assert_eq!(
        delta_from_wire(no_lease, tag.incarnation),
        Err(WireError::MissingField {
            message: "Delta",
            field: "lease"
        })
    );
}

#[test]
fn snapshot_chunks_cover_every_bucket_in_order() {
    let tag = StreamTag {
        incarnation: ProducerIncarnation(5),
        lease: LaneLease {
            consumer_instance: 1,
            lane: 0,
            epoch: 1,
        },
    };
    let snapshot = DcCkfSnapshot {
        tag,
        sequence: 7,
        buckets: (0..10u64).collect(),
    };
    let chunks: Vec<_> = snapshot_to_wire(&snapshot, 24).collect();
    assert_eq!(chunks.len(), 4);
    let mut words = Vec::new();
    for chunk in chunks {
        let core = snapshot_chunk_from_wire(chunk, tag.incarnation).unwrap();
        assert_eq!(core.first_bucket, words.len() as u64);
        words.extend(
            ckf_core::frames::decode_chunk_words(core.first_bucket, &core.words, 10).unwrap(),
        );
    }
    assert_eq!(words, snapshot.buckets);
}

#[test]
fn only_a_superseded_retirement_fences_as_superseded() {
    use ckf_core::publication::FenceReason;
    for raw in 0..=11 {
        let reason = v1::RetireReason::try_from(raw).expect("a defined reason");
        let expected = if reason == v1::RetireReason::Superseded {
            FenceReason::Superseded
        } else {
            FenceReason::UncertainDelivery
        };
        assert_eq!(FenceReason::from(reason), expected, "{reason:?}");
    }
}

#[test]
fn retire_reasons_and_states_map_to_their_wire_names() {
    let gap = RetireReason::Gap {
        installed: 1,
        base_sequence: 3,
    };
    assert_eq!(v1::RetireReason::from(&gap), v1::RetireReason::Gap);
    let lost = RetireReason::StreamLost { detail: "x".into() };
    assert_eq!(
        v1::RetireReason::from(&lost).as_str_name(),
        "RETIRE_REASON_STREAM_LOST"
    );
    let dup =
        RetireReason::MalformedDelta(ckf_core::lane::DeltaError::DuplicateBucket { bucket: 1 });
    assert_eq!(
        v1::RetireReason::from(&dup),
        v1::RetireReason::MalformedFrame
    );
    assert_eq!(
        v1::LaneState::from(LaneState::AwaitingSnapshot),
        v1::LaneState::AwaitingSnapshot
    );
}

#[test]
fn token_queries_map_empty_and_zero_to_absent() {
    use ckf_core::tokens::{MultimodalItem, TokenQuery};
    let empty = TokenQuery::from(v1::FindMatchesByTokensRequest::default());
    assert_eq!(empty, TokenQuery::default());
    let full = TokenQuery::from(v1::FindMatchesByTokensRequest {
        token_ids: vec![1, u32::MAX],
        lora_name: "l".into(),
        cache_salt: "s".into(),
        multimodal: vec![v1::MultimodalItem {
            identifier: "img".into(),
            offset: 3,
            length: 4,
        }],
        block_size: 16,
    });
    assert_eq!(
        full,
        TokenQuery {
            token_ids: vec![1, u32::MAX],
            lora_name: Some("l".into()),
            cache_salt: Some("s".into()),
            multimodal: vec![MultimodalItem {
                identifier: "img".into(),
                offset: 3,
                length: 4
            }],
            block_size: Some(16),
        }
    );
}

#[test]
fn descriptor_set_names_every_service() {
    let set = crate::FILE_DESCRIPTOR_SET;
    for name in ["Ingest", "Relay", "Query", "ckf/v1/common.proto"] {
        assert!(
            set.windows(name.len()).any(|w| w == name.as_bytes()),
            "{name} missing from the descriptor set"
        );
    }
}

/// The per-image wire cost, derived from prost's `encoded_len`.
mod wire_size {
    use prost::Message;

    use crate::convert::WIRE_BYTES_PER_IMAGE;
    use crate::v1;

    /// A delta of `n` worst-case images (largest bucket index, every bit of the image set)
    /// and no other field.
    fn worst_case(n: usize) -> usize {
        v1::Delta {
            buckets: vec![u32::MAX; n],
            images: vec![u64::MAX; n],
            ..v1::Delta::default()
        }
        .encoded_len()
    }

    #[test]
    fn one_more_image_costs_exactly_the_constant() {
        // Between sizes where the length prefixes keep their width, the growth per image is
        // the per-image cost itself.
        for n in [1, 10, 100, 1_000, 10_000] {
            assert_eq!(
                worst_case(n + 1) - worst_case(n),
                WIRE_BYTES_PER_IMAGE,
                "n = {n}"
            );
        }
        // One image: 2 tags + 2 one-byte lengths + the image itself.
        assert_eq!(worst_case(1), 4 + WIRE_BYTES_PER_IMAGE);
    }

    #[test]
    fn the_constant_bounds_every_size_up_to_the_largest_message() {
        // Up to 256 MiB / 13 images: the packed-field overhead stays within 2 x (1 + 5) bytes.
        for n in [
            0,
            1,
            127,
            128,
            1_000,
            16_383,
            16_384,
            65_536,
            1 << 20,
            (256 << 20) / 13,
        ] {
            let len = worst_case(n);
            assert!(len >= n * WIRE_BYTES_PER_IMAGE, "n = {n}: {len}");
            assert!(len <= n * WIRE_BYTES_PER_IMAGE + 12, "n = {n}: {len}");
        }
    }
}
