use super::*;
use crate::encode::{self, BlockRemoved, Event, Layout};
use crate::sequence::SequenceConfig;

fn limits() -> IntakeLimits {
    IntakeLimits {
        decode: DecodeLimits::default(),
        max_message_bytes: 1 << 16,
        max_dp_rank: 4,
    }
}

fn payload(dp_rank: Option<i64>, hashes: &[u64]) -> Vec<u8> {
    encode::encode_batch(
        &encode::Batch {
            ts: 1.5,
            events: vec![Event::Removed(BlockRemoved {
                block_hashes: hashes.to_vec(),
                ..BlockRemoved::default()
            })],
            data_parallel_rank: dp_rank,
        },
        Layout::Tagged,
    )
}

fn live(sequence: i64, payload: &[u8]) -> Read {
    Read::live(&[b"kv", &sequence.to_be_bytes(), payload], &limits())
}

#[test]
fn a_good_live_message_carries_its_batch() {
    let read = live(7, &payload(Some(1), &[10, 11]));
    assert_eq!(read.sequence, Some(7));
    assert_eq!(read.rejected, None);
    assert!(!read.replay_end);
    let batch = read.batch.expect("a batch");
    assert_eq!(batch.dp_rank, Some(1));
    assert_eq!(batch.events.len(), 1);
}

#[test]
fn each_check_drops_the_batch_and_says_why() {
    // Too large: not decoded, but the sequence is kept (no gap).
    let big = vec![0u8; limits().max_message_bytes];
    let read = live(3, &big);
    assert_eq!((read.sequence, read.batch.is_none()), (Some(3), true));
    assert_eq!(
        read.rejected.as_ref().map(Rejection::kind_label),
        Some("oversize")
    );
    // Not an engine message: no sequence at all.
    let read = Read::live(&[b"kv"], &limits());
    assert_eq!(read.sequence, None);
    assert_eq!(
        read.rejected.as_ref().map(Rejection::kind_label),
        Some("parts")
    );
    // Not msgpack: the sequence is kept.
    let read = live(4, b"\xc1");
    assert_eq!((read.sequence, read.batch.is_none()), (Some(4), true));
    assert_eq!(
        read.rejected.as_ref().map(Rejection::kind_label),
        Some("syntax")
    );
    // A dp rank at the bound.
    let read = live(5, &payload(Some(4), &[1]));
    assert_eq!((read.sequence, read.batch.is_none()), (Some(5), true));
    assert_eq!(
        read.rejected,
        Some(Rejection::DpRank { rank: 4, max: 4 }),
        "{:?}",
        read.rejected
    );
    assert_eq!(read.rejected.unwrap().to_string(), "batch dp_rank 4 >= 4");
    // A rank outside u32 is refused as a rank too, not as a malformed batch.
    for rank in [1_i64 << 40, -1] {
        let read = live(6, &payload(Some(rank), &[1]));
        assert_eq!(
            read.rejected,
            Some(Rejection::DpRank {
                rank: u32::MAX,
                max: 4
            }),
            "rank {rank}"
        );
    }
}

#[test]
fn a_dropped_message_keeps_an_identity_of_its_bytes() {
    let good = payload(None, &[1]);
    assert_eq!(
        live(1, &good).identity,
        Some(live(1, &good).batch.unwrap().identity())
    );
    let bad = live(2, b"\xc1bad");
    let again = Read::replayed(&[&2i64.to_be_bytes(), b"\xc1bad"], &limits());
    assert!(bad.identity.is_some());
    assert_eq!(bad.identity, again.identity, "a replay repeats the bytes");
    assert_ne!(bad.identity, live(2, b"\xc1other").identity);
    // Without a sequence there is nothing to identify.
    assert_eq!(Read::live(&[b"x"], &limits()).identity, None);
}

#[test]
fn a_dropped_message_applied_last_still_verifies() {
    let config = SequenceConfig {
        max_buffered_batches: 8,
        replay_available: true,
    };
    let mut sequence = PublisherSequence::<Batch>::new(config);
    let good = payload(None, &[1]);
    // First contact: the re-read returns a good batch then a malformed one.
    sequence.take(live(0, &good));
    let reply = |seq: i64, bytes: &[u8]| Read::replayed(&[&seq.to_be_bytes(), bytes], &limits());
    sequence.take(reply(0, &good));
    sequence.take(reply(1, b"\xc1bad"));
    sequence.take(Read::replayed(&[&(-1i64).to_be_bytes(), b""], &limits()));
    assert_eq!(sequence.last_applied(), Some(1));
    // The idle check verifies the last applied message: the replay repeats its bytes.
    let actions = sequence.idle();
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::RequestReplay { from: 1, .. })),
        "{actions:?}"
    );
    let actions = sequence.take(reply(1, b"\xc1bad"));
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::Verified { sequence: 1 })),
        "{actions:?}"
    );
    let actions = sequence.take(Read::replayed(&[&(-1i64).to_be_bytes(), b""], &limits()));
    assert!(
        !actions
            .iter()
            .any(|a| matches!(a, Action::ClearMembers { .. })),
        "{actions:?}"
    );
}

#[test]
fn a_replay_end_marker_is_not_decoded() {
    let end = Read::replayed(&[&(-1i64).to_be_bytes(), b""], &limits());
    assert!(end.replay_end);
    assert_eq!((end.batch, end.rejected), (None, None));
    // Live, an empty payload is a malformed batch, not an end.
    let read = live(2, b"");
    assert!(!read.replay_end);
    assert_eq!(
        read.rejected.as_ref().map(Rejection::kind_label),
        Some("truncated")
    );
}

#[test]
fn take_routes_each_read_to_its_rule() {
    let config = SequenceConfig {
        max_buffered_batches: 8,
        replay_available: true,
    };
    let mut sequence = PublisherSequence::<Batch>::new(config);
    // A message without a sequence is no event for the rule.
    assert!(sequence.take(Read::live(&[b"x"], &limits())).is_empty());
    // The first live batch before any connection: the rule asks to re-read the buffer.
    let actions = sequence.take(live(0, &payload(None, &[1])));
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::RequestReplay { .. })),
        "{actions:?}"
    );
    // The replay returns sequence 0 (applied as replayed), then its end: the held live batch
    // is a duplicate of what was replayed.
    let reply = Read::replayed(&[&0i64.to_be_bytes(), &payload(None, &[1])], &limits());
    let actions = sequence.take(reply);
    assert!(
        matches!(
            actions.as_slice(),
            [Action::Apply {
                sequence: 0,
                replayed: true,
                batch: Some(_)
            }]
        ),
        "{actions:?}"
    );
    let end = Read::replayed(&[&(-1i64).to_be_bytes(), b""], &limits());
    let actions = sequence.take(end);
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::ReplayFilled { .. })),
        "{actions:?}"
    );
    assert_eq!(sequence.last_applied(), Some(0));
    // A dropped live batch still takes its sequence number: no gap.
    let actions = sequence.take(live(1, b"\xc1"));
    assert!(
        matches!(
            actions.as_slice(),
            [Action::Apply {
                sequence: 1,
                batch: None,
                ..
            }]
        ),
        "{actions:?}"
    );
    let actions = sequence.take(live(2, &payload(None, &[2])));
    assert!(
        !actions.iter().any(|a| matches!(a, Action::Gap { .. })),
        "{actions:?}"
    );
}
