//! Rate limits for log lines an untrusted peer can trigger at will (refused requests, bad
//! frames): at most one line per interval, the rest counted and reported in the next line, so
//! a flood of refusals costs a counter increment each instead of a log write (the metrics
//! still count every one).

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Default interval of refusal log lines: one per this many seconds per call site.
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// One log call site's rate limit; share it (e.g. in an `Arc` or a `static`) between the
/// tasks that log there.
#[derive(Debug)]
pub struct LogThrottle {
    every: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    last: Option<Instant>,
    suppressed: u64,
}

impl LogThrottle {
    /// At most one line per `every`.
    pub const fn new(every: Duration) -> Self {
        Self {
            every,
            state: Mutex::new(State {
                last: None,
                suppressed: 0,
            }),
        }
    }

    /// `Some(n)` when a line may be logged now, `n` being the lines suppressed since the last
    /// one (report it in the line); `None` (and counted) otherwise.
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    fn admit_at(&self, now: Instant) -> Option<u64> {
        let mut st = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if st
            .last
            .is_some_and(|t| now.saturating_duration_since(t) < self.every)
        {
            st.suppressed += 1;
            return None;
        }
        st.last = Some(now);
        Some(std::mem::take(&mut st.suppressed))
    }
}

impl Default for LogThrottle {
    /// [`REFUSAL_LOG_INTERVAL`].
    fn default() -> Self {
        Self::new(REFUSAL_LOG_INTERVAL)
    }
}

/// The remote address of a gRPC request (`ip:port`, behind TLS too), or `unknown` when the
/// transport has none (in-process channels, Unix sockets).
pub fn peer_addr<T>(request: &tonic::Request<T>) -> String {
    request
        .remote_addr()
        .map_or_else(|| "unknown".to_owned(), |a| a.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_reports_the_suppressed_count() {
        let throttle = LogThrottle::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(throttle.admit_at(t0), Some(0));
        for i in 1..=5 {
            assert_eq!(throttle.admit_at(t0 + Duration::from_secs(i)), None);
        }
        assert_eq!(throttle.admit_at(t0 + Duration::from_secs(10)), Some(5));
        assert_eq!(throttle.admit_at(t0 + Duration::from_secs(11)), None);
        assert_eq!(throttle.admit_at(t0 + Duration::from_secs(25)), Some(1));
    }

    #[test]
    fn peer_addr_is_unknown_without_a_transport() {
        assert_eq!(peer_addr(&tonic::Request::new(())), "unknown");
    }
}
