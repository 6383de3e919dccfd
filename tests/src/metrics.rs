//! Reads a service's Prometheus text endpoint (`GET /metrics`) with a plain HTTP/1.1 request.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// The body of `GET http://addr/metrics`.
///
/// # Errors
/// A message naming the address when the request fails.
pub fn scrape(addr: SocketAddr) -> Result<String, String> {
    let fail = |e: std::io::Error| format!("GET http://{addr}/metrics: {e}");
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(fail)?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(fail)?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: e2e\r\nConnection: close\r\n\r\n")
        .map_err(fail)?;
    let mut response = String::new();
    stream.read_to_string(&mut response).map_err(fail)?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("GET http://{addr}/metrics: no HTTP header end"))?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!(
            "GET http://{addr}/metrics: {}",
            head.lines().next().unwrap_or("")
        ));
    }
    Ok(body.to_owned())
}

/// Sum of every sample of `name` whose labels include all of `labels` (`key="value"` pairs).
/// `None` when no sample matches.
pub fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut sum = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (series, sample) = match line.rsplit_once(' ') {
            Some(split) => split,
            None => continue,
        };
        let (metric, label_text) = match series.split_once('{') {
            Some((metric, rest)) => (metric, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        if metric != name {
            continue;
        }
        let all = labels
            .iter()
            .all(|(k, v)| label_text.contains(&format!("{k}=\"{v}\"")));
        if !all {
            continue;
        }
        if let Ok(v) = sample.parse::<f64>() {
            *sum.get_or_insert(0.0) += v;
        }
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_matching_samples_only() {
        let text = "# HELP x y\nx_total{indexer=\"a\",reason=\"r1\"} 2\n\
                    x_total{indexer=\"a\",reason=\"r2\"} 3\nx_total{indexer=\"b\",reason=\"r1\"} 5\n\
                    y 7\n";
        assert_eq!(value(text, "x_total", &[("indexer", "a")]), Some(5.0));
        assert_eq!(value(text, "x_total", &[("reason", "r1")]), Some(7.0));
        assert_eq!(value(text, "y", &[]), Some(7.0));
        assert_eq!(value(text, "x_total", &[("indexer", "c")]), None);
        assert_eq!(value(text, "x", &[]), None);
    }
}
