//! The search bench's tables, built through the real ingest path (lease + barrier snapshot)
//! and filled to the requested slot load, next to the exact baseline index answering the same
//! prefix-depth question; the concurrent delta writer; synthetic and trace workloads.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use ckf_core::addressing::{TableFormat, fmix64};
use ckf_core::bucket::with_slot;
use ckf_core::dc::FoldHashBuilder;
use ckf_core::frames::{BucketImage, DcCkfDelta, DcCkfSnapshot};
use ckf_core::global::{GlobalCkfIndexer, Manifest};
use ckf_core::identity::{
    IndexerDomainId, PoolId, ProducerIdentity, ProducerIncarnation, StreamTag,
};
use ckf_core::lane::{Frame, IngestOutcome, LagPolicy};

/// Block hash -> mask of the lanes holding it.
pub type Exact = HashMap<u64, u64, FoldHashBuilder>;

/// The bench's random source (a `fmix64` counter).
pub struct Rng(pub u64);
impl Rng {
    /// The next value.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        fmix64(self.0)
    }
}

/// The consumer instance of every bench indexer.
const INSTANCE: u64 = 7;

/// A 1..=64-lane indexer of `bucket_count` buckets (lag policy off).
pub fn build_indexer(bucket_count: u64, lanes: usize) -> GlobalCkfIndexer {
    let format = TableFormat::new(bucket_count, 0xC0DE).unwrap();
    let m = Manifest {
        domain: IndexerDomainId::new("bench").unwrap(),
        format,
        lanes: (0..lanes)
            .map(|i| PoolId::new("bench", &format!("dc-{i}")).unwrap())
            .collect(),
    };
    GlobalCkfIndexer::with_policy(m, INSTANCE, LagPolicy::DISABLED).unwrap()
}

/// Fills every lane: `lane_blocks[l]` placed exactly (first free candidate slot), the other
/// slots random filler at `load`. Installs each lane with a barrier snapshot; returns the
/// stream tags (for writers) and the per-lane words.
pub fn fill(
    ix: &GlobalCkfIndexer,
    lane_blocks: &mut [Vec<u64>],
    load: f64,
    seed: u64,
) -> Vec<StreamTag> {
    let n = ix.table().bucket_count();
    let addressing = *ix.addressing();
    let mut tags = Vec::new();
    let mut rng = Rng(seed);
    for (lane, blocks) in lane_blocks.iter_mut().enumerate() {
        // Exact placement first (blocks that find no free candidate slot are dropped from the
        // lane's truth), then filler in free slots.
        let mut words = vec![0u64; n];
        blocks.retain(|&h| {
            let loc = addressing.locate(h);
            for b in [loc.bucket_a, loc.bucket_b] {
                let w = words[b as usize];
                if let Some(s) = ckf_core::bucket::find_empty(w) {
                    words[b as usize] = with_slot(w, s, loc.fingerprint);
                    return true;
                }
            }
            false
        });
        let threshold = (load * u32::MAX as f64) as u64;
        for w in words.iter_mut() {
            let r = rng.next();
            for s in 0..4 {
                if ckf_core::bucket::slot(*w, s) == 0 && (rng.next() & 0xFFFF_FFFF) < threshold {
                    *w = with_slot(*w, s, ((r >> (16 * s)) as u16).max(1));
                }
            }
        }
        let id = ProducerIdentity {
            pool: ix.pool(lane as u8).clone(),
            incarnation: ProducerIncarnation(lane as u64),
            format: ix.manifest().format,
        };
        let lease = ix.grant_lease(&id).unwrap();
        let tag = StreamTag {
            incarnation: id.incarnation,
            lease,
        };
        let out = ix.ingest_now(&Frame::Snapshot(DcCkfSnapshot {
            tag,
            sequence: 0,
            buckets: words,
        }));
        assert!(matches!(out, IngestOutcome::Activated { .. }));
        tags.push(tag);
    }
    tags
}

/// The exact baseline index of the lanes' blocks (block -> lane mask).
pub fn exact_index(lane_blocks: &[Vec<u64>]) -> Exact {
    let mut m = Exact::default();
    for (lane, blocks) in lane_blocks.iter().enumerate() {
        for &h in blocks {
            *m.entry(h).or_default() |= 1 << lane;
        }
    }
    m
}

/// The baseline: same question answered from the exact index. Returns the summed depth.
#[inline(never)]
pub fn exact_query(index: &Exact, ready: u64, q: &[u64]) -> u32 {
    let mut active = ready;
    let mut depths = [0u32; 64];
    for (i, h) in q.iter().enumerate() {
        let mask = index.get(h).copied().unwrap_or(0) & active;
        let mut missed = active & !mask;
        while missed != 0 {
            depths[missed.trailing_zeros() as usize] = i as u32;
            missed &= missed - 1;
        }
        active = mask;
        if active == 0 {
            break;
        }
    }
    while active != 0 {
        depths[active.trailing_zeros() as usize] = q.len() as u32;
        active &= active - 1;
    }
    depths.iter().sum()
}

/// The measured query: the CKF search. Returns the summed depth.
#[inline(never)]
pub fn ckf_query(ix: &GlobalCkfIndexer, q: &[u64]) -> u32 {
    let m = ix.find_prefix_matches(q);
    m.iter().map(|(_, d)| d).sum()
}

/// Checks that the CKF never under-reports (no false negatives) and counts over-reports.
pub fn verify(ix: &GlobalCkfIndexer, index: &Exact, queries: &[Vec<u64>]) -> usize {
    let ready = ix.ready_mask();
    let mut over = 0;
    for q in queries.iter().take(5000) {
        let m = ix.find_prefix_matches(q);
        let mut active = ready;
        let mut exact = [0u32; 64];
        for (i, h) in q.iter().enumerate() {
            let mask = index.get(h).copied().unwrap_or(0) & active;
            let mut missed = active & !mask;
            while missed != 0 {
                exact[missed.trailing_zeros() as usize] = i as u32;
                missed &= missed - 1;
            }
            active = mask;
        }
        while active != 0 {
            exact[active.trailing_zeros() as usize] = q.len() as u32;
            active &= active - 1;
        }
        for (lane, d) in m.iter() {
            assert!(
                d >= exact[lane as usize],
                "false negative: lane {lane} depth {d} < {}",
                exact[lane as usize]
            );
            over += usize::from(d > exact[lane as usize]);
        }
    }
    over
}

/// Applies deltas to lane 0 at about `rate` deltas/s (8 images each, rewriting filler slots only
/// so the query answers stay the same) until stopped. Returns deltas applied.
pub fn spawn_writer(
    ix: Arc<GlobalCkfIndexer>,
    tag: StreamTag,
    rate: f64,
    stop: Arc<AtomicBool>,
    count: Arc<AtomicU64>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let n = ix.table().bucket_count() as u64;
        let mut rng = Rng(99);
        let mut seq = 0u64;
        let start = Instant::now();
        let mut images = Vec::with_capacity(8);
        // Relaxed (here and for `count`): a stop flag and a progress counter publish no data;
        // the deltas themselves go through the indexer's own synchronisation.
        while !stop.load(Ordering::Relaxed) {
            let due = (start.elapsed().as_secs_f64() * rate) as u64;
            if seq >= due {
                std::hint::spin_loop();
                continue;
            }
            images.clear();
            let first = rng.next() % n;
            for k in 0..8u64 {
                let bucket = ((first + k * 977) % n) as u32;
                // Same image (the words are the truth for the queries); the store still moves
                // the cache line to the writer's core, which is the cost under measurement.
                let image = ix.table().load(bucket as usize, 0);
                images.push(BucketImage { bucket, image });
            }
            let d = DcCkfDelta {
                tag,
                base_sequence: seq,
                sequence: seq + 1,
                images: images.clone(),
                oldest_change_age_ms: 0,
            };
            let out = ix.ingest_now(&Frame::Delta(d));
            assert!(matches!(out, IngestOutcome::Applied { .. }), "{out:?}");
            seq += 1;
            count.store(seq, Ordering::Relaxed);
        }
    })
}

/// `count` synthetic queries of `len` blocks (random chained hashes). Every lane holds every
/// query block: the worst case for search (no early exit).
pub fn synthetic_queries(count: usize, len: usize, seed: u64) -> Vec<Vec<u64>> {
    let mut rng = Rng(seed);
    (0..count)
        .map(|_| (0..len).map(|_| rng.next()).collect())
        .collect()
}

/// Mooncake-like: lanes filled with different subsets of the trace (each request stored in each
/// lane with probability 1/4). Returns the indexer, its lanes' stream tags, the exact index and
/// the mean number of blocks per lane.
pub fn trace_indexer(
    trace: &[Vec<u64>],
    big: bool,
) -> (Arc<GlobalCkfIndexer>, Vec<StreamTag>, Exact, usize) {
    let buckets: u64 = if big {
        (256u64 << 20) / 8 / 16
    } else {
        16 << 10
    };
    trace_indexer_sized(trace, buckets, 16)
}

/// [`trace_indexer`] on a table of `lanes` lanes of `buckets` buckets each.
pub fn trace_indexer_sized(
    trace: &[Vec<u64>],
    buckets: u64,
    lanes: usize,
) -> (Arc<GlobalCkfIndexer>, Vec<StreamTag>, Exact, usize) {
    let ix = Arc::new(build_indexer(buckets, lanes));
    let mut rng = Rng(3);
    let mut lane_blocks = vec![Vec::new(); lanes];
    let mut seen: Vec<HashMap<u64, (), FoldHashBuilder>> = vec![HashMap::default(); lanes];
    for q in trace {
        for (lane, lb) in lane_blocks.iter_mut().enumerate() {
            if rng.next().is_multiple_of(4) {
                for &h in q {
                    if seen[lane].insert(h, ()).is_none() {
                        lb.push(h);
                    }
                }
            }
        }
    }
    // Keep each lane within 95% of its slots.
    let cap = (buckets as f64 * 4.0 * 0.95) as usize;
    for lb in lane_blocks.iter_mut() {
        lb.truncate(cap);
    }
    let per_lane: usize = lane_blocks.iter().map(|l| l.len()).sum::<usize>() / lanes;
    let tags = fill(&ix, &mut lane_blocks, 0.95, 11);
    let exact = exact_index(&lane_blocks);
    (ix, tags, exact, per_lane)
}
