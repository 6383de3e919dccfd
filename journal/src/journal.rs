//! The journal handle: open and recover, append, checkpoint, close.

use std::fs::{self, File};
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::config::{JournalConfig, JournalObserver, JournalStats, MAX_COMMIT_INTERVAL};
use crate::error::JournalError;
use crate::header::StateIdentity;
use crate::recovery::{self, Recovered};
use crate::shared::Shared;
use crate::{files, writer};

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
    /// [`crate::record::MAX_RECORD_BYTES`] itself, it becomes a hole (see [`writer`]).
    pub fn append(&self, record: Vec<u8>) {
        if record.len() > crate::record::MAX_RECORD_BYTES {
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
    /// so far. Each record is at most [`crate::record::MAX_RECORD_BYTES`].
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
