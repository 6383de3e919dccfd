//! Per publisher socket: which batch to apply, which to ignore, when to ask the replay socket,
//! and when the publisher's members must be cleared, so that the members converge on what the
//! engine really caches after every ordinary fleet event (an engine restart, a dropped
//! connection, a producer that starts late or restarts).
//!
//! An engine's `ZmqEventPublisher` numbers its batches `0, 1, 2, ...` per PUB socket (one per
//! data-parallel rank) and keeps the newest ones (vLLM: 10,000 by default) in a replay buffer
//! behind a ROUTER socket that answers "everything from sequence `s` on", then an end marker.
//! A SUB socket loses batches silently (slow joiner, reconnect, high-water mark), and a
//! restarted engine numbers from 0 again with an empty cache. [`PublisherSequence`] turns
//! what the sockets delivered into [`Action`]s, with no clock and no socket (the caller owns
//! both and reports the connection's drops and returns).
//!
//! # The rule
//!
//! The members fed since their last clear must reflect one unbroken run of one publisher
//! process's batches. Anything that may break the run makes the publisher **uncertain**
//! ([`Action::Uncertain`], counted by [`Uncertainty`]); an uncertain publisher is checked
//! against its replay buffer, and what cannot be checked is cleared, never kept on faith.
//!
//! - **In order** (`last + 1`): apply. **Duplicate** (`last` with the same identity, or no
//!   identity to compare): ignore.
//! - **Restart**: a sequence below `last`, or `last` again with another identity
//!   ([`PublisherSequence::live`] takes each batch's identity: a digest of its content, which
//!   the replay repeats byte for byte): a new process. Clear ([`ClearReason::Restart`]) and
//!   **re-read** its replay buffer from sequence 0.
//! - **Gap** (above `last + 1`): **verify and fill**: ask the replay socket for everything from
//!   `last` on. Its first batch must be `last` with the identity applied; then the missing
//!   batches follow in order, then the live batches buffered meanwhile (overlap ignored). A
//!   hole in what the replay sends (the buffer no longer holds the batch) is handled as in a
//!   re-read.
//! - **Connection** ([`PublisherSequence::connected`]: the SUB socket connected, or reconnected
//!   after [`PublisherSequence::disconnected`]): batches may have been lost and the process
//!   may have changed. With nothing applied yet (**first contact**, a producer that starts
//!   after its engines) re-read from 0, so all the engine's buffer still holds is indexed; else
//!   verify from `last` (the restored sequence after a producer restart, [`Uncertainty::Restored`]).
//! - **Verification fails** (the replay's first batch is not `last`, or not with its identity,
//!   or the replay is empty): the process changed or the batch left its buffer. Clear
//!   ([`ClearReason::Unverified`]) and re-read from 0. Live batches buffered during the
//!   verification are dropped: the re-read returns them.
//! - **A re-read** applies the replay's first batch whatever its sequence, then each next one;
//!   a hole in the buffer clears again ([`ClearReason::Gap`]) and the run restarts after it.
//!   After a re-read that found the buffer empty (and no live batch held), a first live batch
//!   other than sequence 0 (engines number from 0) shows lost batches: re-read again; live
//!   batches a re-read does not return start the run themselves.
//!   What left the engine's buffer before the re-read stays unknown until the engine stores it
//!   again (its removals of such blocks are no-ops, its children orphans).
//! - **Replay end**: the held live batches follow (overlap ignored). One that had arrived
//!   before the request but that a replay returning batches did not return is **foreign** (the
//!   engine buffers a batch before it answers the next replay request): dropped
//!   ([`Action::Foreign`]), so a stray publisher on a bound endpoint cannot replace the
//!   members. A later one with a gap is a gap as usual.
//! - **Idle** ([`PublisherSequence::idle`], called by the caller after a quiet interval): verify
//!   `last` again. A connection can look open while its peer is gone (a crashed host, a
//!   partition): an engine restarted behind it fails the verification, a gone one times out.
//! - **A replay that fails** (times out, the socket fails, or more than `max_buffered_batches`
//!   arrive meanwhile): clear (the verification's [`ClearReason::Unverified`], else
//!   [`ClearReason::Gap`]) and resume at the oldest buffered live batch as a first batch. The
//!   publisher is then **unsettled** (what the engine held before the failure is missing) until
//!   a re-read completes: the next idle check or connection clears again and re-reads the
//!   buffer instead of verifying (the caller also calls [`PublisherSequence::idle`] a while
//!   after a failed replay, so a busy engine that is never idle is re-read too).
//! - **No replay socket**: nothing can be verified. A gap clears and applies; a restart clears
//!   and applies the new process's batch; a (re)connection clears what was applied before it.
//!
//! Between [`PublisherSequence::disconnected`] and the next connection, live batches buffer;
//! a live batch before the connection is reported (the monitor event may trail the data) starts
//! the verification at once, and the connection then reported is taken as that one.
//!
//! Clearing then applying an unbroken run is always sound: the members then hold a subset of
//! the engine's cache (blocks stored before the run are missing; removals of them are
//! no-ops; stores whose parent is missing are orphans). Only a restart the caller cannot see
//! at all (no connection event, no idle check, and the new process's first delivered batch is
//! exactly `last + 1`) goes unnoticed.

use std::collections::VecDeque;

mod actions;
pub use actions::{Action, ClearReason, ReplayFailure, ReplayKind, Uncertainty};

/// Limits and capabilities of one publisher socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SequenceConfig {
    /// Live batches buffered while a replay runs (or a connection is awaited); one more fails
    /// the replay ([`ReplayFailure::Overflow`]). 0 disables replay like
    /// `replay_available = false`.
    pub max_buffered_batches: usize,
    /// Whether the publisher has a replay socket.
    pub replay_available: bool,
}

impl SequenceConfig {
    fn replays(&self) -> bool {
        self.replay_available && self.max_buffered_batches > 0
    }
}

/// A batch's sequence with its identity (`None`: unknown, e.g. restored from an older checkpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mark {
    sequence: i64,
    identity: Option<u64>,
}

impl Mark {
    /// Whether `other` is provably another batch under the same sequence.
    fn differs(&self, identity: Option<u64>) -> bool {
        matches!((self.identity, identity), (Some(a), Some(b)) if a != b)
    }
}

/// Where a window stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// No request yet: waiting for the connection (after [`PublisherSequence::disconnected`],
    /// or before the first connection).
    Awaiting,
    /// Requested from `at.sequence`; its first batch must be `at`.
    Verify { at: Mark },
    /// `at` verified: the next batches must follow the last applied one.
    Fill { at: Mark },
    /// Requested from 0; `started` once its first batch was applied.
    Reread { started: bool },
}

/// Live batches held back while a replay runs or a connection is awaited.
#[derive(Debug)]
struct Window<T> {
    phase: Phase,
    /// The first sequence requested (0 while awaiting).
    from: i64,
    buffered: VecDeque<(Mark, T)>,
    /// How many of `buffered` had arrived when the replay was requested: the engine had
    /// buffered them by then, so a replay that returns batches returns them too.
    before_request: usize,
}

/// The sequence state of one publisher socket (see the module docs). `T` is the caller's
/// batch (decoded or not); this type only moves it.
#[derive(Debug)]
pub struct PublisherSequence<T> {
    config: SequenceConfig,
    /// The last batch applied since the last clear; `None` before the first.
    last: Option<Mark>,
    window: Option<Window<T>>,
    /// Whether `last` was restored by [`PublisherSequence::resume`] and no connection was
    /// reported since.
    restored: bool,
    /// Whether a connection was seen (reported, or shown by a live batch) since the start.
    contacted: bool,
    /// The verification in flight was started by a live batch before the connection was
    /// reported: the next [`PublisherSequence::connected`] is that connection.
    early: bool,
    /// A re-read found the engine's buffer empty and nothing was applied since: the engine's
    /// next batch is its sequence 0, and any other first batch means batches were lost.
    empty: bool,
    /// A replay failed and cleared the members, and no re-read has completed since: what the
    /// engine held before is missing. The next check (idle, connection) re-reads the buffer.
    unsettled: bool,
}

impl<T> PublisherSequence<T> {
    /// A publisher that has sent nothing yet: the first connection re-reads its buffer.
    pub fn new(config: SequenceConfig) -> Self {
        Self {
            config,
            last: None,
            window: Some(Window::awaiting()),
            restored: false,
            contacted: false,
            early: false,
            empty: false,
            unsettled: false,
        }
    }

    /// A publisher whose batches up to `sequence` (with `identity`, `None` when unknown) were
    /// applied before, by an earlier run of the caller (a producer restored from its journal).
    /// The first connection verifies it ([`Uncertainty::Restored`]): the replay confirms it
    /// and fills what the engine published meanwhile, or the members are cleared and the
    /// buffer re-read (an unknown identity never verifies).
    pub fn resume(config: SequenceConfig, sequence: i64, identity: Option<u64>) -> Self {
        Self {
            last: Some(Mark { sequence, identity }),
            restored: true,
            ..Self::new(config)
        }
    }

    /// The last sequence applied since the last clear, if any.
    pub fn last_applied(&self) -> Option<i64> {
        self.last.map(|m| m.sequence)
    }

    /// Whether a replay failed and no re-read has completed since (see the module docs): the
    /// caller calls [`PublisherSequence::idle`] again after a while, quiet or not.
    pub fn unsettled(&self) -> bool {
        self.unsettled
    }

    /// The first sequence of the replay in flight, if one is.
    pub fn replay_in_flight(&self) -> Option<i64> {
        self.window
            .as_ref()
            .filter(|w| w.phase != Phase::Awaiting)
            .map(|w| w.from)
    }

    /// Live batches held back (behind a replay, or awaiting the connection).
    pub fn buffered(&self) -> usize {
        self.window.as_ref().map_or(0, |w| w.buffered.len())
    }

    /// The live socket connected (the first time, or again after a drop): start checking
    /// what may have changed (see the module docs). A connection already shown by a live
    /// batch is not checked twice.
    pub fn connected(&mut self) -> Vec<Action<T>> {
        let mut out = Vec::new();
        if std::mem::take(&mut self.early) {
            return out;
        }
        self.abandon(&mut out);
        self.start(&mut out);
        out
    }

    /// The live socket lost its connection: the replay in flight is abandoned (its buffered
    /// batches too: the check at the next connection covers them), and live batches are held
    /// until the connection is back.
    pub fn disconnected(&mut self) -> Vec<Action<T>> {
        let mut out = Vec::new();
        self.early = false;
        self.abandon(&mut out);
        self.window = Some(Window::awaiting());
        out
    }

    /// Nothing arrived on the live socket for the caller's idle interval: verify the last
    /// applied batch through the replay socket ([`Uncertainty::Idle`]); an engine that
    /// restarted behind a connection that never dropped fails it, one that is gone times it
    /// out (both clear). Still disconnected after the interval: what was applied is cleared
    /// (the engine may be gone with its cache; the next connection re-reads its buffer). No
    /// action with a replay in flight, nothing applied, or (connected) no replay socket.
    pub fn idle(&mut self) -> Vec<Action<T>> {
        let mut out = Vec::new();
        if self
            .window
            .as_ref()
            .is_some_and(|w| w.phase == Phase::Awaiting)
        {
            // Disconnected for the whole interval: the engine (and its cache) may be gone;
            // nothing can be verified, so what was applied is cleared (re-read when it is
            // back).
            if self.last.take().is_some() {
                out.push(Action::Uncertain {
                    cause: Uncertainty::Idle,
                });
                out.push(Action::ClearMembers {
                    reason: ClearReason::Unverified,
                });
            }
            return out;
        }
        if self.window.is_some() || !self.config.replays() {
            return out;
        }
        if self.unsettled {
            out.push(Action::Uncertain {
                cause: Uncertainty::Idle,
            });
            self.settle(&mut out);
        } else if let Some(at) = self.last {
            out.push(Action::Uncertain {
                cause: Uncertainty::Idle,
            });
            self.request(Phase::Verify { at }, at.sequence, VecDeque::new(), &mut out);
        }
        out
    }

    /// A batch from the live (SUB) socket, with its identity.
    pub fn live(&mut self, sequence: i64, identity: Option<u64>, batch: T) -> Vec<Action<T>> {
        let mut out = Vec::new();
        self.push_live(Mark { sequence, identity }, batch, &mut out);
        out
    }

    /// A batch from the replay socket, with its identity. Ignored (no action) when no replay
    /// is in flight.
    pub fn replayed(&mut self, sequence: i64, identity: Option<u64>, batch: T) -> Vec<Action<T>> {
        let mut out = Vec::new();
        let Some(phase) = self.window.as_ref().map(|w| w.phase) else {
            return out;
        };
        let mark = Mark { sequence, identity };
        match phase {
            Phase::Awaiting => {}
            Phase::Verify { at } => {
                if sequence < at.sequence {
                    out.push(Action::Duplicate { sequence });
                } else if sequence == at.sequence && identity.is_some() && identity == at.identity {
                    self.set_phase(Phase::Fill { at });
                    out.push(Action::Verified { sequence });
                } else {
                    self.unverified(&mut out);
                }
            }
            Phase::Reread { started: false } => {
                self.set_phase(Phase::Reread { started: true });
                self.apply(mark, batch, true, &mut out);
            }
            Phase::Fill { .. } | Phase::Reread { started: true } => match self.last {
                Some(last) if sequence <= last.sequence => {
                    out.push(Action::Duplicate { sequence });
                }
                Some(last) if last.sequence.checked_add(1) == Some(sequence) => {
                    self.apply(mark, batch, true, &mut out);
                }
                last => {
                    // A hole in the engine's buffer: what it held is unknown; start again
                    // after it, as a re-read.
                    self.set_phase(Phase::Reread { started: true });
                    out.push(Action::Gap {
                        expected: last.map_or(sequence, |l| l.sequence.saturating_add(1)),
                        received: sequence,
                    });
                    out.push(Action::ClearMembers {
                        reason: ClearReason::Gap,
                    });
                    self.apply(mark, batch, true, &mut out);
                }
            },
        }
        out
    }

    /// The replay's end marker: a verification that saw nothing fails; otherwise the buffered
    /// live batches follow (overlap ignored). When they do not continue the sequence, the
    /// replay failed.
    pub fn replay_end(&mut self) -> Vec<Action<T>> {
        let mut out = Vec::new();
        let Some(window) = &self.window else {
            return out;
        };
        // Whether the engine's buffer answered with batches: then it held every live batch
        // that had arrived before the request, and one it did not return is foreign.
        let answered = match window.phase {
            Phase::Awaiting => return out,
            Phase::Verify { .. } => {
                self.unverified(&mut out);
                return out;
            }
            Phase::Fill { .. } | Phase::Reread { started: true } => true,
            Phase::Reread { started: false } => false,
        };
        let window = self.window.take().expect("checked above");
        if matches!(window.phase, Phase::Reread { .. }) {
            self.unsettled = false;
        }
        out.push(Action::ReplayFilled { from: window.from });
        // Nothing in the engine's buffer and nothing held: the engine's next batch is its
        // first. Held live batches an empty buffer did not return are the best there is: they
        // start the run (asking again would not end).
        self.empty = self.last.is_none() && window.buffered.is_empty();
        for (i, (mark, batch)) in window.buffered.into_iter().enumerate() {
            if self.last.is_some_and(|l| mark.sequence < l.sequence) {
                // Also replayed: the overlap is ignored.
                out.push(Action::Duplicate {
                    sequence: mark.sequence,
                });
            } else if answered
                && i < window.before_request
                && self.last.is_some_and(|l| mark.sequence > l.sequence)
            {
                // Received before the request, yet not in the engine's buffer: not this
                // process's batch (a stray publisher on a bound endpoint).
                out.push(Action::Foreign {
                    sequence: mark.sequence,
                });
            } else {
                self.push_live(mark, batch, &mut out);
            }
        }
        out
    }

    /// The caller gave up on the replay in flight (`Timeout`, `Transport`). Ignored when no
    /// replay is in flight.
    pub fn replay_failed(&mut self, reason: ReplayFailure) -> Vec<Action<T>> {
        let mut out = Vec::new();
        if self.replay_in_flight().is_some() {
            self.fail(reason, &mut out);
        }
        out
    }

    fn push_live(&mut self, mark: Mark, batch: T, out: &mut Vec<Action<T>>) {
        if let Some(window) = &mut self.window {
            let reference = match window.phase {
                Phase::Awaiting => {
                    // The connection is up (its report may trail the data): check it now.
                    self.window = None;
                    self.start(out);
                    self.early = true;
                    return self.push_live(mark, batch, out);
                }
                Phase::Verify { at } | Phase::Fill { at } => Some(at),
                Phase::Reread { .. } => None,
            };
            // Live batches of one process arrive in order, none below the replay's start.
            if let Some(newest) = window.buffered.back().map(|(m, _)| *m).or(reference) {
                if mark.sequence < newest.sequence {
                    return self.restart(Uncertainty::Backwards, mark, batch, out);
                }
                if mark.sequence == newest.sequence {
                    if newest.differs(mark.identity) {
                        return self.restart(Uncertainty::Repeat, mark, batch, out);
                    }
                    out.push(Action::Duplicate {
                        sequence: mark.sequence,
                    });
                    return;
                }
            }
            if window.buffered.len() >= self.config.max_buffered_batches {
                self.fail(ReplayFailure::Overflow, out);
                return self.push_live(mark, batch, out);
            }
            window.buffered.push_back((mark, batch));
            return;
        }
        let Some(last) = self.last else {
            if std::mem::take(&mut self.empty) && mark.sequence != 0 && self.config.replays() {
                // Published after the empty re-read, and not the engine's first batch.
                out.push(Action::Gap {
                    expected: 0,
                    received: mark.sequence,
                });
                return self.reread(VecDeque::from([(mark, batch)]), out);
            }
            return self.apply(mark, batch, false, out);
        };
        let sequence = mark.sequence;
        match last.sequence.checked_add(1) {
            Some(next) if sequence == next => self.apply(mark, batch, false, out),
            _ if sequence == last.sequence => {
                if last.differs(mark.identity) {
                    self.restart(Uncertainty::Repeat, mark, batch, out);
                } else {
                    out.push(Action::Duplicate { sequence });
                }
            }
            _ if sequence < last.sequence => self.restart(Uncertainty::Backwards, mark, batch, out),
            Some(next) => {
                out.push(Action::Gap {
                    expected: next,
                    received: sequence,
                });
                if self.config.replays() {
                    let buffered = VecDeque::from([(mark, batch)]);
                    self.request(Phase::Verify { at: last }, last.sequence, buffered, out);
                } else {
                    out.push(Action::ClearMembers {
                        reason: ClearReason::Gap,
                    });
                    self.apply(mark, batch, false, out);
                }
            }
            // `last == i64::MAX` and a larger sequence cannot exist.
            None => unreachable!("no i64 is above i64::MAX"),
        }
    }

    /// Starts the check of a connection: verify `last`, or re-read from 0 with nothing
    /// applied; without a replay socket, clear what was applied before it.
    fn start(&mut self, out: &mut Vec<Action<T>>) {
        let cause = if self.restored {
            Uncertainty::Restored
        } else if !self.contacted && self.last.is_none() {
            Uncertainty::FirstContact
        } else {
            Uncertainty::Reconnect
        };
        self.restored = false;
        self.contacted = true;
        self.window = None;
        out.push(Action::Uncertain { cause });
        if !self.config.replays() {
            if self.last.take().is_some() {
                out.push(Action::ClearMembers {
                    reason: ClearReason::Unverified,
                });
            }
            return;
        }
        match self.last {
            _ if self.unsettled => self.settle(out),
            Some(at) => self.request(Phase::Verify { at }, at.sequence, VecDeque::new(), out),
            None => self.reread(VecDeque::new(), out),
        }
    }

    /// After a failed replay: clear what was applied since (if anything) and re-read the
    /// buffer, so what the engine held before the failure is indexed again.
    fn settle(&mut self, out: &mut Vec<Action<T>>) {
        if self.last.take().is_some() {
            out.push(Action::ClearMembers {
                reason: ClearReason::Unverified,
            });
        }
        self.reread(VecDeque::new(), out);
    }

    /// A new process: clear, then re-read its buffer (holding `batch` behind the replay), or
    /// apply `batch` as its first without a replay socket.
    fn restart(&mut self, cause: Uncertainty, mark: Mark, batch: T, out: &mut Vec<Action<T>>) {
        if let Some(from) = self.replay_in_flight() {
            out.push(Action::ReplayFailed {
                from,
                reason: ReplayFailure::Restart,
            });
        }
        self.window = None;
        out.push(Action::Uncertain { cause });
        out.push(Action::ClearMembers {
            reason: ClearReason::Restart,
        });
        self.last = None;
        if self.config.replays() {
            self.reread(VecDeque::from([(mark, batch)]), out);
        } else {
            self.apply(mark, batch, false, out);
        }
    }

    /// The verification failed: clear and re-read. The buffered live batches are dropped: the
    /// re-read returns them.
    fn unverified(&mut self, out: &mut Vec<Action<T>>) {
        let Some(window) = self.window.take() else {
            return;
        };
        out.push(Action::ReplayFailed {
            from: window.from,
            reason: ReplayFailure::Unverified,
        });
        out.push(Action::ClearMembers {
            reason: ClearReason::Unverified,
        });
        self.last = None;
        self.reread(VecDeque::new(), out);
    }

    fn reread(&mut self, buffered: VecDeque<(Mark, T)>, out: &mut Vec<Action<T>>) {
        self.request(Phase::Reread { started: false }, 0, buffered, out);
    }

    fn request(
        &mut self,
        phase: Phase,
        from: i64,
        buffered: VecDeque<(Mark, T)>,
        out: &mut Vec<Action<T>>,
    ) {
        let kind = match phase {
            Phase::Reread { .. } => ReplayKind::Reread,
            _ => ReplayKind::Verify,
        };
        out.push(Action::RequestReplay { from, kind });
        let before_request = buffered.len();
        self.window = Some(Window {
            phase,
            from,
            buffered,
            before_request,
        });
    }

    fn set_phase(&mut self, phase: Phase) {
        if let Some(window) = &mut self.window {
            window.phase = phase;
        }
    }

    /// Drops the window (a replay in flight is reported failed: the connection changed).
    fn abandon(&mut self, out: &mut Vec<Action<T>>) {
        if let Some(from) = self.replay_in_flight() {
            out.push(Action::ReplayFailed {
                from,
                reason: ReplayFailure::Disconnected,
            });
        }
        self.window = None;
    }

    fn apply(&mut self, mark: Mark, batch: T, replayed: bool, out: &mut Vec<Action<T>>) {
        self.last = Some(mark);
        self.empty = false;
        out.push(Action::Apply {
            sequence: mark.sequence,
            batch,
            replayed,
        });
    }

    /// Ends the replay in flight as failed: clear, then resume at the oldest buffered batch
    /// as a first batch (the rest follow through the live rule, so a further gap in them asks
    /// for a new replay).
    fn fail(&mut self, reason: ReplayFailure, out: &mut Vec<Action<T>>) {
        let Some(window) = self.window.take() else {
            return;
        };
        out.push(Action::ReplayFailed {
            from: window.from,
            reason,
        });
        out.push(Action::ClearMembers {
            reason: match window.phase {
                Phase::Verify { .. } => ClearReason::Unverified,
                _ => ClearReason::Gap,
            },
        });
        self.last = None;
        self.unsettled = true;
        for (mark, batch) in window.buffered {
            self.push_live(mark, batch, out);
        }
    }
}

impl<T> Window<T> {
    fn awaiting() -> Self {
        Self {
            phase: Phase::Awaiting,
            from: 0,
            buffered: VecDeque::new(),
            before_request: 0,
        }
    }
}

#[cfg(test)]
mod tests;
