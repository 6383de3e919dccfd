//! `GlobalCkfIndexer`: the transposed global consumer for one indexer domain and up to 64 DC
//! pool lanes (docs/design.md, "Global transposed consumer").
//!
//! It owns the manifest (which pool is which lane), the lease authority (strictly increasing
//! epochs per lane), the shared table sized to the lane count (one
//! [`TransposedTable`](crate::bucket::TransposedTable) per group of 16 lanes,
//! [`LaneGroups`](crate::bucket::groups::LaneGroups)), the ready-lane mask (one `u64`),
//! and one serialized [`crate::lane`] ingestor per lane. Prefix search lives in
//! [`crate::search`]; bounded, lane-sticky transport with deadlines in [`crate::ingestion`].
//!
//! # The weak-read contract
//! Only two things are shared between ingestion and queries: the bucket words and the ready mask.
//!
//! * **Each bucket image is one atomic `u64` store** ([`TransposedTable::store`](crate::bucket::TransposedTable::store), `Release`).
//!   A query never sees a torn bucket.
//! * **Readiness is published with `Release`** when a barrier snapshot completes, after every
//!   word of the snapshot was stored, and **captured once per query with `Acquire`**: a query that
//!   sees a lane's bit also sees that lane's complete snapshot.
//! * **Multi-bucket application is not atomic.** A query running while a delta is applied may see
//!   some of its images and not others (a mix of old and new bucket images). Producers order a
//!   delta's images so that a relocated fingerprint reaches its new bucket before it leaves the
//!   old one, which, together with the search reading the primary candidate bucket first, keeps a
//!   stable block visible in most interleavings (the remaining window is documented in
//!   [`crate::search`]).
//! * **A query that captured readiness may finish after the lane was retired or re-leased**, and
//!   then reports what it read from the lane's words at the time.
//!
//! There is deliberately **no lane seqlock, no table-wide publication lock, no double buffer and
//! no query retry**: queries stay wait-free and allocation-free, and a lossy routing hint does not
//! need more. Lease validation, the installed sequence and the lane state are ingestor-local and
//! never touched by queries.
//!
//! # Files
//! * `global/manifest.rs`: the [`Manifest`] and its rules ([`ManifestError`]).
//! * `global/request.rs`: what a producer presents to attach and why it is refused
//!   ([`AttachRequest`], [`ClaimedFormat`], [`AttachError`]).
//! * `global/indexer.rs`: [`GlobalCkfIndexer`], its lease grants and frame ingestion.
//! * `global/attachment.rs`: one attached producer stream ([`Attachment`]) and its verdicts.
//! * `global/query.rs`: the indexer's prefix queries and search-kernel choice.

mod attachment;
pub(crate) mod indexer;
pub(crate) mod manifest;
mod query;
pub(crate) mod request;

pub use crate::lane::AttachMode;
pub use attachment::{Attachment, StreamEnd, StreamVerdict};
pub use indexer::GlobalCkfIndexer;
pub use manifest::{Manifest, ManifestError};
pub use request::{AttachError, AttachRequest, ClaimedFormat, LaneChangeError};
