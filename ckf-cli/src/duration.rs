//! Durations on the command line (`--duration`, and any flag of the same form).

use std::time::Duration;

/// Longest `--duration` (and longest open-loop interval between two messages): one day.
pub const MAX_RUN: Duration = Duration::from_secs(86_400);

/// Parses `--duration`: seconds (`10`, `2.5`, `10s`) or milliseconds (`500ms`).
///
/// # Errors
/// Anything else, or a duration that is not positive.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let (number, scale) = match text.strip_suffix("ms") {
        Some(ms) => (ms, 1e-3),
        None => (text.strip_suffix('s').unwrap_or(text), 1.0),
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|e| format!("`{text}`: expected seconds (10, 2.5s) or 500ms ({e})"))?;
    let seconds = value * scale;
    if !(seconds.is_finite() && seconds > 0.0) {
        return Err(format!("`{text}`: the duration must be positive"));
    }
    Duration::try_from_secs_f64(seconds)
        .ok()
        .filter(|d| *d <= MAX_RUN)
        .ok_or_else(|| format!("`{text}`: at most one day (86400 s)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_in_seconds_or_milliseconds() {
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("2.5s"), Ok(Duration::from_millis(2_500)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("86400"), Ok(MAX_RUN));
        // 1e30 panicked in the conversion, 1e19 later when added to the start instant.
        for bad in ["", "0", "-1s", "ten", "5m", "1e30", "1e19", "86401"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }
}
