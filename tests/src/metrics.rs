//! Reads a service's Prometheus text endpoint (`GET /metrics`): thin names over
//! `ckf_svc_kit::scrape`, the one scraper the CLI uses too.

use std::net::SocketAddr;
use std::time::Duration;

use ckf_svc_kit::scrape::{Samples, fetch};

/// The body of `GET http://addr/metrics` (5 s timeout).
///
/// # Errors
/// A message naming the URL when the request fails or the answer is not 200.
pub fn scrape(addr: SocketAddr) -> Result<String, String> {
    fetch(&addr.to_string(), Duration::from_secs(5)).map_err(|e| e.to_string())
}

/// Sum of every sample of `name` whose labels include all of `labels` (`key="value"` pairs).
/// `None` when no sample matches.
pub fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    Samples::parse(text).sum(name, labels)
}
