//! # ckf-core
//!
//! Every semantic rule of ckf-relay: the cuckoo-filter (CKF) table format, the producer's exact
//! ownership and refcounts, the publication protocol (leases, sequences, barrier snapshots,
//! deltas, drain markers), the transposed global consumer and its multi-lane prefix search.
//! No network code and no async runtime: the services are thin adapters over this crate.
//!
//! The binding semantics are the Cuckoo KV Indexer design, `docs/design.md` (cited below by
//! section, as `docs/design.md, "Section"`). Module map, following one KV event from producer
//! to query:
//!
//! | module | owns |
//! | --- | --- |
//! | [`addressing`] | block hash -> fingerprint + candidate bucket pair; [`TableFormat`]; sizing |
//! | [`bucket`] | packed `u64` buckets (4 x 16-bit slots), the transposed `AtomicU64` table of a lane group, [`bucket::groups::LaneGroups`] |
//! | [`identity`] | domain, DC, pool, producer incarnation, lane lease |
//! | [`catalog`] | the domains one indexer serves; which one a query or an attachment is for |
//! | [`mutator`] | cuckoo insertion with bounded kicks and rollback; removal of one copy |
//! | [`dirty`] | dirty-bucket tracking and safe image ordering for deltas |
//! | [`dc`] | `DcCkfState`: exact ownership, refcounts, omissions, stats |
//! | [`frames`] | snapshot / chunk / delta / drain-marker frames |
//! | [`sources`] | per-source ingest batch sequences (gap / replay), bounded LRU memory |
//! | [`publication`] | `DcCkfPublisher`: lease and sequence envelope, fencing |
//! | [`cadence`] | when the producer cuts a batch into a delta (size, age, a backed-up attachment) |
//! | [`relay_session`] | the producer's half of the Relay: lease terms, snapshot installed, the next attach |
//! | [`fanout`] | one publisher per attachment, the barrier across them, delta splitting, drain markers |
//! | [`global`] | `GlobalCkfIndexer`: manifest, lane state machine, delta acceptance |
//! | [`lane`] | one lane's serialized ingestor: lease checks, state machine, acceptance rules |
//! | [`ingestion`] | one serialized ingestor per lane, bounded queues, lag policy |
//! | [`search`] | multi-lane prefix search over the transposed table |
//! | [`tokens`] | the canonical token hash space: token ids -> sequence block hashes (Dynamo's scheme) |
//! | `adapter` | (feature `testing`) in-process producer -> consumer composition with recovery, for tests and demos |
//! | [`route`] | the routing decision: expected time to first token per DC from prefix depth, load and round trip; ranking, choice, bookings |
//! | [`pool_load`] | a producer's pool load from its engines' shares: scraped and pushed (`Ingest/ReportLoad`) shares, their validation, expiry and bound |
//! | [`failure`] | pre-/post-commit failure dispositions by affected domain |
//! | [`access`] | credentials, principals, per-pool / per-source policies, refusals (`UNAUTHENTICATED` / `PERMISSION_DENIED`) |
//! | `testing` | (feature `testing`) test kit: frames under a lease, snapshot install |

pub mod access;
#[cfg(feature = "testing")]
pub mod adapter;
pub mod addressing;
pub mod bucket;
pub mod cadence;
pub mod catalog;
pub mod dc;
pub mod dirty;
pub mod failure;
pub mod fanout;
pub mod frames;
pub mod global;
pub mod identity;
pub mod ingestion;
pub mod lane;
mod memory;
pub mod mutator;
pub mod pool_load;
pub mod publication;
pub mod relay_session;
pub mod route;
pub mod search;
pub mod sources;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tokens;

pub use addressing::{Addressing, FormatError, Location, TableFormat};
pub use identity::{
    DcId, IndexerDomainId, LaneIndex, LaneLease, PoolId, ProducerIdentity, ProducerIncarnation,
    StreamTag,
};
