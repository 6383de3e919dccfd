//! Reading one counter from a service's Prometheus `/metrics` endpoint (text format), for the
//! relay wire cost: `ckf_producer_sent_bytes_total` before and after a replay.
//!
//! A plain HTTP/1.0 GET over a TCP connection is all the text format needs; the sum over every
//! label set of the metric is returned.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The producer counter of Relay bytes sent (snapshots, deltas, heartbeats, drain markers).
pub const RELAY_BYTES: &str = "ckf_producer_sent_bytes_total";

/// Fetches `http://{addr}/metrics` and returns the sum of every sample of `metric` (0 when the
/// metric has no sample yet).
///
/// # Errors
/// Connection failures, a non-200 answer, or a sample value that is not a number.
pub async fn scrape_sum(addr: &str, metric: &str) -> Result<f64> {
    let fetch = async {
        let mut stream = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to metrics at {addr}"))?;
        let request = format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut body = String::new();
        stream.read_to_string(&mut body).await?;
        Ok::<_, anyhow::Error>(body)
    };
    let text = tokio::time::timeout(Duration::from_secs(5), fetch)
        .await
        .with_context(|| format!("metrics at {addr} did not answer"))??;
    let status = text.lines().next().unwrap_or_default();
    if !status.contains(" 200") {
        bail!("metrics at {addr} answered `{status}`");
    }
    sum_samples(&text, metric)
}

/// Sums the samples of `metric` in Prometheus text exposition `text`.
///
/// # Errors
/// A sample value that does not parse.
pub fn sum_samples(text: &str, metric: &str) -> Result<f64> {
    let mut sum = 0.0;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(metric) else {
            continue;
        };
        // Exactly this metric: followed by labels or a space, not a longer name.
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            continue;
        }
        let value = rest
            .rsplit(' ')
            .next()
            .with_context(|| format!("sample line `{line}` has no value"))?;
        sum += value
            .parse::<f64>()
            .with_context(|| format!("sample line `{line}`: bad value"))?;
    }
    Ok(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_every_label_set_of_exactly_the_metric() {
        let text = "HTTP/1.0 200 OK\r\n\r\n# HELP ckf_x_total x\n# TYPE ckf_x_total counter\n\
                    ckf_x_total{indexer=\"a\"} 10\nckf_x_total{indexer=\"b\"} 5.5\n\
                    ckf_x_total_other 100\nckf_y 3\n";
        assert_eq!(sum_samples(text, "ckf_x_total").unwrap(), 15.5);
        assert_eq!(sum_samples(text, "ckf_y").unwrap(), 3.0);
        assert_eq!(sum_samples(text, "ckf_z").unwrap(), 0.0);
        assert!(sum_samples("ckf_y nope\n", "ckf_y").is_err());
    }
}
