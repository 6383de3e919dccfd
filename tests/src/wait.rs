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
