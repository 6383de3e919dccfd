//! fjall backend: one key per ownership edge (`member id || rank || hash`, 20 bytes, empty
//! value) in one keyspace; a write batch per event (the event is atomic), journal writes left to
//! the group commit (`manual_journal_persist`) and one `persist(PersistMode::SyncData)`
//! (fdatasync of the journal) per window. Flushes and compactions run on fjall's own worker
//! threads; their CPU shows in `run_cpu_s`.

use std::path::Path;
use std::time::Instant;

use anyhow::Result;
use fjall::{Database, KeyspaceCreateOptions, PersistMode};

use crate::owners::OwnersMap;
use crate::window::{Driver, Run, Step, WriteStats};
use crate::workload::{Member, Workload};

const KEYSPACE: &str = "edges";
/// Edges per fill batch.
const FILL_BATCH: usize = 1 << 16;

fn open(dir: &Path) -> Result<(Database, fjall::Keyspace)> {
    let db = Database::builder(dir.join("fjall"))
        .manual_journal_persist(true)
        .open()?;
    let ks = db.keyspace(KEYSPACE, KeyspaceCreateOptions::default)?;
    Ok((db, ks))
}

/// Fills, then runs the op stream with a journal fdatasync per window.
pub fn write(dir: &Path, w: &Workload, run: &Run) -> Result<WriteStats> {
    let (db, ks) = open(dir)?;

    let t = Instant::now();
    for (m, hs) in w.members.iter().zip(&w.fill) {
        for part in hs.chunks(FILL_BATCH) {
            let mut b = db.batch();
            for &h in part {
                b.insert(&ks, &m.key(h)[..], &[][..]);
            }
            b.commit()?;
        }
    }
    db.persist(PersistMode::SyncData)?;
    let fill_s = t.elapsed().as_secs_f64();

    let mut d = Driver::new(w, run, fill_s);
    loop {
        match d.step() {
            Step::Event(ev) => {
                let m = w.members[ev.member as usize];
                let mut b = db.batch();
                for &h in w.event_hashes(ev) {
                    if ev.store {
                        b.insert(&ks, &m.key(h)[..], &[][..]);
                    } else {
                        b.remove(&ks, &m.key(h)[..]);
                    }
                }
                b.commit()?;
            }
            step => {
                let c = Instant::now();
                db.persist(PersistMode::SyncData)?;
                d.committed(c, c.elapsed().as_secs_f64() * 1e3);
                if matches!(step, Step::Done) {
                    break;
                }
            }
        }
    }
    let st = d.finish();
    std::mem::forget(ks);
    std::mem::forget(db);
    Ok(st)
}

/// Reopens (replaying the journal) and scans every edge into an [`OwnersMap`].
/// Returns the map and the seconds spent opening.
pub fn recover(dir: &Path) -> Result<(OwnersMap, f64)> {
    let t = Instant::now();
    let (db, ks) = open(dir)?;
    let open_s = t.elapsed().as_secs_f64();
    let mut map = OwnersMap::with_capacity(ks.approximate_len());
    let mut last: Option<(Member, u32)> = None;
    for g in ks.iter() {
        let k = g.key()?;
        let (m, h) = Member::from_key(&k);
        let tag = match last {
            Some((lm, t)) if lm == m => t,
            _ => {
                let t = map.tag(m);
                last = Some((m, t));
                t
            }
        };
        map.store(h, tag);
    }
    std::mem::forget(ks);
    std::mem::forget(db);
    Ok((map, open_s))
}
