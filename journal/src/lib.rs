//! `ckf-journal`: the producer's exact state on disk, so a restart does not blind its DC
//! (`docs/design.md`, "Lane recovery and failure boundaries": suspect exact producer state needs
//! a producer-generation rebuild; this is what it rebuilds from).
//!
//! A journal is a directory holding a **checkpoint** (the whole state at one point) and the
//! **log segments** after it (every change since, in order). Records are opaque byte strings:
//! the producer decides what a state image and a change are; this crate makes them durable.
//!
//! | concern | rule |
//! | --- | --- |
//! | integrity | every record and header carries a CRC-32C ([`record`], [`header`]) |
//! | identity | every file names its pool and table format; another's is refused ([`StateIdentity`]) |
//! | durability | records reach the kernel at once (a `kill -9` loses only what is still queued); group commit: one `fdatasync` per `commit_interval` window, on a sync thread ([`writer`]) |
//! | recovery | newest checkpoint, then its segments in order; a torn tail of the newest segment (cut inside a record, or zero-filled) is cut off; any other damage is an error ([`recovery`]) |
//! | bounded recovery | [`Journal::wants_checkpoint`] asks for a checkpoint once the log since the last one outgrows it (and `min_checkpoint_bytes`) |
//! | failure | a failed write fails the journal, not the producer: records are dropped and counted until a checkpoint succeeds ([`writer`]) |
//! | exclusion | an exclusive lock on `LOCK`: one producer per directory ([`files`]) |
//!
//! Why our own log and not an embedded store: see the crate README (the measured comparison
//! with redb and fjall on this workload).
//!
//! No async runtime: [`Journal::append`] and [`Journal::checkpoint`] only queue; a writer
//! thread appends, a sync thread runs the group commits' `fdatasync`s, and each checkpoint is
//! written on a thread of its own while the writer goes on appending ([`writer`]).
pub mod config;
pub mod error;
pub mod files;
pub mod header;
mod journal;
pub mod record;
pub mod recovery;
mod shared;
pub mod writer;

pub use config::{
    DEFAULT_COMMIT_INTERVAL, DEFAULT_MAX_BACKLOG_BYTES, DEFAULT_MIN_CHECKPOINT_BYTES,
    DEFAULT_RETRY_INTERVAL, JournalConfig, JournalObserver, JournalStats, MAX_COMMIT_INTERVAL,
    NoObserver,
};
pub use error::JournalError;
pub use header::{FILE_FORMAT_VERSION, FileKind, HeaderFault, StateIdentity};
pub use journal::Journal;
pub use recovery::{Recovered, TornTail};
