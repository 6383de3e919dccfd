//! The writer thread: appends records, commits them in groups, rotates segments for
//! checkpoints.
//!
//! Records reach the kernel at once: the writer `write`s whenever its queue is empty (and
//! every 64 KiB under load), so a `kill -9` loses only what was still queued in the process,
//! never a commit window. Group commit is for power loss: the first record written after a
//! commit opens a window; when it closes (`commit_interval` later) a separate sync thread
//! `fdatasync`s everything written so far while the writer goes on writing. A slow disk
//! therefore delays durability against power loss by its sync time, but never holds records
//! back from the kernel.
//!
//! Checkpoints never hold records back either. At a checkpoint request the writer only seals
//! segment `n` (hands its buffer to the kernel), creates segment `n + 1` and goes on appending
//! to it; a checkpoint thread then writes `checkpoint-<n+1>`, makes it and segment `n + 1`
//! durable, renames it into place and removes what is older. Until the rename, recovery reads
//! the previous checkpoint and segments `n` and `n + 1`, which hold every record; after it,
//! checkpoint `n + 1` and segment `n + 1`. (The first version wrote checkpoints on this thread:
//! records acknowledged during a checkpoint's five `fsync`s, up to a second on a loaded VM,
//! waited in the process and a `kill -9` lost them.) A sealed segment is `fdatasync`ed before
//! anything of a later one, so a power loss never leaves a hole in the middle of the log.
//!
//! Failure: the first failed write, flush or sync puts the journal in the *failed* state. From
//! then on records are dropped (counted) until a checkpoint succeeds: the checkpoint holds the
//! whole state, so the log is whole again from it on. That healing checkpoint is written on
//! this thread (nothing may be appended after a hole before the checkpoint that covers it is
//! durable). A record the caller could not queue (backlog above its limit) becomes a *hole* at
//! its exact place in the stream, which fails the journal the same way; nothing after a hole is
//! ever written before the next checkpoint, so the log never skips a record. A checkpoint that
//! fails while the log is healthy fails nothing: the log still holds every record, and the
//! next attempt waits `retry_interval`.

use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::config::{JournalConfig, JournalObserver};
use crate::files;
use crate::header::{self, FileKind, Header, StateIdentity};
use crate::record;
use crate::recovery;
use crate::shared::Shared;

pub(crate) enum Msg {
    Append(Vec<u8>),
    /// A record that could not be queued: the log must not go on past it.
    Hole,
    /// A record above `record::MAX_RECORD_BYTES` (its length): a hole too.
    Oversized(usize),
    /// A checkpoint; the function makes its records (on the thread that writes it).
    Checkpoint(BuildRecords),
    /// Commit now, then answer.
    Sync(flume::Sender<Result<(), String>>),
}

/// Makes a checkpoint's records (see [`crate::Journal::checkpoint_with`]).
pub(crate) type BuildRecords = Box<dyn FnOnce() -> Vec<Vec<u8>> + Send>;

/// Bytes of records the writer buffers before a `write` even while its queue is not empty.
pub(crate) const WRITE_BUFFER_BYTES: usize = 64 << 10;

/// One group commit to run off the writer thread: `fdatasync` each file in order (sealed
/// segments first, then the current one), then the directory when a segment is new since the
/// last commit (its entry must outlive a power loss too).
struct SyncJob {
    files: Vec<Arc<File>>,
    dir: Option<PathBuf>,
    bytes: u64,
}

/// The sync thread: runs one [`SyncJob`] at a time; `busy` while one runs.
pub(crate) struct Syncer {
    tx: Option<flume::Sender<SyncJob>>,
    busy: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Syncer {
    pub(crate) fn spawn(
        shared: Arc<Shared>,
        observer: Arc<dyn JournalObserver>,
    ) -> std::io::Result<Self> {
        let (tx, rx) = flume::bounded::<SyncJob>(1);
        let busy = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&busy);
        let thread = std::thread::Builder::new()
            .name("ckf-journal-sync".into())
            .spawn(move || {
                for job in rx {
                    let started = Instant::now();
                    let result = job
                        .files
                        .iter()
                        .try_for_each(|f| f.sync_data())
                        .and_then(|()| {
                            job.dir
                                .as_deref()
                                .map_or(Ok(()), |d| File::open(d).and_then(|d| d.sync_all()))
                        });
                    match result {
                        Ok(()) => {
                            shared.bytes_on_disk.fetch_add(job.bytes, Ordering::Relaxed);
                            shared.mark_commit();
                            observer.committed(started.elapsed(), job.bytes);
                        }
                        Err(e) => {
                            *shared.sync_error.lock().expect("journal lock") =
                                Some(format!("fdatasync: {e}"));
                        }
                    }
                    flag.store(false, Ordering::Release);
                }
            })?;
        Ok(Self {
            tx: Some(tx),
            busy,
            thread: Some(thread),
        })
    }

    /// Starts `job` unless a sync runs; gives it back when one runs.
    fn try_start(&self, job: SyncJob) -> Result<(), SyncJob> {
        if self.busy.swap(true, Ordering::AcqRel) {
            return Err(job);
        }
        if self.tx.as_ref().is_none_or(|tx| tx.send(job).is_err()) {
            self.busy.store(false, Ordering::Release);
        }
        Ok(())
    }

    /// Waits for the sync in flight, if any.
    fn wait_idle(&self) {
        while self.busy.load(Ordering::Acquire) {
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub(crate) struct Writer {
    pub dir: PathBuf,
    pub identity: StateIdentity,
    pub config: JournalConfig,
    pub shared: Arc<Shared>,
    pub observer: Arc<dyn JournalObserver>,
    pub file: BufWriter<File>,
    /// A second handle of the segment, for the sync thread.
    pub sync_file: Arc<File>,
    pub syncer: Syncer,
    pub segment: u64,
    /// When the open window closes (`None`: nothing written since the last commit).
    pub window_end: Option<Instant>,
    /// Bytes written since the last commit.
    pub pending_bytes: u64,
    /// Why the journal is failed, if it is.
    pub failed: Option<String>,
    /// Segments sealed by a checkpoint but not yet `fdatasync`ed: the next commit syncs them
    /// before the current segment.
    pub sealed: Vec<Arc<File>>,
    /// Whether the current segment was created since the last commit (its directory entry
    /// is synced with it).
    pub new_segment: bool,
    /// The checkpoint thread, while one runs (at most one at a time).
    pub checkpointer: Option<std::thread::JoinHandle<()>>,
}

impl Writer {
    pub fn run(mut self, rx: flume::Receiver<Msg>) {
        loop {
            self.check_sync();
            // A receive returns a queued message even after the deadline, so a queue that
            // never empties (sustained load) would keep the window open forever: close it here.
            if self.window_end.is_some_and(|end| Instant::now() >= end) {
                self.commit();
            }
            // Hand what is buffered to the kernel before waiting: a kill -9 then loses nothing
            // the writer has taken from its queue.
            if rx.is_empty()
                && !self.file.buffer().is_empty()
                && self.failed.is_none()
                && let Err(e) = self.file.flush()
            {
                self.fail(format!("write {}: {e}", self.segment_path().display()));
            }
            let msg = match self.window_end {
                Some(end) => match rx.recv_deadline(end) {
                    Ok(msg) => Some(msg),
                    Err(flume::RecvTimeoutError::Timeout) => None,
                    Err(flume::RecvTimeoutError::Disconnected) => break,
                },
                None => match rx.recv() {
                    Ok(msg) => Some(msg),
                    Err(flume::RecvError::Disconnected) => break,
                },
            };
            match msg {
                None => self.commit(),
                Some(Msg::Append(record)) => self.append(record),
                Some(Msg::Hole) => self.hole(|w| {
                    format!(
                        "the writer fell more than {} bytes behind",
                        w.config.max_backlog_bytes
                    )
                }),
                Some(Msg::Oversized(len)) => self.hole(|_| {
                    format!(
                        "a record of {len} bytes exceeds the {}-byte record limit",
                        record::MAX_RECORD_BYTES
                    )
                }),
                Some(Msg::Checkpoint(records)) => self.checkpoint(records),
                Some(Msg::Sync(reply)) => {
                    self.commit_now();
                    self.join_checkpointer();
                    let _ = reply.send(match &self.failed {
                        None => Ok(()),
                        Some(why) => Err(why.clone()),
                    });
                }
            }
        }
        self.commit_now();
        self.join_checkpointer();
    }

    /// A record that never reached the writer: fails the journal (unless it already is) so
    /// nothing after the hole is written before the next checkpoint, and counts the record.
    fn hole(&mut self, why: impl FnOnce(&Self) -> String) {
        if self.failed.is_none() {
            let why = why(self);
            self.fail(format!(
                "{why}; records are dropped until the next checkpoint"
            ));
        }
        self.shared.dropped_records.fetch_add(1, Ordering::Relaxed);
    }

    /// Fails the journal when the sync thread's last fdatasync failed.
    fn check_sync(&mut self) {
        let error = self.shared.sync_error.lock().expect("journal lock").take();
        if let Some(why) = error
            && self.failed.is_none()
        {
            self.fail(format!("{}: {why}", self.segment_path().display()));
        }
    }

    fn append(&mut self, record: Vec<u8>) {
        self.shared
            .queued_bytes
            .fetch_sub(record.len() as u64, Ordering::Relaxed);
        if self.failed.is_some() {
            self.shared.dropped_records.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if let Err(e) = record::encode(&record, &mut self.file) {
            self.fail(format!("write {}: {e}", self.segment_path().display()));
            return;
        }
        let bytes = (record::RECORD_OVERHEAD + record.len()) as u64;
        self.pending_bytes += bytes;
        self.shared
            .log_bytes_since_checkpoint
            .fetch_add(bytes, Ordering::Relaxed);
        self.window_end
            .get_or_insert_with(|| Instant::now() + self.config.commit_interval);
    }

    fn segment_path(&self) -> PathBuf {
        files::segment(&self.dir, self.segment)
    }

    /// The group commit of everything written so far: sealed segments, then the current one
    /// (and the directory when the current segment is new).
    fn sync_job(&self) -> SyncJob {
        let mut files = self.sealed.clone();
        files.push(Arc::clone(&self.sync_file));
        SyncJob {
            files,
            dir: self.new_segment.then(|| self.dir.clone()),
            bytes: self.pending_bytes,
        }
    }

    /// The sync job started or run: what it covers is no longer pending.
    fn synced(&mut self) {
        self.pending_bytes = 0;
        self.sealed.clear();
        self.new_segment = false;
        self.window_end = None;
    }

    /// Closes the open window, if any: writes what is buffered to the kernel and starts an
    /// fdatasync on the sync thread (or, while one still runs, retries in a millisecond).
    fn commit(&mut self) {
        if self.window_end.is_none() || self.failed.is_some() {
            self.window_end = None;
            return;
        }
        if let Err(e) = self.file.flush() {
            self.fail(format!("write {}: {e}", self.segment_path().display()));
            return;
        }
        match self.syncer.try_start(self.sync_job()) {
            Ok(()) => self.synced(),
            Err(_busy) => {
                self.window_end = Some(Instant::now() + std::time::Duration::from_millis(1));
            }
        }
    }

    /// Makes everything written so far durable before returning (sync requests, the end):
    /// flush, wait for the sync thread, fdatasync on this thread.
    fn commit_now(&mut self) {
        self.window_end = None;
        if self.failed.is_some() {
            return;
        }
        self.syncer.wait_idle();
        self.check_sync();
        if self.failed.is_some() {
            return;
        }
        let started = Instant::now();
        let job = self.sync_job();
        let result = self.file.flush().and_then(|()| {
            job.files.iter().try_for_each(|f| f.sync_data())?;
            job.dir
                .as_deref()
                .map_or(Ok(()), |d| File::open(d).and_then(|d| d.sync_all()))
        });
        match result {
            Ok(()) => {
                let bytes = job.bytes;
                self.synced();
                self.shared
                    .bytes_on_disk
                    .fetch_add(bytes, Ordering::Relaxed);
                self.shared.mark_commit();
                self.observer.committed(started.elapsed(), bytes);
            }
            Err(e) => self.fail(format!("commit {}: {e}", self.segment_path().display())),
        }
    }

    fn fail(&mut self, why: String) {
        tracing::error!(error = %why, "journal failed: serving from memory; the next checkpoint restores durability");
        self.shared.healthy.store(false, Ordering::Relaxed);
        self.observer.failed(&why);
        self.window_end = None;
        self.pending_bytes = 0;
        self.failed = Some(why);
    }

    /// Waits for the checkpoint thread, if one runs.
    fn join_checkpointer(&mut self) {
        if let Some(thread) = self.checkpointer.take()
            && thread.join().is_err()
        {
            tracing::error!("the journal checkpoint thread panicked");
            self.shared
                .checkpoint_in_flight
                .store(false, Ordering::Relaxed);
        }
    }

    /// Checkpoint `segment + 1` holding `records` (the whole state after every record written
    /// so far). Healthy: seal the segment, append to segment `segment + 1` from now on, and
    /// write the checkpoint on its own thread. Failed: write it here, and resume appending
    /// only once it is durable (it covers the hole).
    fn checkpoint(&mut self, build: BuildRecords) {
        self.join_checkpointer();
        let started = Instant::now();
        if self.failed.is_none()
            && let Err(e) = self.file.flush()
        {
            self.fail(format!("write {}: {e}", self.segment_path().display()));
        }
        let n = self.segment + 1;
        let segment = match recovery::start_segment(&self.dir, n, &self.identity) {
            Ok((file, _)) => file,
            Err(e) => {
                self.checkpoint_failed(e.to_string());
                return;
            }
        };
        let mut job = CheckpointJob {
            dir: self.dir.clone(),
            identity: self.identity.clone(),
            number: n,
            build: Some(build),
            sealed: Vec::new(),
            segment: Arc::new(match segment.try_clone() {
                Ok(f) => f,
                Err(e) => {
                    self.checkpoint_failed(format!("clone the handle of segment {n}: {e}"));
                    return;
                }
            }),
            shared: Arc::clone(&self.shared),
            observer: Arc::clone(&self.observer),
            started,
        };
        if self.failed.is_some() {
            // Nothing is appended after the hole before this checkpoint is durable.
            match job.write() {
                Ok(bytes) => {
                    self.switch_to(n, segment, Arc::clone(&job.segment));
                    self.new_segment = false; // the job synced it and the directory
                    self.sealed.clear(); // older than the checkpoint: removed by finish()
                    self.shared
                        .log_bytes_since_checkpoint
                        .store(0, Ordering::Relaxed);
                    if let Some(why) = self.failed.take() {
                        tracing::info!(previous_failure = %why, "journal healthy again after a checkpoint");
                    }
                    self.shared.healthy.store(true, Ordering::Relaxed);
                    job.finish(bytes);
                }
                Err(why) => {
                    let _ = fs::remove_file(files::checkpoint_tmp(&self.dir, n));
                    // Segment n + 1 never received a record; left behind, it would make the
                    // tail a hole left in segment n by the failure look like mid-log damage.
                    let _ = fs::remove_file(files::segment(&self.dir, n));
                    self.checkpoint_failed(why);
                }
            }
            return;
        }
        // Healthy: seal segment n, go on in n + 1, write the checkpoint off this thread.
        let previous = Arc::clone(&self.sync_file);
        self.switch_to(n, segment, Arc::clone(&job.segment));
        self.sealed.push(previous);
        job.sealed = self.sealed.clone();
        let carried = self
            .shared
            .log_bytes_since_checkpoint
            .swap(0, Ordering::Relaxed);
        let spawned = std::thread::Builder::new()
            .name("ckf-journal-checkpoint".into())
            .spawn(move || match job.write() {
                Ok(bytes) => job.finish(bytes),
                Err(why) => job.fail(why, carried),
            });
        match spawned {
            Ok(thread) => self.checkpointer = Some(thread),
            Err(e) => {
                // The log goes on in segment n + 1; only this checkpoint is lost.
                self.shared
                    .log_bytes_since_checkpoint
                    .fetch_add(carried, Ordering::Relaxed);
                self.checkpoint_failed(format!("spawn the checkpoint thread: {e}"));
            }
        }
    }

    /// Appends to segment `n` (`file`, and `sync_file` for the sync thread) from now on.
    fn switch_to(&mut self, n: u64, file: File, sync_file: Arc<File>) {
        let old = std::mem::replace(
            &mut self.file,
            BufWriter::with_capacity(WRITE_BUFFER_BYTES, file),
        );
        // Flushed before (or failed, with nothing more to write): drop without a write.
        drop(old.into_parts());
        self.sync_file = sync_file;
        self.segment = n;
        self.new_segment = true;
    }

    /// A checkpoint that could not even start (its segment could not be created): the log
    /// goes on where it was.
    fn checkpoint_failed(&mut self, why: String) {
        fail_checkpoint(
            &self.shared,
            self.observer.as_ref(),
            &why,
            self.failed.is_some(),
        );
    }
}

/// Records a failed checkpoint: the next attempt waits `retry_interval`.
fn fail_checkpoint(shared: &Shared, observer: &dyn JournalObserver, why: &str, failed: bool) {
    shared.mark_checkpoint_attempt();
    shared.checkpoint_failed.store(true, Ordering::Relaxed);
    shared.checkpoint_in_flight.store(false, Ordering::Relaxed);
    observer.checkpoint_failed(why);
    if failed {
        tracing::warn!(error = %why, "journal checkpoint retry failed; still serving from memory");
    } else {
        tracing::warn!(error = %why, "journal checkpoint failed; the log still holds every record");
    }
}

/// One checkpoint being written: `checkpoint-<number>` holding what `build` makes, with segment
/// `number` already created (`segment`) and `sealed` the older segments not yet synced.
struct CheckpointJob {
    dir: PathBuf,
    identity: StateIdentity,
    number: u64,
    /// Makes the records; taken by [`CheckpointJob::write`].
    build: Option<BuildRecords>,
    sealed: Vec<Arc<File>>,
    segment: Arc<File>,
    shared: Arc<Shared>,
    observer: Arc<dyn JournalObserver>,
    started: Instant,
}

impl CheckpointJob {
    /// Writes and fsyncs `checkpoint-<n>.ckpt.tmp`, makes the sealed segments, segment `n`
    /// and its directory entry durable, then renames the checkpoint into place (segment `n`
    /// exists before checkpoint `n` does: a checkpoint without its segment is then always
    /// damage, never a crash). Returns the checkpoint's size in bytes.
    fn write(&mut self) -> Result<u64, String> {
        let n = self.number;
        self.observer.checkpoint_started(n);
        let records = self.build.take().map_or_else(Vec::new, |build| build());
        let bytes = self.write_tmp(&records)?;
        drop(records);
        let synced = self
            .sealed
            .iter()
            .try_for_each(|f| f.sync_data())
            .and_then(|()| self.segment.sync_all());
        synced.map_err(|e| format!("sync {}: {e}", files::segment(&self.dir, n).display()))?;
        files::sync_dir(&self.dir).map_err(|e| e.to_string())?;
        let tmp = files::checkpoint_tmp(&self.dir, n);
        fs::rename(&tmp, files::checkpoint(&self.dir, n))
            .map_err(|e| format!("rename {}: {e}", tmp.display()))?;
        files::sync_dir(&self.dir).map_err(|e| e.to_string())?;
        Ok(bytes)
    }

    /// Writes and fsyncs `checkpoint-<n>.ckpt.tmp`; returns its size.
    fn write_tmp(&self, records: &[Vec<u8>]) -> Result<u64, String> {
        let n = self.number;
        let tmp = files::checkpoint_tmp(&self.dir, n);
        let file = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&tmp)
            .map_err(|e| format!("create {}: {e}", tmp.display()))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        let header = Header {
            kind: FileKind::Checkpoint,
            number: n,
            identity: self.identity.clone(),
        };
        let written = (|| {
            header::encode(&header, &mut out)?;
            for record in records {
                record::encode(record, &mut out)?;
            }
            record::encode_end(records.len() as u64, &mut out)?;
            let file = out.into_inner().map_err(|e| e.into_error())?;
            file.sync_all()?;
            file.metadata().map(|m| m.len())
        })()
        .map_err(|e| format!("write {}: {e}", tmp.display()))?;
        Ok(written)
    }

    /// The checkpoint is in place: remove what is older, update the counters.
    fn finish(&self, bytes: u64) {
        remove_older_than(&self.dir, self.number);
        let s = &self.shared;
        s.last_checkpoint_bytes.store(bytes, Ordering::Relaxed);
        s.bytes_on_disk
            .store(files::bytes_on_disk(&self.dir), Ordering::Relaxed);
        s.checkpoint_failed.store(false, Ordering::Relaxed);
        s.mark_commit();
        s.checkpoint_in_flight.store(false, Ordering::Relaxed);
        self.observer.checkpointed(self.started.elapsed(), bytes);
    }

    /// The checkpoint failed: the log since the previous one (`carried` bytes before the new
    /// segment) still counts towards the next.
    fn fail(&self, why: String, carried: u64) {
        let _ = fs::remove_file(files::checkpoint_tmp(&self.dir, self.number));
        self.shared
            .log_bytes_since_checkpoint
            .fetch_add(carried, Ordering::Relaxed);
        fail_checkpoint(&self.shared, self.observer.as_ref(), &why, false);
    }
}

/// Removes the segments and checkpoints older than checkpoint `n` (recovery removes what is
/// left over, so a failure here costs only disk).
fn remove_older_than(dir: &std::path::Path, n: u64) {
    let Ok(listing) = files::list(dir) else {
        return;
    };
    let old = listing
        .segments
        .iter()
        .filter(|&&s| s < n)
        .map(|&s| files::segment(dir, s))
        .chain(
            listing
                .checkpoints
                .iter()
                .filter(|&&c| c < n)
                .map(|&c| files::checkpoint(dir, c)),
        );
    for path in old {
        if let Err(e) = fs::remove_file(&path) {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove an old journal file");
        }
    }
}
