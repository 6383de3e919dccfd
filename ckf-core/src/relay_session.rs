//! The producer's half of the Relay protocol as pure rules: the terms a lease grant implies
//! ([`LeaseTerms`]), when a barrier snapshot counts as installed ([`StreamProgress`]), whether
//! this producer itself was stalled ([`StallLog`]) and how the next attach is made after a
//! session ends ([`AttachPolicy`]).
//!
//! The producer's relay session (one per configured indexer) does the I/O, the logging and the
//! metrics; every decision it acts on is taken here (`docs/design.md`, "Publication protocol"
//! and "Lane recovery and failure boundaries").
//!
//! Nothing here reads a clock: durations come in as arguments, so the tests need no runtime.

use std::collections::VecDeque;
use std::time::Duration;

use crate::failure::{Disposed, Disposition};
use crate::fanout::FrameLimits;
use crate::global::AttachMode;
use crate::publication::FenceReason;

/// Bytes reserved in every frame for the envelope (lease, sequences, field tags).
pub const FRAME_OVERHEAD_BYTES: usize = 256;
/// The smallest chunk budget, whatever the limits say.
const MIN_CHUNK_BYTES: usize = 64;

/// What an indexer's `LeaseGranted` grants, in wire terms (`0` means "no limit" / "none").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Granted {
    /// The indexer's message size limit, in bytes.
    pub max_message_bytes: u64,
    /// Most images the indexer takes in one delta.
    pub max_images_per_delta: u32,
    /// The indexer retires an attachment silent for this long, in milliseconds.
    pub heartbeat_deadline_ms: u64,
    /// The indexer takes load reports on the stream (an older one does not say so).
    pub accepts_load: bool,
}

/// This producer's own settings that bound the terms of any lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalLimits {
    /// The producer's own message size limit, in bytes.
    pub max_message_bytes: usize,
    /// Idle time before a heartbeat, before the indexer's deadline caps it.
    pub heartbeat_interval: Duration,
    /// Connect and lease-grant timeout; also the shortest per-frame send timeout.
    pub connect_timeout: Duration,
    /// Wire bytes one bucket image takes in a delta.
    pub bytes_per_image: usize,
}

/// The terms one session publishes under, derived from a grant and the local limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTerms {
    /// How the fan-out splits deltas for this attachment.
    pub limits: FrameLimits,
    /// Bytes of images per frame (snapshot chunks and deltas): half the smaller message limit
    /// less the envelope, so every frame stays well inside both sides' limits.
    pub chunk_bytes: usize,
    /// Idle time before a heartbeat: the local interval, at most a third of the deadline.
    pub heartbeat: Duration,
    /// The indexer's heartbeat deadline (`None`: it has none).
    pub deadline: Option<Duration>,
    /// How long one frame may wait for room before the session fails: the connect timeout, or
    /// the deadline when longer, so an indexer stalled for less than its deadline never costs
    /// the attachment.
    pub send_timeout: Duration,
    /// Whether load reports may be sent on the stream: only to an indexer that said it takes
    /// them (an older one would end the stream on a frame it does not know).
    pub load_reports: bool,
}

impl LeaseTerms {
    /// The terms of a session under `granted`.
    pub fn derive(granted: Granted, local: LocalLimits) -> Self {
        let indexer_limit = usize::try_from(granted.max_message_bytes).unwrap_or(usize::MAX);
        let limit = match indexer_limit {
            0 => local.max_message_bytes,
            n => n.min(local.max_message_bytes),
        };
        let chunk_bytes = (limit / 2)
            .saturating_sub(FRAME_OVERHEAD_BYTES)
            .max(MIN_CHUNK_BYTES);
        let by_bytes = (chunk_bytes / local.bytes_per_image.max(1)).max(1);
        let by_count = match granted.max_images_per_delta {
            0 => usize::MAX,
            n => n as usize,
        };
        let deadline = match granted.heartbeat_deadline_ms {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        };
        let heartbeat = deadline
            .map_or(local.heartbeat_interval, |d| {
                local.heartbeat_interval.min(d / 3)
            })
            .max(Duration::from_millis(1));
        Self {
            limits: FrameLimits {
                max_images_per_delta: by_bytes.min(by_count),
            },
            chunk_bytes,
            heartbeat,
            deadline,
            send_timeout: deadline.map_or(local.connect_timeout, |d| d.max(local.connect_timeout)),
            load_reports: granted.accepts_load,
        }
    }

    /// Whether a silence this long (the longest gap between this side's sends) outlived the
    /// indexer's deadline: the indexer must have retired the attachment for it.
    pub fn outlived(&self, silence: Duration) -> bool {
        self.deadline.is_some_and(|d| silence >= d)
    }
}

/// Gaps shorter than this are scheduling noise, not a stall.
pub const MIN_STALL: Duration = Duration::from_millis(100);
/// Stalls remembered (the most recent ones).
const STALLS_KEPT: usize = 64;

/// The recent times this process did not run at all (stopped, frozen VM, swapped out), as a
/// ticker that should have run every few milliseconds saw them: each gap and when it ended.
///
/// It tells this producer's own silence from time spent waiting for the indexer: a session
/// blocked on the indexer's flow control is not silent, and a stall that ended before a
/// session began is not that session's. Generic over the caller's clock.
#[derive(Debug, Clone)]
pub struct StallLog<I> {
    gaps: VecDeque<(I, Duration)>,
}

impl<I> Default for StallLog<I> {
    fn default() -> Self {
        Self {
            gaps: VecDeque::new(),
        }
    }
}

impl<I: Copy + Ord> StallLog<I> {
    /// The process did not run for `gap` up to `ended`. Gaps under [`MIN_STALL`] are ignored;
    /// only the most recent ones are kept.
    pub fn record(&mut self, ended: I, gap: Duration) {
        if gap < MIN_STALL {
            return;
        }
        if self.gaps.len() == STALLS_KEPT {
            self.gaps.pop_front();
        }
        self.gaps.push_back((ended, gap));
    }

    /// The longest stall that ended at or after `since` (a session's start): with
    /// [`LeaseTerms::outlived`], whether the indexer must have retired that session for this
    /// producer's own silence.
    pub fn longest_since(&self, since: I) -> Duration {
        self.gaps
            .iter()
            .filter(|(ended, _)| *ended >= since)
            .map(|(_, gap)| *gap)
            .max()
            .unwrap_or(Duration::ZERO)
    }
}

/// What an indexer's acknowledgement means for the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckEffect {
    /// The drain marker is installed: the session ends cleanly at this sequence.
    Drained(u64),
    /// The barrier snapshot is installed and the lane ready: deltas now stream.
    SnapshotInstalled(u64),
    /// Progress within the stream; nothing changes.
    Progress,
}

/// One session's stream: which barrier snapshot was sent, and whether it is installed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamProgress {
    snapshot: Option<u64>,
    streaming: bool,
}

impl StreamProgress {
    /// The barrier snapshot at `sequence` was sent.
    pub fn snapshot_sent(&mut self, sequence: u64) {
        self.snapshot = Some(sequence);
    }

    /// Whether the snapshot was installed (deltas stream).
    pub fn streaming(&self) -> bool {
        self.streaming
    }

    /// An acknowledgement of `installed` arrived. The snapshot counts as installed once the
    /// lane is ready at or past the snapshot's sequence; a drained acknowledgement ends the
    /// session whatever came before.
    pub fn on_ack(&mut self, installed: u64, ready: bool, drained: bool) -> AckEffect {
        if drained {
            return AckEffect::Drained(installed);
        }
        if ready && !self.streaming && self.snapshot.is_some_and(|s| installed >= s) {
            self.streaming = true;
            return AckEffect::SnapshotInstalled(installed);
        }
        AckEffect::Progress
    }
}

/// How a session failed, as far as the next attach is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionFailure {
    /// An `IF_VACANT` attach was refused: another live producer holds the lane.
    pub lane_occupied: bool,
    /// A lease was granted before the failure.
    pub leased: bool,
    /// The indexer retired the attachment for silence, or this side sent nothing for at least
    /// the deadline (the process was stalled).
    pub outlived_deadline: bool,
    /// How the publisher is fenced.
    pub fence: FenceReason,
    /// The snapshot was installed before the failure.
    pub was_streaming: bool,
}

/// What to do after a failed session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextAttach {
    /// The lane is still held by another live producer: nothing changed at the indexer; count
    /// a refusal and retry after the backoff, standing by.
    StillOccupied,
    /// Another attachment got a newer lease: stand by, retrying `IF_VACANT` from the first
    /// backoff step, so two producers never take the lane from each other in turn.
    StandBy,
    /// The publisher was fenced for shutdown: nothing to recover, the relay session ends.
    Stop,
    /// Fence, back off and attach again with a new lease and barrier snapshot.
    Retry {
        /// Start the backoff over (the session had reached streaming).
        reset_backoff: bool,
    },
}

/// [`AttachPolicy::after_failure`]'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// What follows.
    pub next: NextAttach,
    /// The next attach switched from `TAKEOVER` to `IF_VACANT` because this producer was silent
    /// past the deadline: a producer that took the lane meanwhile keeps it.
    pub yielded: bool,
}

/// Why a producer stands by, as its shutdown outcome reports it ([`AttachPolicy::standby`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StandbyCause {
    /// It held a lease and lost the lane to another producer (superseded, or the lane was
    /// taken while this producer was silent past the deadline).
    Superseded,
    /// It never held a lease: a hot standby (`IF_VACANT` from the start) refused all along
    /// because another live producer holds the lane.
    NeverHeld,
}

/// The attach loop's policy: the mode of the next attach, and whether this producer stands by.
///
/// A fresh start takes the lane over (unless configured as a hot standby). After a
/// supersession, or after this producer's own silence outlived the deadline, only a vacant lane
/// is taken; a granted lease ends standing by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttachPolicy {
    mode: AttachMode,
    standing_by: bool,
    /// A lease was granted in an earlier session (or a supersession said one was replaced).
    held_lease: bool,
}

impl AttachPolicy {
    /// The policy of a relay session that starts in `mode`.
    pub fn new(mode: AttachMode) -> Self {
        Self {
            mode,
            standing_by: false,
            held_lease: false,
        }
    }

    /// How the next attach is made.
    pub fn mode(&self) -> AttachMode {
        self.mode
    }

    /// Whether another live producer holds the lane (this one waits for it to be vacant).
    pub fn standing_by(&self) -> bool {
        self.standing_by
    }

    /// Why this producer stands by (`None` when it does not): it lost the lane it held, or it
    /// never held one.
    pub fn standby(&self) -> Option<StandbyCause> {
        self.standing_by.then_some(if self.held_lease {
            StandbyCause::Superseded
        } else {
            StandbyCause::NeverHeld
        })
    }

    /// Decides what follows a failed session.
    pub fn after_failure(&mut self, f: &SessionFailure) -> Decision {
        if f.lane_occupied {
            self.standing_by = true;
            return Decision {
                next: NextAttach::StillOccupied,
                yielded: false,
            };
        }
        if f.leased {
            // A lease was granted: whatever held the lane before is gone.
            self.standing_by = false;
            self.held_lease = true;
        }
        let yielded = f.outlived_deadline && self.mode == AttachMode::Takeover;
        if yielded {
            self.mode = AttachMode::IfVacant;
        }
        let next = if f.fence == FenceReason::Superseded {
            self.mode = AttachMode::IfVacant;
            self.standing_by = true;
            // Only a granted lease can be superseded.
            self.held_lease = true;
            NextAttach::StandBy
        } else {
            match f.fence.disposition() {
                Disposition::Omission => NextAttach::Stop,
                // A fenced publisher never needs more than a new lease and a barrier snapshot
                // (`crate::failure`); the stronger dispositions do not arise from a fence.
                Disposition::NewLeaseAndSnapshot
                | Disposition::RetireLane
                | Disposition::ProducerRebuild => NextAttach::Retry {
                    reset_backoff: f.was_streaming,
                },
            }
        };
        Decision { next, yielded }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCAL: LocalLimits = LocalLimits {
        max_message_bytes: 16 << 20,
        heartbeat_interval: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(5),
        bytes_per_image: 13,
    };

    #[test]
    fn terms_stay_under_the_smaller_limit_and_a_third_of_the_deadline() {
        let t = LeaseTerms::derive(
            Granted {
                max_message_bytes: 4 << 20,
                max_images_per_delta: 0,
                heartbeat_deadline_ms: 1_500,
                accepts_load: false,
            },
            LOCAL,
        );
        assert_eq!(t.chunk_bytes, (2 << 20) - FRAME_OVERHEAD_BYTES);
        assert_eq!(t.limits.max_images_per_delta, t.chunk_bytes / 13);
        assert_eq!(t.heartbeat, Duration::from_millis(500));
        assert_eq!(t.deadline, Some(Duration::from_millis(1_500)));
        // The connect timeout is longer than the deadline here.
        assert_eq!(t.send_timeout, Duration::from_secs(5));
        assert!(!t.outlived(Duration::from_millis(1_499)));
        assert!(t.outlived(Duration::from_millis(1_500)));
    }

    #[test]
    fn a_grant_without_limits_falls_back_to_the_local_ones() {
        let t = LeaseTerms::derive(Granted::default(), LOCAL);
        assert_eq!(t.chunk_bytes, (8 << 20) - FRAME_OVERHEAD_BYTES);
        assert_eq!(t.heartbeat, Duration::from_secs(1));
        assert_eq!(t.deadline, None);
        assert_eq!(t.send_timeout, LOCAL.connect_timeout);
        assert!(!t.outlived(Duration::from_secs(3_600)));
        let capped = LeaseTerms::derive(
            Granted {
                max_images_per_delta: 7,
                heartbeat_deadline_ms: 60_000,
                ..Granted::default()
            },
            LOCAL,
        );
        assert_eq!(capped.limits.max_images_per_delta, 7);
        assert_eq!(capped.send_timeout, Duration::from_secs(60));
    }

    #[test]
    fn tiny_limits_still_carry_one_image_per_frame() {
        let t = LeaseTerms::derive(
            Granted {
                max_message_bytes: 100,
                heartbeat_deadline_ms: 1,
                ..Granted::default()
            },
            LOCAL,
        );
        assert_eq!(t.chunk_bytes, MIN_CHUNK_BYTES);
        assert_eq!(t.limits.max_images_per_delta, MIN_CHUNK_BYTES / 13);
        assert_eq!(t.heartbeat, Duration::from_millis(1));
    }

    #[test]
    fn only_stalls_of_this_session_and_past_the_noise_count() {
        let mut log = StallLog::<u64>::default();
        log.record(10, Duration::from_millis(99));
        assert_eq!(log.longest_since(0), Duration::ZERO);
        log.record(20, Duration::from_secs(4));
        log.record(30, Duration::from_millis(300));
        assert_eq!(log.longest_since(0), Duration::from_secs(4));
        // A session that began after the long stall ended sees only the later one.
        assert_eq!(log.longest_since(21), Duration::from_millis(300));
        assert_eq!(log.longest_since(31), Duration::ZERO);
        // Bounded: the oldest stalls go first.
        for t in 100..100 + STALLS_KEPT as u64 {
            log.record(t, MIN_STALL);
        }
        assert_eq!(log.longest_since(0), MIN_STALL);
    }

    #[test]
    fn the_snapshot_counts_as_installed_once_ready_at_its_sequence() {
        let mut p = StreamProgress::default();
        // An acknowledgement before any snapshot was sent installs nothing.
        assert_eq!(p.on_ack(9, true, false), AckEffect::Progress);
        p.snapshot_sent(10);
        assert_eq!(p.on_ack(9, true, false), AckEffect::Progress);
        assert_eq!(p.on_ack(10, false, false), AckEffect::Progress);
        assert!(!p.streaming());
        assert_eq!(p.on_ack(10, true, false), AckEffect::SnapshotInstalled(10));
        assert!(p.streaming());
        assert_eq!(p.on_ack(11, true, false), AckEffect::Progress);
        assert_eq!(p.on_ack(12, true, true), AckEffect::Drained(12));
    }

    fn failure(fence: FenceReason) -> SessionFailure {
        SessionFailure {
            lane_occupied: false,
            leased: true,
            outlived_deadline: false,
            fence,
            was_streaming: false,
        }
    }

    #[test]
    fn a_supersession_stands_by_until_a_lease_is_granted() {
        let mut p = AttachPolicy::new(AttachMode::Takeover);
        assert_eq!(
            p.after_failure(&failure(FenceReason::Superseded)).next,
            NextAttach::StandBy
        );
        assert_eq!((p.mode(), p.standing_by()), (AttachMode::IfVacant, true));
        let occupied = SessionFailure {
            lane_occupied: true,
            leased: false,
            ..failure(FenceReason::UncertainDelivery)
        };
        assert_eq!(p.after_failure(&occupied).next, NextAttach::StillOccupied);
        assert!(p.standing_by());
        let granted_then_lost = SessionFailure {
            was_streaming: true,
            ..failure(FenceReason::UncertainDelivery)
        };
        assert_eq!(
            p.after_failure(&granted_then_lost),
            Decision {
                next: NextAttach::Retry {
                    reset_backoff: true
                },
                yielded: false
            }
        );
        // The lane stays IF_VACANT once superseded: the newest producer wins.
        assert_eq!((p.mode(), p.standing_by()), (AttachMode::IfVacant, false));
    }

    #[test]
    fn a_silence_past_the_deadline_yields_the_lane_once() {
        let mut p = AttachPolicy::new(AttachMode::Takeover);
        let stalled = SessionFailure {
            outlived_deadline: true,
            ..failure(FenceReason::UncertainDelivery)
        };
        let retry = NextAttach::Retry {
            reset_backoff: false,
        };
        assert_eq!(
            p.after_failure(&stalled),
            Decision {
                next: retry,
                yielded: true
            }
        );
        assert_eq!(p.mode(), AttachMode::IfVacant);
        // Already IF_VACANT: nothing more to yield.
        assert_eq!(
            p.after_failure(&stalled),
            Decision {
                next: retry,
                yielded: false
            }
        );
        // A stalled producer that finds itself superseded yields and stands by.
        let mut q = AttachPolicy::new(AttachMode::Takeover);
        let superseded = SessionFailure {
            outlived_deadline: true,
            ..failure(FenceReason::Superseded)
        };
        assert_eq!(
            q.after_failure(&superseded),
            Decision {
                next: NextAttach::StandBy,
                yielded: true
            }
        );
    }

    #[test]
    fn a_hot_standby_refused_from_the_start_never_held_the_lane() {
        let refused = SessionFailure {
            lane_occupied: true,
            leased: false,
            ..failure(FenceReason::UncertainDelivery)
        };
        let mut hot = AttachPolicy::new(AttachMode::IfVacant);
        assert_eq!(hot.standby(), None);
        hot.after_failure(&refused);
        hot.after_failure(&refused);
        assert_eq!(hot.standby(), Some(StandbyCause::NeverHeld));
        // Once granted a lease and then superseded, it lost a lane it held.
        hot.after_failure(&failure(FenceReason::UncertainDelivery));
        assert_eq!(hot.standby(), None);
        hot.after_failure(&failure(FenceReason::Superseded));
        hot.after_failure(&refused);
        assert_eq!(hot.standby(), Some(StandbyCause::Superseded));

        // A takeover producer superseded, then refused: superseded.
        let mut p = AttachPolicy::new(AttachMode::Takeover);
        p.after_failure(&failure(FenceReason::Superseded));
        assert_eq!(p.standby(), Some(StandbyCause::Superseded));
        p.after_failure(&refused);
        assert_eq!(p.standby(), Some(StandbyCause::Superseded));
        // One silent past the deadline whose lane was taken meanwhile: it held it, superseded.
        let mut q = AttachPolicy::new(AttachMode::Takeover);
        q.after_failure(&SessionFailure {
            outlived_deadline: true,
            ..failure(FenceReason::UncertainDelivery)
        });
        q.after_failure(&refused);
        assert_eq!(q.standby(), Some(StandbyCause::Superseded));
    }

    #[test]
    fn a_shutdown_fence_stops_and_a_hot_standby_starts_if_vacant() {
        let mut p = AttachPolicy::new(AttachMode::IfVacant);
        assert_eq!(p.mode(), AttachMode::IfVacant);
        assert_eq!(
            p.after_failure(&failure(FenceReason::Shutdown)).next,
            NextAttach::Stop
        );
    }
}
