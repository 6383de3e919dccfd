//! Names of pools, producers and leases (docs/design.md, "Core concepts").
//!
//! ```text
//! PoolId = (IndexerDomainId, DcId)
//! ```
//! A pool is exactly one DC-local producer and publication stream. A lane lease is granted by
//! the consumer (the lease authority) and fences every older stream of the same lane.
//!
//! # Canonical identity strings
//! Every name that arrives from outside (config, Attach, Ingest) is checked here before it is
//! used as a key, a log field or a metric label:
//!
//! | string | rule | type |
//! | --- | --- | --- |
//! | indexer domain, DC id | 1..=[`MAX_NAME_LEN`] (64) bytes of `[A-Za-z0-9._-]` | [`IndexerDomainId`], [`DcId`] |
//! | ingest source id | 1..=[`MAX_SOURCE_ID_LEN`] (128) bytes of UTF-8, no control character (Unicode `Cc`: C0, DEL, C1) and no invisible formatting character (zero-width, bidi embedding/override/isolate, BOM) | [`SourceId`] |
//!
//! Source ids stay free-form (`"worker-7/boot-3f2a"`, host names, paths) but cannot hide a line
//! break, a NUL or a right-to-left override in a log line, and two ids that print the same are
//! the same bytes. A refused value is quoted back escaped and cut to
//! [`QUOTED_PREFIX_CHARS`] characters, so an error message stays bounded however long the
//! input was.

use std::fmt;

use thiserror::Error;

use crate::addressing::TableFormat;

/// Longest accepted domain or DC name, in bytes.
pub const MAX_NAME_LEN: usize = 64;

/// An invalid domain or DC name.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NameError {
    /// The name is empty.
    #[error("{kind} name is empty")]
    Empty {
        /// "domain" or "dc".
        kind: &'static str,
    },
    /// The name is longer than [`MAX_NAME_LEN`] bytes.
    #[error("{kind} name {} is longer than {MAX_NAME_LEN} bytes", quoted(name))]
    TooLong {
        /// "domain" or "dc".
        kind: &'static str,
        /// The offending name.
        name: String,
    },
    /// The name has a character outside `[A-Za-z0-9._-]`.
    #[error(
        "{kind} name {} may only contain ASCII letters, digits, '.', '_' and '-'",
        quoted(name)
    )]
    BadCharacter {
        /// "domain" or "dc".
        kind: &'static str,
        /// The offending name.
        name: String,
    },
}

/// Characters of a refused value quoted back in an error message (the rest is elided and its
/// length given), so a multi-megabyte input cannot make a multi-megabyte error.
pub const QUOTED_PREFIX_CHARS: usize = 64;

/// `value` escaped for an error message (Rust string escapes: `\0`, `\n`, `\u{202e}`, ...),
/// in double quotes, cut to [`QUOTED_PREFIX_CHARS`] characters with the total length appended
/// when longer.
pub fn quoted(value: &str) -> String {
    let mut out = String::with_capacity(value.len().min(QUOTED_PREFIX_CHARS * 2) + 16);
    out.push('"');
    let mut chars = value.chars();
    for c in chars.by_ref().take(QUOTED_PREFIX_CHARS) {
        out.extend(c.escape_debug());
    }
    out.push('"');
    if chars.next().is_some() {
        out.push_str(&format!("... ({} bytes)", value.len()));
    }
    out
}

fn check_name(kind: &'static str, name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty { kind });
    }
    if name.len() > MAX_NAME_LEN {
        return Err(NameError::TooLong {
            kind,
            name: name.to_owned(),
        });
    }
    if !name
        .bytes()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
    {
        return Err(NameError::BadCharacter {
            kind,
            name: name.to_owned(),
        });
    }
    Ok(())
}

macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            /// Validates and wraps a name (1..=64 bytes of `[A-Za-z0-9._-]`).
            ///
            /// # Errors
            /// [`NameError`] naming the rule that failed.
            pub fn new(name: impl Into<String>) -> Result<Self, NameError> {
                let name = name.into();
                check_name($kind, &name)?;
                Ok(Self(name))
            }

            /// The name as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

name_type!(
    /// One logical KV indexer namespace (one model's). A global consumer owns exactly one; an
    /// indexer serves one or more (`crate::catalog`).
    IndexerDomainId,
    "domain"
);
name_type!(
    /// A stable data-center identifier within a domain.
    DcId,
    "dc"
);

/// Longest accepted ingest source id, in bytes.
pub const MAX_SOURCE_ID_LEN: usize = 128;

/// An ingest source id that is not canonical (see the module docs). Messages name the rule and
/// quote the value escaped ([`quoted`]); the caller adds the field name.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SourceIdError {
    /// The id is empty.
    #[error("is required (1..={MAX_SOURCE_ID_LEN} bytes)")]
    Empty,
    /// The id is longer than [`MAX_SOURCE_ID_LEN`] bytes.
    #[error(
        "{} is {len} bytes; at most {MAX_SOURCE_ID_LEN} are allowed",
        quoted(id)
    )]
    TooLong {
        /// The offending id (possibly long; display quotes a bounded prefix).
        id: String,
        /// Its length in bytes.
        len: usize,
    },
    /// The id contains a control or invisible formatting character.
    #[error(
        "{} has the character U+{:04X} at byte {at}; control characters (U+0000..U+001F, \
         U+007F..U+009F) and invisible formatting characters (zero-width, bidi controls, BOM) \
         are not allowed",
        quoted(id),
        u32::from(*character)
    )]
    BadCharacter {
        /// The offending id.
        id: String,
        /// The refused character.
        character: char,
        /// Its byte offset in the id.
        at: usize,
    },
}

/// Invisible formatting characters refused in source ids besides Unicode `Cc`: zero-width
/// space/joiners and marks, bidi embeddings, overrides and isolates, word joiner and the BOM.
fn is_invisible_format(c: char) -> bool {
    matches!(
        c,
        '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{FEFF}'
    )
}

/// Checks that `id` is a canonical source id (see the module docs).
///
/// # Errors
/// [`SourceIdError`] naming the rule that failed.
pub fn check_source_id(id: &str) -> Result<(), SourceIdError> {
    if id.is_empty() {
        return Err(SourceIdError::Empty);
    }
    if id.len() > MAX_SOURCE_ID_LEN {
        return Err(SourceIdError::TooLong {
            id: id.to_owned(),
            len: id.len(),
        });
    }
    if let Some((at, character)) = id
        .char_indices()
        .find(|&(_, c)| c.is_control() || is_invisible_format(c))
    {
        return Err(SourceIdError::BadCharacter {
            id: id.to_owned(),
            character,
            at,
        });
    }
    Ok(())
}

/// A validated ingest source id: the stable name of one incarnation of an event source
/// (1..=128 bytes, no control or invisible formatting character; see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceId(String);

impl SourceId {
    /// Validates and wraps a source id.
    ///
    /// # Errors
    /// [`SourceIdError`] naming the rule that failed.
    pub fn new(id: impl Into<String>) -> Result<Self, SourceIdError> {
        let id = id.into();
        check_source_id(&id)?;
        Ok(Self(id))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id as an owned string.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Display for SourceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Exactly one DC-local producer pool and publication stream: `(IndexerDomainId, DcId)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolId {
    /// The indexer domain.
    pub domain: IndexerDomainId,
    /// The data center.
    pub dc: DcId,
}

impl PoolId {
    /// Builds and validates a pool id from two names.
    ///
    /// # Errors
    /// [`NameError`] for either name.
    pub fn new(domain: &str, dc: &str) -> Result<Self, NameError> {
        Ok(Self {
            domain: IndexerDomainId::new(domain)?,
            dc: DcId::new(dc)?,
        })
    }
}

impl fmt::Display for PoolId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.domain, self.dc)
    }
}

/// One run of a producer process. A restarted producer has a new incarnation, so frames of the
/// previous run can never be mistaken for the new one's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProducerIncarnation(pub u64);

impl fmt::Display for ProducerIncarnation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#018x}", self.0)
    }
}

/// What a producer presents when it attaches to a consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerIdentity {
    /// The pool the producer publishes.
    pub pool: PoolId,
    /// The producer's current incarnation.
    pub incarnation: ProducerIncarnation,
    /// The producer's table format; must equal the consumer's.
    pub format: TableFormat,
}

/// Index of a lane in a consumer's manifest (0..16).
pub type LaneIndex = u8;

/// A lane lease: the right to publish into one consumer lane. Granted by the consumer with a
/// strictly increasing `epoch` per lane; a newer lease fences every older one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LaneLease {
    /// Identity of the consumer process that granted the lease (changes when it restarts).
    pub consumer_instance: u64,
    /// The lane the lease is for.
    pub lane: LaneIndex,
    /// Strictly increasing per lane within one consumer instance; starts at 1.
    pub epoch: u64,
}

impl fmt::Display for LaneLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "lane {} epoch {} (consumer {:#x})",
            self.lane, self.epoch, self.consumer_instance
        )
    }
}

/// The envelope every publication frame carries: who sent it and under which lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StreamTag {
    /// Incarnation of the producer that holds the lease.
    pub incarnation: ProducerIncarnation,
    /// The lease the frame was sent under.
    pub lease: LaneLease,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated() {
        assert!(PoolId::new("prod", "dc-a").is_ok());
        assert_eq!(DcId::new("").unwrap_err(), NameError::Empty { kind: "dc" });
        assert!(matches!(
            IndexerDomainId::new("a b"),
            Err(NameError::BadCharacter { .. })
        ));
        assert!(matches!(
            DcId::new("x".repeat(65)),
            Err(NameError::TooLong { .. })
        ));
        assert_eq!(
            PoolId::new("prod", "dc-a").unwrap().to_string(),
            "prod/dc-a"
        );
        // A refused name is quoted escaped and bounded.
        let e = DcId::new(format!("a\n{}", "x".repeat(10_000))).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("\"a\\nxxx"), "{text}");
        assert!(text.contains("(10002 bytes)"), "{text}");
        assert!(text.len() < 200, "{}", text.len());
    }

    #[test]
    fn source_ids_are_canonical_and_bounded() {
        for ok in ["w1", "worker-7/boot-3f2a", "häst:1 2", &"x".repeat(128)] {
            assert_eq!(SourceId::new(ok).unwrap().as_str(), ok);
        }
        assert_eq!(SourceId::new("").unwrap_err(), SourceIdError::Empty);
        assert!(matches!(
            SourceId::new("x".repeat(129)),
            Err(SourceIdError::TooLong { len: 129, .. })
        ));
        // 43 three-byte characters: 129 bytes, the limit is in bytes.
        assert!(matches!(
            SourceId::new("€".repeat(43)),
            Err(SourceIdError::TooLong { len: 129, .. })
        ));
        for (bad, character, at) in [
            ("a\0b", '\0', 1),
            ("line\nbreak", '\n', 4),
            ("cr\r", '\r', 2),
            ("\ttab", '\t', 0),
            ("del\u{7f}", '\u{7f}', 3),
            ("c1\u{85}", '\u{85}', 2),
            ("rtl\u{202e}gnp.exe", '\u{202e}', 3),
            ("zero\u{200b}width", '\u{200b}', 4),
            ("\u{feff}bom", '\u{feff}', 0),
        ] {
            let e = SourceId::new(bad).unwrap_err();
            assert_eq!(
                e,
                SourceIdError::BadCharacter {
                    id: bad.into(),
                    character,
                    at
                },
                "{bad:?}"
            );
            let text = e.to_string();
            // The value is quoted escaped: the message itself has no raw control character.
            assert!(!text.chars().any(char::is_control), "{text:?}");
            assert!(
                text.contains(&format!("U+{:04X}", u32::from(character))),
                "{text}"
            );
        }
        let text = SourceId::new("a\0b").unwrap_err().to_string();
        assert!(
            text.starts_with("\"a\\0b\" has the character U+0000 at byte 1"),
            "{text}"
        );
    }
}
