//! Reading a Prometheus `/metrics` endpoint, for the `ckf` CLI (relay wire cost of a replay),
//! the producer (its engines' load) and the end-to-end tests (counters after a kill, a fence,
//! a drain).
//!
//! The HTTP GET is `ureq` (blocking, plain HTTP, bounded by a timeout; call it from
//! `tokio::task::spawn_blocking` inside a runtime) and the text exposition is parsed by
//! `prometheus-parse`. That parser skips a sample line whose value is not a number instead of
//! failing, and splits labels on `,` and `=`: fine for this project's label values (DC ids,
//! lane indices, reasons, endpoint URLs), which never contain either.

use std::time::Duration;

use prometheus_parse::{Scrape, Value};

/// Why a scrape failed.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    /// No answer, a non-200 answer or an unreadable body.
    #[error("GET {url}: {message}")]
    Fetch {
        /// The URL requested.
        url: String,
        /// What went wrong (connection refused, timeout, `http status: 503`, ...).
        message: String,
    },
}

/// The body of `GET http://{addr}/metrics` (`addr` is `host:port`), within `timeout` overall.
///
/// # Errors
/// [`ScrapeError::Fetch`] naming the URL.
pub fn fetch(addr: &str, timeout: Duration) -> Result<String, ScrapeError> {
    fetch_url(&format!("http://{addr}/metrics"), timeout)
}

/// The body of `GET url` (plain `http://`), within `timeout` overall.
///
/// # Errors
/// [`ScrapeError::Fetch`] naming the URL.
pub fn fetch_url(url: &str, timeout: Duration) -> Result<String, ScrapeError> {
    let fail = |e: ureq::Error| ScrapeError::Fetch {
        url: url.to_owned(),
        message: e.to_string(),
    };
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        // Metrics endpoints are local or in-cluster: never route them through an
        // `HTTP_PROXY` from the environment.
        .proxy(None)
        .build()
        .into();
    agent
        .get(url)
        .call()
        .map_err(fail)?
        .body_mut()
        .read_to_string()
        .map_err(fail)
}

/// Parsed samples of one scrape.
#[derive(Debug, Clone)]
pub struct Samples {
    scrape: Scrape,
}

impl Samples {
    /// Parses Prometheus text exposition `text`.
    pub fn parse(text: &str) -> Self {
        let lines = text.lines().map(|line| Ok(line.to_owned()));
        let scrape = Scrape::parse(lines).expect("lines of a string cannot fail to read");
        Self { scrape }
    }

    /// Sum over every counter, gauge or untyped sample named exactly `name` whose labels
    /// include all of `labels` (`(name, value)` pairs); `None` when no sample matches.
    /// Histogram and summary series are read through their `_count` / `_sum` samples.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.scrape
            .samples
            .iter()
            .filter(|s| s.metric == name)
            .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .filter_map(|s| match s.value {
                Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => Some(v),
                Value::Histogram(_) | Value::Summary(_) => None,
            })
            .fold(None, |sum, v| Some(sum.unwrap_or(0.0) + v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP ckf_x_total X.\n# TYPE ckf_x_total counter\n\
        ckf_x_total{indexer=\"http://a:1\",reason=\"r1\"} 2\n\
        ckf_x_total{indexer=\"http://a:1\",reason=\"r2\"} 3\n\
        ckf_x_total{indexer=\"http://b:2\",reason=\"r1\"} 5.5\n\
        ckf_x_total_other 100\n\
        # TYPE ckf_y gauge\nckf_y 7\n\
        # TYPE ckf_h_seconds histogram\n\
        ckf_h_seconds_bucket{le=\"1\"} 1\nckf_h_seconds_bucket{le=\"+Inf\"} 2\n\
        ckf_h_seconds_sum 1.5\nckf_h_seconds_count 2\n";

    #[test]
    fn sums_every_matching_label_set_of_exactly_the_metric() {
        let samples = Samples::parse(TEXT);
        assert_eq!(samples.sum("ckf_x_total", &[]), Some(10.5));
        assert_eq!(
            samples.sum("ckf_x_total", &[("indexer", "http://a:1")]),
            Some(5.0)
        );
        assert_eq!(samples.sum("ckf_x_total", &[("reason", "r1")]), Some(7.5));
        assert_eq!(
            samples.sum(
                "ckf_x_total",
                &[("indexer", "http://a:1"), ("reason", "r2")]
            ),
            Some(3.0)
        );
        assert_eq!(samples.sum("ckf_x_total", &[("indexer", "c")]), None);
        assert_eq!(samples.sum("ckf_y", &[]), Some(7.0));
        assert_eq!(samples.sum("ckf_x", &[]), None); // a prefix is not the metric
        assert_eq!(samples.sum("ckf_z", &[]), None);
        assert_eq!(samples.sum("ckf_h_seconds_count", &[]), Some(2.0));
    }

    #[tokio::test]
    async fn fetches_a_served_registry_and_names_the_url_on_failure() {
        let registry = prometheus::Registry::new();
        crate::metrics::counter(&registry, "ckf_t_scraped_total", "Scraped.").inc_by(4);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server =
            crate::metrics::serve_metrics("127.0.0.1:0".parse().unwrap(), registry, async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        let addr = server.addr.to_string();
        let fetch_off_runtime = || {
            let addr = addr.clone();
            tokio::task::spawn_blocking(move || fetch(&addr, Duration::from_secs(5)))
        };
        let text = fetch_off_runtime().await.unwrap().unwrap();
        assert_eq!(
            Samples::parse(&text).sum("ckf_t_scraped_total", &[]),
            Some(4.0)
        );
        stop.send(()).unwrap();
        server.task.await.unwrap().unwrap();

        // Nothing listens there any more.
        let err = fetch_off_runtime().await.unwrap().unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("http://{}/metrics", server.addr)),
            "{err}"
        );
    }
}
