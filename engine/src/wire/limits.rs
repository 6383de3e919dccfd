//! What stops a decode: the bounds on one payload ([`DecodeLimits`]) and why a whole batch is
//! refused ([`DecodeError`]).

use thiserror::Error;

/// Bounds on one payload, so a hostile or broken publisher cannot make the decoder allocate
/// without limit. A batch breaking `max_events` or `max_depth` is a [`DecodeError`]; an event
/// breaking the per-event limits is skipped and counted (the rest of the batch decodes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Events per batch.
    pub max_events: usize,
    /// Block hashes per event (also bounds `extra_keys` lists and their per-block entries).
    pub max_blocks_per_event: usize,
    /// Token ids per event.
    pub max_tokens_per_event: usize,
    /// msgpack nesting depth of the whole payload (the batch array is depth 1).
    pub max_depth: usize,
}

impl Default for DecodeLimits {
    /// 65,536 events, 65,536 blocks and 4,194,304 tokens per event, depth 32: far beyond any
    /// engine step, still bounded.
    fn default() -> Self {
        Self {
            max_events: 65_536,
            max_blocks_per_event: 65_536,
            max_tokens_per_event: 4_194_304,
            max_depth: 32,
        }
    }
}

/// Why a payload is not an `EventBatch` (the whole batch is refused; nothing is applied).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// The payload ends inside a msgpack value.
    #[error("payload truncated")]
    Truncated,
    /// Bytes that are not msgpack (the reserved marker `0xc1`).
    #[error("invalid msgpack: {0}")]
    Syntax(String),
    /// Bytes left after the batch value.
    #[error("{0} trailing bytes after the batch")]
    Trailing(usize),
    /// The batch envelope has the wrong shape (not `[ts, events, dp_rank?]` nor a map with
    /// `ts` and `events`, or an envelope field of the wrong type).
    #[error("batch envelope: {0}")]
    Type(String),
    /// The batch breaks a [`DecodeLimits`] bound (`max_events`, `max_depth`).
    #[error("limit exceeded: {0}")]
    Limit(String),
}

impl DecodeError {
    /// A short stable label for metrics: `"truncated"`, `"syntax"`, `"trailing"`, `"type"`,
    /// `"limit"`.
    pub fn kind_label(&self) -> &'static str {
        match self {
            Self::Truncated => "truncated",
            Self::Syntax(_) => "syntax",
            Self::Trailing(_) => "trailing",
            Self::Type(_) => "type",
            Self::Limit(_) => "limit",
        }
    }
}
