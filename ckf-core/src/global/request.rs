//! What a producer presents to attach ([`AttachRequest`], its [`ClaimedFormat`]) and why a lease
//! is refused to it ([`AttachError`]).

use thiserror::Error;

use crate::addressing::TableFormat;
use crate::identity::{LaneIndex, PoolId, ProducerIdentity, ProducerIncarnation};
use crate::lane::{AttachMode, LaneState};

/// The table format a producer claims when it attaches: one this build can use, or not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimedFormat {
    /// A valid format (it may still differ from the manifest's).
    Valid(TableFormat),
    /// A format this build cannot use (e.g. a bucket count that is not a power of two): how it
    /// was sent, and why it is unusable. Always a [`AttachError::FormatMismatch`].
    Unusable {
        /// The format as received, for the refusal message.
        shown: String,
        /// Why it is not a valid format.
        problem: String,
    },
}

impl ClaimedFormat {
    /// The format as text (`TableFormat`'s `Display`, or the received form).
    pub fn shown(&self) -> String {
        match self {
            ClaimedFormat::Valid(format) => format.to_string(),
            ClaimedFormat::Unusable { shown, .. } => shown.clone(),
        }
    }

    /// Why the format is unusable, if it is.
    pub fn problem(&self) -> Option<&str> {
        match self {
            ClaimedFormat::Valid(_) => None,
            ClaimedFormat::Unusable { problem, .. } => Some(problem),
        }
    }
}

/// What a producer presents to attach: its pool, its incarnation, its claimed table format and
/// the attach mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachRequest {
    /// The pool the producer publishes.
    pub pool: PoolId,
    /// The producer's current incarnation.
    pub incarnation: ProducerIncarnation,
    /// The producer's table format as claimed; must be valid and equal the manifest's.
    pub format: ClaimedFormat,
    /// Whether a live holder is superseded or refuses the attach.
    pub mode: AttachMode,
}

impl From<&ProducerIdentity> for AttachRequest {
    /// A [`AttachMode::Takeover`] request.
    fn from(id: &ProducerIdentity) -> Self {
        Self {
            pool: id.pool.clone(),
            incarnation: id.incarnation,
            format: ClaimedFormat::Valid(id.format),
            mode: AttachMode::Takeover,
        }
    }
}

/// Why a lease is refused to a producer (`Attach`). Each variant carries everything a refusal
/// message needs, so a service only translates it (its `Display` is the message).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AttachError {
    /// The producer's pool is not in the manifest (includes pools of other domains).
    #[error(
        "pool {pool} is not a lane of this indexer (configured pools: {})",
        join_pools(configured)
    )]
    UnknownPool {
        /// The producer's pool.
        pool: PoolId,
        /// The manifest's pools, in lane order.
        configured: Vec<PoolId>,
    },
    /// The producer's table format differs from the manifest's, or is not one this build can
    /// use at all (then `got` says why).
    #[error(
        "table format mismatch for pool {pool}: indexer has [{expected}], producer has [{}]{}; \
         give both the same table.expected_blocks (or table.bucket_count) and table.seed",
        got.shown(),
        got.problem().map(|p| format!(" ({p})")).unwrap_or_default()
    )]
    FormatMismatch {
        /// The pool.
        pool: PoolId,
        /// The manifest's format.
        expected: TableFormat,
        /// The producer's format as claimed.
        got: ClaimedFormat,
    },
    /// An [`AttachMode::IfVacant`] attach found the lane held by a live attachment of another
    /// incarnation; nothing was superseded or leased.
    #[error(
        "pool {pool} (lane {lane}) is held by a live attachment: incarnation {holder}, lease \
         epoch {epoch}, {}; an IF_VACANT attach does not supersede it",
        state.as_str()
    )]
    Occupied {
        /// The pool.
        pool: PoolId,
        /// Its lane.
        lane: LaneIndex,
        /// The live holder's incarnation.
        holder: ProducerIncarnation,
        /// The live holder's lease epoch.
        epoch: u64,
        /// The lane's state (awaiting its snapshot, or active).
        state: LaneState,
    },
}

fn join_pools(pools: &[PoolId]) -> String {
    pools
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Why a lane cannot be added or removed while the consumer runs.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LaneChangeError {
    /// The pool is another domain's.
    #[error("pool {pool} is not in domain {domain}")]
    ForeignDomain {
        /// The pool.
        pool: PoolId,
        /// This consumer's domain.
        domain: crate::identity::IndexerDomainId,
    },
    /// The pool is served already.
    #[error("pool {pool} is served already (lane {lane})")]
    Served {
        /// The pool.
        pool: PoolId,
        /// Its lane.
        lane: LaneIndex,
    },
    /// Every slot serves, or once served, another pool.
    #[error(
        "no spare lane for pool {pool}: all {slots} lane slots serve or once served another \
         pool (a lane keeps its pool for the indexer's life)"
    )]
    NoSpareLane {
        /// The pool.
        pool: PoolId,
        /// Lane slots of the consumer.
        slots: usize,
    },
    /// The lane serves no pool now.
    #[error("lane {lane} serves no pool")]
    NotServed {
        /// The lane.
        lane: LaneIndex,
    },
}
