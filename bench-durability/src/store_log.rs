//! The lead's plan: a logical write-ahead log of the producer's events plus a checkpoint of the
//! logical state (member -> block hashes).
//!
//! Log record: `len u32 | crc32 u32 | payload`, little-endian, crc32 (IEEE, `crc32fast`) over
//! the payload; payload `kind u8 (1 store, 2 remove) | n u8 | member id u64 | rank u32 |
//! n x hash u64`. The caller's thread only encodes into the open window's buffer; at each window
//! close the buffer goes to a writer thread that appends it and calls fdatasync (at most two
//! windows in flight, then the caller waits). Replay stops at the first torn or corrupt record.
//!
//! Checkpoint: `magic 8 B | edges u64 | chunks u64 | crc32 of those`, then chunks of
//! `member id u64 | rank u32 | n u32 | n x hash u64 | crc32 of the chunk`, at most
//! [`CHUNK`] hashes each; written with one `fsync` at the end.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Read, Write};
use std::path::Path;
use std::sync::mpsc;
use std::thread;
use std::time::Instant;

use anyhow::{Result, bail};

use crate::owners::OwnersMap;
use crate::window::{Driver, Run, Step, WriteStats};
use crate::workload::{Member, Workload};

const LOG: &str = "events.log";
const CHECKPOINT: &str = "state.ckpt";
const MAGIC: &[u8; 8] = b"CKFCKPT1";
/// Hashes per checkpoint chunk (64 KiB of hashes).
pub const CHUNK: usize = 8192;
const STORE: u8 = 1;
const REMOVE: u8 = 2;

fn encode(buf: &mut Vec<u8>, store: bool, m: Member, hashes: &[u64]) {
    let at = buf.len();
    buf.extend_from_slice(&[0u8; 8]);
    buf.push(if store { STORE } else { REMOVE });
    buf.push(hashes.len() as u8);
    buf.extend_from_slice(&m.id.to_le_bytes());
    buf.extend_from_slice(&m.rank.to_le_bytes());
    for h in hashes {
        buf.extend_from_slice(&h.to_le_bytes());
    }
    let len = (buf.len() - at - 8) as u32;
    let crc = crc32fast::hash(&buf[at + 8..]);
    buf[at..at + 4].copy_from_slice(&len.to_le_bytes());
    buf[at + 4..at + 8].copy_from_slice(&crc.to_le_bytes());
}

/// Writes the checkpoint of `state` (members with their hashes) to `path`, durably.
fn write_checkpoint(path: &Path, members: &[Member], state: &[Vec<u64>]) -> Result<()> {
    let edges: u64 = state.iter().map(|v| v.len() as u64).sum();
    let chunks: u64 = state.iter().map(|v| v.len().div_ceil(CHUNK) as u64).sum();
    let mut f = BufWriter::with_capacity(1 << 20, File::create(path)?);
    let mut head = Vec::with_capacity(28);
    head.extend_from_slice(MAGIC);
    head.extend_from_slice(&edges.to_le_bytes());
    head.extend_from_slice(&chunks.to_le_bytes());
    let crc = crc32fast::hash(&head);
    head.extend_from_slice(&crc.to_le_bytes());
    f.write_all(&head)?;
    let mut buf = Vec::with_capacity(16 + CHUNK * 8 + 4);
    for (m, hs) in members.iter().zip(state) {
        for part in hs.chunks(CHUNK) {
            buf.clear();
            buf.extend_from_slice(&m.id.to_le_bytes());
            buf.extend_from_slice(&m.rank.to_le_bytes());
            buf.extend_from_slice(&(part.len() as u32).to_le_bytes());
            for h in part {
                buf.extend_from_slice(&h.to_le_bytes());
            }
            let crc = crc32fast::hash(&buf);
            buf.extend_from_slice(&crc.to_le_bytes());
            f.write_all(&buf)?;
        }
    }
    f.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    Ok(())
}

/// Writes the fill as a checkpoint, then runs the op stream through the log.
pub fn write(dir: &Path, w: &Workload, run: &Run) -> Result<WriteStats> {
    let t = Instant::now();
    write_checkpoint(&dir.join(CHECKPOINT), &w.members, &w.fill)?;
    let fill_s = t.elapsed().as_secs_f64();

    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(dir.join(LOG))?;
    File::open(dir)?.sync_all()?;
    // Two windows in flight at most: the one being synced and one queued.
    let (to_writer, from_caller) = mpsc::sync_channel::<(Vec<u8>, Instant)>(1);
    let (to_caller, spare) = mpsc::channel::<Vec<u8>>();
    let writer = thread::spawn(move || -> std::io::Result<Vec<(Instant, f64)>> {
        let mut lat = Vec::new();
        for (buf, closed) in from_caller {
            file.write_all(&buf)?;
            file.sync_data()?;
            lat.push((closed, closed.elapsed().as_secs_f64() * 1e3));
            let _ = to_caller.send(buf);
        }
        Ok(lat)
    });

    let mut d = Driver::new(w, run, fill_s);
    let mut buf = Vec::with_capacity(1 << 22);
    loop {
        match d.step() {
            Step::Event(ev) => encode(
                &mut buf,
                ev.store,
                w.members[ev.member as usize],
                w.event_hashes(ev),
            ),
            Step::Commit => {
                let mut next = spare
                    .try_recv()
                    .unwrap_or_else(|_| Vec::with_capacity(1 << 22));
                next.clear();
                let full = std::mem::replace(&mut buf, next);
                to_writer.send((full, Instant::now()))?;
            }
            Step::Done => break,
        }
    }
    to_writer.send((buf, Instant::now()))?;
    drop(to_writer);
    for (closed, ms) in writer.join().expect("log writer thread")? {
        d.committed(closed, ms);
    }
    Ok(d.finish())
}

fn read_all(path: &Path) -> Result<Vec<u8>> {
    let mut f = File::open(path)?;
    let mut v = Vec::with_capacity(f.metadata()?.len() as usize);
    f.read_to_end(&mut v)?;
    Ok(v)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Loads the checkpoint, then replays the log up to its first torn or corrupt record.
/// Returns the map, the checkpoint-only seconds, and the number of log records replayed.
pub fn recover(dir: &Path) -> Result<(OwnersMap, f64, u64)> {
    let t = Instant::now();
    let ck = read_all(&dir.join(CHECKPOINT))?;
    if ck.len() < 28 || &ck[..8] != MAGIC || crc32fast::hash(&ck[..24]) != u32_at(&ck, 24) {
        bail!("checkpoint header corrupt");
    }
    let (edges, chunks) = (u64_at(&ck, 8), u64_at(&ck, 16));
    let mut map = OwnersMap::with_capacity(edges as usize);
    let mut at = 28;
    for _ in 0..chunks {
        let n = u32_at(&ck, at + 12) as usize;
        let end = at + 16 + n * 8;
        if n > CHUNK || end + 4 > ck.len() || crc32fast::hash(&ck[at..end]) != u32_at(&ck, end) {
            bail!("checkpoint chunk at byte {at} corrupt");
        }
        let tag = map.tag(Member {
            id: u64_at(&ck, at),
            rank: u32_at(&ck, at + 8),
        });
        for h in ck[at + 16..end].chunks_exact(8) {
            map.store(u64::from_le_bytes(h.try_into().expect("8 bytes")), tag);
        }
        at = end + 4;
    }
    drop(ck);
    let ck_s = t.elapsed().as_secs_f64();

    let log = read_all(&dir.join(LOG))?;
    let (mut at, mut records) = (0usize, 0u64);
    let mut last: Option<(Member, u32)> = None;
    while at + 8 <= log.len() {
        let len = u32_at(&log, at) as usize;
        let body = at + 8;
        if len < 14
            || body + len > log.len()
            || crc32fast::hash(&log[body..body + len]) != u32_at(&log, at + 4)
        {
            break;
        }
        let (kind, n) = (log[body], log[body + 1] as usize);
        if 14 + n * 8 != len {
            break;
        }
        let m = Member {
            id: u64_at(&log, body + 2),
            rank: u32_at(&log, body + 10),
        };
        let tag = match last {
            Some((lm, t)) if lm == m => t,
            _ => {
                let t = map.tag(m);
                last = Some((m, t));
                t
            }
        };
        for h in log[body + 14..body + len].chunks_exact(8) {
            let h = u64::from_le_bytes(h.try_into().expect("8 bytes"));
            if kind == STORE {
                map.store(h, tag);
            } else {
                map.remove(h, tag);
            }
        }
        records += 1;
        at = body + len;
    }
    Ok((map, ck_s, records))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_then_recover_gives_the_model_state_and_stops_at_a_torn_tail() {
        let dir = std::env::temp_dir().join(format!("bench-durability-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let w = Workload::generate(20_000, 10, 30_000, 3);
        let run = Run {
            commit_ms: 1,
            offered: 1e6,
            paced_s: 0.01,
            max_s: 60.0,
        };
        let st = write(&dir, &w, &run).unwrap();
        assert_eq!(st.events, w.events.len());
        let (map, _, records) = recover(&dir).unwrap();
        assert_eq!(records, w.events.len() as u64);
        assert_eq!(map.digest(), w.final_digest);
        // Tear the last record: replay must stop before it, all earlier records intact.
        let p = dir.join(LOG);
        let len = std::fs::metadata(&p).unwrap().len();
        OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(len - 3)
            .unwrap();
        let (_, _, records) = recover(&dir).unwrap();
        assert_eq!(records, w.events.len() as u64 - 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
