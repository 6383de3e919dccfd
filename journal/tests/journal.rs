//! The journal against its contract, on real files: round trips, checkpoints, torn tails,
//! damage, foreign state, the lock, set-aside, and failure.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ckf_journal::{Journal, JournalConfig, JournalError, NoObserver, Recovered, StateIdentity};

fn identity() -> StateIdentity {
    StateIdentity {
        pool: "global/dc-a".into(),
        format: "v1 buckets=1024".into(),
    }
}

fn config() -> JournalConfig {
    JournalConfig {
        commit_interval: Duration::from_millis(5),
        ..JournalConfig::default()
    }
}

fn open(dir: &Path) -> Result<(Journal, Recovered), JournalError> {
    Journal::open(dir, identity(), config(), Arc::new(NoObserver))
}

fn rec(i: u32) -> Vec<u8> {
    format!("record {i}").into_bytes()
}

fn files(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with(prefix))
        .collect();
    v.sort();
    v
}

#[test]
fn records_and_checkpoints_come_back_in_order_and_old_files_go() {
    let dir = tempfile::tempdir().unwrap();
    let (j, r) = open(dir.path()).unwrap();
    assert!(r.checkpoint.is_empty() && r.records.is_empty() && r.torn.is_none());
    for i in 0..10 {
        j.append(rec(i));
    }
    j.close().unwrap();

    let (j, r) = open(dir.path()).unwrap();
    assert_eq!(r.records, (0..10).map(rec).collect::<Vec<_>>());
    assert_eq!(r.checkpoint_number, None);
    // The checkpoint replaces the log before it.
    j.checkpoint(vec![b"image a".to_vec(), b"image b".to_vec()]);
    j.append(rec(10));
    j.append(rec(11));
    j.close().unwrap();
    assert_eq!(files(dir.path(), "wal-").len(), 1);
    assert_eq!(files(dir.path(), "checkpoint-").len(), 1);

    let (j, r) = open(dir.path()).unwrap();
    assert_eq!(r.checkpoint, vec![b"image a".to_vec(), b"image b".to_vec()]);
    assert_eq!(r.records, vec![rec(10), rec(11)]);
    // Appending resumes the same segment after recovery.
    j.append(rec(12));
    j.close().unwrap();
    let (_j, r) = open(dir.path()).unwrap();
    assert_eq!(r.records, vec![rec(10), rec(11), rec(12)]);
}

#[test]
fn a_dropped_journal_still_commits_its_queue() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = open(dir.path()).unwrap();
    for i in 0..1000 {
        j.append(rec(i));
    }
    drop(j);
    let (_j, r) = open(dir.path()).unwrap();
    assert_eq!(r.records.len(), 1000);
}

#[test]
fn records_reach_the_file_within_one_commit_window_without_close() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = open(dir.path()).unwrap();
    j.append(rec(1));
    let segment = files(dir.path(), "wal-").pop().unwrap();
    let before = fs::metadata(&segment).unwrap().len();
    // What a kill -9 leaves is what reached the kernel; poll the file, not the handle.
    let mut grown = false;
    for _ in 0..200 {
        if fs::metadata(&segment).unwrap().len() > before {
            grown = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(grown, "the record did not reach the file within a second");
    // The group commit (fdatasync) follows within a window plus the sync's duration.
    let mut committed = false;
    for _ in 0..1000 {
        if j.stats().last_commit_age.is_some() {
            committed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(committed, "no group commit within 5 s of a 5 ms window");
    std::mem::forget(j); // no close, no drop: like a killed process (the lock dies with the fd)
}

fn append_raw(path: &Path, bytes: &[u8]) {
    OpenOptions::new()
        .append(true)
        .open(path)
        .unwrap()
        .write_all(bytes)
        .unwrap();
}

#[test]
fn a_torn_tail_is_cut_and_appending_goes_on_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = open(dir.path()).unwrap();
    j.append(rec(1));
    j.append(rec(2));
    j.close().unwrap();
    let segment = files(dir.path(), "wal-").pop().unwrap();
    let valid = fs::metadata(&segment).unwrap().len();
    // Half a record: a length and part of a payload.
    append_raw(&segment, &[40, 0, 0, 0, 1, 2, 3, 4, b'x', b'y']);

    let (j, r) = open(dir.path()).unwrap();
    assert_eq!(r.records, vec![rec(1), rec(2)]);
    let torn = r.torn.expect("torn tail reported");
    assert_eq!((torn.offset, torn.dropped_bytes), (valid, 10));
    assert_eq!(fs::metadata(&segment).unwrap().len(), valid, "tail cut");
    j.append(rec(3));
    j.close().unwrap();
    let (_j, r) = open(dir.path()).unwrap();
    assert_eq!(r.records, vec![rec(1), rec(2), rec(3)]);
    assert!(r.torn.is_none());
}

#[test]
fn a_zero_filled_tail_is_torn_but_a_damaged_record_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = open(dir.path()).unwrap();
    j.append(rec(1));
    j.append(rec(2));
    j.close().unwrap();
    let segment = files(dir.path(), "wal-").pop().unwrap();
    append_raw(&segment, &[0u8; 4096]);
    let (j, r) = open(dir.path()).unwrap();
    assert_eq!(r.records.len(), 2);
    assert_eq!(r.torn.unwrap().dropped_bytes, 4096);
    drop(j);

    // Flip one payload byte of the first record: a checksum mismatch followed by data.
    let mut bytes = fs::read(&segment).unwrap();
    let at = bytes.len() - (8 + rec(2).len()) - 2;
    bytes[at] ^= 0x40;
    fs::write(&segment, &bytes).unwrap();
    let err = open(dir.path()).unwrap_err();
    assert!(
        matches!(err, JournalError::Corrupt { .. }) && err.is_invalid_state(),
        "{err}"
    );
    assert!(err.to_string().contains("checksum"), "{err}");
    // Refusing changed nothing.
    assert_eq!(fs::read(&segment).unwrap(), bytes);
}

#[test]
fn a_damaged_or_incomplete_checkpoint_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = open(dir.path()).unwrap();
    j.checkpoint(vec![vec![7u8; 1000]]);
    j.close().unwrap();
    let ckpt = files(dir.path(), "checkpoint-").pop().unwrap();
    let good = fs::read(&ckpt).unwrap();

    let mut flipped = good.clone();
    flipped[good.len() / 2] ^= 1;
    fs::write(&ckpt, &flipped).unwrap();
    let err = open(dir.path()).unwrap_err();
    assert!(matches!(err, JournalError::Corrupt { .. }), "{err}");

    fs::write(&ckpt, &good[..good.len() - 16]).unwrap();
    let err = open(dir.path()).unwrap_err();
    assert!(
        matches!(err, JournalError::IncompleteCheckpoint { .. }),
        "{err}"
    );
    fs::write(&ckpt, &good).unwrap();
    let (_j, r) = open(dir.path()).unwrap();
    assert_eq!(r.checkpoint, vec![vec![7u8; 1000]]);
}

#[test]
fn another_pools_or_formats_state_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = open(dir.path()).unwrap();
    j.append(rec(1));
    j.close().unwrap();
    let other = StateIdentity {
        pool: "global/dc-b".into(),
        ..identity()
    };
    let err = Journal::open(dir.path(), other, config(), Arc::new(NoObserver)).unwrap_err();
    assert!(matches!(err, JournalError::ForeignPool { .. }), "{err}");
    assert!(err.to_string().contains("\"global/dc-a\""), "{err}");
    let resized = StateIdentity {
        format: "v1 buckets=2048".into(),
        ..identity()
    };
    let err = Journal::open(dir.path(), resized, config(), Arc::new(NoObserver)).unwrap_err();
    assert!(matches!(err, JournalError::ForeignFormat { .. }), "{err}");
}

#[test]
fn a_second_opener_is_locked_out() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = open(dir.path()).unwrap();
    let err = open(dir.path()).unwrap_err();
    assert!(matches!(err, JournalError::Locked { .. }), "{err}");
    assert!(!err.is_invalid_state());
    j.close().unwrap();
    open(dir.path()).unwrap();
}

#[test]
fn set_aside_keeps_the_evidence_and_leaves_an_empty_journal() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = open(dir.path()).unwrap();
    j.checkpoint(vec![b"state".to_vec()]);
    j.append(rec(1));
    j.close().unwrap();
    let moved = Journal::set_aside(dir.path()).unwrap();
    assert_eq!(fs::read_dir(&moved).unwrap().count(), 2);
    let (_j, r) = open(dir.path()).unwrap();
    assert!(r.checkpoint.is_empty() && r.records.is_empty());
}

#[test]
fn a_missing_segment_after_the_checkpoint_is_a_hole() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = open(dir.path()).unwrap();
    j.checkpoint(vec![b"state".to_vec()]);
    j.append(rec(1));
    j.close().unwrap();
    // Fake a later segment with the one in between gone.
    let segment = files(dir.path(), "wal-").pop().unwrap();
    let name = segment.file_name().unwrap().to_str().unwrap().to_owned();
    let n: u64 = name[4..24].parse().unwrap();
    let later = dir.path().join(format!("wal-{:020}.log", n + 1));
    fs::rename(&segment, &later).unwrap();
    let err = open(dir.path()).unwrap_err();
    assert!(
        matches!(
            err,
            JournalError::Misnumbered { .. } | JournalError::MissingSegment { .. }
        ),
        "{err}"
    );
}

#[test]
fn over_the_backlog_the_journal_fails_and_a_checkpoint_heals_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = JournalConfig {
        max_backlog_bytes: 0,
        retry_interval: Duration::ZERO,
        ..config()
    };
    let (j, _) = Journal::open(dir.path(), identity(), cfg, Arc::new(NoObserver)).unwrap();
    j.append(rec(1)); // above a zero backlog: a hole
    assert!(j.sync().is_err());
    let stats = j.stats();
    assert!(!stats.healthy && stats.dropped_records == 1, "{stats:?}");
    assert!(j.wants_checkpoint());
    j.checkpoint(vec![b"whole state".to_vec()]);
    j.sync().unwrap();
    assert!(j.stats().healthy);
    j.close().unwrap();
    let (_j, r) = Journal::open(dir.path(), identity(), cfg, Arc::new(NoObserver)).unwrap();
    assert_eq!(r.checkpoint, vec![b"whole state".to_vec()]);
    assert!(r.records.is_empty());
}

#[test]
fn a_checkpoint_is_wanted_once_the_log_outgrows_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = JournalConfig {
        min_checkpoint_bytes: 1000,
        ..config()
    };
    let (j, _) = Journal::open(dir.path(), identity(), cfg, Arc::new(NoObserver)).unwrap();
    j.checkpoint(vec![vec![1u8; 3000]]);
    j.sync().unwrap();
    assert!(!j.wants_checkpoint());
    for _ in 0..20 {
        j.append(vec![2u8; 100]);
    }
    j.sync().unwrap();
    assert!(
        !j.wants_checkpoint(),
        "2160 log bytes < the 3008-byte checkpoint"
    );
    for _ in 0..10 {
        j.append(vec![2u8; 100]);
    }
    j.sync().unwrap();
    assert!(j.wants_checkpoint());
}

#[test]
fn an_oversized_record_fails_the_journal_instead_of_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = open(dir.path()).unwrap();
    j.append(rec(1));
    j.append(vec![0u8; ckf_journal::record::MAX_RECORD_BYTES + 1]);
    j.append(rec(2)); // after the hole: dropped, never written past it
    let err = j.sync().unwrap_err();
    assert!(err.contains("exceeds"), "{err}");
    assert_eq!(j.stats().dropped_records, 2);
    j.checkpoint(vec![b"state".to_vec()]);
    j.sync().unwrap();
    j.close().unwrap();
    let (_j, r) = open(dir.path()).unwrap();
    assert_eq!(r.checkpoint, vec![b"state".to_vec()]);
}

#[test]
fn a_checkpoint_whose_log_was_deleted_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = open(dir.path()).unwrap();
    j.checkpoint(vec![b"state".to_vec()]);
    j.append(rec(1));
    j.close().unwrap();
    for segment in files(dir.path(), "wal-") {
        fs::remove_file(segment).unwrap();
    }
    let err = open(dir.path()).unwrap_err();
    assert!(
        matches!(err, JournalError::MissingSegment { .. }) && err.is_invalid_state(),
        "{err}"
    );
    assert!(err.to_string().contains("wal-"), "{err}");
}

#[test]
fn records_reach_the_kernel_while_the_writer_is_idle_without_waiting_for_a_window() {
    let dir = tempfile::tempdir().unwrap();
    // A window far longer than the poll: only the prompt write can make the file grow.
    let cfg = JournalConfig {
        commit_interval: Duration::from_secs(1),
        ..config()
    };
    let (j, _) = Journal::open(dir.path(), identity(), cfg, Arc::new(NoObserver)).unwrap();
    let segment = files(dir.path(), "wal-").pop().unwrap();
    let before = fs::metadata(&segment).unwrap().len();
    j.append(rec(7));
    let mut grown = false;
    for _ in 0..100 {
        if fs::metadata(&segment).unwrap().len() > before {
            grown = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(grown, "the record stayed in the process");
    std::mem::forget(j); // like a kill -9: what reached the kernel stays
    // (the lock dies with the process in real life; here the test ends without reopening)
}

/// Holds every checkpoint at its start until released: the files can then be looked at in
/// the middle of a checkpoint, as a `kill -9` at that moment would leave them.
#[derive(Default)]
struct Gate {
    open: std::sync::Mutex<bool>,
    opened: std::sync::Condvar,
    failures: std::sync::Mutex<Vec<String>>,
}

impl Gate {
    fn release(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }
}

impl ckf_journal::JournalObserver for Gate {
    fn checkpoint_started(&self, _number: u64) {
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.opened.wait(open).unwrap();
        }
    }
    fn checkpoint_failed(&self, why: &str) {
        self.failures.lock().unwrap().push(why.to_owned());
    }
}

/// What a `kill -9` would leave of `dir` now: its journal files copied to `to` and recovered.
fn recover_copy(dir: &Path, to: &Path) -> Recovered {
    let _ = fs::remove_dir_all(to);
    fs::create_dir(to).unwrap();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        if name.starts_with("wal-") || name.starts_with("checkpoint-") {
            fs::copy(&path, to.join(name)).unwrap();
        }
    }
    open(to).unwrap().1
}

#[test]
fn records_appended_during_a_checkpoint_reach_the_kernel_before_it_ends() {
    let dir = tempfile::tempdir().unwrap();
    let copy = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    let (j, _) = Journal::open(dir.path(), identity(), config(), gate.clone()).unwrap();
    j.append(rec(1));
    j.checkpoint(vec![b"state after record 1".to_vec()]);
    j.append(rec(2));
    // The checkpoint is held at its start; record 2 must still reach the kernel (the first
    // version wrote checkpoints on the writer thread, so it waited in the process).
    let mut seen = (0, Vec::new());
    for _ in 0..500 {
        let r = recover_copy(dir.path(), &copy.path().join("snap"));
        seen = (r.checkpoint.len(), r.records);
        if seen.1.len() == 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(4));
    }
    let healthy = j.stats().healthy;
    gate.release(); // before asserting: a failed assertion must not leave the writer held
    assert_eq!(
        seen,
        (0, vec![rec(1), rec(2)]),
        "a kill -9 now loses records"
    );
    assert!(healthy);
    j.close().unwrap();
    assert_eq!(
        files(dir.path(), "wal-").len(),
        1,
        "the sealed segment is removed"
    );
    let (_j, r) = open(dir.path()).unwrap();
    assert_eq!(r.checkpoint, vec![b"state after record 1".to_vec()]);
    assert_eq!(r.records, vec![rec(2)]);
}

#[test]
fn a_failed_checkpoint_of_a_healthy_journal_loses_nothing_and_waits_to_retry() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    gate.release();
    let cfg = JournalConfig {
        min_checkpoint_bytes: 1,
        retry_interval: Duration::from_secs(3600),
        ..config()
    };
    let (j, _) = Journal::open(dir.path(), identity(), cfg, gate.clone()).unwrap();
    j.append(rec(1));
    j.sync().unwrap();
    // The checkpoint's temporary file cannot be created: a directory holds its name.
    let blocker = dir.path().join(format!("checkpoint-{:020}.ckpt.tmp", 1));
    fs::create_dir(&blocker).unwrap();
    assert!(j.wants_checkpoint());
    j.checkpoint(vec![b"never written".to_vec()]);
    j.append(rec(2));
    j.sync().unwrap();
    let failures = gate.failures.lock().unwrap().clone();
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert!(failures[0].contains(".ckpt.tmp"), "{failures:?}");
    assert!(j.stats().healthy, "the log is whole: nothing failed");
    assert!(!j.wants_checkpoint(), "a retry waits retry_interval");
    j.append(rec(3));
    j.close().unwrap();
    fs::remove_dir(&blocker).unwrap();
    let (_j, r) = open(dir.path()).unwrap();
    assert!(r.checkpoint.is_empty());
    assert_eq!(r.records, vec![rec(1), rec(2), rec(3)]);
}

/// The files a checkpoint held at its start leaves (segment 1 created, header only): copied to
/// `to` as a power loss at that moment could leave them, before the checkpoint is released.
fn state_in_the_middle_of_a_checkpoint(to: &Path, after: &[Vec<u8>]) {
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    let (j, _) = Journal::open(dir.path(), identity(), config(), gate.clone()).unwrap();
    j.append(rec(1));
    j.append(rec(2));
    j.sync().unwrap();
    j.checkpoint(vec![b"held".to_vec()]);
    for record in after {
        j.append(record.clone());
    }
    let want = 2 + after.len();
    let mut copied = 0;
    for _ in 0..500 {
        copied = recover_copy(dir.path(), to).records.len();
        if files(to, "wal-").len() == 2 && copied == want {
            break;
        }
        std::thread::sleep(Duration::from_millis(4));
    }
    gate.release();
    j.close().unwrap();
    assert_eq!(
        copied, want,
        "the copy holds both segments and every record"
    );
}

#[test]
fn a_power_loss_just_after_a_checkpoint_sealed_a_torn_segment_is_a_torn_tail() {
    let root = tempfile::tempdir().unwrap();
    let snap = root.path().join("snap");
    state_in_the_middle_of_a_checkpoint(&snap, &[]);
    // Segment 0's last record never reached the disk (it was not synced yet); segment 1 holds
    // only its header: the tear is the end of the log.
    let sealed = files(&snap, "wal-").remove(0);
    let len = fs::metadata(&sealed).unwrap().len();
    OpenOptions::new()
        .write(true)
        .open(&sealed)
        .unwrap()
        .set_len(len - 3)
        .unwrap();
    let (j, r) = open(&snap).unwrap();
    assert_eq!(r.records, vec![rec(1)]);
    assert_eq!(r.torn.as_ref().unwrap().path, sealed);
    j.append(rec(3));
    j.close().unwrap();
    let (_j, r) = open(&snap).unwrap();
    assert_eq!(r.records, vec![rec(1), rec(3)]);
}

#[test]
fn a_torn_segment_followed_by_records_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let snap = root.path().join("snap");
    state_in_the_middle_of_a_checkpoint(&snap, &[rec(3)]);
    let sealed = files(&snap, "wal-").remove(0);
    let len = fs::metadata(&sealed).unwrap().len();
    OpenOptions::new()
        .write(true)
        .open(&sealed)
        .unwrap()
        .set_len(len - 3)
        .unwrap();
    let err = open(&snap).unwrap_err();
    assert!(
        matches!(err, JournalError::Corrupt { .. }) && err.is_invalid_state(),
        "{err}"
    );
}

#[test]
fn the_checkpoints_own_segment_cut_inside_its_header_is_refused_and_nothing_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = open(dir.path()).unwrap();
    j.append(rec(1));
    j.checkpoint(vec![b"state".to_vec()]);
    j.append(rec(2));
    j.close().unwrap();
    let segment = files(dir.path(), "wal-").pop().unwrap();
    // Leftovers a refusal must keep: a temporary and an older segment.
    let stray = dir.path().join(format!("checkpoint-{:020}.ckpt.tmp", 9));
    fs::write(&stray, b"partial").unwrap();
    let older = dir.path().join(format!("wal-{:020}.log", 0));
    fs::write(&older, b"old").unwrap();
    for cut in [0u64, 5] {
        OpenOptions::new()
            .write(true)
            .open(&segment)
            .unwrap()
            .set_len(cut)
            .unwrap();
        let err = open(dir.path()).unwrap_err();
        assert!(
            matches!(err, JournalError::Header { .. }) && err.is_invalid_state(),
            "cut at {cut}: {err}"
        );
        assert!(stray.exists() && older.exists(), "a refusal removed files");
    }
}
