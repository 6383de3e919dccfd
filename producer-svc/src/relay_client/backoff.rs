//! Bounded exponential reconnect backoff with jitter.
//!
//! Delays start at `initial`, double after every failed attempt and stop growing at `max`; each
//! delay gets up to 25% random jitter on top (still capped at `max`) so producers that lost the
//! same indexer do not reconnect in lock-step. A session that reached streaming resets it.

use std::time::Duration;

use rand::Rng;

/// Reconnect delay generator.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// A backoff from `initial` up to `max` (`max >= initial`, checked by the configuration).
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            next: initial,
        }
    }

    /// The next delay (with jitter) and doubles the base for the one after.
    pub fn next_delay(&mut self) -> Duration {
        let base = self.next;
        self.next = (self.next * 2).min(self.max);
        let jitter = rand::rng().random_range(0.0..=0.25);
        base.mul_f64(1.0 + jitter).min(self.max)
    }

    /// Back to `initial` (after a healthy session).
    pub fn reset(&mut self) {
        self.next = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_and_stay_bounded() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(100), ms(1_000));
        let delays: Vec<Duration> = (0..8).map(|_| b.next_delay()).collect();
        for (i, d) in delays.iter().enumerate() {
            let base = ms(100 * (1u64 << i.min(4))).min(ms(1_000));
            assert!(
                *d >= base && *d <= base.mul_f64(1.25).min(ms(1_000)),
                "{i}: {d:?}"
            );
        }
        assert_eq!(*delays.last().unwrap(), ms(1_000));
        b.reset();
        assert!(b.next_delay() <= ms(125));
    }
}
