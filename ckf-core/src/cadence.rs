//! The publication cadence: when a producer cuts its pending batch of dirty buckets into a
//! publication (the rule; the producer's state actor keeps the clock and the I/O).
//!
//! After each complete command the batch is cut when `batch_threshold` buckets are dirty
//! ([`CutReason::Threshold`]), when no command is waiting ([`CutReason::Idle`], with
//! [`Cadence::cut_when_idle`]: nothing more is coming that could share the batch), or once
//! `max_delay` has passed since the first dirty bucket ([`CutReason::MaxDelay`]). The threshold
//! wins over idleness (the larger cause is the one worth counting). A barrier (a lease granted
//! to another attachment) and shutdown cut whatever is pending, whatever the cadence.
//!
//! **Backed up.** While an attachment's queue is more than half full (its reader is falling
//! behind, [`Fanout::backed_up`](crate::fanout::Fanout::backed_up)), consecutive cuts are at
//! least [`Cadence::backed_up_interval`] apart ([`Cadence::hold_until`]): a cut due earlier is
//! held, the changes keep coalescing in the pending batch (a bucket changed many times is sent
//! once), and the held batch is cut at the end of the interval. A stalled reader's queue then
//! gains at most one entry per interval once it is half full, whatever the publication rate,
//! and a reader keeping up sees at most one interval more delay. Barrier and shutdown cuts are
//! never held.
//!
//! The functions are generic over the instant type, so the caller's clock (tokio's, which tests
//! can pause, or std's) is the one used.

use std::ops::Add;
use std::time::Duration;

/// The default [`Cadence::backed_up_interval`]: a backed-up queue gains at most ten entries a
/// second, so the free half of a 1,024-entry queue lasts about 51 s.
pub const BACKED_UP_INTERVAL: Duration = Duration::from_millis(100);

/// The cadence settings (the producer's `[publication]`: `batch_threshold`, `max_delay_ms`,
/// `cut_when_idle`; the backed-up interval).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cadence {
    /// Cut a batch at this many dirty buckets.
    pub batch_threshold: usize,
    /// Cut a batch at most this long after the first dirty bucket: the bound on coalescing.
    pub max_delay: Duration,
    /// Cut a batch as soon as no command is waiting after a command (Nagle off). `false`
    /// keeps the timer cadence: only the threshold or `max_delay` cut.
    pub cut_when_idle: bool,
    /// While an attachment queue is backed up, consecutive cuts are at least this far apart
    /// ([`Cadence::hold_until`]); zero turns the rule off. Default [`BACKED_UP_INTERVAL`].
    pub backed_up_interval: Duration,
}

/// Why a publication batch was cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CutReason {
    /// No command was waiting after a command: nothing queued could join the batch.
    Idle,
    /// `batch_threshold` buckets were dirty.
    Threshold,
    /// `max_delay` passed since the first dirty bucket while commands kept coming (or, with
    /// `cut_when_idle` off, at all).
    MaxDelay,
    /// An attachment was granted a lease: the pending batch goes to the other attachments
    /// before its barrier snapshot.
    Barrier,
    /// Shutdown: the pending tail before the drain markers.
    Shutdown,
}

impl CutReason {
    /// Every reason, in label order.
    pub const ALL: [CutReason; 5] = [
        Self::Idle,
        Self::Threshold,
        Self::MaxDelay,
        Self::Barrier,
        Self::Shutdown,
    ];

    /// A short stable label (a metric's `reason`).
    pub fn label(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::Threshold => "threshold",
            Self::MaxDelay => "max_delay",
            Self::Barrier => "barrier",
            Self::Shutdown => "shutdown",
        }
    }
}

impl Cadence {
    /// After a complete command: whether `pending` dirty buckets are cut at `now`, and why
    /// (`None` keeps coalescing). `queue_empty`: no command is waiting; `deadline`: the first
    /// dirty bucket's time plus `max_delay`, when buckets are dirty. The deadline is checked
    /// here too, so a steady flow of commands that keeps a timer from firing still cuts.
    pub fn cut_reason<I: Copy + Ord>(
        &self,
        pending: usize,
        queue_empty: bool,
        deadline: Option<I>,
        now: I,
    ) -> Option<CutReason> {
        if pending == 0 {
            None
        } else if pending >= self.batch_threshold {
            Some(CutReason::Threshold)
        } else if queue_empty && self.cut_when_idle {
            Some(CutReason::Idle)
        } else if deadline.is_some_and(|d| now >= d) {
            Some(CutReason::MaxDelay)
        } else {
            None
        }
    }

    /// The backed-up rule (see the module docs): a cut due at `now` is held until the returned
    /// instant while `backed_up` and `now` is within `backed_up_interval` of `last_cut`;
    /// `None` cuts now (also with no cut yet).
    pub fn hold_until<I: Copy + Ord + Add<Duration, Output = I>>(
        &self,
        now: I,
        last_cut: Option<I>,
        backed_up: bool,
    ) -> Option<I> {
        let until = last_cut? + self.backed_up_interval;
        (backed_up && now < until).then_some(until)
    }
}

/// How long an attachment queue of `capacity` entries lasts while its reader is stalled and
/// the producer publishes as fast as it can: the first half fills at once, the rest at one
/// batch per `interval` (the backed-up rule).
pub fn backed_up_queue_lasts(capacity: usize, interval: Duration) -> Duration {
    let slow_entries = capacity - capacity / 2;
    interval * u32::try_from(slow_entries).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    fn cadence(batch_threshold: usize, cut_when_idle: bool, interval: Duration) -> Cadence {
        Cadence {
            batch_threshold,
            max_delay: Duration::from_millis(5),
            cut_when_idle,
            backed_up_interval: interval,
        }
    }

    #[test]
    fn the_threshold_wins_over_idleness_and_the_deadline_cuts_a_steady_flow() {
        let c = cadence(64, true, BACKED_UP_INTERVAL);
        let now = Instant::now();
        let due = Some(now);
        let later = Some(now + Duration::from_secs(1));
        assert_eq!(c.cut_reason(0, true, due, now), None, "nothing pending");
        assert_eq!(
            c.cut_reason(64, true, later, now),
            Some(CutReason::Threshold)
        );
        assert_eq!(c.cut_reason(1, true, later, now), Some(CutReason::Idle));
        assert_eq!(c.cut_reason(1, false, later, now), None, "commands waiting");
        assert_eq!(c.cut_reason(1, false, due, now), Some(CutReason::MaxDelay));
        let timer = cadence(64, false, BACKED_UP_INTERVAL);
        assert_eq!(timer.cut_reason(1, true, later, now), None, "idle cuts off");
        assert_eq!(
            timer.cut_reason(1, true, due, now),
            Some(CutReason::MaxDelay)
        );
    }

    #[test]
    fn a_cut_is_held_only_while_backed_up_and_inside_the_interval() {
        let interval = Duration::from_millis(100);
        let c = cadence(64, true, interval);
        let last = Instant::now();
        let soon = last + Duration::from_millis(30);
        let until = last + interval;
        assert_eq!(c.hold_until(soon, Some(last), true), Some(until));
        // Not backed up, no cut yet, or the interval over: cut now.
        assert_eq!(c.hold_until(soon, Some(last), false), None);
        assert_eq!(c.hold_until(soon, None, true), None);
        assert_eq!(c.hold_until(until, Some(last), true), None);
        // A zero interval turns the rule off.
        let off = cadence(64, true, Duration::ZERO);
        assert_eq!(off.hold_until(last, Some(last), true), None);
    }

    #[test]
    fn an_attachment_queue_outlasts_half_its_entries_at_the_backed_up_cadence() {
        let lasts = |capacity| backed_up_queue_lasts(capacity, BACKED_UP_INTERVAL);
        assert_eq!(lasts(1_024), Duration::from_millis(51_200));
        assert_eq!(lasts(64), Duration::from_millis(3_200));
        assert_eq!(lasts(3), Duration::from_millis(200));
    }

    #[test]
    fn every_reason_has_its_own_label() {
        let labels: std::collections::HashSet<_> =
            CutReason::ALL.iter().map(|r| r.label()).collect();
        assert_eq!(labels.len(), CutReason::ALL.len());
    }
}
