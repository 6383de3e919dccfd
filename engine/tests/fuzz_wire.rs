//! Hostile engine publisher messages on raw bytes: multipart ZMQ messages with any number of
//! parts of any length (`EngineMessage::parse`), then their payloads through `decode_batch`;
//! msgpack headers that claim huge lengths (str/bin/array/map 32-bit counts) or nest deeply.
//! Nothing panics or allocates what a header claims (inputs are a few hundred bytes, so every
//! run is bounded), and every refusal is a typed error with one of the documented labels.

use ckf_engine::message::{EngineMessage, MessageError};
use ckf_engine::wire::{DecodeLimits, decode_batch};
use proptest::prelude::*;

const LABELS: [&str; 5] = ["truncated", "syntax", "trailing", "type", "limit"];

fn decode_checked(payload: &[u8]) {
    let small = DecodeLimits {
        max_events: 2,
        max_blocks_per_event: 3,
        max_tokens_per_event: 4,
        max_depth: 4,
    };
    for limits in [DecodeLimits::default(), small] {
        match decode_batch(payload, &limits) {
            Ok(batch) => assert!(batch.events.len() <= limits.max_events),
            Err(e) => {
                assert!(LABELS.contains(&e.kind_label()), "{e}");
                assert!(!e.to_string().is_empty());
            }
        }
    }
}

/// msgpack headers claiming up to 4 Gi elements or bytes.
fn bomb_header() -> impl Strategy<Value = Vec<u8>> {
    let big = prop_oneof![
        Just(u32::MAX),
        Just(1u32 << 31),
        1u32 << 16..1u32 << 24,
        0..64u32
    ];
    (
        prop::sample::select(vec![0xdbu8, 0xc6, 0xdd, 0xdf, 0xda, 0xc5, 0xdc, 0xde]),
        big,
    )
        .prop_map(|(marker, n)| {
            let mut bytes = vec![marker];
            match marker {
                0xda | 0xc5 | 0xdc | 0xde => bytes.extend((n as u16).to_be_bytes()),
                _ => bytes.extend(n.to_be_bytes()),
            }
            bytes
        })
}

#[test]
fn deep_nesting_is_a_limit_not_a_stack_overflow() {
    for marker in [0x91u8, 0x81] {
        // 100k nested one-element arrays (or maps keyed by nil... each level one header byte)
        let mut payload = vec![marker; 100_000];
        payload.push(0xc0);
        let err = decode_batch(&payload, &DecodeLimits::default()).unwrap_err();
        assert!(
            ["limit", "truncated", "type"].contains(&err.kind_label()),
            "{err}"
        );
    }
    // inside a valid envelope: [ts, [[[[...]]]]]
    let mut payload = vec![0x92, 0x00];
    payload.extend(vec![0x91u8; 50_000]);
    payload.push(0x90);
    let err = decode_batch(&payload, &DecodeLimits::default()).unwrap_err();
    assert_eq!(err.kind_label(), "limit", "{err}");
}

#[test]
fn claimed_lengths_beyond_the_payload_are_truncated() {
    // [ts, array32(4 Gi)] and [ts, [str32 4 GiB]]
    for tail in [
        vec![0xdd, 0xff, 0xff, 0xff, 0xff],
        vec![0x91, 0xdb, 0xff, 0xff, 0xff, 0xff, b'x'],
        vec![0x91, 0xc6, 0xff, 0xff, 0xff, 0xff],
        vec![0x91, 0xdf, 0xff, 0xff, 0xff, 0xff],
    ] {
        let mut payload = vec![0x92, 0x00];
        payload.extend(tail);
        let err = decode_batch(&payload, &DecodeLimits::default()).unwrap_err();
        assert!(["truncated", "limit"].contains(&err.kind_label()), "{err}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_multipart_message_parses_or_is_refused_by_its_rule(
        parts in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..24), 0..5),
    ) {
        let slices: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        match EngineMessage::parse(&slices) {
            Ok(frame) => {
                prop_assert!(matches!(slices.len(), 2 | 3));
                let seq = slices[slices.len() - 2];
                prop_assert_eq!(frame.sequence, i64::from_be_bytes(seq.try_into().unwrap()));
                prop_assert_eq!(&frame.payload[..], slices[slices.len() - 1]);
                decode_checked(&frame.payload);
            }
            Err(MessageError::PartCount(n)) => {
                prop_assert!(!matches!(n, 2 | 3));
                prop_assert_eq!(n, slices.len());
            }
            Err(MessageError::SequenceLength(n)) => {
                prop_assert_ne!(n, 8);
                prop_assert_eq!(n, slices[slices.len() - 2].len());
            }
        }
    }

    #[test]
    fn bomb_headers_anywhere_in_a_payload_are_refused_cheaply(
        prefix in prop::sample::select(vec![
            vec![0x92u8, 0x00],            // [ts, <here>
            vec![0x92, 0x00, 0x91],        // [ts, [<here>
            vec![0x92, 0x00, 0x91, 0x92],  // [ts, [[<here>
            vec![0x82, 0xa2, b't', b's', 0x00, 0xa6, b'e', b'v', b'e', b'n', b't', b's'], // {ts:0, events:<here>
            vec![],
        ]),
        bombs in prop::collection::vec(bomb_header(), 1..4),
        tail in prop::collection::vec(any::<u8>(), 0..32),
    ) {
        let mut payload = prefix;
        for bomb in bombs {
            payload.extend(bomb);
        }
        payload.extend(tail);
        decode_checked(&payload);
    }
}
