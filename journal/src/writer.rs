//! The writer thread: appends records, commits them in groups, writes checkpoints.
//!
//! Records reach the kernel at once: the writer `write`s whenever its queue is empty (and
//! every 64 KiB under load), so a `kill -9` loses only what was still queued in the process,
//! never a commit window. Group commit is for power loss: the first record written after a
//! commit opens a window; when it closes (`commit_interval` later) a separate sync thread
//! `fdatasync`s everything written so far while the writer goes on writing. A slow disk
//! therefore delays durability against power loss by its sync time, but never holds records
//! back from the kernel.
//!
//! Failure: the first failed write, flush, sync or checkpoint puts the journal in the *failed*
//! state. From then on records are dropped (counted) until a checkpoint succeeds: the
//! checkpoint holds the whole state, so the log is whole again from it on. A record the caller
//! could not queue (backlog above its limit) becomes a *hole* at its exact place in the stream,
//! which fails the journal the same way; nothing after a hole is ever written before the next
//! checkpoint, so the log never skips a record.

use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::files;
use crate::frame;
use crate::header::{self, FileKind, Header, StateIdentity};
use crate::recovery;
use crate::{JournalConfig, JournalObserver, Shared};

pub(crate) enum Msg {
    Append(Vec<u8>),
    /// A record that could not be queued: the log must not go on past it.
    Hole,
    /// A record above `frame::MAX_RECORD_BYTES` (its length): a hole too.
    Oversized(usize),
    Checkpoint(Vec<Vec<u8>>),
    /// Commit now, then answer.
    Sync(flume::Sender<Result<(), String>>),
}

/// Bytes of records the writer buffers before a `write` even while its queue is not empty.
pub(crate) const WRITE_BUFFER_BYTES: usize = 64 << 10;

/// One `fdatasync` to run off the writer thread.
struct SyncJob {
    file: Arc<File>,
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
                    match job.file.sync_data() {
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

    /// Starts a sync of `file` unless one runs; `false` when one runs.
    fn try_start(&self, file: &Arc<File>, bytes: u64) -> bool {
        if self.busy.swap(true, Ordering::AcqRel) {
            return false;
        }
        let job = SyncJob {
            file: Arc::clone(file),
            bytes,
        };
        if self.tx.as_ref().is_none_or(|tx| tx.send(job).is_err()) {
            self.busy.store(false, Ordering::Release);
        }
        true
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
                        frame::MAX_RECORD_BYTES
                    )
                }),
                Some(Msg::Checkpoint(records)) => self.checkpoint(records),
                Some(Msg::Sync(reply)) => {
                    self.commit_now();
                    let _ = reply.send(match &self.failed {
                        None => Ok(()),
                        Some(why) => Err(why.clone()),
                    });
                }
            }
        }
        self.commit_now();
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
        if let Err(e) = frame::encode(&record, &mut self.file) {
            self.fail(format!("write {}: {e}", self.segment_path().display()));
            return;
        }
        let bytes = (frame::FRAME_OVERHEAD + record.len()) as u64;
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
        if self.syncer.try_start(&self.sync_file, self.pending_bytes) {
            self.pending_bytes = 0;
            self.window_end = None;
        } else {
            self.window_end = Some(Instant::now() + std::time::Duration::from_millis(1));
        }
    }

    /// Makes everything written so far durable before returning (sync requests, checkpoints,
    /// the end): flush, wait for the sync thread, fdatasync on this thread.
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
        let result = self
            .file
            .flush()
            .and_then(|()| self.file.get_ref().sync_data());
        match result {
            Ok(()) => {
                let bytes = std::mem::take(&mut self.pending_bytes);
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

    /// Writes checkpoint `segment + 1` holding `records` (the whole state after every record
    /// written so far), starts segment `segment + 1`, and removes the older files.
    fn checkpoint(&mut self, records: Vec<Vec<u8>>) {
        self.commit_now();
        let started = Instant::now();
        let n = self.segment + 1;
        // Segment n exists before checkpoint n does: a checkpoint without its segment is then
        // always damage (a deleted log), never a crash between the two.
        let result = self.write_checkpoint_tmp(n, &records).and_then(|bytes| {
            let (file, _) = recovery::create_segment(&self.dir, n, &self.identity)
                .map_err(|e| e.to_string())?;
            let tmp = files::checkpoint_tmp(&self.dir, n);
            fs::rename(&tmp, files::checkpoint(&self.dir, n))
                .map_err(|e| format!("rename {}: {e}", tmp.display()))?;
            files::sync_dir(&self.dir).map_err(|e| e.to_string())?;
            Ok((bytes, file))
        });
        self.shared
            .checkpoint_in_flight
            .store(false, Ordering::Relaxed);
        let (bytes, file) = match result {
            Ok(done) => done,
            Err(why) => {
                let _ = fs::remove_file(files::checkpoint_tmp(&self.dir, n));
                self.shared.mark_checkpoint_attempt();
                if self.failed.is_none() {
                    self.fail(why);
                } else {
                    tracing::warn!(error = %why, "journal checkpoint retry failed");
                }
                return;
            }
        };
        let sync_file = match file.try_clone() {
            Ok(f) => Arc::new(f),
            Err(e) => {
                self.fail(format!("clone the handle of segment {n}: {e}"));
                return;
            }
        };
        let old = std::mem::replace(
            &mut self.file,
            BufWriter::with_capacity(WRITE_BUFFER_BYTES, file),
        );
        drop(old.into_parts());
        self.sync_file = sync_file;
        self.segment = n;
        self.remove_older_than(n);
        if let Some(why) = self.failed.take() {
            tracing::info!(previous_failure = %why, "journal healthy again after a checkpoint");
        }
        self.shared.healthy.store(true, Ordering::Relaxed);
        self.shared
            .log_bytes_since_checkpoint
            .store(0, Ordering::Relaxed);
        self.shared
            .last_checkpoint_bytes
            .store(bytes, Ordering::Relaxed);
        self.shared
            .bytes_on_disk
            .store(files::bytes_on_disk(&self.dir), Ordering::Relaxed);
        self.shared.mark_commit();
        self.observer.checkpointed(started.elapsed(), bytes);
    }

    /// Writes and fsyncs `checkpoint-<n>.ckpt.tmp`; returns its size.
    fn write_checkpoint_tmp(&self, n: u64, records: &[Vec<u8>]) -> Result<u64, String> {
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
                frame::encode(record, &mut out)?;
            }
            frame::encode_end(records.len() as u64, &mut out)?;
            let file = out.into_inner().map_err(|e| e.into_error())?;
            file.sync_all()?;
            file.metadata().map(|m| m.len())
        })()
        .map_err(|e| format!("write {}: {e}", tmp.display()))?;
        Ok(written)
    }

    fn remove_older_than(&self, n: u64) {
        let Ok(listing) = files::list(&self.dir) else {
            return;
        };
        let old = listing
            .segments
            .iter()
            .filter(|&&s| s < n)
            .map(|&s| files::segment(&self.dir, s))
            .chain(
                listing
                    .checkpoints
                    .iter()
                    .filter(|&&c| c < n)
                    .map(|&c| files::checkpoint(&self.dir, c)),
            );
        for path in old {
            // Recovery removes what is left over, so a failure here costs only disk.
            if let Err(e) = fs::remove_file(&path) {
                tracing::warn!(path = %path.display(), error = %e, "cannot remove an old journal file");
            }
        }
    }
}
