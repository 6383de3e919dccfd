//! `tracing` initialisation: human-readable lines by default, one JSON object per event with
//! `--log-format json`, filtered by `RUST_LOG` (`EnvFilter` syntax, e.g.
//! `info,indexer_svc=debug`) or a default directive when `RUST_LOG` is unset.

use std::io::IsTerminal;

use serde::{Deserialize, Serialize};
use tracing_subscriber::{EnvFilter, fmt, prelude::*};

/// How log events are rendered on stderr.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines (the default), coloured only when stderr is a terminal and
    /// `NO_COLOR` is unset or empty (<https://no-color.org>), so a file or a pipe gets plain
    /// text.
    #[default]
    Human,
    /// One JSON object per event, for log collectors.
    Json,
}

/// A global subscriber was already installed (for example by a test or the in-process demo).
#[derive(Debug, thiserror::Error)]
#[error("a global tracing subscriber is already installed")]
pub struct AlreadyInitialised;

/// Installs the global subscriber writing to stderr.
///
/// `default_directive` (e.g. `"info"`) applies when `RUST_LOG` is unset or unparsable.
///
/// # Errors
/// [`AlreadyInitialised`] when a global subscriber exists; callers that may run twice in one
/// process (tests, `ckf demo`) can ignore it.
pub fn init_tracing(format: LogFormat, default_directive: &str) -> Result<(), AlreadyInitialised> {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_directive));
    let registry = tracing_subscriber::registry().with(filter);
    let result = match format {
        LogFormat::Human => registry
            .with(
                fmt::layer()
                    .with_ansi(colour(
                        std::io::stderr().is_terminal(),
                        std::env::var_os("NO_COLOR"),
                    ))
                    .with_writer(std::io::stderr),
            )
            .try_init(),
        LogFormat::Json => registry
            .with(
                fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(false)
                    .with_writer(std::io::stderr),
            )
            .try_init(),
    };
    result.map_err(|_| AlreadyInitialised)
}

/// Whether human-readable lines are coloured: on a terminal, unless `NO_COLOR` is set to
/// something.
fn colour(terminal: bool, no_colour: Option<std::ffi::OsString>) -> bool {
    terminal && no_colour.is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(colour(true, None));
        assert!(colour(true, Some("".into())));
        assert!(!colour(true, Some("1".into())));
        assert!(!colour(false, None));
    }

    #[test]
    fn second_init_is_reported_not_fatal() {
        // The first call may race with other tests in this binary; either way a second call
        // must report AlreadyInitialised instead of panicking.
        let _ = init_tracing(LogFormat::Json, "info");
        assert!(init_tracing(LogFormat::Human, "info").is_err());
    }
}
