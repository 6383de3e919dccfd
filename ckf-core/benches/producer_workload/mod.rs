//! The producer bench's workload (see the bench's module docs, "Workload"): LRU-like churn of
//! 4 members generated before timing, how it is applied to the state and to the baselines
//! (exact refcounts, the block map's access pattern under each candidate hasher), and the
//! on-CPU clock the rates are measured with.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::BuildHasher;
use std::hint::black_box;
use std::time::Instant;

use ckf_core::TableFormat;
use ckf_core::addressing::fmix64;
use ckf_core::dc::{DcCkfState, FoldHashBuilder, MemberId};

/// Members of a workload.
pub const MEMBERS: usize = 4;
/// Blocks per event.
pub const EVENT_BLOCKS: usize = 16;
/// Percent of a store's blocks another member holds.
pub const SHARED_PERCENT: u64 = 20;
/// Block ops of the timed steady churn.
pub const STEADY_BLOCK_OPS: usize = 2_000_000;
/// Events between publication batches (`+pub`).
pub const BATCH_EVERY_EVENTS: usize = 64;

/// What an event does.
#[derive(Clone, Copy)]
pub enum Kind {
    /// The member stores the blocks.
    Store,
    /// The member evicts the blocks.
    Remove,
}

/// One event of the workload.
pub struct Event {
    /// The member storing or removing.
    pub member: MemberId,
    /// Store or remove.
    pub kind: Kind,
    /// Its blocks, in order.
    pub blocks: Vec<u64>,
}

/// One row's events: the untimed warm-up fill, then the timed steady churn.
pub struct Workload {
    /// Stores filling the members to their capacity.
    pub warmup: Vec<Event>,
    /// Store/evict pairs, [`STEADY_BLOCK_OPS`] block ops.
    pub steady: Vec<Event>,
    /// Distinct blocks held at the end (exact, from the generator's own bookkeeping).
    pub unique_at_end: usize,
}

/// LRU-like churn over 4 members, each holding `capacity` blocks.
pub fn workload(capacity: usize, seed: u64) -> Workload {
    let mut rng = seed;
    let mut next = move || {
        rng = rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        fmix64(rng)
    };
    let mut queues: Vec<VecDeque<u64>> = vec![VecDeque::new(); MEMBERS];
    let mut owned: Vec<HashSet<u64, FoldHashBuilder>> = vec![HashSet::default(); MEMBERS];
    let member = |m: usize| MemberId::new(m as u64, 0);
    let mut store_event = |m: usize,
                           queues: &mut Vec<VecDeque<u64>>,
                           owned: &mut Vec<HashSet<u64, FoldHashBuilder>>|
     -> Event {
        let mut blocks = Vec::with_capacity(EVENT_BLOCKS);
        while blocks.len() < EVENT_BLOCKS {
            let r = next();
            let other = (m + 1 + (r as usize % (MEMBERS - 1))) % MEMBERS;
            let h = if r % 100 < SHARED_PERCENT && !queues[other].is_empty() {
                let q = &queues[other];
                q[(r >> 20) as usize % q.len()]
            } else {
                next()
            };
            if owned[m].insert(h) {
                queues[m].push_back(h);
                blocks.push(h);
            }
        }
        Event {
            member: member(m),
            kind: Kind::Store,
            blocks,
        }
    };
    let mut warmup = Vec::new();
    for _ in 0..capacity / EVENT_BLOCKS {
        for m in 0..MEMBERS {
            warmup.push(store_event(m, &mut queues, &mut owned));
        }
    }
    let mut steady = Vec::new();
    let mut ops = 0;
    let mut m = 0;
    while ops < STEADY_BLOCK_OPS {
        steady.push(store_event(m, &mut queues, &mut owned));
        let blocks: Vec<u64> = (0..EVENT_BLOCKS)
            .map(|_| queues[m].pop_front().expect("member holds blocks"))
            .collect();
        for h in &blocks {
            owned[m].remove(h);
        }
        steady.push(Event {
            member: member(m),
            kind: Kind::Remove,
            blocks,
        });
        ops += 2 * EVENT_BLOCKS;
        m = (m + 1) % MEMBERS;
    }
    let unique_at_end = owned.iter().flatten().collect::<HashSet<_>>().len();
    Workload {
        warmup,
        steady,
        unique_at_end,
    }
}

/// Applies `events` in order; with `hint`, each event is preceded by
/// `DcCkfState::prefetch_next` of the next one's blocks, as the producer's actor does within an
/// ingest batch. With `publish`, takes a publication batch every [`BATCH_EVERY_EVENTS`] events
/// and, given `batches`, folds every image of it (word and bucket, in order) and its cycles
/// broken into that digest.
/// Returns the blocks omitted.
pub fn apply_ckf(
    state: &mut DcCkfState,
    events: &[Event],
    publish: bool,
    hint: bool,
    mut batches: Option<&mut u64>,
) -> u64 {
    let mut omitted = 0u64;
    for (i, e) in events.iter().enumerate() {
        if hint && let Some(next) = events.get(i + 1) {
            state.prefetch_next(&next.blocks);
        }
        let out = match e.kind {
            Kind::Store => state.store(e.member, &e.blocks),
            Kind::Remove => state.remove(e.member, &e.blocks),
        };
        omitted += u64::from(out.omitted);
        if publish && i % BATCH_EVERY_EVENTS == BATCH_EVERY_EVENTS - 1 {
            let batch = state.take_batch();
            if let (Some(digest), Some(batch)) = (batches.as_deref_mut(), &batch) {
                for image in &batch.images {
                    *digest = fmix64(fmix64(*digest ^ image.image) ^ u64::from(image.bucket));
                }
                *digest = fmix64(*digest ^ u64::from(batch.cycles_broken));
            }
            black_box(batch);
        }
    }
    omitted
}

/// The baseline: the same block ops on exact refcounts.
pub fn apply_baseline(index: &mut HashMap<u64, u32, FoldHashBuilder>, events: &[Event]) {
    for e in events {
        match e.kind {
            Kind::Store => {
                for &h in &e.blocks {
                    *index.entry(h).or_insert(0) += 1;
                }
            }
            Kind::Remove => {
                for h in &e.blocks {
                    if let Some(rc) = index.get_mut(h) {
                        *rc -= 1;
                        if *rc == 0 {
                            index.remove(h);
                        }
                    }
                }
            }
        }
    }
}

/// An entry the size of the producer's block-map value (refcount + three inline owner tags).
#[derive(Clone, Copy, Default)]
pub struct Entry {
    refcount: u32,
    _owners: [u32; 3],
}

/// The block map's access pattern under hasher `S`: one probe per block op.
pub fn apply_block_map<S: BuildHasher>(index: &mut HashMap<u64, Entry, S>, events: &[Event]) {
    for e in events {
        match e.kind {
            Kind::Store => {
                for &h in &e.blocks {
                    index.entry(h).or_default().refcount += 1;
                }
            }
            Kind::Remove => {
                for h in &e.blocks {
                    if let Some(o) = index.get_mut(h) {
                        o.refcount -= 1;
                        if o.refcount == 0 {
                            index.remove(h);
                        }
                    }
                }
            }
        }
    }
}

/// Block ops per second of the block map under hasher `S` (warm-up applied first, untimed).
pub fn block_map_rate<S: BuildHasher + Default>(w: &Workload, ops: f64) -> f64 {
    let mut index: HashMap<u64, Entry, S> = HashMap::default();
    apply_block_map(&mut index, &w.warmup);
    let r = rate(ops, || apply_block_map(&mut index, &w.steady));
    black_box(&index);
    r
}

/// Map hashers compared in the second table, the producer's first.
pub const HASHERS: [&str; 3] = ["foldhash (ours)", "rustc-hash", "std SipHash"];

/// Best of three interleaved runs of each hasher on the block map.
pub fn hasher_rates(w: &Workload, ops: f64) -> [f64; 3] {
    let mut best = [0.0f64; 3];
    for _ in 0..3 {
        let runs = [
            block_map_rate::<FoldHashBuilder>(w, ops),
            block_map_rate::<rustc_hash::FxBuildHasher>(w, ops),
            block_map_rate::<std::collections::hash_map::RandomState>(w, ops),
        ];
        for (b, r) in best.iter_mut().zip(runs) {
            *b = b.max(r);
        }
    }
    best
}

/// Nanoseconds this thread has spent on a CPU (or since an arbitrary origin on the wall clock).
pub fn cpu_ns() -> u64 {
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| ORIGIN.get_or_init(Instant::now).elapsed().as_nanos() as u64)
}

/// Block ops per second of `run`, by [`cpu_ns`].
pub fn rate(ops: f64, run: impl FnOnce()) -> f64 {
    let start = cpu_ns();
    run();
    ops * 1e9 / (cpu_ns() - start).max(1) as f64
}

/// The workload of one row: member capacity for `load` of `format`'s slots in unique blocks
/// (one trial generation measures how much the members' sets overlap, then the capacity is
/// rescaled).
pub fn sized_workload(format: TableFormat, load: f64) -> Workload {
    let unique = (format.slot_count() as f64 * load) as usize;
    let seed = format.bucket_count ^ load.to_bits();
    // At least one event's worth per member, so a member always has blocks to evict (tiny
    // tables and loads); the trial holds at least one block, so the rescale stays finite.
    let guess = (unique / MEMBERS).max(EVENT_BLOCKS);
    let trial = workload(guess, seed).unique_at_end.max(1);
    let capacity = (guess as f64 * unique as f64 / trial as f64) as usize;
    workload(capacity, seed)
}

/// Block ops of `events`.
pub fn block_ops(events: &[Event]) -> usize {
    events.iter().map(|e| e.blocks.len()).sum()
}
