//! The data directory's layout.
//!
//! | file | what |
//! | --- | --- |
//! | `LOCK` | held (`flock`, exclusive) while a journal is open: one producer per directory |
//! | `wal-<n>.log` | log segment `n`: the records appended after checkpoint `n` (or from empty state for `n = 0`) |
//! | `checkpoint-<n>.ckpt` | the state before segment `n`; the newest one is where recovery starts |
//! | `checkpoint-<n>.ckpt.tmp` | a checkpoint being written; renamed when complete, removed on open |
//! | `invalid-<unix seconds>/` | files set aside by [`crate::Journal::set_aside`] |
//!
//! Numbers are written as 20 decimal digits so names sort in number order.

use std::fs;
use std::path::{Path, PathBuf};

use crate::error::JournalError;

pub(crate) const LOCK: &str = "LOCK";

pub(crate) fn segment(dir: &Path, n: u64) -> PathBuf {
    dir.join(format!("wal-{n:020}.log"))
}

pub(crate) fn checkpoint(dir: &Path, n: u64) -> PathBuf {
    dir.join(format!("checkpoint-{n:020}.ckpt"))
}

pub(crate) fn checkpoint_tmp(dir: &Path, n: u64) -> PathBuf {
    dir.join(format!("checkpoint-{n:020}.ckpt.tmp"))
}

/// What a directory listing found, numbers ascending.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    pub segments: Vec<u64>,
    pub checkpoints: Vec<u64>,
    pub temporaries: Vec<PathBuf>,
}

fn number(name: &str, prefix: &str, suffix: &str) -> Option<u64> {
    let digits = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

pub(crate) fn list(dir: &Path) -> Result<Listing, JournalError> {
    let mut listing = Listing::default();
    for entry in fs::read_dir(dir).map_err(JournalError::io("list", dir))? {
        let entry = entry.map_err(JournalError::io("list", dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(n) = number(name, "wal-", ".log") {
            listing.segments.push(n);
        } else if let Some(n) = number(name, "checkpoint-", ".ckpt") {
            listing.checkpoints.push(n);
        } else if number(name, "checkpoint-", ".ckpt.tmp").is_some() {
            listing.temporaries.push(entry.path());
        }
    }
    listing.segments.sort_unstable();
    listing.checkpoints.sort_unstable();
    Ok(listing)
}

/// Makes a rename or creation in `dir` durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), JournalError> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(JournalError::io("sync directory", dir))
}

/// Bytes of the journal's files in `dir` (segments and checkpoints).
pub(crate) fn bytes_on_disk(dir: &Path) -> u64 {
    let Ok(listing) = list(dir) else { return 0 };
    let size = |p: PathBuf| fs::metadata(p).map_or(0, |m| m.len());
    listing
        .segments
        .iter()
        .map(|&n| size(segment(dir, n)))
        .sum::<u64>()
        + listing
            .checkpoints
            .iter()
            .map(|&n| size(checkpoint(dir, n)))
            .sum::<u64>()
}
