//! Bounded polling for async probes (tests wait for a state, they never assert how long it
//! took).

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// The default bound of every wait: generous for debug binaries on a busy 2-core machine.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// Polls `probe` every 50 ms until it returns `Ok`, up to `timeout`.
///
/// # Panics
/// When the deadline passes, with `what` and the last `Err` the probe gave (its description
/// of what it saw instead).
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let last = match probe().await {
            Ok(value) => return value,
            Err(last) => last,
        };
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}; last seen: {last}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until a flood of batches has been acknowledged for at least `span`: first (up to
/// [`DEADLINE`]) for the first acknowledgement in `acks` (pushed by the flood's task, one per
/// acknowledged batch), then until that instant lies `span` in the past. The kill tests use it
/// to strike a producer in the middle of many commit windows; it waits for a state, it asserts
/// no duration (however slow the machine, the flood then has run for `span`).
///
/// # Panics
/// When no batch is acknowledged by the deadline.
pub async fn flood_acknowledged_for(
    acks: &std::sync::Mutex<Vec<std::time::Instant>>,
    span: Duration,
) {
    let first = eventually("the flood's first acknowledgement", DEADLINE, || async {
        acks.lock()
            .unwrap()
            .first()
            .copied()
            .ok_or_else(|| "no batch acknowledged".to_owned())
    })
    .await;
    tokio::time::sleep_until(Instant::from_std(first + span)).await;
}
