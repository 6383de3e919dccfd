//! What a served request sends: the simulated rank's KV events as one `ckf.v1` batch.
//!
//! Event order inside a batch is the order things happened on the rank: one `Removed` event for
//! the evictions, then one `Stored` event per contiguous run of newly stored blocks (with the
//! run's parent hash). Sources are the DC's workers, each with its own batch sequence, as a
//! worker's event publisher would send them.

use ckf_proto::v1::{self, kv_event::Kind};

use crate::bench::fleet::Served;

/// The member id a rank publishes as.
pub fn member(worker: usize, rank: usize) -> v1::MemberId {
    v1::MemberId {
        worker_id: worker as u64,
        dp_rank: rank as u32,
    }
}

/// The KV events of one serve, in order (empty when the rank stored and evicted nothing).
pub fn serve_events(served: &Served) -> Vec<v1::KvEvent> {
    let member = member(served.rank_id.worker, served.rank_id.rank);
    let mut events = Vec::with_capacity(1 + served.stored.len());
    if !served.evicted.is_empty() {
        events.push(v1::KvEvent {
            member: Some(member),
            kind: Some(Kind::Removed(v1::Removed {
                block_hashes: served.evicted.clone(),
            })),
        });
    }
    for run in &served.stored {
        events.push(v1::KvEvent {
            member: Some(member),
            kind: Some(Kind::Stored(v1::Stored {
                block_hashes: run.hashes.clone(),
                parent_hash: run.parent,
            })),
        });
    }
    events
}

/// Block hashes carried by an event (0 for clears).
pub fn event_blocks(event: &v1::KvEvent) -> usize {
    match &event.kind {
        Some(Kind::Stored(s)) => s.block_hashes.len(),
        Some(Kind::Removed(r)) => r.block_hashes.len(),
        _ => 0,
    }
}

/// Per-source batch sequences (one source per simulated worker, plus control sources).
#[derive(Debug, Default)]
pub struct Sources {
    run: String,
    next: std::collections::HashMap<String, u64>,
}

impl Sources {
    /// Sources named after `run` (unique per replay, so a second replay against the same
    /// producer is not mistaken for a duplicate of the first).
    pub fn new(run: String) -> Self {
        Self {
            run,
            next: Default::default(),
        }
    }

    /// A batch from source `name` (e.g. `"w3"`) with its next sequence (1, 2, ...).
    pub fn batch(&mut self, name: &str, events: Vec<v1::KvEvent>) -> v1::KvEventBatch {
        let source_id = format!("{}/{name}", self.run);
        let seq = self.next.entry(source_id.clone()).or_insert(0);
        *seq += 1;
        v1::KvEventBatch {
            source_id,
            sequence: *seq,
            events,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::fleet::{RankId, StoredRun};

    #[test]
    fn removed_first_then_one_stored_event_per_run() {
        let served = Served {
            rank_id: RankId {
                dc: 1,
                worker: 2,
                rank: 3,
            },
            dc_seq: 9,
            requested: 5,
            reused: 1,
            evicted: vec![77],
            stored: vec![
                StoredRun {
                    parent: Some(1),
                    hashes: vec![2, 3],
                },
                StoredRun {
                    parent: Some(4),
                    hashes: vec![5],
                },
            ],
        };
        let events = serve_events(&served);
        assert_eq!(events.len(), 3);
        assert!(matches!(&events[0].kind, Some(Kind::Removed(r)) if r.block_hashes == vec![77]));
        assert!(
            matches!(&events[2].kind, Some(Kind::Stored(s)) if s.block_hashes == vec![5] && s.parent_hash == Some(4))
        );
        assert_eq!(events[1].member, Some(member(2, 3)));
        assert_eq!(events.iter().map(event_blocks).sum::<usize>(), 4);
    }

    #[test]
    fn sequences_count_per_source() {
        let mut s = Sources::new("run".into());
        assert_eq!(s.batch("w0", vec![]).sequence, 1);
        assert_eq!(s.batch("w1", vec![]).sequence, 1);
        let b = s.batch("w0", vec![]);
        assert_eq!((b.sequence, b.source_id.as_str()), (2, "run/w0"));
    }
}
