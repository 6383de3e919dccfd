//! What can go wrong opening or writing a journal.

use std::io;
use std::path::PathBuf;

use crate::header::HeaderFault;

/// Errors of [`crate::Journal::open`] and [`crate::Journal::set_aside`]. Every variant names
/// the file it is about.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// A file-system call failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was being done (`"read"`, `"create"`, ...).
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Another process (a second producer on the same data directory) holds the lock.
    #[error(
        "{} is locked by another process: two producers cannot share a data directory",
        path.display()
    )]
    Locked {
        /// The lock file.
        path: PathBuf,
    },
    /// A file's header is damaged, of another kind, or of another journal format version.
    #[error("{}: {fault}", path.display())]
    Header {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        fault: HeaderFault,
    },
    /// The state was written by a producer of another pool.
    #[error("{} holds the state of pool {found:?}, but this producer serves pool {expected:?}", path.display())]
    ForeignPool {
        /// The file.
        path: PathBuf,
        /// The pool in the file.
        found: String,
        /// The pool of this producer.
        expected: String,
    },
    /// The state was written for another table format (bucket count, seed, ...).
    #[error("{} was written for table format {found:?}, but this producer uses {expected:?}", path.display())]
    ForeignFormat {
        /// The format in the file.
        path: PathBuf,
        /// The format in the file.
        found: String,
        /// The format of this producer.
        expected: String,
    },
    /// A record of a checkpoint, or of a log segment that is not the newest, is damaged. (A
    /// damaged tail of the newest segment is a torn write and is cut off, not an error.)
    #[error("{} is corrupt at byte {offset}: {fault}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Where the damaged record starts.
        offset: u64,
        /// What is wrong with it.
        fault: String,
    },
    /// A checkpoint has no valid end marker, or a record count that does not match it.
    #[error("{} is incomplete: {why}", path.display())]
    IncompleteCheckpoint {
        /// The file.
        path: PathBuf,
        /// What is missing.
        why: String,
    },
    /// A log segment after the checkpoint is missing (the checkpoint's own first segment, or
    /// one between it and the newest): records after the checkpoint were lost.
    #[error("{} is missing: the log after checkpoint {checkpoint} (newest segment {newest}) has a hole; records after the checkpoint were lost", path.display())]
    MissingSegment {
        /// The expected segment file.
        path: PathBuf,
        /// The checkpoint number recovery starts from (0 = none).
        checkpoint: u64,
        /// The newest segment present.
        newest: u64,
    },
    /// A file's header number differs from the number in its name.
    #[error("{} says it is number {found} in its header", path.display())]
    Misnumbered {
        /// The file.
        path: PathBuf,
        /// The header's number.
        found: u64,
    },
}

impl JournalError {
    /// Whether the error is about the *content* of the state (damaged, foreign, incomplete):
    /// the files can be set aside and the producer started empty. `false` for I/O errors and
    /// a held lock, which setting the files aside would not fix.
    pub fn is_invalid_state(&self) -> bool {
        !matches!(self, Self::Io { .. } | Self::Locked { .. })
    }

    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { op, path, source }
    }
}
