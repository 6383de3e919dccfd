//! Reading one counter from a service's Prometheus `/metrics` endpoint, for the relay wire
//! cost: `ckf_producer_sent_bytes_total` before and after a replay. The GET and the text
//! parse are `ckf_svc_kit::scrape` (shared with the end-to-end tests).

use std::time::Duration;

use anyhow::{Context, Result};
use ckf_svc_kit::scrape::{Samples, fetch};

/// The producer counter of Relay bytes sent (snapshots, deltas, heartbeats, drain markers).
pub const RELAY_BYTES: &str = "ckf_producer_sent_bytes_total";

/// Fetches `http://{addr}/metrics` and returns the sum of every sample of `metric` (0 when the
/// metric has no sample yet).
///
/// # Errors
/// Connection failures, a timeout (5 s) or a non-200 answer.
pub async fn scrape_sum(addr: &str, metric: &str) -> Result<f64> {
    let owned = addr.to_owned();
    let text = tokio::task::spawn_blocking(move || fetch(&owned, Duration::from_secs(5)))
        .await
        .context("metrics scrape task")?
        .with_context(|| format!("reading metrics at {addr}"))?;
    Ok(Samples::parse(&text).sum(metric, &[]).unwrap_or(0.0))
}
