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

/// Waits (up to [`DEADLINE`]) until a flood of batches has been acknowledged for at least
/// `span`: until the first instant in `acks` (pushed by the flood's task, one per
/// acknowledged batch) lies `span` in the past. The kill tests use it to strike a producer in
/// the middle of many commit windows; it waits for a state, it asserts no duration.
///
/// # Panics
/// When the flood has not run that long by the deadline (no batch acknowledged, or too late).
pub async fn flood_acknowledged_for(
    acks: &std::sync::Mutex<Vec<std::time::Instant>>,
    span: Duration,
) {
    eventually("the flood to run", DEADLINE, || async {
        let acks = acks.lock().unwrap();
        match acks.first() {
            Some(first) if first.elapsed() >= span => Ok(()),
            _ => Err(format!("{} batches acknowledged", acks.len())),
        }
    })
    .await;
}
