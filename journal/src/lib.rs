//! `ckf-journal`: the producer's exact state on disk, so a restart does not blind its DC
//! (`docs/design.md`, "Lane recovery and failure boundaries": suspect exact producer state needs a
//! producer-generation rebuild; this is what it rebuilds from).
//!
//! A journal is a directory holding a **checkpoint** (the whole state at one point) and the
//! **log segments** after it (every change since, in order). Records are opaque byte strings:
//! the producer decides what a state image and a change are; this crate makes them durable.
//!
//! | concern | rule |
//! | --- | --- |
//! | integrity | every record and header carries a CRC-32C ([`frame`], [`header`]) |
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

pub mod error;
pub mod files;
pub mod frame;
pub mod header;
pub mod recovery;
pub mod writer;

use std::fs::{self, File};
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use error::JournalError;
pub use header::{FILE_FORMAT_VERSION, FileKind, HeaderFault, StateIdentity};
pub use recovery::{Recovered, TornTail};

/// Default group-commit window: at most this much of the newest changes (plus one `fdatasync`)
/// is lost on power loss; a `kill -9` loses only what the writer had not taken yet.
pub const DEFAULT_COMMIT_INTERVAL: Duration = Duration::from_millis(50);
/// Longest accepted group-commit window. The durability rule asks for a window of at most
/// 100 ms by default (what power loss may take); up to a second may be configured for slow
/// disks.
pub const MAX_COMMIT_INTERVAL: Duration = Duration::from_secs(1);
/// Default floor of the log size that triggers a checkpoint.
pub const DEFAULT_MIN_CHECKPOINT_BYTES: u64 = 64 << 20;
/// Default limit of queued, unwritten bytes before records become holes (see [`writer`]).
pub const DEFAULT_MAX_BACKLOG_BYTES: u64 = 256 << 20;
/// Default pause between checkpoint attempts while the journal is failed.
pub const DEFAULT_RETRY_INTERVAL: Duration = Duration::from_secs(10);

/// Journal settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalConfig {
    /// Group-commit window, `1 ms..=MAX_COMMIT_INTERVAL`: how often what was written is
    /// `fdatasync`ed (what a power loss can lose, plus one sync's duration). Default
    /// [`DEFAULT_COMMIT_INTERVAL`].
    pub commit_interval: Duration,
    /// A checkpoint is wanted once the log since the last one exceeds this many bytes and the
    /// last checkpoint's size (recovery then reads at most about twice the state). Default
    /// [`DEFAULT_MIN_CHECKPOINT_BYTES`].
    pub min_checkpoint_bytes: u64,
    /// Queued but unwritten bytes above which a record becomes a hole. Default
    /// [`DEFAULT_MAX_BACKLOG_BYTES`].
    pub max_backlog_bytes: u64,
    /// While failed, a checkpoint is wanted at most this often. Default
    /// [`DEFAULT_RETRY_INTERVAL`].
    pub retry_interval: Duration,
}

impl Default for JournalConfig {
    fn default() -> Self {
        Self {
            commit_interval: DEFAULT_COMMIT_INTERVAL,
            min_checkpoint_bytes: DEFAULT_MIN_CHECKPOINT_BYTES,
            max_backlog_bytes: DEFAULT_MAX_BACKLOG_BYTES,
            retry_interval: DEFAULT_RETRY_INTERVAL,
        }
    }
}

/// Hooks for metrics; every method defaults to doing nothing. Called on the journal's threads
/// (writer, sync, checkpoint), never on the caller's.
pub trait JournalObserver: Send + Sync + 'static {
    /// A group commit of `bytes` bytes took `latency` (flush + fdatasync).
    fn committed(&self, latency: Duration, bytes: u64) {
        let _ = (latency, bytes);
    }
    /// A checkpoint of `bytes` bytes was written in `took`.
    fn checkpointed(&self, took: Duration, bytes: u64) {
        let _ = (took, bytes);
    }
    /// The journal failed (`why` names the file and the OS error).
    fn failed(&self, why: &str) {
        let _ = why;
    }
    /// Checkpoint `number` is about to be written, on the thread that writes it (its own, or
    /// the writer's while the journal is failed); its segment already receives the records
    /// that follow it. Tests block here to look at the files in the middle of a checkpoint.
    fn checkpoint_started(&self, number: u64) {
        let _ = number;
    }
    /// A checkpoint failed (`why` names the file and the OS error). While the journal is
    /// healthy this fails nothing: the log still holds every record.
    fn checkpoint_failed(&self, why: &str) {
        let _ = why;
    }
}

/// An observer that records nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoObserver;
impl JournalObserver for NoObserver {}

/// State shared between the handle and the writer thread.
#[derive(Debug)]
pub(crate) struct Shared {
    opened: Instant,
    pub healthy: AtomicBool,
    pub queued_bytes: AtomicU64,
    pub log_bytes_since_checkpoint: AtomicU64,
    pub last_checkpoint_bytes: AtomicU64,
    pub bytes_on_disk: AtomicU64,
    pub dropped_records: AtomicU64,
    pub checkpoint_in_flight: AtomicBool,
    /// Whether the last checkpoint attempt failed (the next waits `retry_interval`).
    pub checkpoint_failed: AtomicBool,
    /// Milliseconds since `opened` of the last commit; `u64::MAX` = never.
    last_commit_ms: AtomicU64,
    last_attempt: Mutex<Option<Instant>>,
    /// The sync thread's last failure, for the writer to act on.
    pub sync_error: Mutex<Option<String>>,
}

impl Shared {
    pub(crate) fn mark_commit(&self) {
        let ms = u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        self.last_commit_ms.store(ms, Ordering::Relaxed);
    }

    pub(crate) fn mark_checkpoint_attempt(&self) {
        *self.last_attempt.lock().expect("journal lock") = Some(Instant::now());
    }
}

/// A snapshot of a journal's counters (for gauges).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalStats {
    /// Whether records are being made durable (`false` after a failure, until a checkpoint).
    pub healthy: bool,
    /// Bytes of segments and checkpoints on disk (committed).
    pub bytes_on_disk: u64,
    /// Log bytes written since the last checkpoint.
    pub log_bytes_since_checkpoint: u64,
    /// Records queued but not yet written (bytes).
    pub queued_bytes: u64,
    /// Records dropped while failed or as holes.
    pub dropped_records: u64,
    /// Time since the last successful commit or checkpoint (`None`: none since open).
    pub last_commit_age: Option<Duration>,
    /// Whether the last checkpoint attempt failed (while `healthy`, the log still holds
    /// every record).
    pub last_checkpoint_failed: bool,
}

/// An open journal; see the crate docs. Dropping it commits what was queued, like
/// [`Journal::close`], without reporting a failure.
pub struct Journal {
    dir: PathBuf,
    config: JournalConfig,
    tx: Option<flume::Sender<writer::Msg>>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    /// Held for the journal's lifetime: the exclusive lock.
    _lock: File,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("dir", &self.dir)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Journal {
    /// Opens (creating if needed, mode 0700) the journal in `dir` for `identity`, recovers
    /// what it holds and starts the writer thread.
    ///
    /// # Errors
    /// [`JournalError::Locked`] when another process has it open; [`JournalError::Io`];
    /// and, for damaged or foreign content ([`JournalError::is_invalid_state`]),
    /// [`JournalError::Header`], [`JournalError::ForeignPool`], [`JournalError::ForeignFormat`],
    /// [`JournalError::Corrupt`], [`JournalError::IncompleteCheckpoint`],
    /// [`JournalError::MissingSegment`], [`JournalError::Misnumbered`]. Nothing is changed on
    /// disk by a refused open except leftover temporaries.
    ///
    /// # Panics
    /// When `config.commit_interval` is zero or above [`MAX_COMMIT_INTERVAL`] (validate
    /// configuration first).
    pub fn open(
        dir: &Path,
        identity: StateIdentity,
        config: JournalConfig,
        observer: Arc<dyn JournalObserver>,
    ) -> Result<(Self, Recovered), JournalError> {
        assert!(
            !config.commit_interval.is_zero() && config.commit_interval <= MAX_COMMIT_INTERVAL,
            "commit_interval out of range"
        );
        create_private_dir(dir)?;
        let lock = lock(dir)?;
        let (recovered, resume) = recovery::recover(dir, &identity)?;
        let (file, _) = recovery::open_for_append(dir, &resume, &identity)?;
        let shared = Arc::new(Shared {
            opened: Instant::now(),
            healthy: AtomicBool::new(true),
            queued_bytes: AtomicU64::new(0),
            log_bytes_since_checkpoint: AtomicU64::new(
                recovered.records.iter().map(|r| r.len() as u64 + 8).sum(),
            ),
            last_checkpoint_bytes: AtomicU64::new(
                recovered
                    .checkpoint
                    .iter()
                    .map(|r| r.len() as u64 + 8)
                    .sum(),
            ),
            bytes_on_disk: AtomicU64::new(files::bytes_on_disk(dir)),
            dropped_records: AtomicU64::new(0),
            checkpoint_in_flight: AtomicBool::new(false),
            checkpoint_failed: AtomicBool::new(false),
            last_commit_ms: AtomicU64::new(u64::MAX),
            last_attempt: Mutex::new(None),
            sync_error: Mutex::new(None),
        });
        let (tx, rx) = flume::unbounded();
        let sync_file = file
            .try_clone()
            .map(Arc::new)
            .map_err(JournalError::io("clone the handle of", dir))?;
        let syncer = writer::Syncer::spawn(Arc::clone(&shared), Arc::clone(&observer))
            .map_err(JournalError::io("spawn the sync thread for", dir))?;
        let w = writer::Writer {
            dir: dir.to_owned(),
            identity,
            config,
            shared: Arc::clone(&shared),
            observer,
            file: BufWriter::with_capacity(writer::WRITE_BUFFER_BYTES, file),
            sync_file,
            syncer,
            segment: resume.segment,
            window_end: None,
            pending_bytes: 0,
            failed: None,
            sealed: Vec::new(),
            new_segment: false,
            checkpointer: None,
        };
        let thread = std::thread::Builder::new()
            .name("ckf-journal".into())
            .spawn(move || w.run(rx))
            .map_err(JournalError::io("spawn the writer thread for", dir))?;
        Ok((
            Self {
                dir: dir.to_owned(),
                config,
                tx: Some(tx),
                shared,
                thread: Some(thread),
                _lock: lock,
            },
            recovered,
        ))
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn send(&self, msg: writer::Msg) {
        if let Some(tx) = &self.tx {
            // The writer only stops when the handle is dropped; a send cannot fail before.
            let _ = tx.send(msg);
        }
    }

    /// Queues one record (non-blocking). It is on disk within one commit window; while the
    /// journal is failed it is dropped, and above `max_backlog_bytes` of queued bytes, or above
    /// [`frame::MAX_RECORD_BYTES`] itself, it becomes a hole (see [`writer`]).
    pub fn append(&self, record: Vec<u8>) {
        if record.len() > frame::MAX_RECORD_BYTES {
            self.send(writer::Msg::Oversized(record.len()));
            return;
        }
        let len = record.len() as u64;
        let queued = self.shared.queued_bytes.load(Ordering::Relaxed);
        if queued + len > self.config.max_backlog_bytes {
            self.send(writer::Msg::Hole);
            return;
        }
        self.shared.queued_bytes.fetch_add(len, Ordering::Relaxed);
        self.send(writer::Msg::Append(record));
    }

    /// Queues a checkpoint: `records` must hold the whole state after every record appended
    /// so far. Each record is at most [`frame::MAX_RECORD_BYTES`].
    pub fn checkpoint(&self, records: Vec<Vec<u8>>) {
        self.checkpoint_with(move || records);
    }

    /// As [`Journal::checkpoint`], with the records made by `build` on the thread that writes
    /// the checkpoint (its own; the writer's while the journal is failed), so the caller only
    /// captures its state and the encoding costs it nothing. Records appended after this call
    /// belong to the next segment and are replayed on the checkpoint, so `build` must make
    /// records which, with them replayed, give the state after them: the whole state as of
    /// this call, or an image the caller captures while appending (a fuzzy one that the replay
    /// makes exact). `build` may wait for the caller to finish that capture; while the journal
    /// is failed it runs on the writer's thread, which then appends nothing until it returns.
    pub fn checkpoint_with(&self, build: impl FnOnce() -> Vec<Vec<u8>> + Send + 'static) {
        self.shared
            .checkpoint_in_flight
            .store(true, Ordering::Relaxed);
        self.send(writer::Msg::Checkpoint(Box::new(build)));
    }

    /// Whether the producer should send a checkpoint now: the log since the last one
    /// outgrew `max(min_checkpoint_bytes, last checkpoint)`, or the journal is failed and
    /// `retry_interval` passed since the last attempt; after a failed checkpoint, also only
    /// once `retry_interval` passed. Never while one is queued or being written.
    pub fn wants_checkpoint(&self) -> bool {
        let s = &self.shared;
        if s.checkpoint_in_flight.load(Ordering::Relaxed) {
            return false;
        }
        if !s.healthy.load(Ordering::Relaxed) || s.checkpoint_failed.load(Ordering::Relaxed) {
            let last = *s.last_attempt.lock().expect("journal lock");
            return last.is_none_or(|t| t.elapsed() >= self.config.retry_interval);
        }
        let threshold = self
            .config
            .min_checkpoint_bytes
            .max(s.last_checkpoint_bytes.load(Ordering::Relaxed));
        s.log_bytes_since_checkpoint.load(Ordering::Relaxed) >= threshold
    }

    /// Commits everything queued before this call and waits for it.
    ///
    /// # Errors
    /// The failure that put the journal in the failed state (its records were not written).
    pub fn sync(&self) -> Result<(), String> {
        let (reply, answer) = flume::bounded(1);
        self.send(writer::Msg::Sync(reply));
        answer
            .recv()
            .unwrap_or_else(|_| Err("the journal writer stopped".into()))
    }

    /// Counters for gauges.
    pub fn stats(&self) -> JournalStats {
        let s = &self.shared;
        let last = s.last_commit_ms.load(Ordering::Relaxed);
        JournalStats {
            healthy: s.healthy.load(Ordering::Relaxed),
            bytes_on_disk: s.bytes_on_disk.load(Ordering::Relaxed),
            log_bytes_since_checkpoint: s.log_bytes_since_checkpoint.load(Ordering::Relaxed),
            queued_bytes: s.queued_bytes.load(Ordering::Relaxed),
            dropped_records: s.dropped_records.load(Ordering::Relaxed),
            last_checkpoint_failed: s.checkpoint_failed.load(Ordering::Relaxed),
            last_commit_age: (last != u64::MAX).then(|| {
                s.opened
                    .elapsed()
                    .saturating_sub(Duration::from_millis(last))
            }),
        }
    }

    /// Commits what is queued, stops the writer thread and releases the lock.
    ///
    /// # Errors
    /// As [`Journal::sync`].
    pub fn close(mut self) -> Result<(), String> {
        let result = self.sync();
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        result
    }

    /// Moves every journal file of `dir` into a new `dir/invalid-<unix seconds>/` so the
    /// producer can start empty without destroying the evidence. Returns the new directory.
    /// Call it only while no journal is open on `dir`.
    ///
    /// # Errors
    /// [`JournalError::Io`].
    pub fn set_aside(dir: &Path) -> Result<PathBuf, JournalError> {
        // Held while moving: a producer that opened the directory meanwhile is not robbed.
        let _lock = lock(dir)?;
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut target = dir.join(format!("invalid-{secs}"));
        let mut k = 1;
        while target.exists() {
            target = dir.join(format!("invalid-{secs}-{k}"));
            k += 1;
        }
        fs::create_dir(&target).map_err(JournalError::io("create", &target))?;
        let listing = files::list(dir)?;
        let paths = listing
            .segments
            .iter()
            .map(|&n| files::segment(dir, n))
            .chain(
                listing
                    .checkpoints
                    .iter()
                    .map(|&n| files::checkpoint(dir, n)),
            )
            .chain(listing.temporaries);
        for path in paths {
            let to = target.join(path.file_name().expect("a file name"));
            fs::rename(&path, &to).map_err(JournalError::io("move", &path))?;
        }
        files::sync_dir(dir)?;
        Ok(target)
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        // The writer commits its queue and stops; wait for it so the lock is released only
        // after the last write (a new journal on the directory must not race this one).
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Takes the directory's exclusive lock (released when the file is dropped).
fn lock(dir: &Path) -> Result<File, JournalError> {
    let lock_path = dir.join(files::LOCK);
    let lock = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(JournalError::io("open", &lock_path))?;
    match lock.try_lock() {
        Ok(()) => Ok(lock),
        Err(fs::TryLockError::WouldBlock) => Err(JournalError::Locked { path: lock_path }),
        Err(fs::TryLockError::Error(e)) => Err(JournalError::Io {
            op: "lock",
            path: lock_path,
            source: e,
        }),
    }
}

fn create_private_dir(dir: &Path) -> Result<(), JournalError> {
    if dir.is_dir() {
        return Ok(());
    }
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(dir).map_err(JournalError::io("create", dir))
}
