//! The consumer's [`Manifest`] (one domain, its lanes, one table format) and why one is refused
//! ([`ManifestError`]).

use thiserror::Error;

use crate::addressing::{FormatError, TableFormat};
use crate::bucket::{MAX_LANES, TableError};
use crate::identity::{IndexerDomainId, LaneIndex, PoolId};

/// The consumer's configuration: one domain, its lanes (lane index = position), one format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// The one indexer domain every lane belongs to.
    pub domain: IndexerDomainId,
    /// The table format every producer must use.
    pub format: TableFormat,
    /// Lane `i` is pool `lanes[i]`; 1..=64 distinct pools in distinct DCs.
    pub lanes: Vec<PoolId>,
}

/// Why a manifest is refused. Each variant names the offending lane and pool.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ManifestError {
    /// No lanes configured.
    #[error("manifest has no lanes (need 1..={MAX_LANES})")]
    NoLanes,
    /// More than 64 lanes.
    #[error("manifest has {0} lanes (at most {MAX_LANES})")]
    TooManyLanes(usize),
    /// A lane's pool belongs to another domain.
    #[error("lane {lane}: pool {pool} is not in domain {domain}")]
    ForeignDomain {
        /// The lane.
        lane: LaneIndex,
        /// Its pool.
        pool: PoolId,
        /// The manifest's domain.
        domain: IndexerDomainId,
    },
    /// The same pool appears twice. Every pool is in the manifest's one domain, so this is
    /// also exactly the "two lanes share a DC" error (the message names the DC).
    #[error("lane {lane}: pool {pool} (DC {}) is already lane {first}", pool.dc)]
    DuplicatePool {
        /// The later lane.
        lane: LaneIndex,
        /// The lane that has the pool first.
        first: LaneIndex,
        /// The pool.
        pool: PoolId,
    },
    /// The table format is invalid.
    #[error("manifest table format: {0}")]
    Format(#[from] FormatError),
    /// The table cannot be allocated.
    #[error("consumer table: {0}")]
    Table(#[from] TableError),
}

impl Manifest {
    /// Checks every manifest rule.
    ///
    /// # Errors
    /// [`ManifestError`] naming the first offending lane.
    pub fn validate(&self) -> Result<(), ManifestError> {
        if self.lanes.is_empty() {
            return Err(ManifestError::NoLanes);
        }
        if self.lanes.len() > MAX_LANES {
            return Err(ManifestError::TooManyLanes(self.lanes.len()));
        }
        self.format.validate()?;
        for (i, pool) in self.lanes.iter().enumerate() {
            let lane = i as LaneIndex;
            if pool.domain != self.domain {
                return Err(ManifestError::ForeignDomain {
                    lane,
                    pool: pool.clone(),
                    domain: self.domain.clone(),
                });
            }
            if let Some(first) = self.lanes[..i].iter().position(|p| p == pool) {
                return Err(ManifestError::DuplicatePool {
                    lane,
                    first: first as LaneIndex,
                    pool: pool.clone(),
                });
            }
        }
        Ok(())
    }
}
