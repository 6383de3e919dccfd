//! Request traces in the Mooncake JSONL format.
//!
//! One request per line (the Mooncake project's FAST'25 trace release uses this format):
//! ```text
//! {"timestamp": <ms since trace start>, "input_length": <tokens>, "output_length": <tokens>,
//!  "hash_ids": [<prefix-block id>, ...]}
//! ```
//! `hash_ids` name 512-token prefix blocks: equal ids at the same position mean an equal prefix up
//! to that block. Extra fields are ignored; blank lines are skipped.
//!
//! The whole file is parsed and validated before anything is replayed, so a bad line is reported
//! (line number and field) before a single event is sent: nothing is half-sent.

use std::io::BufRead;
use std::path::Path;

use serde_json::Value;
use thiserror::Error;

/// Tokens per prefix block in Mooncake traces.
pub const TOKENS_PER_BLOCK: u64 = 512;

/// One request of a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Arrival time in milliseconds since the trace start (used for ordering only; the replay
    /// runs as fast as the services answer).
    pub timestamp_ms: u64,
    /// Prompt length in tokens.
    pub input_length: u64,
    /// Generated length in tokens (informational).
    pub output_length: u64,
    /// Prefix-block ids, one per 512-token block of the prompt, in prefix order.
    pub hash_ids: Vec<u64>,
}

/// A trace that could not be read. Every variant names the 1-based line it refers to.
#[derive(Debug, Error)]
pub enum TraceError {
    /// The file could not be opened or read.
    #[error("cannot read trace {path}: {source}")]
    Io {
        /// The trace path.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file holds no request.
    #[error("line 1: trace is empty (no requests)")]
    Empty,
    /// A line is not a JSON object.
    #[error("line {line}: not a JSON object: {reason}")]
    Malformed {
        /// 1-based line number.
        line: usize,
        /// What the JSON parser said.
        reason: String,
    },
    /// A required field is absent.
    #[error("line {line}: missing field `{field}`")]
    MissingField {
        /// 1-based line number.
        line: usize,
        /// The field name.
        field: &'static str,
    },
    /// A field has the wrong type or an out-of-range value.
    #[error("line {line}: field `{field}` {reason}")]
    BadField {
        /// 1-based line number.
        line: usize,
        /// The field name (`hash_ids[i]` for an element).
        field: String,
        /// What is wrong, e.g. "must be a non-negative integer, got -3".
        reason: String,
    },
}

impl TraceError {
    /// The 1-based line the error refers to (`None` for I/O errors).
    pub fn line(&self) -> Option<usize> {
        match self {
            TraceError::Io { .. } => None,
            TraceError::Empty => Some(1),
            TraceError::Malformed { line, .. }
            | TraceError::MissingField { line, .. }
            | TraceError::BadField { line, .. } => Some(*line),
        }
    }
}

/// Reads and validates a whole trace file.
///
/// # Errors
/// [`TraceError::Io`] when the file cannot be read, otherwise the first bad line's error.
pub fn read_trace(path: &Path) -> Result<Vec<Request>, TraceError> {
    let io_err = |source| TraceError::Io {
        path: path.display().to_string(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io_err)?;
    parse_trace(std::io::BufReader::new(file)).map_err(|e| match e {
        TraceError::Io { source, .. } => io_err(source),
        other => other,
    })
}

/// Parses and validates a trace from any reader (see the module docs for the format).
///
/// # Errors
/// The first bad line's [`TraceError`]; [`TraceError::Empty`] when no line holds a request.
pub fn parse_trace(reader: impl BufRead) -> Result<Vec<Request>, TraceError> {
    let mut requests = Vec::new();
    for (index, line) in reader.lines().enumerate() {
        let line_no = index + 1;
        let text = line.map_err(|source| TraceError::Io {
            path: String::new(),
            source,
        })?;
        if text.trim().is_empty() {
            continue;
        }
        requests.push(parse_line(line_no, &text)?);
    }
    if requests.is_empty() {
        return Err(TraceError::Empty);
    }
    Ok(requests)
}

/// Parses one non-blank line.
///
/// # Errors
/// [`TraceError::Malformed`], [`TraceError::MissingField`] or [`TraceError::BadField`].
pub fn parse_line(line: usize, text: &str) -> Result<Request, TraceError> {
    let value: Value = serde_json::from_str(text).map_err(|e| TraceError::Malformed {
        line,
        reason: e.to_string(),
    })?;
    let Value::Object(object) = value else {
        return Err(TraceError::Malformed {
            line,
            reason: format!("got {}", kind(&value)),
        });
    };
    let field = |name: &'static str| {
        object
            .get(name)
            .ok_or(TraceError::MissingField { line, field: name })
    };
    let timestamp_ms = non_negative(line, "timestamp", field("timestamp")?)?;
    let input_length = non_negative(line, "input_length", field("input_length")?)?;
    let output_length = non_negative(line, "output_length", field("output_length")?)?;
    let Value::Array(ids) = field("hash_ids")? else {
        return Err(TraceError::BadField {
            line,
            field: "hash_ids".into(),
            reason: format!(
                "must be an array of block ids, got {}",
                kind(&object["hash_ids"])
            ),
        });
    };
    let hash_ids = ids
        .iter()
        .enumerate()
        .map(|(i, id)| non_negative(line, &format!("hash_ids[{i}]"), id))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Request {
        timestamp_ms,
        input_length,
        output_length,
        hash_ids,
    })
}

fn non_negative(line: usize, field: &str, value: &Value) -> Result<u64, TraceError> {
    value.as_u64().ok_or_else(|| TraceError::BadField {
        line,
        field: field.to_string(),
        reason: format!("must be a non-negative integer, got {value}"),
    })
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Vec<Request>, TraceError> {
        parse_trace(text.as_bytes())
    }

    #[test]
    fn parses_valid_lines_and_skips_blank_ones() {
        let trace = parse(
            "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [0, 1]}\n\n\
             {\"timestamp\": 7, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [0], \"x\": 1}\n",
        )
        .unwrap();
        assert_eq!(trace.len(), 2);
        assert_eq!(trace[0].hash_ids, vec![0, 1]);
        assert_eq!(trace[1].timestamp_ms, 7);
    }

    #[test]
    fn errors_name_line_and_field() {
        let good =
            "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}";
        let cases = [
            ("{\"timestamp\": 0, ", 2, "not a JSON object"),
            ("[1, 2]", 2, "not a JSON object"),
            (
                "{\"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}",
                2,
                "missing field `timestamp`",
            ),
            (
                "{\"timestamp\": 0, \"input_length\": -3, \"output_length\": 1, \"hash_ids\": []}",
                2,
                "field `input_length` must be a non-negative integer, got -3",
            ),
            (
                "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": \"x\", \"hash_ids\": []}",
                2,
                "field `output_length`",
            ),
            (
                "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": 5}",
                2,
                "field `hash_ids` must be an array",
            ),
            (
                "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1, 2.5]}",
                2,
                "field `hash_ids[1]`",
            ),
        ];
        for (bad, line, needle) in cases {
            let err = parse(&format!("{good}\n{bad}\n{good}\n")).unwrap_err();
            assert_eq!(err.line(), Some(line), "{bad}");
            let text = err.to_string();
            assert!(text.starts_with(&format!("line {line}: ")), "{text}");
            assert!(text.contains(needle), "{text} lacks {needle}");
        }
    }

    #[test]
    fn empty_input_is_an_error() {
        assert!(matches!(parse(""), Err(TraceError::Empty)));
        assert!(matches!(parse("\n  \n"), Err(TraceError::Empty)));
    }
}
