//! Reading a journal back: the newest checkpoint, then every later segment in order.

use std::fs::{self, File, OpenOptions};
use std::io::{BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::JournalError;
use crate::files::{self, Listing};
use crate::header::{self, FileKind, Header, StateIdentity};
use crate::record::{self, Entry, EntryFault};

/// A torn tail cut off the newest segment: what a `kill -9` or power loss during a write
/// leaves. Everything before `offset` was recovered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornTail {
    /// The segment.
    pub path: PathBuf,
    /// Where the first damaged record starts (bytes from the start of the file).
    pub offset: u64,
    /// Bytes cut off.
    pub dropped_bytes: u64,
    /// What was wrong with the record at `offset`.
    pub fault: String,
}

/// What [`crate::Journal::open`] read back, in the order to apply it.
#[derive(Debug, Default)]
pub struct Recovered {
    /// The newest checkpoint's records (empty when the journal had none: start from empty).
    pub checkpoint: Vec<Vec<u8>>,
    /// The checkpoint's number, if there was one.
    pub checkpoint_number: Option<u64>,
    /// The log records appended after the checkpoint, oldest first.
    pub records: Vec<Vec<u8>>,
    /// Bytes read (checkpoint and segments).
    pub bytes_read: u64,
    /// The torn tail cut off the newest segment, if any.
    pub torn: Option<TornTail>,
    /// How long reading took.
    pub took: Duration,
}

/// Where appending resumes after recovery.
pub(crate) struct Resume {
    /// The segment to append to (created if absent).
    pub segment: u64,
    /// Its length after the torn tail was cut (0 when it must be created).
    pub valid_len: u64,
}

fn check_identity(
    path: &Path,
    found: &Header,
    expected: &StateIdentity,
) -> Result<(), JournalError> {
    if found.identity.pool != expected.pool {
        return Err(JournalError::ForeignPool {
            path: path.to_owned(),
            found: found.identity.pool.clone(),
            expected: expected.pool.clone(),
        });
    }
    if found.identity.format != expected.format {
        return Err(JournalError::ForeignFormat {
            path: path.to_owned(),
            found: found.identity.format.clone(),
            expected: expected.format.clone(),
        });
    }
    Ok(())
}

/// Opens `path` and checks its header; returns the reader positioned after it and its offset.
fn open_checked(
    path: &Path,
    kind: FileKind,
    number: u64,
    identity: &StateIdentity,
) -> Result<(BufReader<File>, u64), JournalError> {
    let file = File::open(path).map_err(JournalError::io("open", path))?;
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let header = header::decode(kind, &mut reader)
        .map_err(JournalError::io("read", path))?
        .map_err(|fault| JournalError::Header {
            path: path.to_owned(),
            fault,
        })?;
    if header.number != number {
        return Err(JournalError::Misnumbered {
            path: path.to_owned(),
            found: header.number,
        });
    }
    check_identity(path, &header, identity)?;
    let offset = reader
        .stream_position()
        .map_err(JournalError::io("read", path))?;
    Ok((reader, offset))
}

fn read_checkpoint(
    dir: &Path,
    number: u64,
    identity: &StateIdentity,
    out: &mut Recovered,
) -> Result<(), JournalError> {
    let path = files::checkpoint(dir, number);
    let (mut reader, mut offset) = open_checked(&path, FileKind::Checkpoint, number, identity)?;
    loop {
        let at = offset;
        match record::decode(&mut reader).map_err(JournalError::io("read", &path))? {
            Ok(Entry::Record(payload)) => {
                offset += (record::RECORD_OVERHEAD + payload.len()) as u64;
                out.checkpoint.push(payload);
            }
            Ok(Entry::End(count)) => {
                if count != out.checkpoint.len() as u64 {
                    return Err(JournalError::IncompleteCheckpoint {
                        path,
                        why: format!(
                            "its end marker counts {count} records, {} were read",
                            out.checkpoint.len()
                        ),
                    });
                }
                out.bytes_read += offset + 16;
                out.checkpoint_number = Some(number);
                return Ok(());
            }
            Ok(Entry::Eof) | Err(EntryFault::Truncated) => {
                return Err(JournalError::IncompleteCheckpoint {
                    path,
                    why: "it has no end marker".into(),
                });
            }
            Err(fault) => {
                return Err(JournalError::Corrupt {
                    path,
                    offset: at,
                    fault: fault.to_string(),
                });
            }
        }
    }
}

/// Reads segment `number`; a damaged record ends it. Returns the valid length and the fault.
fn read_segment(
    path: &Path,
    number: u64,
    identity: &StateIdentity,
    out: &mut Recovered,
) -> Result<(u64, Option<(u64, EntryFault)>), JournalError> {
    let (mut reader, mut offset) = open_checked(path, FileKind::Segment, number, identity)?;
    loop {
        match record::decode(&mut reader).map_err(JournalError::io("read", path))? {
            Ok(Entry::Record(payload)) => {
                offset += (record::RECORD_OVERHEAD + payload.len()) as u64;
                out.records.push(payload);
            }
            Ok(Entry::Eof) => return Ok((offset, None)),
            Ok(Entry::End(_)) => return Ok((offset, Some((offset, EntryFault::Checksum)))),
            Err(fault) => return Ok((offset, Some((offset, fault)))),
        }
    }
}

/// Whether segments `later` hold no record (only a header, or a header cut short).
fn later_hold_no_records(
    dir: &Path,
    later: &[u64],
    identity: &StateIdentity,
) -> Result<bool, JournalError> {
    for &m in later {
        let mut scratch = Recovered::default();
        match read_segment(&files::segment(dir, m), m, identity, &mut scratch) {
            Ok((_, None)) if scratch.records.is_empty() => {}
            Err(JournalError::Header {
                fault: crate::header::HeaderFault::Truncated,
                ..
            }) => {}
            _ => return Ok(false),
        }
    }
    Ok(true)
}

/// Whether every byte of `path` from `offset` on is zero.
fn zeros_from(path: &Path, offset: u64) -> Result<bool, JournalError> {
    use std::io::Read;
    let mut file = File::open(path).map_err(JournalError::io("open", path))?;
    file.seek(SeekFrom::Start(offset))
        .map_err(JournalError::io("seek", path))?;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match file
            .read(&mut buf)
            .map_err(JournalError::io("read", path))?
        {
            0 => return Ok(true),
            n if buf[..n].iter().any(|&b| b != 0) => return Ok(false),
            _ => {}
        }
    }
}

/// Recovers `dir`: see the crate docs for the rules. Removes leftovers (temporary
/// checkpoints, files older than the newest checkpoint) and cuts a torn tail.
pub(crate) fn recover(
    dir: &Path,
    identity: &StateIdentity,
) -> Result<(Recovered, Resume), JournalError> {
    let started = Instant::now();
    let Listing {
        segments,
        checkpoints,
        temporaries,
    } = files::list(dir)?;
    let mut out = Recovered::default();
    let base = checkpoints.last().copied();
    if let Some(n) = base {
        read_checkpoint(dir, n, identity, &mut out)?;
    }
    let start = base.unwrap_or(0);
    // Leftovers (temporaries, and files of an interrupted clean-up after checkpoint `start`)
    // are removed only once everything read is known good: a refusal changes nothing.
    let leftovers: Vec<PathBuf> = temporaries
        .into_iter()
        .chain(
            checkpoints
                .iter()
                .filter(|&&c| c < start)
                .map(|&c| files::checkpoint(dir, c)),
        )
        .chain(
            segments
                .iter()
                .filter(|&&s| s < start)
                .map(|&s| files::segment(dir, s)),
        )
        .collect();
    let live: Vec<u64> = segments.into_iter().filter(|&s| s >= start).collect();
    let newest = live.last().copied();
    if let Some(c) = base
        && live.first() != Some(&c)
    {
        // Segment c is created before checkpoint c is renamed into place, so its absence is a
        // deleted or lost log, not a crash: the records after the checkpoint are gone.
        return Err(JournalError::MissingSegment {
            path: files::segment(dir, c),
            checkpoint: c,
            newest: newest.unwrap_or(c),
        });
    }
    for (i, &n) in live.iter().enumerate() {
        let expected = start + i as u64;
        if n != expected {
            return Err(JournalError::MissingSegment {
                path: files::segment(dir, expected),
                checkpoint: start,
                newest: newest.unwrap_or(start),
            });
        }
    }
    let mut resume = Resume {
        segment: start,
        valid_len: 0,
    };
    for (i, &n) in live.iter().enumerate() {
        let path = files::segment(dir, n);
        let (valid, fault) = match read_segment(&path, n, identity, &mut out) {
            // A segment cut inside its header can only be the newest one, created (not yet
            // synced) by a checkpoint that never completed: nothing was appended to it. The
            // base checkpoint's own segment was synced before that checkpoint was renamed into
            // place, so a cut header there is damage (a lost log), refused below.
            Err(JournalError::Header {
                fault: crate::header::HeaderFault::Truncated,
                ..
            }) if Some(n) == newest && Some(n) != base => (0, None),
            other => other?,
        };
        out.bytes_read += valid;
        if let Some((offset, fault)) = fault {
            // Torn: cut inside the last record (kill -9 mid-write), or only zeros from there
            // on (blocks a power loss left unwritten), in the newest segment, or in one whose
            // later segments hold no record yet: a power loss just after a checkpoint sealed it
            // (every commit syncs a sealed segment before anything later, so nothing after a
            // tear was ever synced). Anything else is damage.
            let last_with_records =
                Some(n) == newest || later_hold_no_records(dir, &live[i + 1..], identity)?;
            let torn =
                last_with_records && (fault == EntryFault::Truncated || zeros_from(&path, offset)?);
            if !torn {
                return Err(JournalError::Corrupt {
                    path,
                    offset,
                    fault: fault.to_string(),
                });
            }
            let len = fs::metadata(&path)
                .map_err(JournalError::io("stat", &path))?
                .len();
            out.torn = Some(TornTail {
                path: path.clone(),
                offset,
                dropped_bytes: len - offset,
                fault: fault.to_string(),
            });
        }
        resume = Resume {
            segment: n,
            valid_len: valid,
        };
    }
    for path in &leftovers {
        fs::remove_file(path).map_err(JournalError::io("remove", path))?;
    }
    if let Some(torn) = &out.torn {
        let file = OpenOptions::new()
            .write(true)
            .open(&torn.path)
            .map_err(JournalError::io("open", &torn.path))?;
        file.set_len(torn.offset)
            .and_then(|()| file.sync_all())
            .map_err(JournalError::io("truncate", &torn.path))?;
    }
    out.took = started.elapsed();
    Ok((out, resume))
}

/// Opens segment `resume.segment` for appending, creating it with a header when new.
pub(crate) fn open_for_append(
    dir: &Path,
    resume: &Resume,
    identity: &StateIdentity,
) -> Result<(File, u64), JournalError> {
    let path = files::segment(dir, resume.segment);
    if resume.valid_len == 0 {
        return create_segment(dir, resume.segment, identity);
    }
    let mut file = OpenOptions::new()
        .write(true)
        .open(&path)
        .map_err(JournalError::io("open", &path))?;
    file.seek(SeekFrom::Start(resume.valid_len))
        .map_err(JournalError::io("seek", &path))?;
    Ok((file, resume.valid_len))
}

/// Creates (or replaces) segment `n` holding only its header, durably.
pub(crate) fn create_segment(
    dir: &Path,
    n: u64,
    identity: &StateIdentity,
) -> Result<(File, u64), JournalError> {
    let (file, len) = start_segment(dir, n, identity)?;
    let path = files::segment(dir, n);
    file.sync_all().map_err(JournalError::io("sync", &path))?;
    files::sync_dir(dir)?;
    Ok((file, len))
}

/// Creates (or replaces) segment `n` holding only its header, without waiting for the disk:
/// the header reaches the kernel in one `write`, so a `kill -9` leaves it whole or absent
/// (a power loss may leave it cut, which recovery accepts in the newest segment). The caller
/// syncs the file and the directory before anything depends on them.
pub(crate) fn start_segment(
    dir: &Path,
    n: u64,
    identity: &StateIdentity,
) -> Result<(File, u64), JournalError> {
    let path = files::segment(dir, n);
    let mut file = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(&path)
        .map_err(JournalError::io("create", &path))?;
    let mut bytes = Vec::new();
    header::encode(
        &Header {
            kind: FileKind::Segment,
            number: n,
            identity: identity.clone(),
        },
        &mut bytes,
    )
    .expect("writing to a Vec");
    use std::io::Write;
    if let Err(e) = file.write_all(&bytes) {
        // No segment without its whole header: on a full disk, a cut header left here would
        // make the next start create the segment again, and fail on the same full disk.
        drop(file);
        let _ = fs::remove_file(&path);
        return Err(JournalError::io("write", &path)(e));
    }
    Ok((file, bytes.len() as u64))
}
