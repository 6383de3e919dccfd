//! Per publisher socket: which batch to apply, which to ignore, when to ask for a replay and
//! when the publisher's members must be cleared.
//!
//! An engine's `ZmqEventPublisher` numbers its batches `0, 1, 2, ...` per PUB socket (one per
//! data-parallel rank) and keeps the last few thousand in a replay buffer behind a ROUTER
//! socket. A SUB socket loses batches silently (slow joiner, reconnect, high-water mark), and
//! a restarted engine starts numbering again. [`PublisherSequence`] turns what the socket
//! delivered into [`Action`]s, with no clock and no socket (the caller owns both):
//!
//! - The first sequence seen may be anything (TensorRT-LLM starts at a time stamp): apply.
//! - `last + 1`: apply. `last`: a duplicate, ignore.
//! - Below `last`: the engine restarted. Its old blocks are gone from its cache, so the
//!   publisher's members are cleared ([`ClearReason::Restart`]) and the batch is applied.
//! - Above `last + 1`: a gap. With a replay socket, ask it for everything from `last + 1`
//!   ([`Action::RequestReplay`]) and buffer live batches (at most `max_buffered_batches`)
//!   until the replay ends. Replayed batches are applied in order, what overlaps what was
//!   already applied is ignored, then the buffered live batches follow, likewise.
//! - A replay that cannot fill the gap (it skips a sequence, ends short, times out, fails, or
//!   the buffer overflows) or no replay socket at all: the members' state is uncertain, so
//!   they are cleared ([`ClearReason::Gap`]); a later store re-adds what is really cached.
//!   Then the live stream resumes at the oldest buffered batch as if it were a first batch.
//!
//! - [`PublisherSequence::resume`] starts from a sequence applied by an earlier run of the
//!   caller (restored after a restart), so the batches published meanwhile are a gap the
//!   replay fills, and an engine that restarted meanwhile is seen going backwards.
//!   [`PublisherSequence::catch_up`] then asks the replay socket for them at once, instead of
//!   waiting for the engine's next live batch to reveal the gap (an idle engine may publish
//!   nothing for minutes). A catch-up that cannot reach the replay socket (timeout,
//!   transport) clears nothing: the rule falls back to waiting for the next live batch.
//!
//! Ambiguity the rule accepts: a restarted engine whose first batch the socket sees carries
//! exactly `last` (or `last + 1`) looks like a duplicate (or the next batch); only a sequence
//! below `last` proves a restart. Empty batches (heartbeats) take part like any other batch.

use std::collections::VecDeque;

/// Limits and capabilities of one publisher socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SequenceConfig {
    /// Live batches buffered while a replay runs; one more fails the replay
    /// ([`ReplayFailure::Overflow`]). 0 disables replay like `replay_available = false`.
    pub max_buffered_batches: usize,
    /// Whether the publisher has a replay socket; without one a gap clears the members at
    /// once.
    pub replay_available: bool,
}

/// Why the publisher's members are cleared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClearReason {
    /// Batches were lost and no replay could supply them.
    Gap,
    /// The sequence went backwards: the engine restarted with an empty cache.
    Restart,
}

impl ClearReason {
    /// A short stable label for metrics: `"gap"` or `"restart"`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Gap => "gap",
            Self::Restart => "restart",
        }
    }
}

/// Why a replay did not fill its gap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReplayFailure {
    /// The replay skipped sequence `missing` (the engine's buffer no longer holds it), or
    /// ended before the buffered live batches continued the sequence.
    Incomplete {
        /// The first sequence still missing.
        missing: i64,
    },
    /// More live batches arrived than `max_buffered_batches` while the replay ran.
    Overflow,
    /// The caller's deadline passed (reported through [`PublisherSequence::replay_failed`]).
    Timeout,
    /// The replay socket failed (connect, send or receive; reported by the caller).
    Transport,
    /// The engine restarted while the replay ran.
    Restart,
}

impl ReplayFailure {
    /// A short stable label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Incomplete { .. } => "incomplete",
            Self::Overflow => "overflow",
            Self::Timeout => "timeout",
            Self::Transport => "transport",
            Self::Restart => "restart",
        }
    }
}

/// One thing the caller must do (or count), in the order returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action<T> {
    /// Apply this batch now.
    Apply {
        /// Its sequence.
        sequence: i64,
        /// The batch.
        batch: T,
        /// Whether it came from the replay socket.
        replayed: bool,
    },
    /// A batch already applied (a live duplicate or a replay overlap): ignore it.
    Duplicate {
        /// Its sequence.
        sequence: i64,
    },
    /// Sequences `expected..received` were not delivered (counted once per gap).
    Gap {
        /// The first missing sequence.
        expected: i64,
        /// The sequence that revealed the gap.
        received: i64,
    },
    /// Send a replay request for every batch from `from` on; deliver its batches with
    /// [`PublisherSequence::replayed`] and its end with [`PublisherSequence::replay_end`].
    RequestReplay {
        /// The first sequence wanted.
        from: i64,
    },
    /// The replay started for `from` filled the gap; the caller may stop its replay I/O.
    ReplayFilled {
        /// The first sequence requested.
        from: i64,
    },
    /// The replay started for `from` failed; the caller stops its replay I/O (later replies
    /// are ignored anyway). A [`Action::ClearMembers`] follows.
    ReplayFailed {
        /// The first sequence requested.
        from: i64,
        /// Why.
        reason: ReplayFailure,
    },
    /// Clear every member of this publisher (state and lineage) before the actions after it.
    ClearMembers {
        /// Why.
        reason: ClearReason,
    },
}

/// A replay in flight.
#[derive(Debug)]
struct Window<T> {
    /// The first sequence requested.
    from: i64,
    /// Live batches received since the request, in arrival order.
    buffered: VecDeque<(i64, T)>,
    /// Whether it is a [`PublisherSequence::catch_up`] (no gap seen yet).
    catch_up: bool,
}

/// The sequence state of one publisher socket (see the module docs). `T` is the caller's
/// batch (decoded or not); this type only moves it.
#[derive(Debug)]
pub struct PublisherSequence<T> {
    config: SequenceConfig,
    /// The last sequence applied since the last clear; `None` before the first batch.
    last: Option<i64>,
    replay: Option<Window<T>>,
}

impl<T> PublisherSequence<T> {
    /// A publisher that has sent nothing yet.
    pub fn new(config: SequenceConfig) -> Self {
        Self {
            config,
            last: None,
            replay: None,
        }
    }

    /// A publisher whose batches up to `last` were applied before, by an earlier run of the
    /// caller (a producer restored from its journal): the rule goes on as if `last` had just
    /// been applied. The next live batch decides what happened meanwhile: `last + 1` applies,
    /// `last` is a duplicate, above `last + 1` is a gap (a replay from `last + 1` fills it
    /// from the engine's buffer, or the members are cleared without one), below `last` is an
    /// engine restart (cleared).
    pub fn resume(config: SequenceConfig, last: i64) -> Self {
        Self {
            config,
            last: Some(last),
            replay: None,
        }
    }

    /// After [`PublisherSequence::resume`]: asks for every batch after the restored sequence
    /// now ([`Action::RequestReplay`] from `last + 1`), so what the engine published while the
    /// caller was down arrives without waiting for a live batch. Live batches buffer behind it
    /// as behind any replay; one below the restored sequence is an engine restart (cleared).
    /// An empty replay fills it (nothing was missed, or an engine restart the next live batch
    /// will show). When the replay socket cannot be reached ([`ReplayFailure::Timeout`],
    /// [`ReplayFailure::Transport`]) nothing is cleared: the rule goes on as after `resume`,
    /// and the next live batch's gap asks again. No action without a replay socket, with a
    /// replay in flight, before any applied batch, or at `i64::MAX`.
    pub fn catch_up(&mut self) -> Vec<Action<T>> {
        let mut out = Vec::new();
        if self.replay.is_some()
            || !self.config.replay_available
            || self.config.max_buffered_batches == 0
        {
            return out;
        }
        let Some(from) = self.last.and_then(|l| l.checked_add(1)) else {
            return out;
        };
        out.push(Action::RequestReplay { from });
        self.replay = Some(Window {
            from,
            buffered: VecDeque::new(),
            catch_up: true,
        });
        out
    }

    /// The last sequence applied, if any.
    pub fn last_applied(&self) -> Option<i64> {
        self.last
    }

    /// The first sequence of the replay in flight, if one is.
    pub fn replay_in_flight(&self) -> Option<i64> {
        self.replay.as_ref().map(|w| w.from)
    }

    /// Live batches buffered behind the replay in flight.
    pub fn buffered(&self) -> usize {
        self.replay.as_ref().map_or(0, |w| w.buffered.len())
    }

    /// A batch from the live (SUB) socket.
    pub fn live(&mut self, sequence: i64, batch: T) -> Vec<Action<T>> {
        let mut out = Vec::new();
        self.push_live(sequence, batch, &mut out);
        out
    }

    /// A batch from the replay socket. Ignored (no action) when no replay is in flight.
    pub fn replayed(&mut self, sequence: i64, batch: T) -> Vec<Action<T>> {
        let mut out = Vec::new();
        let Some(window) = &self.replay else {
            return out;
        };
        let from = window.from;
        let next = self.last.and_then(|l| l.checked_add(1)).unwrap_or(from);
        if sequence < next {
            out.push(Action::Duplicate { sequence });
        } else if sequence == next {
            self.last = Some(sequence);
            out.push(Action::Apply {
                sequence,
                batch,
                replayed: true,
            });
        } else {
            self.fail(ReplayFailure::Incomplete { missing: next }, &mut out);
        }
        out
    }

    /// The replay's end marker: merge the buffered live batches (overlap ignored). When they
    /// do not continue the sequence, the replay failed.
    pub fn replay_end(&mut self) -> Vec<Action<T>> {
        let mut out = Vec::new();
        let Some(window) = &self.replay else {
            return out;
        };
        let mut next = self.last.and_then(|l| l.checked_add(1));
        for (s, _) in &window.buffered {
            match next {
                Some(n) if *s < n => {}
                Some(n) if *s == n => next = n.checked_add(1),
                _ => {
                    let missing = next.unwrap_or(*s);
                    self.fail(ReplayFailure::Incomplete { missing }, &mut out);
                    return out;
                }
            }
        }
        let window = self.replay.take().expect("checked above");
        out.push(Action::ReplayFilled { from: window.from });
        for (sequence, batch) in window.buffered {
            if self.last.is_some_and(|l| sequence <= l) {
                // Also replayed: the overlap is ignored.
                out.push(Action::Duplicate { sequence });
            } else {
                self.push_live(sequence, batch, &mut out);
            }
        }
        out
    }

    /// The caller gave up on the replay in flight (`Timeout`, `Transport`). Ignored when no
    /// replay is in flight.
    pub fn replay_failed(&mut self, reason: ReplayFailure) -> Vec<Action<T>> {
        let mut out = Vec::new();
        if self.replay.is_some() {
            self.fail(reason, &mut out);
        }
        out
    }

    fn push_live(&mut self, sequence: i64, batch: T, out: &mut Vec<Action<T>>) {
        if let Some(window) = &mut self.replay {
            let newest = window.buffered.back().map(|(s, _)| *s);
            // Below the sequence applied when the replay started (`from - 1`): only a
            // restarted engine goes back there (a catch-up has no buffered batch to compare).
            let below_start = window.from.checked_sub(1).is_some_and(|l| sequence < l);
            if below_start || newest.is_some_and(|n| sequence < n) {
                let from = window.from;
                self.replay = None;
                out.push(Action::ReplayFailed {
                    from,
                    reason: ReplayFailure::Restart,
                });
                self.restart(sequence, batch, out);
            } else if newest == Some(sequence) {
                out.push(Action::Duplicate { sequence });
            } else if window.buffered.len() >= self.config.max_buffered_batches {
                self.fail(ReplayFailure::Overflow, out);
                self.push_live(sequence, batch, out);
            } else {
                window.buffered.push_back((sequence, batch));
            }
            return;
        }
        let Some(last) = self.last else {
            self.apply(sequence, batch, out);
            return;
        };
        match last.checked_add(1) {
            Some(next) if sequence == next => self.apply(sequence, batch, out),
            _ if sequence == last => out.push(Action::Duplicate { sequence }),
            _ if sequence < last => self.restart(sequence, batch, out),
            Some(next) => {
                out.push(Action::Gap {
                    expected: next,
                    received: sequence,
                });
                if self.config.replay_available && self.config.max_buffered_batches > 0 {
                    out.push(Action::RequestReplay { from: next });
                    self.replay = Some(Window {
                        from: next,
                        buffered: VecDeque::from([(sequence, batch)]),
                        catch_up: false,
                    });
                } else {
                    out.push(Action::ClearMembers {
                        reason: ClearReason::Gap,
                    });
                    self.apply(sequence, batch, out);
                }
            }
            // `last == i64::MAX` and a larger sequence cannot exist.
            None => unreachable!("no i64 is above i64::MAX"),
        }
    }

    fn apply(&mut self, sequence: i64, batch: T, out: &mut Vec<Action<T>>) {
        self.last = Some(sequence);
        out.push(Action::Apply {
            sequence,
            batch,
            replayed: false,
        });
    }

    fn restart(&mut self, sequence: i64, batch: T, out: &mut Vec<Action<T>>) {
        out.push(Action::ClearMembers {
            reason: ClearReason::Restart,
        });
        self.apply(sequence, batch, out);
    }

    /// Ends the replay in flight as failed: clear, then resume at the oldest buffered batch
    /// as a first batch (the rest follow through the live rule, so a further gap in them can
    /// ask for a new replay).
    fn fail(&mut self, reason: ReplayFailure, out: &mut Vec<Action<T>>) {
        let Some(window) = self.replay.take() else {
            return;
        };
        out.push(Action::ReplayFailed {
            from: window.from,
            reason,
        });
        if window.catch_up && matches!(reason, ReplayFailure::Timeout | ReplayFailure::Transport) {
            // No gap was seen: nothing is known to be missing. Go on as after `resume`; the
            // buffered batches take the live rule, so a gap among them asks for a replay.
            for (sequence, batch) in window.buffered {
                self.push_live(sequence, batch, out);
            }
            return;
        }
        out.push(Action::ClearMembers {
            reason: ClearReason::Gap,
        });
        self.last = None;
        for (sequence, batch) in window.buffered {
            self.push_live(sequence, batch, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPLAY: SequenceConfig = SequenceConfig {
        max_buffered_batches: 3,
        replay_available: true,
    };
    const NO_REPLAY: SequenceConfig = SequenceConfig {
        max_buffered_batches: 3,
        replay_available: false,
    };

    fn apply(sequence: i64) -> Action<i64> {
        Action::Apply {
            sequence,
            batch: sequence,
            replayed: false,
        }
    }

    fn replayed(sequence: i64) -> Action<i64> {
        Action::Apply {
            sequence,
            batch: sequence,
            replayed: true,
        }
    }

    fn clear(reason: ClearReason) -> Action<i64> {
        Action::ClearMembers { reason }
    }

    fn live(p: &mut PublisherSequence<i64>, s: i64) -> Vec<Action<i64>> {
        p.live(s, s)
    }

    #[test]
    fn first_sequence_may_be_anything_then_in_order() {
        let mut p = PublisherSequence::new(REPLAY);
        assert_eq!(live(&mut p, 1_733_000_000), vec![apply(1_733_000_000)]);
        assert_eq!(live(&mut p, 1_733_000_001), vec![apply(1_733_000_001)]);
        assert_eq!(p.last_applied(), Some(1_733_000_001));
        let mut q = PublisherSequence::new(REPLAY);
        assert_eq!(live(&mut q, -5), vec![apply(-5)]);
        assert_eq!(live(&mut q, -4), vec![apply(-4)]);
    }

    #[test]
    fn duplicate_is_ignored() {
        let mut p = PublisherSequence::new(REPLAY);
        live(&mut p, 0);
        assert_eq!(live(&mut p, 0), vec![Action::Duplicate { sequence: 0 }]);
        assert_eq!(live(&mut p, 1), vec![apply(1)]);
    }

    #[test]
    fn backwards_is_a_restart_clear_then_apply() {
        let mut p = PublisherSequence::new(REPLAY);
        for s in 0..5 {
            live(&mut p, s);
        }
        assert_eq!(live(&mut p, 0), vec![clear(ClearReason::Restart), apply(0)]);
        assert_eq!(live(&mut p, 1), vec![apply(1)]);
    }

    #[test]
    fn gap_without_replay_clears_then_applies() {
        let mut p = PublisherSequence::new(NO_REPLAY);
        live(&mut p, 0);
        assert_eq!(
            live(&mut p, 3),
            vec![
                Action::Gap {
                    expected: 1,
                    received: 3
                },
                clear(ClearReason::Gap),
                apply(3)
            ]
        );
        assert_eq!(p.replay_in_flight(), None);
        assert_eq!(live(&mut p, 4), vec![apply(4)]);
    }

    #[test]
    fn zero_buffer_disables_replay() {
        let mut p = PublisherSequence::new(SequenceConfig {
            max_buffered_batches: 0,
            replay_available: true,
        });
        live(&mut p, 0);
        let out = live(&mut p, 2);
        assert!(out.contains(&clear(ClearReason::Gap)));
        assert!(
            !out.iter()
                .any(|a| matches!(a, Action::RequestReplay { .. }))
        );
    }

    #[test]
    fn gap_filled_by_replay_in_order_overlap_ignored() {
        let mut p = PublisherSequence::new(REPLAY);
        live(&mut p, 10);
        assert_eq!(
            live(&mut p, 13),
            vec![
                Action::Gap {
                    expected: 11,
                    received: 13
                },
                Action::RequestReplay { from: 11 }
            ]
        );
        assert_eq!(p.replay_in_flight(), Some(11));
        assert_eq!(live(&mut p, 14), vec![]);
        assert_eq!(p.buffered(), 2);
        // The replay answers from its buffer: an old one first (overlap), then the gap, then
        // what was also received live.
        assert_eq!(p.replayed(10, 10), vec![Action::Duplicate { sequence: 10 }]);
        assert_eq!(p.replayed(11, 11), vec![replayed(11)]);
        assert_eq!(p.replayed(12, 12), vec![replayed(12)]);
        assert_eq!(p.replayed(13, 13), vec![replayed(13)]);
        assert_eq!(
            p.replay_end(),
            vec![
                Action::ReplayFilled { from: 11 },
                Action::Duplicate { sequence: 13 },
                apply(14)
            ]
        );
        assert_eq!(p.replay_in_flight(), None);
        assert_eq!(live(&mut p, 15), vec![apply(15)]);
    }

    #[test]
    fn replay_that_skips_the_missing_sequence_fails_and_clears() {
        let mut p = PublisherSequence::new(REPLAY);
        live(&mut p, 0);
        live(&mut p, 5);
        live(&mut p, 6);
        // The engine's buffer starts at 3: 1 and 2 are gone.
        assert_eq!(
            p.replayed(3, 3),
            vec![
                Action::ReplayFailed {
                    from: 1,
                    reason: ReplayFailure::Incomplete { missing: 1 }
                },
                clear(ClearReason::Gap),
                apply(5),
                apply(6)
            ]
        );
        // Later replies of the abandoned replay are ignored.
        assert_eq!(p.replayed(4, 4), vec![]);
        assert_eq!(p.replay_end(), vec![]);
        assert_eq!(live(&mut p, 7), vec![apply(7)]);
    }

    #[test]
    fn replay_ending_short_fails() {
        let mut p = PublisherSequence::new(REPLAY);
        live(&mut p, 0);
        live(&mut p, 4);
        assert_eq!(p.replayed(1, 1), vec![replayed(1)]);
        assert_eq!(
            p.replay_end(),
            vec![
                Action::ReplayFailed {
                    from: 1,
                    reason: ReplayFailure::Incomplete { missing: 2 }
                },
                clear(ClearReason::Gap),
                apply(4)
            ]
        );
    }

    #[test]
    fn empty_replay_fails() {
        let mut p = PublisherSequence::new(REPLAY);
        live(&mut p, 0);
        live(&mut p, 2);
        let out = p.replay_end();
        assert_eq!(
            out[0],
            Action::ReplayFailed {
                from: 1,
                reason: ReplayFailure::Incomplete { missing: 1 }
            }
        );
        assert_eq!(out[1..], [clear(ClearReason::Gap), apply(2)]);
    }

    #[test]
    fn timeout_and_transport_failures_clear_and_resume_at_live() {
        for reason in [ReplayFailure::Timeout, ReplayFailure::Transport] {
            let mut p = PublisherSequence::new(REPLAY);
            live(&mut p, 0);
            live(&mut p, 3);
            live(&mut p, 4);
            assert_eq!(
                p.replay_failed(reason),
                vec![
                    Action::ReplayFailed { from: 1, reason },
                    clear(ClearReason::Gap),
                    apply(3),
                    apply(4)
                ]
            );
            assert_eq!(p.replay_failed(reason), vec![]);
        }
    }

    #[test]
    fn buffer_overflow_fails_the_replay() {
        let mut p = PublisherSequence::new(REPLAY);
        live(&mut p, 0);
        live(&mut p, 2);
        live(&mut p, 3);
        live(&mut p, 4);
        assert_eq!(p.buffered(), 3);
        assert_eq!(
            live(&mut p, 5),
            vec![
                Action::ReplayFailed {
                    from: 1,
                    reason: ReplayFailure::Overflow
                },
                clear(ClearReason::Gap),
                apply(2),
                apply(3),
                apply(4),
                apply(5)
            ]
        );
    }

    #[test]
    fn restart_during_a_replay_abandons_it() {
        let mut p = PublisherSequence::new(REPLAY);
        live(&mut p, 7);
        live(&mut p, 9);
        assert_eq!(
            live(&mut p, 0),
            vec![
                Action::ReplayFailed {
                    from: 8,
                    reason: ReplayFailure::Restart
                },
                clear(ClearReason::Restart),
                apply(0)
            ]
        );
        assert_eq!(p.replayed(8, 8), vec![]);
    }

    #[test]
    fn gap_among_buffered_after_failure_asks_a_new_replay() {
        let mut p = PublisherSequence::new(REPLAY);
        live(&mut p, 0);
        live(&mut p, 2);
        live(&mut p, 4);
        let out = p.replay_failed(ReplayFailure::Timeout);
        assert_eq!(
            out[2..],
            [
                apply(2),
                Action::Gap {
                    expected: 3,
                    received: 4
                },
                Action::RequestReplay { from: 3 }
            ]
        );
        assert_eq!(p.replay_in_flight(), Some(3));
    }

    #[test]
    fn duplicate_while_buffering_is_ignored() {
        let mut p = PublisherSequence::new(REPLAY);
        live(&mut p, 0);
        live(&mut p, 2);
        assert_eq!(live(&mut p, 2), vec![Action::Duplicate { sequence: 2 }]);
        assert_eq!(p.buffered(), 1);
    }

    #[test]
    fn replies_without_a_replay_are_ignored() {
        let mut p = PublisherSequence::new(REPLAY);
        live(&mut p, 0);
        assert_eq!(p.replayed(1, 1), vec![]);
        assert_eq!(p.replay_end(), vec![]);
        assert_eq!(p.replay_failed(ReplayFailure::Timeout), vec![]);
        assert_eq!(live(&mut p, 1), vec![apply(1)]);
    }

    #[test]
    fn resume_goes_on_after_the_restored_sequence() {
        // In order and duplicate.
        let mut p = PublisherSequence::resume(REPLAY, 41);
        assert_eq!(p.last_applied(), Some(41));
        assert_eq!(live(&mut p, 41), vec![Action::Duplicate { sequence: 41 }]);
        assert_eq!(live(&mut p, 42), vec![apply(42)]);
        // Below the restored sequence: the engine restarted while the caller was down.
        let mut p = PublisherSequence::resume(REPLAY, 41);
        assert_eq!(live(&mut p, 3), vec![clear(ClearReason::Restart), apply(3)]);
        // No replay socket: what was published meanwhile is lost, the members are cleared.
        let mut p = PublisherSequence::resume(NO_REPLAY, 41);
        assert_eq!(
            live(&mut p, 45),
            vec![
                Action::Gap {
                    expected: 42,
                    received: 45
                },
                clear(ClearReason::Gap),
                apply(45)
            ]
        );
    }

    #[test]
    fn resume_fills_the_downtime_from_the_replay() {
        let mut p = PublisherSequence::resume(REPLAY, 41);
        assert_eq!(
            live(&mut p, 44),
            vec![
                Action::Gap {
                    expected: 42,
                    received: 44
                },
                Action::RequestReplay { from: 42 }
            ]
        );
        assert_eq!(p.replayed(42, 42), vec![replayed(42)]);
        assert_eq!(p.replayed(43, 43), vec![replayed(43)]);
        assert_eq!(p.replayed(44, 44), vec![replayed(44)]);
        assert_eq!(
            p.replay_end(),
            vec![
                Action::ReplayFilled { from: 42 },
                Action::Duplicate { sequence: 44 }
            ]
        );
        assert_eq!(live(&mut p, 45), vec![apply(45)]);
        // The engine restarted meanwhile and its new buffer has nothing from 42 on: the
        // replay ends empty, which does not fill the gap.
        let mut p = PublisherSequence::resume(REPLAY, 41);
        live(&mut p, 50);
        assert_eq!(
            p.replay_end()[..2],
            [
                Action::ReplayFailed {
                    from: 42,
                    reason: ReplayFailure::Incomplete { missing: 42 }
                },
                clear(ClearReason::Gap)
            ]
        );
    }

    #[test]
    fn catch_up_asks_for_the_downtime_at_once() {
        // The engine published 42..=43 while the caller was down, then went idle.
        let mut p = PublisherSequence::resume(REPLAY, 41);
        assert_eq!(p.catch_up(), vec![Action::RequestReplay { from: 42 }]);
        assert_eq!(p.catch_up(), vec![], "one replay at a time");
        assert_eq!(p.replayed(42, 42), vec![replayed(42)]);
        assert_eq!(p.replayed(43, 43), vec![replayed(43)]);
        assert_eq!(p.replay_end(), vec![Action::ReplayFilled { from: 42 }]);
        assert_eq!(live(&mut p, 44), vec![apply(44)]);
        // Nothing was published meanwhile: an empty replay fills it.
        let mut p = PublisherSequence::resume(REPLAY, 41);
        p.catch_up();
        assert_eq!(p.replay_end(), vec![Action::ReplayFilled { from: 42 }]);
        assert_eq!(live(&mut p, 42), vec![apply(42)]);
        // Live batches during the catch-up buffer behind it; the overlap is ignored.
        let mut p = PublisherSequence::resume(REPLAY, 41);
        p.catch_up();
        assert_eq!(live(&mut p, 43), vec![]);
        assert_eq!(p.replayed(42, 42), vec![replayed(42)]);
        assert_eq!(p.replayed(43, 43), vec![replayed(43)]);
        assert_eq!(
            p.replay_end(),
            vec![
                Action::ReplayFilled { from: 42 },
                Action::Duplicate { sequence: 43 }
            ]
        );
    }

    #[test]
    fn a_catch_up_sees_an_engine_restart_and_a_lost_downtime() {
        // A live batch below the restored sequence: the engine restarted meanwhile.
        let mut p = PublisherSequence::resume(REPLAY, 41);
        p.catch_up();
        assert_eq!(
            live(&mut p, 2),
            vec![
                Action::ReplayFailed {
                    from: 42,
                    reason: ReplayFailure::Restart
                },
                clear(ClearReason::Restart),
                apply(2)
            ]
        );
        // The engine's buffer no longer reaches back to 42: the downtime is lost.
        let mut p = PublisherSequence::resume(REPLAY, 41);
        p.catch_up();
        assert_eq!(
            p.replayed(50, 50)[..2],
            [
                Action::ReplayFailed {
                    from: 42,
                    reason: ReplayFailure::Incomplete { missing: 42 }
                },
                clear(ClearReason::Gap)
            ]
        );
    }

    #[test]
    fn an_unreachable_replay_socket_fails_a_catch_up_without_clearing() {
        for reason in [ReplayFailure::Timeout, ReplayFailure::Transport] {
            let mut p = PublisherSequence::resume(REPLAY, 41);
            p.catch_up();
            assert_eq!(live(&mut p, 42), vec![]);
            assert_eq!(
                p.replay_failed(reason),
                vec![Action::ReplayFailed { from: 42, reason }, apply(42)],
                "{reason:?}"
            );
            assert_eq!(p.last_applied(), Some(42));
            // A later gap asks again, as without a catch-up.
            assert_eq!(live(&mut p, 45)[1..], [Action::RequestReplay { from: 43 }]);
        }
        // Buffered batches with a gap behind a failed catch-up: a replay for the gap.
        let mut p = PublisherSequence::resume(REPLAY, 41);
        p.catch_up();
        live(&mut p, 44);
        assert_eq!(
            p.replay_failed(ReplayFailure::Timeout),
            vec![
                Action::ReplayFailed {
                    from: 42,
                    reason: ReplayFailure::Timeout
                },
                Action::Gap {
                    expected: 42,
                    received: 44
                },
                Action::RequestReplay { from: 42 }
            ]
        );
        // A gap-triggered replay that times out still clears: a gap was seen.
        let mut p = PublisherSequence::resume(REPLAY, 41);
        live(&mut p, 44);
        assert!(
            p.replay_failed(ReplayFailure::Timeout)
                .contains(&clear(ClearReason::Gap))
        );
    }

    #[test]
    fn no_catch_up_without_a_replay_socket_or_a_restored_sequence() {
        let mut p = PublisherSequence::<i64>::resume(NO_REPLAY, 41);
        assert_eq!(p.catch_up(), vec![]);
        let mut p = PublisherSequence::<i64>::new(REPLAY);
        assert_eq!(p.catch_up(), vec![]);
        let mut p = PublisherSequence::<i64>::resume(REPLAY, i64::MAX);
        assert_eq!(p.catch_up(), vec![]);
    }

    #[test]
    fn resume_at_the_extremes() {
        let mut p = PublisherSequence::resume(REPLAY, i64::MAX);
        assert_eq!(
            live(&mut p, i64::MAX),
            vec![Action::Duplicate { sequence: i64::MAX }]
        );
        assert_eq!(live(&mut p, 0), vec![clear(ClearReason::Restart), apply(0)]);
        let mut p = PublisherSequence::resume(REPLAY, i64::MIN);
        assert_eq!(live(&mut p, i64::MIN + 1), vec![apply(i64::MIN + 1)]);
    }

    #[test]
    fn extreme_sequences_do_not_overflow() {
        let mut p = PublisherSequence::new(REPLAY);
        assert_eq!(live(&mut p, i64::MAX), vec![apply(i64::MAX)]);
        assert_eq!(
            live(&mut p, i64::MAX),
            vec![Action::Duplicate { sequence: i64::MAX }]
        );
        assert_eq!(live(&mut p, 0), vec![clear(ClearReason::Restart), apply(0)]);
        assert_eq!(ClearReason::Gap.label(), "gap");
        assert_eq!(ReplayFailure::Overflow.label(), "overflow");
    }
}
