//! Untrusted bytes through every wire decoder of `ckf.v1`: prost decoding of raw bytes, then
//! the wire -> core conversions the services run on what decoded (Relay frames and snapshot
//! chunks on the indexer, Relay replies on the producer, Query requests). Arbitrary bytes,
//! and structure-aware mutations of valid encodings (generated messages, encoded, then bytes
//! flipped, cut and spliced). Every input either decodes or gets a typed error; nothing panics;
//! a conversion refuses exactly the values its documented rules refuse. Inputs are bounded
//! (a few hundred bytes), so a run cannot hang; `scripts/fuzz.sh` runs the same decoders under
//! a coverage-guided fuzzer.

use ckf_core::identity::{ProducerIdentity, ProducerIncarnation};
use ckf_proto::convert::{self, WireError};
use ckf_proto::v1::{self, relay_frame::Frame, relay_reply::Reply};
use proptest::prelude::*;
use prost::Message;

const INCARNATION: ProducerIncarnation = ProducerIncarnation(7);

/// Every conversion the indexer's Relay handler runs on a received frame, with the rule each
/// refusal must follow. Returns the frame kind.
fn convert_frame(frame: v1::RelayFrame) -> &'static str {
    match frame.frame {
        None => "empty",
        Some(Frame::Attach(attach)) => {
            let pool = convert::attach_pool(&attach);
            let missing = attach.pool.is_none();
            match ProducerIdentity::try_from(attach) {
                Ok(identity) => {
                    assert_eq!(pool.expect("a full decode implies the pool"), identity.pool);
                }
                Err(e) => {
                    if missing {
                        // the pool is checked first
                        assert!(
                            matches!(e, WireError::MissingField { field: "pool", .. }),
                            "{e}"
                        );
                    }
                    typed(&e);
                }
            }
            "attach"
        }
        Some(Frame::SnapshotChunk(chunk)) => {
            let (len, lease) = (chunk.words.len(), chunk.lease);
            match convert::snapshot_chunk_from_wire(chunk, INCARNATION) {
                // words are the consumer's to check (whole words, in range): kept as received
                Ok(core) => assert_eq!(core.words.len(), len),
                Err(e) => lease_refused(lease, &e),
            }
            "chunk"
        }
        Some(Frame::Delta(delta)) => {
            let (buckets, images, lease) = (delta.buckets.len(), delta.images.len(), delta.lease);
            match convert::delta_from_wire(delta, INCARNATION) {
                Ok(core) => assert_eq!((core.images.len(), buckets), (images, images)),
                Err(WireError::LengthMismatch { .. }) => assert_ne!(buckets, images),
                Err(e) => {
                    assert_eq!(buckets, images, "{e}");
                    lease_refused(lease, &e);
                }
            }
            "delta"
        }
        Some(Frame::Heartbeat(heartbeat)) => {
            let lease = heartbeat.lease;
            if let Err(e) = convert::heartbeat_from_wire(heartbeat, INCARNATION) {
                lease_refused(lease, &e);
            }
            "heartbeat"
        }
        Some(Frame::DrainMarker(marker)) => {
            let lease = marker.lease;
            if let Err(e) = convert::drain_marker_from_wire(marker, INCARNATION) {
                lease_refused(lease, &e);
            }
            "drain_marker"
        }
        Some(Frame::Load(report)) => {
            let (lease, sequence) = (report.lease, report.sequence);
            match convert::load_from_wire(report, INCARNATION) {
                // the values are the keeper's to check (LaneLoads::report): kept as received
                Ok(core) => {
                    assert_eq!(core.sequence, sequence);
                    keep_load(&core);
                }
                Err(e) => lease_refused(lease, &e),
            }
            "load"
        }
    }
}

/// What the indexer does with a converted load report: `LaneLoads::report` keeps it unless a
/// value is out of its documented range (usage outside 0..=1, a capacity neither 0 nor a finite
/// number >= 1, no engine reporting, more reporting than configured); an age of any size is
/// kept (observed "now" at worst).
fn keep_load(frame: &convert::LoadFrame) {
    use ckf_core::route::{LaneLoads, LoadRefused};
    let load = frame.load;
    let capacity = load.prefill_tokens_per_s;
    let valid = (0.0..=1.0).contains(&load.kv_usage)
        && capacity.is_finite()
        && (capacity == 0.0 || capacity >= 1.0)
        && load.engines_reporting >= 1
        && load.engines_reporting <= load.engines_configured;
    let lane = frame.tag.lease.lane;
    let now = std::time::Instant::now();
    let mut loads = LaneLoads::default();
    let kept = loads.report(
        lane,
        frame.tag.lease.epoch,
        frame.sequence,
        load,
        frame.age,
        now,
    );
    match kept {
        Ok(()) => {
            assert!(valid, "{load:?} kept");
            let (latest, age) = loads.latest(lane, now).expect("kept");
            assert_eq!(latest, load);
            assert!(age <= frame.age);
            // the same report again is older than the one kept
            let again = loads.report(
                lane,
                frame.tag.lease.epoch,
                frame.sequence,
                load,
                frame.age,
                now,
            );
            assert_eq!(again, Err(LoadRefused::Older));
        }
        Err(refused) => {
            assert!(!valid, "{load:?} refused: {refused}");
            assert!(matches!(refused, LoadRefused::Invalid(_)), "{refused}");
            assert!(loads.latest(lane, now).is_none());
        }
    }
}

/// A lease-carrying frame is refused only for a missing lease or a lane above 63.
fn lease_refused(lease: Option<v1::LaneLease>, error: &WireError) {
    typed(error);
    match lease {
        None => assert!(matches!(error, WireError::MissingField { .. }), "{error}"),
        Some(l) => {
            assert!(l.lane > 63, "lane {} refused: {error}", l.lane);
            assert!(
                matches!(
                    error,
                    WireError::OutOfRange {
                        field: "LaneLease.lane",
                        ..
                    }
                ),
                "{error}"
            );
        }
    }
}

/// A refusal names what is wrong.
fn typed(error: &WireError) {
    assert!(!error.to_string().is_empty());
}

/// Every conversion the producer runs on a received reply.
fn convert_reply(reply: v1::RelayReply) {
    match reply.reply {
        Some(Reply::LeaseGranted(granted)) => {
            if let Some(lease) = granted.lease
                && let Err(e) = ckf_core::identity::LaneLease::try_from(lease)
            {
                assert!(lease.lane > 63, "{e}");
            }
        }
        Some(Reply::Retired(retired)) => {
            // an unknown enum number decodes as the default, never panics
            let reason = retired.reason();
            let _ = ckf_core::publication::FenceReason::from(reason);
        }
        Some(Reply::Ack(_)) | None => {}
    }
}

/// Raw bytes through each top-level message a service decodes from a peer.
fn decode_all(bytes: &[u8]) {
    if let Ok(frame) = v1::RelayFrame::decode(bytes) {
        convert_frame(frame);
    }
    if let Ok(reply) = v1::RelayReply::decode(bytes) {
        convert_reply(reply);
    }
    if let Ok(query) = v1::FindMatchesByTokensRequest::decode(bytes) {
        let _ = ckf_core::tokens::TokenQuery::from(query);
    }
    let _ = v1::FindMatchesRequest::decode(bytes);
    let _ = v1::ListLanesRequest::decode(bytes);
    if let Ok(batch) = v1::RouteBatchRequest::decode(bytes) {
        for request in batch.requests {
            route_query(request);
        }
    }
    if let Ok(request) = v1::RouteRequest::decode(bytes) {
        route_query(request);
    }
    let _ = v1::KvEventBatch::decode(bytes);
    // the length-delimited framing gRPC bodies are cut from
    let _ = v1::RelayFrame::decode_length_delimited(bytes);
}

/// What the indexer reads of a Route request before its checks: the prefix (token ids become
/// a `TokenQuery`) and the round trips, any f64 (the checks refuse what is not a number of ms
/// >= 0).
fn route_query(request: v1::RouteRequest) {
    match request.query {
        Some(v1::route_request::Query::Tokens(t)) => {
            let _ = ckf_core::tokens::TokenQuery::from(t);
        }
        Some(v1::route_request::Query::Hashes(_)) | None => {}
    }
    for ms in request.rtt_ms.values() {
        let _ = std::time::Duration::try_from_secs_f64(ms / 1e3);
    }
}

fn lease() -> impl Strategy<Value = Option<v1::LaneLease>> {
    prop::option::weighted(
        0.9,
        (
            any::<u64>(),
            prop_oneof![0..16u32, any::<u32>()],
            any::<u64>(),
        )
            .prop_map(|(consumer_instance, lane, epoch)| v1::LaneLease {
                consumer_instance,
                lane,
                epoch,
            }),
    )
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        "[A-Za-z0-9._-]{1,64}",
        "[A-Za-z0-9._-]{65,70}",
        ".{0,8}",
        Just(String::new())
    ]
}

fn format() -> impl Strategy<Value = v1::TableFormat> {
    (
        0..3u32,
        any::<u64>(),
        prop::sample::select(vec![
            0u64,
            1,
            2,
            3,
            1024,
            1 << 20,
            1 << 32,
            1 << 33,
            u64::MAX,
        ]),
        prop_oneof![Just(16u32), any::<u32>()],
        prop_oneof![Just(4u32), any::<u32>()],
    )
        .prop_map(
            |(version, seed, bucket_count, fingerprint_bits, slots_per_bucket)| v1::TableFormat {
                version,
                seed,
                bucket_count,
                fingerprint_bits,
                slots_per_bucket,
            },
        )
}

/// Any Relay frame, fields from valid to out of range.
fn relay_frame() -> impl Strategy<Value = v1::RelayFrame> {
    let attach = (
        prop::option::weighted(0.9, (name(), name())),
        any::<u64>(),
        prop::option::weighted(0.9, format()),
        prop_oneof![0..3i32, any::<i32>()],
    )
        .prop_map(|(pool, incarnation, format, mode)| {
            Frame::Attach(v1::Attach {
                pool: pool.map(|(domain, dc)| v1::PoolId { domain, dc }),
                incarnation,
                format,
                mode,
            })
        });
    let chunk = (
        lease(),
        any::<u64>(),
        any::<u64>(),
        prop::collection::vec(any::<u8>(), 0..70),
    )
        .prop_map(|(lease, sequence, first_bucket, words)| {
            Frame::SnapshotChunk(v1::SnapshotChunk {
                lease,
                sequence,
                first_bucket,
                words,
            })
        });
    let delta = (
        lease(),
        any::<u64>(),
        any::<u64>(),
        prop::collection::vec(any::<u32>(), 0..8),
        prop::collection::vec(any::<u64>(), 0..8),
        any::<u64>(),
    )
        .prop_map(|(lease, base_sequence, sequence, buckets, images, age)| {
            Frame::Delta(v1::Delta {
                lease,
                base_sequence,
                sequence,
                buckets,
                images,
                oldest_change_age_ms: age,
            })
        });
    let heartbeat = (lease(), any::<u64>())
        .prop_map(|(lease, sequence)| Frame::Heartbeat(v1::Heartbeat { lease, sequence }));
    let drain = (lease(), any::<u64>())
        .prop_map(|(lease, sequence)| Frame::DrainMarker(v1::DrainMarker { lease, sequence }));
    let number = || {
        prop_oneof![
            Just(0.0),
            Just(0.5),
            Just(1.0),
            Just(1.5),
            Just(-1.0),
            Just(f64::NAN),
            Just(f64::INFINITY),
            any::<f64>(),
            0.0..100_000.0f64,
        ]
    };
    let load = (
        lease(),
        any::<u64>(),
        prop_oneof![0..10_000u64, any::<u64>()],
        (0..4u32, 0..4u32, any::<u32>(), any::<u32>()),
        number(),
        number(),
    )
        .prop_map(|(lease, sequence, age_ms, engines, kv_usage, capacity)| {
            let (engines_reporting, engines_configured, running, waiting) = engines;
            Frame::Load(v1::LoadReport {
                lease,
                sequence,
                age_ms,
                engines_reporting,
                engines_configured,
                running,
                waiting,
                kv_usage,
                prefill_tokens_per_s: capacity,
            })
        });
    prop::option::weighted(
        0.95,
        prop_oneof![attach, chunk, delta, heartbeat, drain, load],
    )
    .prop_map(|frame| v1::RelayFrame { frame })
}

/// Byte flips, a cut and a spliced tail applied to `bytes`.
fn mutate(
    mut bytes: Vec<u8>,
    flips: &[(prop::sample::Index, u8)],
    cut: prop::sample::Index,
    tail: &[u8],
) -> Vec<u8> {
    if !bytes.is_empty() {
        for (at, byte) in flips {
            let i = at.index(bytes.len());
            bytes[i] ^= byte;
        }
    }
    bytes.truncate(cut.index(bytes.len() + 1));
    bytes.extend_from_slice(tail);
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_bytes_never_panic_a_decoder(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        decode_all(&bytes);
    }

    #[test]
    fn generated_frames_round_trip_and_convert_by_their_rules(frame in relay_frame()) {
        let bytes = frame.encode_to_vec();
        let decoded = v1::RelayFrame::decode(bytes.as_slice()).expect("own encoding decodes");
        // compared encoded: a NaN load value is never equal to itself
        prop_assert_eq!(decoded.encode_to_vec(), bytes);
        convert_frame(decoded);
    }

    #[test]
    fn mutated_encodings_never_panic_a_decoder(
        frame in relay_frame(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        cut in any::<prop::sample::Index>(),
        tail in prop::collection::vec(any::<u8>(), 0..12),
    ) {
        let bytes = mutate(frame.encode_to_vec(), &flips, cut, &tail);
        decode_all(&bytes);
    }

    /// A valid snapshot chunk cut anywhere still decodes (to a shorter or field-less message)
    /// or is refused by prost: the consumer gets whole messages or none.
    #[test]
    fn truncated_chunks_decode_or_are_refused(
        words in prop::collection::vec(any::<u8>(), 1..64),
        cut in any::<prop::sample::Index>(),
    ) {
        let frame = v1::RelayFrame {
            frame: Some(Frame::SnapshotChunk(v1::SnapshotChunk {
                lease: Some(v1::LaneLease { consumer_instance: 1, lane: 0, epoch: 1 }),
                sequence: 1,
                first_bucket: 0,
                words: words.clone(),
            })),
        };
        let bytes = frame.encode_to_vec();
        let at = cut.index(bytes.len());
        match v1::RelayFrame::decode(&bytes[..at]) {
            Ok(decoded) => {
                if let Some(Frame::SnapshotChunk(c)) = &decoded.frame {
                    prop_assert!(c.words.len() <= words.len());
                }
                convert_frame(decoded);
            }
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }
}
