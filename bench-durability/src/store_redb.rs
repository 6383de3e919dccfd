//! redb backend: one row per ownership edge, key `member id || rank || hash` (20 bytes,
//! big-endian), empty value; one write transaction per group-commit window with
//! `Durability::Immediate`. `quick_repair` records the allocator state at every commit (two-phase
//! commit), which redb documents as slower commits but near-instant reopening after a crash;
//! without it, reopening after kill -9 repairs by walking the whole file.

use std::path::Path;
use std::time::Instant;

use anyhow::Result;
use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition,
};

use crate::owners::OwnersMap;
use crate::window::{Driver, Run, Step, WriteStats};
use crate::workload::{Member, Workload};

const EDGES: TableDefinition<&[u8; 20], ()> = TableDefinition::new("edges");
const FILE: &str = "edges.redb";
/// Edges per fill transaction.
const FILL_TXN: usize = 1 << 20;

/// Fills, then runs the op stream with a commit per window.
pub fn write(dir: &Path, w: &Workload, run: &Run, quick_repair: bool) -> Result<WriteStats> {
    let db = Database::create(dir.join(FILE))?;
    let begin = || -> Result<redb::WriteTransaction> {
        let mut txn = db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        txn.set_quick_repair(quick_repair);
        Ok(txn)
    };

    let t = Instant::now();
    let edges: Vec<[u8; 20]> = w
        .members
        .iter()
        .zip(&w.fill)
        .flat_map(|(m, hs)| hs.iter().map(|&h| m.key(h)))
        .collect();
    for part in edges.chunks(FILL_TXN) {
        let txn = begin()?;
        {
            let mut tab = txn.open_table(EDGES)?;
            for k in part {
                tab.insert(k, ())?;
            }
        }
        txn.commit()?;
    }
    drop(edges);
    let fill_s = t.elapsed().as_secs_f64();

    let mut d = Driver::new(w, run, fill_s);
    loop {
        let txn = begin()?;
        let mut done = false;
        {
            let mut tab = txn.open_table(EDGES)?;
            loop {
                match d.step() {
                    Step::Event(ev) => {
                        let m = w.members[ev.member as usize];
                        for &h in w.event_hashes(ev) {
                            if ev.store {
                                tab.insert(&m.key(h), ())?;
                            } else {
                                tab.remove(&m.key(h))?;
                            }
                        }
                    }
                    Step::Commit => break,
                    Step::Done => {
                        done = true;
                        break;
                    }
                }
            }
        }
        let c = Instant::now();
        txn.commit()?;
        d.committed(c, c.elapsed().as_secs_f64() * 1e3);
        if done {
            break;
        }
    }
    let st = d.finish();
    // No close: the caller exits without destructors, as kill -9 would.
    std::mem::forget(db);
    Ok(st)
}

/// Reopens (repairing if the last run was killed) and scans every edge into an [`OwnersMap`].
/// Returns the map and the seconds spent in `Database::open` alone.
pub fn recover(dir: &Path) -> Result<(OwnersMap, f64)> {
    let t = Instant::now();
    let db = Database::open(dir.join(FILE))?;
    let open_s = t.elapsed().as_secs_f64();
    let txn = db.begin_read()?;
    let tab = txn.open_table(EDGES)?;
    let mut map = OwnersMap::with_capacity(tab.len()? as usize);
    let mut last: Option<(Member, u32)> = None;
    for row in tab.iter()? {
        let (k, _) = row?;
        let (m, h) = Member::from_key(k.value());
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
    std::mem::forget(txn);
    std::mem::forget(db);
    Ok((map, open_s))
}
