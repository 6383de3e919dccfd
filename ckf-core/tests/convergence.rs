//! Convergence (docs/design.md, "Correctness checks"): after random churn on real producers (`DcCkfState` +
//! `DcCkfPublisher`), a barrier snapshot, the following deltas and an exact drain marker
//! reconstruct each producer's table bytes in its consumer lane, and prefix search finds every
//! tracked block at full depth (no false negatives). Several lanes with different contents.

use ckf_core::addressing::{TableFormat, fmix64};
use ckf_core::dc::{DcCkfConfig, DcCkfState, MemberId};
use ckf_core::global::GlobalCkfIndexer;
use ckf_core::identity::{PoolId, ProducerIdentity, ProducerIncarnation};
use ckf_core::lane::{Frame, IngestOutcome, LaneState};
use ckf_core::publication::DcCkfPublisher;
use ckf_core::testing;
use proptest::prelude::*;

/// Small deterministic generator (the churn is driven by a proptest-chosen seed).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        fmix64(self.0)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

struct Producer {
    state: DcCkfState,
    publisher: DcCkfPublisher,
}

const MEMBERS: u64 = 4;

impl Producer {
    fn new(format: TableFormat, dc: &str, incarnation: u64) -> Self {
        let identity = ProducerIdentity {
            pool: PoolId::new("prod", dc).unwrap(),
            incarnation: ProducerIncarnation(incarnation),
            format,
        };
        Self {
            state: DcCkfState::new(DcCkfConfig::new(format)).unwrap(),
            publisher: DcCkfPublisher::new(identity),
        }
    }

    /// One random command: store a run, remove some, clear a member or remove a worker.
    /// `space` bounds the block-hash space so removals hit owned blocks.
    fn churn(&mut self, rng: &mut Rng, space: u64, salt: u64) {
        self.churn_with(rng, space, salt, 20)
    }

    /// As `churn`; `kinds` < 20 restricts the command mix to the first `kinds` of 20 weights
    /// (12 = stores only, 18 = stores and removes).
    fn churn_with(&mut self, rng: &mut Rng, space: u64, salt: u64, kinds: u64) {
        let member = MemberId::new(rng.below(MEMBERS / 2), rng.below(2) as u32);
        let hashes: Vec<u64> = (0..1 + rng.below(12))
            .map(|_| fmix64(rng.below(space) ^ salt))
            .collect();
        match rng.below(kinds) {
            0..=11 => {
                self.state.store(member, &hashes);
            }
            12..=17 => {
                self.state.remove(member, &hashes);
            }
            18 => {
                self.state.clear_member(member);
            }
            _ => {
                self.state.remove_worker(member.worker_id);
            }
        }
    }

    /// Every tracked block of every member, per member, in a stable order.
    fn tracked(&self) -> Vec<Vec<u64>> {
        let mut members: Vec<_> = self.state.members().collect();
        members.sort();
        members
            .into_iter()
            .map(|m| {
                let mut v: Vec<u64> = self.state.member_blocks(m);
                v.sort_unstable();
                v
            })
            .collect()
    }
}

fn publish_pending(p: &mut Producer, ix: &GlobalCkfIndexer) -> u32 {
    let mut applied = 0;
    if let Some(batch) = p.state.take_batch() {
        let delta = p.publisher.delta(&batch).unwrap();
        let want = delta.sequence;
        assert_eq!(
            ix.ingest_now(&Frame::Delta(delta)),
            IngestOutcome::Applied {
                installed_sequence: want
            }
        );
        applied += 1;
    }
    applied
}

fn attach_and_snapshot(p: &mut Producer, ix: &GlobalCkfIndexer, chunk_bytes: usize) {
    testing::install_snapshot(ix, &mut p.publisher, &mut p.state, chunk_bytes);
}

fn check_converged(p: &Producer, ix: &GlobalCkfIndexer, lane: u8) {
    let drain = p.publisher.clone().drain_marker().unwrap();
    let seq = drain.sequence;
    assert_eq!(
        ix.ingest_now(&Frame::Drain(drain)),
        IngestOutcome::Drained {
            installed_sequence: seq
        }
    );
    let st = ix.lane_status(lane).unwrap();
    assert!(st.ready && st.drained && st.state == LaneState::Active);
    assert_eq!(
        ix.table().lane_words(lane as usize),
        p.state.buckets(),
        "lane {lane} bytes differ from its producer"
    );
    for blocks in p.tracked() {
        for &h in &blocks {
            assert!(p.state.refcount(h) > 0);
            assert_eq!(
                ix.find_prefix_matches(&[h]).depth(lane),
                Some(1),
                "tracked {h:#x} missing"
            );
        }
        // The member's whole block list as one query: full depth.
        let m = ix.find_prefix_matches(&blocks);
        assert_eq!(m.depth(lane), Some(blocks.len() as u32));
    }
}

fn format(buckets: u64) -> TableFormat {
    TableFormat::new(buckets, 0x5EED).unwrap()
}

fn indexer(format: TableFormat, lanes: usize) -> GlobalCkfIndexer {
    testing::indexer("prod", format, lanes, 42)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Three lanes with different churn; snapshot after some churn, deltas after, exact drain.
    #[test]
    fn snapshot_deltas_and_drain_reconstruct_every_lane(
        seed in any::<u64>(),
        before in 0usize..200,
        after in 1usize..400,
        publish_every in 1usize..6,
        chunk_bytes in 8usize..4096,
    ) {
        let fmt = format(256); // 1024 slots: kicks and omissions happen
        let ix = indexer(fmt, 3);
        let mut rng = Rng(seed);
        let mut producers: Vec<Producer> =
            (0..3).map(|i| Producer::new(fmt, &format!("dc-{i}"), 100 + i)).collect();
        let mut snapshots = Vec::new();
        for (i, p) in producers.iter_mut().enumerate() {
            for _ in 0..before {
                p.churn(&mut rng, 1500, i as u64);
            }
            attach_and_snapshot(p, &ix, chunk_bytes);
            snapshots.push(p.state.buckets().to_vec());
        }
        let mut deltas = 0;
        for step in 0..after {
            for (i, p) in producers.iter_mut().enumerate() {
                p.churn(&mut rng, 1500, i as u64);
                if step % publish_every == 0 {
                    deltas += publish_pending(p, &ix);
                }
            }
        }
        for (i, p) in producers.iter_mut().enumerate() {
            deltas += publish_pending(p, &ix);
            check_converged(p, &ix, i as u8);
        }
        prop_assert_eq!(ix.ready_mask(), 0b111);
        // A table that moved away from its snapshot reached the lane through deltas. (A few
        // churn events can leave every table as it was, e.g. removals of untracked blocks or
        // stores of blocks already held: then there is nothing to send.)
        let moved = producers
            .iter()
            .zip(&snapshots)
            .any(|(p, snapshot)| p.state.buckets() != &snapshot[..]);
        prop_assert!(!moved || deltas > 0, "tables moved, yet no delta was sent");
        // Lanes hold different contents (different salts).
        prop_assert_ne!(ix.table().lane_words(0), ix.table().lane_words(1));
    }
}

/// A re-leased producer (new incarnation after a restart) converges again through a new barrier
/// snapshot, and at high load (kicks, omissions) nothing tracked is missing.
#[test]
fn high_load_reattach_converges() {
    let fmt = format(512);
    let ix = indexer(fmt, 2);
    let mut rng = Rng(7);
    let mut a = Producer::new(fmt, "dc-0", 1);
    let mut b = Producer::new(fmt, "dc-1", 2);
    attach_and_snapshot(&mut a, &ix, 512);
    attach_and_snapshot(&mut b, &ix, 100);
    for _ in 0..3000 {
        a.churn_with(&mut rng, 4000, 1, 14);
        publish_pending(&mut a, &ix);
        b.churn_with(&mut rng, 4000, 2, 14);
    }
    let load = a.state.stats().load_factor;
    assert!(load > 0.8, "high load reached: {load}");
    assert!(a.state.stats().kicks_total > 0);
    check_converged(&a, &ix, 0);
    // b never published deltas: re-attach (new lease) and re-snapshot.
    attach_and_snapshot(&mut b, &ix, 100);
    check_converged(&b, &ix, 1);
    assert_eq!(ix.lane_status(1).unwrap().lease.unwrap().epoch, 2);
}
