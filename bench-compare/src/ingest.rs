//! Producer ingest: block ops/s of ckf-core's `DcCkfState`, dynamo's `DcCkfState`, dynamo's
//! `RadixTree` and an exact `HashMap<u64, u32>` refcount index, on the same block-op sequence.
//!
//! Workload: 4 members (workers), each an LRU cache of 16-block chains. Every step one member
//! stores a chain (80% fresh: 16 random local hashes, chained by dynamo's rule; 20% a chain
//! another member holds, so shared blocks exist and refcounts go above 1) and evicts its oldest
//! chain (16 blocks, one removed event). Member capacity is set so the distinct blocks fill ~85%
//! of the CKF slots. Ops are generated before timing, and each segment's inputs are built
//! before its clock starts, alike for every implementation (one heap buffer per event, in
//! order): engine events for dynamo and the `RadixTree`, the member and its hash list for
//! ckf-core and the `HashMap` (local hashes for "+chain" stores). Each implementation consumes
//! its events in the timed loop (an event is dropped once applied, as `apply_event` takes its
//! event by value). Every implementation gets its own state
//! warmed to that load (untimed), then applies the same `STEADY_BLOCK_OPS` block ops, in
//! `SEGMENTS` segments taken round-robin across implementations; time is the thread's on-CPU
//! time, summed over segments.
//!
//! Inputs: dynamo gets engine events (external block ids = the chained hashes, local token
//! hashes, parent = none because each chain starts a sequence) and chains them itself;
//! ckf-core gets the chained `u64`s; "ckf-core +chain" computes them from the local hashes first
//! with dynamo's `compute_seq_hash_for_block`, the like-for-like figure. Before each event
//! ckf-core is given the next event's hashes (`DcCkfState::prefetch_next`), as the producer's
//! actor does within an ingest batch; in "+chain" the next event's chain is computed one event
//! ahead for that, once per event.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hint::black_box;

use ckf_core::TableFormat;
use ckf_core::addressing::fmix64;
use ckf_core::dc::{DcCkfConfig, DcCkfState, FoldHashBuilder, MemberId};
use dynamo_kv_router::RadixTree;
use dynamo_kv_router::indexer::cuckoo::DcCkfState as DynState;
use dynamo_kv_router::protocols::{
    ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheRemoveData, KvCacheStoreData,
    KvCacheStoredBlockData, LocalBlockHash, RouterEvent, compute_seq_hash_for_block,
};

use crate::alloc::retained;
use crate::tables::dynamo_config;
use crate::timing::cpu_ns;

const MEMBERS: usize = 4;
const CHAIN: usize = 16;
const SHARED_PERCENT: u64 = 20;
const STEADY_BLOCK_OPS: usize = 2_000_000;
const PUBLISH_EVERY: usize = 64;
const OUR_SEED: u64 = 0xBE7C;

struct Chain {
    local: Vec<LocalBlockHash>,
    canon: Vec<u64>,
}

#[derive(Clone, Copy)]
enum Kind {
    Store,
    Remove,
}

#[derive(Clone, Copy)]
struct Op {
    member: usize,
    kind: Kind,
    chain: u32,
}

struct Workload {
    chains: Vec<Chain>,
    warmup: Vec<Op>,
    steady: Vec<Op>,
    unique_at_end: usize,
}

fn workload(capacity_chains: usize, seed: u64) -> Workload {
    let mut rng = seed;
    let mut next = move || {
        rng = rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        fmix64(rng)
    };
    let mut chains: Vec<Chain> = Vec::new();
    let mut queues: Vec<VecDeque<u32>> = vec![VecDeque::new(); MEMBERS];
    let mut holds: Vec<HashSet<u32, FoldHashBuilder>> = vec![HashSet::default(); MEMBERS];
    let mut store = |m: usize,
                     chains: &mut Vec<Chain>,
                     queues: &mut Vec<VecDeque<u32>>,
                     holds: &mut Vec<HashSet<u32, FoldHashBuilder>>|
     -> Op {
        let r = next();
        let other = (m + 1 + (r as usize % (MEMBERS - 1))) % MEMBERS;
        let shared = (r >> 8) % 100 < SHARED_PERCENT && !queues[other].is_empty();
        let mut chain = None;
        if shared {
            let q = &queues[other];
            let c = q[(r >> 20) as usize % q.len()];
            if !holds[m].contains(&c) {
                chain = Some(c);
            }
        }
        let c = chain.unwrap_or_else(|| {
            let local: Vec<LocalBlockHash> = (0..CHAIN).map(|_| LocalBlockHash(next())).collect();
            let canon = compute_seq_hash_for_block(&local);
            chains.push(Chain { local, canon });
            (chains.len() - 1) as u32
        });
        holds[m].insert(c);
        queues[m].push_back(c);
        Op {
            member: m,
            kind: Kind::Store,
            chain: c,
        }
    };
    let mut warmup = Vec::new();
    for _ in 0..capacity_chains {
        for m in 0..MEMBERS {
            warmup.push(store(m, &mut chains, &mut queues, &mut holds));
        }
    }
    let mut steady = Vec::new();
    let (mut ops, mut m) = (0, 0);
    while ops < STEADY_BLOCK_OPS {
        steady.push(store(m, &mut chains, &mut queues, &mut holds));
        let c = queues[m].pop_front().expect("member holds chains");
        holds[m].remove(&c);
        steady.push(Op {
            member: m,
            kind: Kind::Remove,
            chain: c,
        });
        ops += 2 * CHAIN;
        m = (m + 1) % MEMBERS;
    }
    let unique_at_end = queues.iter().flatten().collect::<HashSet<_>>().len() * CHAIN;
    Workload {
        chains,
        warmup,
        steady,
        unique_at_end,
    }
}

fn router_event(w: &Workload, op: &Op, id: u64) -> RouterEvent {
    let c = &w.chains[op.chain as usize];
    let data = match op.kind {
        Kind::Store => KvCacheEventData::Stored(KvCacheStoreData {
            parent_hash: None,
            start_position: Some(0),
            blocks: c
                .local
                .iter()
                .zip(&c.canon)
                .map(|(&tokens_hash, &h)| KvCacheStoredBlockData {
                    block_hash: ExternalSequenceBlockHash(h),
                    tokens_hash,
                    mm_extra_info: None,
                })
                .collect(),
        }),
        Kind::Remove => KvCacheEventData::Removed(KvCacheRemoveData {
            block_hashes: c
                .canon
                .iter()
                .map(|&h| ExternalSequenceBlockHash(h))
                .collect(),
        }),
    };
    RouterEvent::new(
        op.member as u64,
        KvCacheEvent {
            event_id: id,
            data,
            dp_rank: 0,
        },
    )
}

/// One event as ckf-core's producer is given it, built before the clock starts as the engine
/// events of dynamo and the `RadixTree` are: the member and the chained hashes, or for
/// "+chain" stores the local hashes, chained inside the timed loop.
struct OurEvent {
    member: MemberId,
    kind: Kind,
    hashes: Vec<u64>,
    local: Vec<LocalBlockHash>,
}

fn our_events(w: &Workload, ops: &[Op], chain: bool) -> Vec<OurEvent> {
    ops.iter()
        .map(|op| {
            let c = &w.chains[op.chain as usize];
            let local_input = chain && matches!(op.kind, Kind::Store);
            OurEvent {
                member: MemberId::new(op.member as u64, 0),
                kind: op.kind,
                hashes: if local_input {
                    Vec::new()
                } else {
                    c.canon.clone()
                },
                local: if local_input {
                    c.local.clone()
                } else {
                    Vec::new()
                },
            }
        })
        .collect()
}

fn ours_apply(state: &mut DcCkfState, events: Vec<OurEvent>, first: usize, publish: bool) {
    // Each event's hashes (a "+chain" store's chain computed here, once per event), one event
    // ahead: the next event's go to `DcCkfState::prefetch_next`, as the producer's actor does
    // within an ingest batch, so the prefetch ring runs on across events. Events are consumed
    // (dropped once applied), as dynamo's and the `RadixTree`'s `apply_event` consume theirs.
    let chained = |e: &OurEvent| -> Option<Vec<u64>> {
        (!e.local.is_empty()).then(|| compute_seq_hash_for_block(&e.local))
    };
    let mut events = events.into_iter().enumerate().peekable();
    let mut current = events.peek().and_then(|(_, e)| chained(e));
    while let Some((i, e)) = events.next() {
        let next = events.peek().map(|(_, n)| {
            let c = chained(n);
            state.prefetch_next(c.as_deref().unwrap_or(&n.hashes));
            c
        });
        let this = current.take();
        let hashes = this.as_deref().unwrap_or(&e.hashes);
        match e.kind {
            Kind::Store => {
                black_box(state.store(e.member, hashes));
            }
            Kind::Remove => {
                black_box(state.remove(e.member, hashes));
            }
        }
        drop(e);
        current = next.flatten();
        if publish && (first + i) % PUBLISH_EVERY == PUBLISH_EVERY - 1 {
            black_box(state.take_batch());
        }
    }
}

fn exact_apply(index: &mut HashMap<u64, u32, FoldHashBuilder>, events: Vec<OurEvent>) {
    for e in events {
        match e.kind {
            Kind::Store => {
                for &h in &e.hashes {
                    *index.entry(h).or_insert(0) += 1;
                }
            }
            Kind::Remove => {
                for h in &e.hashes {
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

/// One table size's results.
pub struct IngestRow {
    pub buckets: u64,
    pub load_ours: f64,
    pub load_dyn: f64,
    pub omitted_ours: u64,
    pub omitted_dyn: u64,
    pub unique_blocks: usize,
    /// block ops/s
    pub ours: f64,
    pub ours_chain: f64,
    pub ours_pub: f64,
    pub dyn_never: f64,
    pub dyn_pub: f64,
    pub dyn_default: f64,
    pub radix: f64,
    pub exact: f64,
    /// retained heap bytes per distinct tracked block at the target load
    pub mem_ours: f64,
    pub mem_dyn: f64,
    pub mem_radix: f64,
    pub mem_exact: f64,
}

/// One implementation under test, warmed to the target load.
enum Runner {
    Ours {
        state: Box<DcCkfState>,
        chain: bool,
        publish: bool,
    },
    // Both states are boxed: each is several hundred bytes, the other variants a few words.
    Dyn(Box<DynState>),
    Radix(RadixTree),
    Exact(HashMap<u64, u32, FoldHashBuilder>),
}

impl Runner {
    /// Applies `ops` (steady ops `first..`); engine events are built before the clock starts.
    /// Returns the on-CPU nanoseconds spent applying.
    fn apply(&mut self, w: &Workload, ops: &[Op], first: usize) -> u64 {
        let evs = match self {
            Runner::Dyn(_) | Runner::Radix(_) => ops
                .iter()
                .enumerate()
                .map(|(i, op)| router_event(w, op, (first + i) as u64))
                .collect(),
            _ => Vec::new(),
        };
        let ours = match self {
            Runner::Ours { chain, .. } => our_events(w, ops, *chain),
            Runner::Exact(_) => our_events(w, ops, false),
            _ => Vec::new(),
        };
        let start = cpu_ns();
        match self {
            Runner::Ours { state, publish, .. } => ours_apply(state, ours, first, *publish),
            Runner::Dyn(state) => {
                for e in evs {
                    black_box(state.apply_event(e));
                }
            }
            Runner::Radix(tree) => {
                for e in evs {
                    let _ = black_box(tree.apply_event(e));
                }
            }
            Runner::Exact(index) => exact_apply(index, ours),
        }
        cpu_ns() - start
    }
}

/// Steady ops are applied in this many segments, round-robin over the implementations, so that
/// load from other tenants of the machine falls on all of them alike.
const SEGMENTS: usize = 8;

/// Runs every implementation at `buckets` buckets and `load` slot load.
pub fn run(buckets: u64, load: f64) -> IngestRow {
    let format = TableFormat::new(buckets, OUR_SEED).expect("format");
    let unique = (format.slot_count() as f64 * load) as usize;
    let seed = buckets ^ load.to_bits();
    let guess = unique / MEMBERS / CHAIN;
    let trial = workload(guess, seed).unique_at_end;
    let capacity = (guess as f64 * unique as f64 / trial as f64) as usize;
    let w = workload(capacity, seed);
    let ops = w.steady.len() as f64 * CHAIN as f64;
    // The large size skips dynamo's default cadence (one more warm-up) to keep the whole run
    // within a few minutes on a shared 2-core machine. ckf-core +chain runs at every size: it is
    // the like-for-like headline against dynamo (which chains inside its producer).
    let full = buckets <= 1 << 16;

    // Warm every implementation (untimed); heap retained by the first of each kind = memory.
    let mut runners: Vec<(&str, Runner)> = Vec::new();
    let (mut mem_ours, mut mem_dyn) = (0.0, 0.0);
    let mut warm_unique = 1.0;
    for (name, chain, publish) in [
        ("ours", false, false),
        ("ours+chain", true, false),
        ("ours+pub", false, true),
    ] {
        let (state, bytes) = retained(|| {
            let mut s = DcCkfState::new(DcCkfConfig::new(format)).expect("state");
            ours_apply(&mut s, our_events(&w, &w.warmup, false), 0, false);
            // The warm-up is one burst, published as one batch; that batch's scratch buffers
            // (sized for every bucket it changed) are given back at the next publication,
            // which a producer takes within milliseconds. Measure after it: what the producer
            // holds, not the burst's transient.
            s.take_batch();
            s.take_batch();
            s
        });
        if name == "ours" {
            warm_unique = state.stats().unique_blocks as f64;
            mem_ours = bytes as f64 / warm_unique;
        }
        runners.push((
            name,
            Runner::Ours {
                state: Box::new(state),
                chain,
                publish,
            },
        ));
    }
    for (name, every) in [
        ("dyn", usize::MAX),
        ("dyn+pub", PUBLISH_EVERY),
        ("dyn default", 1),
    ] {
        if every == 1 && !full {
            continue;
        }
        let mut config = dynamo_config(buckets);
        config.publish_every_n_events = every;
        let (state, bytes) = retained(|| {
            let mut s = DynState::new(config).expect("dynamo state");
            for (i, op) in w.warmup.iter().enumerate() {
                black_box(s.apply_event(router_event(&w, op, i as u64)));
            }
            s.flush();
            s
        });
        if name == "dyn" {
            mem_dyn = bytes as f64 / state.stats().aggregation().unique_block_count() as f64;
        }
        runners.push((name, Runner::Dyn(Box::new(state))));
    }
    let (tree, bytes) = retained(|| {
        let mut t = RadixTree::new();
        for (i, op) in w.warmup.iter().enumerate() {
            let _ = black_box(t.apply_event(router_event(&w, op, i as u64)));
        }
        t
    });
    let mem_radix = bytes as f64 / warm_unique;
    runners.push(("radix", Runner::Radix(tree)));
    let (index, bytes) = retained(|| {
        let mut m: HashMap<u64, u32, FoldHashBuilder> = HashMap::default();
        exact_apply(&mut m, our_events(&w, &w.warmup, false));
        m
    });
    let mem_exact = bytes as f64 / index.len() as f64;
    runners.push(("exact", Runner::Exact(index)));

    // Steady state, interleaved by segment (segments hold whole store + remove pairs).
    let seg = w.steady.len().div_ceil(SEGMENTS).next_multiple_of(2);
    let mut spent = vec![0u64; runners.len()];
    for (s, ops) in w.steady.chunks(seg).enumerate() {
        for ((_, r), t) in runners.iter_mut().zip(spent.iter_mut()) {
            *t += r.apply(&w, ops, s * seg);
        }
    }
    let rate = |name: &str| {
        runners
            .iter()
            .zip(&spent)
            .find(|((n, _), _)| *n == name)
            .map_or(f64::NAN, |(_, &t)| ops * 1e9 / t.max(1) as f64)
    };
    let (mut load_ours, mut omitted_ours, mut load_dyn, mut omitted_dyn) = (0.0, 0, 0.0, 0);
    for (name, r) in &runners {
        match r {
            Runner::Ours { state, .. } if *name == "ours" => {
                let s = state.stats();
                load_ours = s.load_factor;
                omitted_ours = s.omissions_total;
            }
            Runner::Dyn(state) if *name == "dyn" => {
                let a = state.stats().aggregation();
                load_dyn = a.occupied_slot_count() as f64 / (buckets * 4) as f64;
                omitted_dyn = state.lifetime_capacity_omissions();
            }
            _ => {}
        }
    }
    IngestRow {
        buckets,
        load_ours,
        load_dyn,
        omitted_ours,
        omitted_dyn,
        unique_blocks: w.unique_at_end,
        ours: rate("ours"),
        ours_chain: rate("ours+chain"),
        ours_pub: rate("ours+pub"),
        dyn_never: rate("dyn"),
        dyn_pub: rate("dyn+pub"),
        dyn_default: rate("dyn default"),
        radix: rate("radix"),
        exact: rate("exact"),
        mem_ours,
        mem_dyn,
        mem_radix,
        mem_exact,
    }
}
