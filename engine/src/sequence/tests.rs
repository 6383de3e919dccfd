//! Unit tests of the sequence rule, one behaviour each (the proptest against a simulated
//! engine is `engine/tests/sequence_model.rs`).

use super::*;

const REPLAY: SequenceConfig = SequenceConfig {
    max_buffered_batches: 3,
    replay_available: true,
};
const NO_REPLAY: SequenceConfig = SequenceConfig {
    max_buffered_batches: 3,
    replay_available: false,
};

/// The first process's batches carry identity `s`, a restarted one's `1000 + s`.
type B = (u32, i64);

fn id((epoch, s): B) -> Option<u64> {
    Some(u64::from(epoch) * 1000 + s as u64)
}

fn apply(epoch: u32, sequence: i64) -> Action<B> {
    Action::Apply {
        sequence,
        batch: (epoch, sequence),
        replayed: false,
    }
}

fn replayed(epoch: u32, sequence: i64) -> Action<B> {
    Action::Apply {
        sequence,
        batch: (epoch, sequence),
        replayed: true,
    }
}

fn clear(reason: ClearReason) -> Action<B> {
    Action::ClearMembers { reason }
}

fn uncertain(cause: Uncertainty) -> Action<B> {
    Action::Uncertain { cause }
}

fn verify(from: i64) -> Action<B> {
    Action::RequestReplay {
        from,
        kind: ReplayKind::Verify,
    }
}

fn reread() -> Action<B> {
    Action::RequestReplay {
        from: 0,
        kind: ReplayKind::Reread,
    }
}

fn live(p: &mut PublisherSequence<B>, epoch: u32, s: i64) -> Vec<Action<B>> {
    p.live(s, id((epoch, s)), (epoch, s))
}

fn reply(p: &mut PublisherSequence<B>, epoch: u32, s: i64) -> Vec<Action<B>> {
    p.replayed(s, id((epoch, s)), (epoch, s))
}

/// Connected with an empty engine buffer behind it: the first contact's re-read is empty.
fn fresh(config: SequenceConfig) -> PublisherSequence<B> {
    let mut p = PublisherSequence::new(config);
    p.connected();
    p.replay_end();
    p
}

/// Connected, and the engine's buffer held only `s`: applied by the first contact's re-read.
fn started(config: SequenceConfig, s: i64) -> PublisherSequence<B> {
    let mut p = PublisherSequence::new(config);
    p.connected();
    assert_eq!(reply(&mut p, 0, s), vec![replayed(0, s)]);
    p.replay_end();
    p
}

#[test]
fn after_an_empty_reread_the_first_batch_must_be_sequence_0() {
    let mut p = fresh(REPLAY);
    assert_eq!(
        live(&mut p, 0, 2),
        vec![
            Action::Gap {
                expected: 0,
                received: 2
            },
            reread()
        ]
    );
    for k in 0..3 {
        assert_eq!(reply(&mut p, 0, k), vec![replayed(0, k)]);
    }
    let mut p = fresh(REPLAY);
    assert_eq!(live(&mut p, 0, 0), vec![apply(0, 0)]);
}

#[test]
fn a_reread_that_stays_empty_applies_the_held_batches_instead_of_asking_again() {
    // An engine whose replay buffer holds nothing (disabled, or always answering empty).
    let mut p = fresh(REPLAY);
    assert_eq!(live(&mut p, 0, 5)[1], reread());
    assert_eq!(live(&mut p, 0, 6), vec![]);
    assert_eq!(
        p.replay_end(),
        vec![Action::ReplayFilled { from: 0 }, apply(0, 5), apply(0, 6)]
    );
    assert_eq!(live(&mut p, 0, 7), vec![apply(0, 7)]);
}

#[test]
fn first_contact_rereads_the_engine_buffer_then_goes_live() {
    let mut p = PublisherSequence::new(REPLAY);
    assert_eq!(
        p.connected(),
        vec![uncertain(Uncertainty::FirstContact), reread()]
    );
    // Live batches wait behind the re-read; it starts wherever the buffer starts.
    assert_eq!(live(&mut p, 0, 7), vec![]);
    assert_eq!(reply(&mut p, 0, 4), vec![replayed(0, 4)]);
    assert_eq!(reply(&mut p, 0, 5), vec![replayed(0, 5)]);
    assert_eq!(reply(&mut p, 0, 6), vec![replayed(0, 6)]);
    assert_eq!(reply(&mut p, 0, 7), vec![replayed(0, 7)]);
    assert_eq!(
        p.replay_end(),
        vec![
            Action::ReplayFilled { from: 0 },
            Action::Duplicate { sequence: 7 }
        ]
    );
    assert_eq!(live(&mut p, 0, 8), vec![apply(0, 8)]);
    assert_eq!(p.last_applied(), Some(8));
}

#[test]
fn a_live_batch_before_the_connection_report_starts_the_check_once() {
    let mut p = PublisherSequence::new(REPLAY);
    assert_eq!(
        live(&mut p, 0, 3),
        vec![uncertain(Uncertainty::FirstContact), reread()]
    );
    assert_eq!(p.connected(), vec![], "the same connection, reported late");
    assert_eq!(reply(&mut p, 0, 3), vec![replayed(0, 3)]);
    assert_eq!(
        p.replay_end(),
        vec![
            Action::ReplayFilled { from: 0 },
            Action::Duplicate { sequence: 3 }
        ]
    );
}

#[test]
fn in_order_and_duplicates() {
    let mut p = fresh(REPLAY);
    assert_eq!(live(&mut p, 0, 0), vec![apply(0, 0)]);
    assert_eq!(live(&mut p, 0, 0), vec![Action::Duplicate { sequence: 0 }]);
    assert_eq!(live(&mut p, 0, 1), vec![apply(0, 1)]);
    // An unknown identity cannot prove a new process.
    assert_eq!(
        p.live(1, None, (9, 1)),
        vec![Action::Duplicate { sequence: 1 }]
    );
}

#[test]
fn backwards_or_a_repeat_with_another_identity_is_a_restart_that_rereads() {
    for (s, cause) in [(0, Uncertainty::Backwards), (4, Uncertainty::Repeat)] {
        let mut p = fresh(REPLAY);
        for k in 0..5 {
            live(&mut p, 0, k);
        }
        assert_eq!(
            live(&mut p, 1, s),
            vec![uncertain(cause), clear(ClearReason::Restart), reread()],
            "{cause:?}"
        );
        for k in 0..=s {
            assert_eq!(reply(&mut p, 1, k), vec![replayed(1, k)]);
        }
        assert_eq!(
            p.replay_end(),
            vec![
                Action::ReplayFilled { from: 0 },
                Action::Duplicate { sequence: s }
            ]
        );
        assert_eq!(live(&mut p, 1, s + 1), vec![apply(1, s + 1)]);
    }
}

#[test]
fn without_a_replay_socket_a_restart_clears_and_applies() {
    let mut p = fresh(NO_REPLAY);
    live(&mut p, 0, 0);
    live(&mut p, 0, 1);
    assert_eq!(
        live(&mut p, 1, 1),
        vec![
            uncertain(Uncertainty::Repeat),
            clear(ClearReason::Restart),
            apply(1, 1)
        ]
    );
}

#[test]
fn a_gap_verifies_the_last_batch_then_fills() {
    let mut p = started(REPLAY, 10);
    assert_eq!(
        live(&mut p, 0, 13),
        vec![
            Action::Gap {
                expected: 11,
                received: 13
            },
            verify(10)
        ]
    );
    assert_eq!(p.replay_in_flight(), Some(10));
    assert_eq!(live(&mut p, 0, 14), vec![]);
    assert_eq!(p.buffered(), 2);
    assert_eq!(
        reply(&mut p, 0, 10),
        vec![Action::Verified { sequence: 10 }]
    );
    assert_eq!(reply(&mut p, 0, 11), vec![replayed(0, 11)]);
    assert_eq!(reply(&mut p, 0, 12), vec![replayed(0, 12)]);
    assert_eq!(reply(&mut p, 0, 13), vec![replayed(0, 13)]);
    assert_eq!(
        p.replay_end(),
        vec![
            Action::ReplayFilled { from: 10 },
            Action::Duplicate { sequence: 13 },
            apply(0, 14)
        ]
    );
    assert_eq!(p.replay_in_flight(), None);
    assert_eq!(live(&mut p, 0, 15), vec![apply(0, 15)]);
}

#[test]
fn a_gap_from_a_restarted_engine_fails_the_verification_and_rereads() {
    // The old process applied up to 5; the new one's batch 7 arrives first.
    let mut p = fresh(REPLAY);
    for k in 0..6 {
        live(&mut p, 0, k);
    }
    assert_eq!(live(&mut p, 1, 7)[1], verify(5));
    // Its buffer holds 5 too, with another identity.
    assert_eq!(
        reply(&mut p, 1, 5),
        vec![
            Action::ReplayFailed {
                from: 5,
                reason: ReplayFailure::Unverified
            },
            clear(ClearReason::Unverified),
            reread()
        ]
    );
    assert_eq!(p.buffered(), 0, "the re-read returns what was held");
    for k in 0..8 {
        assert_eq!(reply(&mut p, 1, k), vec![replayed(1, k)]);
    }
    assert_eq!(p.replay_end(), vec![Action::ReplayFilled { from: 0 }]);
    assert_eq!(live(&mut p, 1, 8), vec![apply(1, 8)]);
}

#[test]
fn a_verification_fails_when_the_buffer_lost_the_batch_or_is_empty() {
    let mut p = fresh(REPLAY);
    live(&mut p, 0, 0);
    live(&mut p, 0, 3);
    assert_eq!(
        reply(&mut p, 0, 2)[..2],
        [
            Action::ReplayFailed {
                from: 0,
                reason: ReplayFailure::Unverified
            },
            clear(ClearReason::Unverified)
        ]
    );
    let mut p = fresh(REPLAY);
    live(&mut p, 0, 0);
    live(&mut p, 0, 3);
    assert_eq!(
        p.replay_end()[1..],
        [clear(ClearReason::Unverified), reread()]
    );
}

#[test]
fn a_reconnect_verifies_and_fills_what_the_drop_lost() {
    let mut p = fresh(REPLAY);
    live(&mut p, 0, 0);
    live(&mut p, 0, 1);
    assert_eq!(p.disconnected(), vec![]);
    assert_eq!(
        p.connected(),
        vec![uncertain(Uncertainty::Reconnect), verify(1)]
    );
    assert_eq!(live(&mut p, 0, 4), vec![]);
    assert_eq!(reply(&mut p, 0, 1), vec![Action::Verified { sequence: 1 }]);
    assert_eq!(reply(&mut p, 0, 2), vec![replayed(0, 2)]);
    assert_eq!(reply(&mut p, 0, 3), vec![replayed(0, 3)]);
    assert_eq!(reply(&mut p, 0, 4), vec![replayed(0, 4)]);
    assert_eq!(
        p.replay_end(),
        vec![
            Action::ReplayFilled { from: 1 },
            Action::Duplicate { sequence: 4 }
        ]
    );
}

#[test]
fn a_restart_behind_a_reconnect_is_found_whatever_its_sequence() {
    // The old process applied 0..=3. The new one published `n` batches before the
    // producer's SUB came back; the first it delivers live is `n`.
    for n in [2i64, 3, 4, 5, 9] {
        let mut p = fresh(REPLAY);
        for k in 0..=3 {
            live(&mut p, 0, k);
        }
        p.disconnected();
        assert_eq!(p.connected()[1], verify(3));
        // Live batches wait; a live batch below 3 shows the restart at once.
        let mut out = live(&mut p, 1, n);
        if n < 3 {
            assert_eq!(
                out[1..3],
                [
                    uncertain(Uncertainty::Backwards),
                    clear(ClearReason::Restart)
                ]
            );
        } else if n == 3 {
            assert_eq!(
                out[1..3],
                [uncertain(Uncertainty::Repeat), clear(ClearReason::Restart)]
            );
        } else {
            assert_eq!(out, vec![]);
            // The replay from 3 starts with the new process's 3, or with nothing.
            out = if n > 3 {
                reply(&mut p, 1, 3)
            } else {
                p.replay_end()
            };
            assert_eq!(out[1], clear(ClearReason::Unverified));
        }
        assert_eq!(*out.last().unwrap(), reread(), "n = {n}");
        for k in 0..=n {
            assert_eq!(reply(&mut p, 1, k), vec![replayed(1, k)], "n = {n}");
        }
        p.replay_end();
        assert_eq!(p.last_applied(), Some(n));
        assert_eq!(live(&mut p, 1, n + 1), vec![apply(1, n + 1)]);
    }
}

#[test]
fn a_reconnect_without_a_replay_socket_clears_what_was_applied() {
    let mut p = fresh(NO_REPLAY);
    live(&mut p, 0, 0);
    p.disconnected();
    assert_eq!(
        p.connected(),
        vec![
            uncertain(Uncertainty::Reconnect),
            clear(ClearReason::Unverified)
        ]
    );
    assert_eq!(live(&mut p, 0, 5), vec![apply(0, 5)]);
    // Nothing applied: nothing to clear.
    let mut p = PublisherSequence::<B>::new(NO_REPLAY);
    assert_eq!(p.connected(), vec![uncertain(Uncertainty::FirstContact)]);
    assert_eq!(live(&mut p, 0, 5), vec![apply(0, 5)]);
}

#[test]
fn a_disconnected_publisher_holds_live_batches_until_it_is_checked() {
    let mut p = fresh(REPLAY);
    live(&mut p, 0, 0);
    p.disconnected();
    // A live batch shows the connection is back before its report.
    assert_eq!(
        live(&mut p, 0, 2),
        vec![uncertain(Uncertainty::Reconnect), verify(0)]
    );
    assert_eq!(p.buffered(), 1);
    assert_eq!(p.connected(), vec![]);
    assert_eq!(reply(&mut p, 0, 0), vec![Action::Verified { sequence: 0 }]);
    assert_eq!(reply(&mut p, 0, 1), vec![replayed(0, 1)]);
    assert_eq!(p.replay_end()[1], apply(0, 2));
}

#[test]
fn a_drop_during_a_replay_abandons_it() {
    let mut p = fresh(REPLAY);
    live(&mut p, 0, 0);
    live(&mut p, 0, 2);
    assert_eq!(
        p.disconnected(),
        vec![Action::ReplayFailed {
            from: 0,
            reason: ReplayFailure::Disconnected
        }]
    );
    assert_eq!(
        reply(&mut p, 0, 0),
        vec![],
        "the abandoned replay is ignored"
    );
    assert_eq!(p.connected()[1], verify(0));
}

#[test]
fn a_restored_sequence_is_verified_at_the_first_connection() {
    let mut p = PublisherSequence::resume(REPLAY, 41, id((0, 41)));
    assert_eq!(p.last_applied(), Some(41));
    assert_eq!(
        p.connected(),
        vec![uncertain(Uncertainty::Restored), verify(41)]
    );
    assert_eq!(
        reply(&mut p, 0, 41),
        vec![Action::Verified { sequence: 41 }]
    );
    assert_eq!(reply(&mut p, 0, 42), vec![replayed(0, 42)]);
    assert_eq!(p.replay_end(), vec![Action::ReplayFilled { from: 41 }]);
    assert_eq!(live(&mut p, 0, 43), vec![apply(0, 43)]);
    // Restored without an identity: never verified, the buffer is re-read.
    let mut p = PublisherSequence::resume(REPLAY, 41, None);
    p.connected();
    assert_eq!(
        reply(&mut p, 0, 41)[1..],
        [clear(ClearReason::Unverified), reread()]
    );
    // Without a replay socket the restored members are cleared.
    let mut p = PublisherSequence::<B>::resume(NO_REPLAY, 41, id((0, 41)));
    assert_eq!(p.connected()[1], clear(ClearReason::Unverified));
}

#[test]
fn a_reread_with_a_hole_clears_and_starts_again_after_it() {
    let mut p = PublisherSequence::new(REPLAY);
    p.connected();
    assert_eq!(reply(&mut p, 0, 0), vec![replayed(0, 0)]);
    assert_eq!(
        reply(&mut p, 0, 3),
        vec![
            Action::Gap {
                expected: 1,
                received: 3
            },
            clear(ClearReason::Gap),
            replayed(0, 3)
        ]
    );
    assert_eq!(p.replay_end(), vec![Action::ReplayFilled { from: 0 }]);
    assert_eq!(live(&mut p, 0, 4), vec![apply(0, 4)]);
}

#[test]
fn a_fill_that_skips_clears_and_goes_on_after_the_hole() {
    let mut p = fresh(REPLAY);
    live(&mut p, 0, 0);
    live(&mut p, 0, 5);
    live(&mut p, 0, 6);
    reply(&mut p, 0, 0);
    // The engine's buffer lost 1 and 2.
    assert_eq!(
        reply(&mut p, 0, 3),
        vec![
            Action::Gap {
                expected: 1,
                received: 3
            },
            clear(ClearReason::Gap),
            replayed(0, 3)
        ]
    );
    assert_eq!(reply(&mut p, 0, 4), vec![replayed(0, 4)]);
    assert_eq!(reply(&mut p, 0, 5), vec![replayed(0, 5)]);
    assert_eq!(
        p.replay_end(),
        vec![
            Action::ReplayFilled { from: 0 },
            Action::Duplicate { sequence: 5 },
            apply(0, 6)
        ]
    );
}

#[test]
fn a_held_batch_the_replay_did_not_return_is_foreign_and_dropped() {
    // A stray publisher's batch (sequence 1000) on a bound endpoint: the real engine's
    // replay verifies 0 and returns 1; 1000 had arrived before the request, so the
    // engine would have returned it: dropped, the members untouched.
    let mut p = fresh(REPLAY);
    live(&mut p, 0, 0);
    assert_eq!(p.live(1000, Some(77), (9, 1000))[1], verify(0));
    reply(&mut p, 0, 0);
    reply(&mut p, 0, 1);
    assert_eq!(
        p.replay_end(),
        vec![
            Action::ReplayFilled { from: 0 },
            Action::Foreign { sequence: 1000 }
        ]
    );
    assert_eq!(p.last_applied(), Some(1));
    // A batch that arrived after the request and jumps ahead is a gap as usual.
    let mut p = fresh(REPLAY);
    live(&mut p, 0, 0);
    live(&mut p, 0, 3);
    live(&mut p, 0, 6);
    reply(&mut p, 0, 0);
    for k in 1..=3 {
        reply(&mut p, 0, k);
    }
    let out = p.replay_end();
    assert_eq!(out[1], Action::Duplicate { sequence: 3 });
    assert_eq!(
        out[2..],
        [
            Action::Gap {
                expected: 4,
                received: 6
            },
            verify(3)
        ]
    );
}

#[test]
fn an_idle_publisher_is_verified_again() {
    let mut p = fresh(REPLAY);
    live(&mut p, 0, 0);
    live(&mut p, 0, 1);
    assert_eq!(p.idle(), vec![uncertain(Uncertainty::Idle), verify(1)]);
    assert_eq!(p.idle(), vec![], "one check at a time");
    // Alive and unchanged: verified, nothing else.
    assert_eq!(reply(&mut p, 0, 1), vec![Action::Verified { sequence: 1 }]);
    assert_eq!(p.replay_end(), vec![Action::ReplayFilled { from: 1 }]);
    // Restarted behind a connection that never dropped: its buffer has another 1.
    p.idle();
    assert_eq!(reply(&mut p, 1, 1)[1], clear(ClearReason::Unverified));
    // Gone: the check times out.
    let mut p = fresh(REPLAY);
    live(&mut p, 0, 0);
    p.idle();
    assert_eq!(
        p.replay_failed(ReplayFailure::Timeout)[1],
        clear(ClearReason::Unverified)
    );
    // Nothing to check without a replay socket or before anything was applied.
    let mut p = fresh(NO_REPLAY);
    live(&mut p, 0, 0);
    assert_eq!(p.idle(), vec![]);
    assert_eq!(fresh(REPLAY).idle(), vec![]);
    // Disconnected for the whole interval (with or without a replay socket): cleared once,
    // and the connection's return re-reads the engine's buffer.
    for config in [REPLAY, NO_REPLAY] {
        let mut p = fresh(config);
        live(&mut p, 0, 0);
        p.disconnected();
        assert_eq!(
            p.idle(),
            vec![uncertain(Uncertainty::Idle), clear(ClearReason::Unverified)]
        );
        assert_eq!(p.idle(), vec![]);
        assert_eq!(p.last_applied(), None);
    }
    let mut p = fresh(REPLAY);
    live(&mut p, 0, 0);
    p.disconnected();
    p.idle();
    assert_eq!(p.connected()[1], reread());
}

#[test]
fn timeouts_transport_failures_and_overflow_clear_and_resume_at_live() {
    for reason in [ReplayFailure::Timeout, ReplayFailure::Transport] {
        // Failing during the verification: unverified.
        let mut p = fresh(REPLAY);
        live(&mut p, 0, 0);
        live(&mut p, 0, 3);
        assert_eq!(
            p.replay_failed(reason),
            vec![
                Action::ReplayFailed { from: 0, reason },
                clear(ClearReason::Unverified),
                apply(0, 3)
            ]
        );
        assert_eq!(p.replay_failed(reason), vec![]);
        // Failing after it: the gap stays unfilled.
        let mut p = fresh(REPLAY);
        live(&mut p, 0, 0);
        live(&mut p, 0, 3);
        reply(&mut p, 0, 0);
        assert_eq!(p.replay_failed(reason)[1], clear(ClearReason::Gap));
    }
    let mut p = fresh(REPLAY);
    live(&mut p, 0, 0);
    for k in 2..5 {
        live(&mut p, 0, k);
    }
    assert_eq!(
        live(&mut p, 0, 5),
        vec![
            Action::ReplayFailed {
                from: 0,
                reason: ReplayFailure::Overflow
            },
            clear(ClearReason::Unverified),
            apply(0, 2),
            apply(0, 3),
            apply(0, 4),
            apply(0, 5)
        ]
    );
}

#[test]
fn after_a_failed_replay_the_next_check_rereads_until_a_reread_completes() {
    // Batches 0..=2 applied; an idle verification of 2 times out: cleared, the next live
    // batch starts the run.
    let mut p = started(REPLAY, 0);
    live(&mut p, 0, 1);
    live(&mut p, 0, 2);
    assert_eq!(p.idle(), vec![uncertain(Uncertainty::Idle), verify(2)]);
    assert_eq!(
        p.replay_failed(ReplayFailure::Timeout)[1],
        clear(ClearReason::Unverified)
    );
    assert_eq!(live(&mut p, 0, 3), vec![apply(0, 3)]);
    // Unsettled: the next idle check does not verify 3 (0..=2 are missing), it clears and
    // re-reads the buffer, which returns them.
    assert_eq!(
        p.idle(),
        vec![
            uncertain(Uncertainty::Idle),
            clear(ClearReason::Unverified),
            reread()
        ]
    );
    // A re-read that fails leaves it unsettled: a reconnection re-reads again.
    assert_eq!(
        p.replay_failed(ReplayFailure::Transport)[0],
        Action::ReplayFailed {
            from: 0,
            reason: ReplayFailure::Transport
        }
    );
    assert_eq!(
        p.connected(),
        vec![uncertain(Uncertainty::Reconnect), reread()]
    );
    for s in 0..=3 {
        reply(&mut p, 0, s);
    }
    assert_eq!(p.replay_end(), vec![Action::ReplayFilled { from: 0 }]);
    assert_eq!(p.last_applied(), Some(3));
    // Settled: the idle check verifies again.
    assert_eq!(p.idle(), vec![uncertain(Uncertainty::Idle), verify(3)]);
}

#[test]
fn a_restart_during_a_replay_abandons_it_and_rereads() {
    let mut p = started(REPLAY, 7);
    live(&mut p, 0, 9);
    assert_eq!(
        live(&mut p, 1, 0),
        vec![
            Action::ReplayFailed {
                from: 7,
                reason: ReplayFailure::Restart
            },
            uncertain(Uncertainty::Backwards),
            clear(ClearReason::Restart),
            reread()
        ]
    );
    assert_eq!(reply(&mut p, 1, 0), vec![replayed(1, 0)]);
}

#[test]
fn zero_buffer_disables_replay() {
    let mut p = fresh(SequenceConfig {
        max_buffered_batches: 0,
        replay_available: true,
    });
    live(&mut p, 0, 0);
    let out = live(&mut p, 0, 2);
    assert!(out.contains(&clear(ClearReason::Gap)));
    assert!(
        !out.iter()
            .any(|a| matches!(a, Action::RequestReplay { .. }))
    );
}

#[test]
fn replies_without_a_replay_are_ignored() {
    let mut p = fresh(REPLAY);
    live(&mut p, 0, 0);
    assert_eq!(reply(&mut p, 0, 1), vec![]);
    assert_eq!(p.replay_end(), vec![]);
    assert_eq!(p.replay_failed(ReplayFailure::Timeout), vec![]);
    assert_eq!(live(&mut p, 0, 1), vec![apply(0, 1)]);
}

#[test]
fn extreme_sequences_do_not_overflow() {
    let mut p = fresh(NO_REPLAY);
    assert_eq!(live(&mut p, 0, i64::MAX), vec![apply(0, i64::MAX)]);
    assert_eq!(
        live(&mut p, 0, i64::MAX),
        vec![Action::Duplicate { sequence: i64::MAX }]
    );
    let mut p = PublisherSequence::resume(REPLAY, i64::MAX, id((0, i64::MAX)));
    p.connected();
    assert_eq!(
        reply(&mut p, 0, i64::MAX),
        vec![Action::Verified { sequence: i64::MAX }]
    );
    assert_eq!(
        p.replay_end(),
        vec![Action::ReplayFilled { from: i64::MAX }]
    );
    let mut p = fresh(NO_REPLAY);
    assert_eq!(live(&mut p, 0, i64::MIN), vec![apply(0, i64::MIN)]);
    assert_eq!(live(&mut p, 0, i64::MIN + 1), vec![apply(0, i64::MIN + 1)]);
    assert_eq!(ClearReason::Unverified.label(), "unverified");
    assert_eq!(Uncertainty::FirstContact.label(), "first_contact");
    assert_eq!(ReplayKind::Reread.label(), "reread");
}
