//! Names of pools, producers and leases (design source, "Core concepts").
//!
//! ```text
//! PoolId = (IndexerDomainId, DcId)
//! ```
//! A pool is exactly one DC-local producer and publication stream. A lane lease is granted by
//! the consumer (the lease authority) and fences every older stream of the same lane.

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
    #[error("{kind} name {name:?} is longer than {MAX_NAME_LEN} bytes")]
    TooLong {
        /// "domain" or "dc".
        kind: &'static str,
        /// The offending name.
        name: String,
    },
    /// The name has a character outside `[A-Za-z0-9._-]`.
    #[error("{kind} name {name:?} may only contain ASCII letters, digits, '.', '_' and '-'")]
    BadCharacter {
        /// "domain" or "dc".
        kind: &'static str,
        /// The offending name.
        name: String,
    },
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

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

name_type!(
    /// One logical KV indexer namespace. A global consumer owns exactly one.
    IndexerDomainId,
    "domain"
);
name_type!(
    /// A stable data-center identifier within a domain.
    DcId,
    "dc"
);

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
    }
}
