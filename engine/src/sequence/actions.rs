//! What the sequence rule tells its caller: the actions to execute or count, and the reasons
//! and causes they carry (labels for metrics).

/// Why the publisher's members are cleared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClearReason {
    /// Batches were lost and no replay could supply them.
    Gap,
    /// A new process: the sequence went backwards, or repeated with another identity.
    Restart,
    /// The publisher was uncertain (a reconnection, a restored sequence, a gap) and its replay
    /// could not confirm the last batch applied.
    Unverified,
}

impl ClearReason {
    /// A short stable label for metrics: `"gap"`, `"restart"` or `"unverified"`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Gap => "gap",
            Self::Restart => "restart",
            Self::Unverified => "unverified",
        }
    }
}

/// What made a publisher uncertain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Uncertainty {
    /// The first connection, with nothing applied before: re-read the engine's buffer.
    FirstContact,
    /// The first connection after the caller restored `last` from its journal.
    Restored,
    /// The connection dropped and came back.
    Reconnect,
    /// The sequence went below the last applied one.
    Backwards,
    /// The last applied sequence came again with another identity.
    Repeat,
    /// Nothing arrived for a while: the connection may be dead while it looks open (a crashed
    /// host, a partition), and the engine may have restarted behind it.
    Idle,
}

impl Uncertainty {
    /// A short stable label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Self::FirstContact => "first_contact",
            Self::Restored => "restored",
            Self::Reconnect => "reconnect",
            Self::Backwards => "backwards",
            Self::Repeat => "repeat",
            Self::Idle => "idle",
        }
    }
}

/// What a replay request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReplayKind {
    /// From the last applied sequence: confirm it, then fill what follows.
    Verify,
    /// From 0: everything the engine's buffer holds, applied from its first batch.
    Reread,
}

impl ReplayKind {
    /// A short stable label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Verify => "verify",
            Self::Reread => "reread",
        }
    }
}

/// Why a replay ended without doing its job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReplayFailure {
    /// The replay skipped sequence `missing` (the engine's buffer no longer holds it), or
    /// ended before the buffered live batches continued the sequence.
    Incomplete {
        /// The first sequence still missing.
        missing: i64,
    },
    /// The replay did not start with the last applied batch and its identity.
    Unverified,
    /// More live batches arrived than `max_buffered_batches` while the replay ran.
    Overflow,
    /// The caller's deadline passed (reported through [`PublisherSequence::replay_failed`](crate::sequence::PublisherSequence::replay_failed)).
    Timeout,
    /// The replay socket failed (connect, send or receive; reported by the caller).
    Transport,
    /// The engine restarted while the replay ran.
    Restart,
    /// The live connection dropped or came back while the replay ran.
    Disconnected,
}

impl ReplayFailure {
    /// A short stable label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Incomplete { .. } => "incomplete",
            Self::Unverified => "unverified",
            Self::Overflow => "overflow",
            Self::Timeout => "timeout",
            Self::Transport => "transport",
            Self::Restart => "restart",
            Self::Disconnected => "disconnected",
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
    /// A live batch the replay, asked after it arrived, did not return: not the verified
    /// process's (a stray publisher); dropped.
    Foreign {
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
    /// The publisher became uncertain (counted and logged once per episode); what to do
    /// about it follows.
    Uncertain {
        /// Why.
        cause: Uncertainty,
    },
    /// Send a replay request for every batch from `from` on; deliver its batches with
    /// [`PublisherSequence::replayed`](crate::sequence::PublisherSequence::replayed) and its end with [`PublisherSequence::replay_end`](crate::sequence::PublisherSequence::replay_end).
    /// Replaces any replay in flight.
    RequestReplay {
        /// The first sequence wanted.
        from: i64,
        /// Verify from the last applied batch, or re-read from 0.
        kind: ReplayKind,
    },
    /// The replay showed the last applied batch unchanged: nothing applied was lost.
    Verified {
        /// The sequence confirmed.
        sequence: i64,
    },
    /// The replay started for `from` did its job; the caller may stop its replay I/O.
    ReplayFilled {
        /// The first sequence requested.
        from: i64,
    },
    /// The replay started for `from` failed; the caller stops its replay I/O (later replies
    /// are ignored anyway). A clear or a new request follows.
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
