//! `DcCkfState`: one DC pool's exact ownership, refcounts, omissions and stats, and the packed
//! cuckoo-filter table projected from them (docs/design.md, "Producer invariants").
//!
//! The exact state is the authority; the table is a lossy projection:
//!
//! | refcount transition | table effect |
//! | --- | --- |
//! | first owner, `0 -> 1` | insert one fingerprint ([`crate::mutator`]) |
//! | additional owner, `n -> n+1` | none |
//! | remaining owner, `n -> n-1` | none |
//! | final owner, `1 -> 0` | remove one matching copy |
//!
//! * A store of a block the member already owns is a no-op (`redundant`).
//! * An unknown `(member, block hash)` removal is an idempotent no-op (`unknown`): it never
//!   deletes by fingerprint.
//! * Distinct block hashes with the same fingerprint and bucket pair each hold their own
//!   physical copy, because each has its own `0 -> 1` transition.
//! * Blocks of one event are processed in order: a failed block is unchanged, its siblings stay
//!   applied, later blocks are still attempted, and the first error is kept.
//! * Capacity exhaustion is a pre-commit omission: no ownership edge, no refcount change, no
//!   dirty bucket, identical table bytes. Service continues and a later store may retry.
//! * Blocks are applied one at a time, but an event's blocks are located (fingerprint, bucket
//!   pair, block-map lines, all from one mixed hash per block) and their cache lines
//!   prefetched a few blocks ahead of their turn, so the cache misses of a large state
//!   overlap; this changes no outcome.
//! * At most 2^21 - 1 members own blocks at once (the block map packs 21-bit owner tags): a
//!   store by one more member omits its blocks with [`BlockError::MemberLimit`], like a
//!   capacity omission.
//!
//! The state is single-owner (an actor): every method takes `&mut self`, so a publication
//! batch ([`DcCkfState::take_batch`]) is always sampled between complete commands.
//!
//! # Files
//! * `dc/state.rs`: [`DcCkfState`] and its core methods.
//! * `dc/config.rs`: [`DcCkfConfig`], the kick bounds, [`DcCkfError`].
//! * `dc/blocks.rs`: the block-keyed half of the state (`Blocks`: the exact block map, the filter table, its dirty tracking) and the prefetch pipeline.
//! * `dc/events.rs`: [`KvEvent`], [`MemberId`], [`EventOutcome`], [`BlockError`].
//! * `dc/block_map.rs`: the exact block map (hash -> owner tags); `dc/tags.rs`: owner tags.
//! * `dc/ownership.rs`: member records and their tags; `dc/quota.rs`: ingest quotas.
//! * `dc/release.rs`: clears in slices; `dc/image.rs`: ownership images;
//!   `dc/member_scan.rs`: [`MemberScan`]; `dc/stats.rs`: [`DcCkfStats`];
//!   `dc/hasher.rs`: [`FoldHashBuilder`]; `dc/maps.rs`: hash-map housekeeping.

mod block_map;
mod blocks;
mod config;
mod events;
mod hasher;
mod image;
mod maps;
mod member_scan;
mod ownership;
pub mod quota;
mod release;
mod state;
mod stats;
mod tags;
#[cfg(test)]
mod tests;

pub use block_map::RebuildStats;
pub use config::{DEFAULT_MAX_KICKS, DcCkfConfig, DcCkfError, MAX_KICKS_LIMIT, SLICE_LINES};
pub use events::{BlockError, EventOutcome, KvEvent, KvEventKind, MemberId};
pub use hasher::FoldHashBuilder;
pub use image::{MemberImage, OwnershipCapture};
pub use member_scan::MemberScan;
pub use quota::{QuotaError, Quotas};
pub use state::DcCkfState;
pub use stats::DcCkfStats;
