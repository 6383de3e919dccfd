//! What a run counts: per-message latency and open-loop send delay (HDR histograms), messages and
//! queries answered, errors by gRPC status code name.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use tonic::Code;

use crate::bench::stats::{latency_histogram, quantile_us};

/// The canonical gRPC name of a status code (`UNAVAILABLE`, `INVALID_ARGUMENT`, ...), the key
/// of the errors table.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// The error key of a stream answer whose id is not the id sent (never expected).
pub const ID_MISMATCH: &str = "ID_MISMATCH";

/// The error key of a health check answered with a status other than `SERVING`.
pub const NOT_SERVING: &str = "NOT_SERVING";

/// The counts and latencies of one sender (merged at the end).
#[derive(Debug)]
pub struct Tally {
    /// Latency per answered message, nanoseconds.
    pub latency: Histogram<u64>,
    /// Open loop only: per sent message, nanoseconds from its due time to when a sender sent it
    /// (the pacer thread's own lateness, the hand-off to a sender and any wait for a free sender).
    /// Part of `latency`: it tells how much of a tail the load generator itself added.
    pub send_delay: Histogram<u64>,
    /// Messages answered.
    pub messages: u64,
    /// Queries answered (messages x queries per message).
    pub queries: u64,
    /// Queries sent (answered or not).
    pub sent: u64,
    /// Failed messages by status code name.
    pub errors: BTreeMap<&'static str, u64>,
}

impl Tally {
    /// Empty.
    pub fn new() -> Self {
        Self {
            latency: latency_histogram(),
            send_delay: latency_histogram(),
            messages: 0,
            queries: 0,
            sent: 0,
            errors: BTreeMap::new(),
        }
    }

    /// Adds `other` into this one.
    pub fn merge(&mut self, other: &Tally) {
        self.latency
            .add(&other.latency)
            .expect("histograms with equal bounds merge");
        self.send_delay
            .add(&other.send_delay)
            .expect("histograms with equal bounds merge");
        self.messages += other.messages;
        self.queries += other.queries;
        self.sent += other.sent;
        for (code, n) in &other.errors {
            *self.errors.entry(code).or_default() += n;
        }
    }

    pub(crate) fn answered(&mut self, latency: Duration, queries: usize) {
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.latency.saturating_record(ns.max(1));
        self.messages += 1;
        self.queries += queries as u64;
    }

    pub(crate) fn delayed(&mut self, delay: Duration) {
        let ns = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
        self.send_delay.saturating_record(ns.max(1));
    }

    pub(crate) fn failed(&mut self, code: &'static str) {
        *self.errors.entry(code).or_default() += 1;
    }

    /// Latency at `quantile` (0..=1) in microseconds (0 when nothing was answered).
    pub fn latency_us(&self, quantile: f64) -> f64 {
        quantile_us(&self.latency, quantile)
    }

    /// Open-loop send delay at `quantile` (0..=1) in microseconds, `None` when no message was
    /// sent on a schedule (closed loop).
    pub fn send_delay_us(&self, quantile: f64) -> Option<f64> {
        (!self.send_delay.is_empty()).then(|| quantile_us(&self.send_delay, quantile))
    }
}

impl Default for Tally {
    fn default() -> Self {
        Self::new()
    }
}
