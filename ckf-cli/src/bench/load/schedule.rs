//! The open loop's schedule: when each message is due (`--rate`), the pacer thread that hands
//! due messages to free senders, and the messages that were due but not sent ([`NOT_SENT`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::duration::MAX_RUN;

/// When message `k` of an open-loop run is due, `interval` apart from `start`.
pub fn due_time(start: Instant, interval: Duration, k: u64) -> Instant {
    // Nanoseconds in u128: k x interval cannot overflow for any run length that ends.
    let offset = interval.as_nanos().saturating_mul(u128::from(k));
    start + Duration::from_nanos(u64::try_from(offset).unwrap_or(u64::MAX))
}

/// The time between two messages for `rate` queries/s at `per_message` queries per message.
///
/// # Errors
/// A rate that is not a positive finite number.
pub fn message_interval(rate: f64, per_message: usize) -> Result<Duration> {
    if !(rate.is_finite() && rate > 0.0) {
        bail!("--rate must be a positive number of queries per second, got {rate}");
    }
    // A rate so small that one message's interval does not fit a `Duration` (or is more than
    // a day) is a typo, not a load test: refuse it instead of panicking in the conversion.
    let interval = Duration::try_from_secs_f64(per_message as f64 / rate)
        .ok()
        .filter(|interval| *interval <= MAX_RUN)
        .with_context(|| {
            format!(
                "--rate {rate}: one message of {per_message} queries every more than a day; \
                 give a rate of at least {:.6} queries/s",
                per_message as f64 / MAX_RUN.as_secs_f64()
            )
        })?;
    // An interval that rounds to 0 ns makes every message due at the start: no message is ever
    // due after the end, so the run would never end.
    if interval.is_zero() {
        bail!(
            "--rate {rate}: more than one message of {per_message} queries per nanosecond; \
             give at most {} queries/s",
            per_message as f64 * 1e9
        );
    }
    Ok(interval)
}

/// The schedule every sender shares: which message is next and when to stop.
pub(crate) struct Schedule {
    pub(crate) next: AtomicU64,
    pub(crate) start: Instant,
    pub(crate) end: Option<Instant>,
    pub(crate) messages: Option<u64>,
    pub(crate) interval: Option<Duration>,
    pub(crate) stopped: AtomicBool,
}

impl Schedule {
    /// The next message to send and its due time (open loop), or `None` when the run is over.
    pub(crate) fn take(&self) -> Option<(u64, Option<Instant>)> {
        if self.stopped.load(Ordering::Relaxed) {
            return None;
        }
        let k = self.next.fetch_add(1, Ordering::Relaxed);
        if self.messages.is_some_and(|n| k >= n) {
            return None;
        }
        let due = self.interval.map(|i| due_time(self.start, i, k));
        let at = due.unwrap_or_else(Instant::now);
        if self.end.is_some_and(|end| at >= end) {
            return None;
        }
        Some((k, due))
    }
}

/// Sets the calling thread's timer slack to 1 ns (Linux `PR_SET_TIMERSLACK`), so its sleeps
/// end when asked rather than up to the default 50 us later (`prctl(2)`). Elsewhere, or if
/// refused, the default stays: the pacer is then that much later, which the send delay shows.
pub(crate) fn tighten_timer_slack() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument and touches no memory of ours.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
    }
}

/// The error key of the open-loop messages due before the end of the run that no sender was
/// free to send by then (the rate is above what `--concurrency` senders sustain).
pub const NOT_SENT: &str = "NOT_SENT";

/// How many messages of an open-loop run are due before `end` (`interval` apart from `start`,
/// at most `messages`): the `k` with `due_time(start, interval, k) < end`.
pub fn due_before(start: Instant, end: Instant, interval: Duration, messages: Option<u64>) -> u64 {
    let span = end.saturating_duration_since(start).as_nanos();
    let step = interval.as_nanos().max(1);
    let due = u64::try_from(span.div_ceil(step)).unwrap_or(u64::MAX);
    messages.map_or(due, |n| due.min(n))
}

/// The open-loop pacer: a thread that releases every message of `schedule` at its due time
/// into `tx` (bounded by the caller; when every sender is busy and the queue is full the pacer
/// waits, and the waiting message's latency still starts at its due time). A thread with
/// `std::thread::sleep` and not a tokio timer, whose millisecond ticks would add up to a
/// millisecond of the generator's own lateness to every latency. The thread's timer slack is
/// set to 1 ns ([`tighten_timer_slack`]). What lateness is left (measured on a 2-vCPU KVM
/// guest: p50 45 us for a 0.85 ms sleep, 140 us for 8.5 ms, mostly waking a halted vCPU) is
/// reported as the send delay ([`Tally::send_delay`]).
///
/// Returns the messages due before the end that it never released: once the end has passed,
/// a backlog sent late would stretch the run far past `--duration` (without bound for a rate
/// far above what the senders sustain), so it is counted as [`NOT_SENT`] instead.
pub(crate) fn pace(
    schedule: Arc<Schedule>,
    tx: flume::Sender<(u64, Instant)>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        tighten_timer_slack();
        while let Some((k, due)) = schedule.take() {
            let due = due.expect("an open-loop schedule has due times");
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if let (Some(end), Some(interval)) = (schedule.end, schedule.interval)
                && now >= end
            {
                return due_before(schedule.start, end, interval, schedule.messages) - k;
            }
            if tx.send((k, due)).is_err() {
                return 0;
            }
        }
        0
    })
}
