//! Query side: per-lane prefix depths from every structure, a correctness check against the
//! exact index, interleaved per-query timing, and the concurrent delta writer.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ckf_core::bucket::{GROUP_LANES, MAX_LANES};
use ckf_core::frames::{BucketImage, DcCkfDelta};
use ckf_core::global::GlobalCkfIndexer;
use ckf_core::identity::StreamTag;
use ckf_core::lane::{Frame, IngestOutcome};
use dynamo_kv_router::indexer::SyncIndexer;
use dynamo_kv_router::indexer::cuckoo::{
    GlobalCkfBucketImage, GlobalCkfDelta, GlobalCkfIngestOutcome, GlobalCkfLaneIngestor,
    LaneLease as DynLease, ProducerIdentity as DynIdentity,
};
use dynamo_kv_router::protocols::{OverlapScores, compute_seq_hash_for_block};

use crate::tables::{Crtc, Dyn, Exact, Ours};
use crate::timing::{Lat, summarize, ticks};
use crate::trace::{DYN_MAX_LANES, Trace};

/// Per-lane depths (lanes past the run's lane count stay 0).
pub type Depths = [u32; MAX_LANES];

/// Exact per-lane prefix depths of chained query `q` over the first `lanes` (<= N) lanes
/// (linear walk, stops when no lane matches).
#[inline]
pub fn exact_depths<const N: usize>(index: &Exact, q: &[u64], lanes: usize) -> [u32; N] {
    let mut depths = [0u32; N];
    let mut active: u64 = u64::MAX >> (64 - lanes);
    for (i, h) in q.iter().enumerate() {
        let mask = index.get(h).copied().unwrap_or(0) & active;
        let mut missed = active & !mask;
        while missed != 0 {
            depths[missed.trailing_zeros() as usize] = i as u32;
            missed &= missed - 1;
        }
        active = mask;
        if active == 0 {
            return depths;
        }
    }
    while active != 0 {
        depths[active.trailing_zeros() as usize] = q.len() as u32;
        active &= active - 1;
    }
    depths
}

/// Summed depth: what every timed closure returns (the answer is consumed, not discarded).
/// Up to 16 lanes it walks a 16-lane array, as before lane counts past 16 existed.
#[inline]
pub fn exact_sum(index: &Exact, q: &[u64], lanes: usize) -> u32 {
    if lanes <= GROUP_LANES {
        exact_depths::<GROUP_LANES>(index, q, lanes).iter().sum()
    } else {
        exact_depths::<MAX_LANES>(index, q, lanes).iter().sum()
    }
}

fn ours_depths(ix: &GlobalCkfIndexer, q: &[u64]) -> Depths {
    let mut d = [0; MAX_LANES];
    for (lane, depth) in ix.find_prefix_matches(q).iter() {
        d[lane as usize] = depth;
    }
    d
}

#[inline]
pub fn ours_sum(ix: &GlobalCkfIndexer, q: &[u64]) -> u32 {
    ix.find_prefix_matches(q).iter().map(|(_, d)| d).sum()
}

fn dyn_depths(d: &Dyn, q: &[dynamo_kv_router::protocols::LocalBlockHash]) -> Depths {
    let r = d.ix.find_prefix_matches(q).expect("dynamo lanes ready");
    std::array::from_fn(|l| {
        (l < DYN_MAX_LANES)
            .then(|| r.lanes()[l])
            .flatten()
            .map_or(0, |m| m.prefix_depth())
    })
}

#[inline]
pub fn dyn_sum(d: &Dyn, q: &[dynamo_kv_router::protocols::LocalBlockHash]) -> u32 {
    let r = d.ix.find_prefix_matches(q).expect("dynamo lanes ready");
    r.lanes().iter().flatten().map(|m| m.prefix_depth()).sum()
}

fn scores_depths(s: &OverlapScores) -> Depths {
    let mut d = [0; MAX_LANES];
    for (w, &v) in &s.scores {
        d[w.worker_id as usize] = v;
    }
    d
}

/// Correctness of one structure against the exact index over all queries.
#[derive(Default, Debug, Clone, Copy)]
pub struct Check {
    /// Lane answers below the exact depth (false negatives).
    pub under: u64,
    /// Lane answers above the exact depth (false-positive extensions).
    pub over: u64,
}

/// Checks every structure on every query over `lanes` lanes; radix trees must be exact. The
/// dynamo CKF's entry is `None` when it was not built (more than 16 lanes).
pub fn verify(
    trace: &Trace,
    exact: &Exact,
    ours: &Ours,
    dynamo: Option<&Dyn>,
    radix: &dynamo_kv_router::RadixTree,
    crtc: &Crtc,
    lanes: usize,
) -> [Option<Check>; 4] {
    let mut c = [Check::default(); 4];
    for (q, local) in trace.chained.iter().zip(&trace.local) {
        let truth = exact_depths::<MAX_LANES>(exact, q, lanes);
        let got = [
            ours_depths(&ours.ix, q),
            dynamo.map_or(truth, |d| dyn_depths(d, local)),
            scores_depths(&radix.find_matches(local.clone(), false)),
            scores_depths(&SyncIndexer::find_matches(&*crtc.tree, local, false)),
        ];
        for (k, g) in got.iter().enumerate() {
            for lane in 0..lanes {
                c[k].under += u64::from(g[lane] < truth[lane]);
                c[k].over += u64::from(g[lane] > truth[lane]);
            }
        }
    }
    let [o, d, r, t] = c;
    [Some(o), dynamo.map(|_| d), Some(r), Some(t)]
}

/// One timed implementation: a name and a closure answering query `i`.
pub struct Timed<'a> {
    pub name: &'static str,
    pub run: Box<dyn FnMut(usize) -> u32 + 'a>,
}

/// Times every implementation on the same queries, interleaved in chunks of `CHUNK` queries so
/// that load from other processes on the machine falls on all of them alike. In each round,
/// implementation `k` runs chunk `(round + k * chunks / impls) % chunks`: no two implementations
/// run the same queries back to back, so none finds rows (ckf-core and ckf-core +chain share one
/// table) or query vectors left warm by another. `order` is a fixed random permutation of the queries;
/// every implementation sees it `passes` times. Returns per implementation the summary of all
/// samples (`raw`) and of each query's fastest pass (`filtered`: a query is not repeated
/// back-to-back, so its minimum is not a warm repeat; it drops samples hit by preemption or
/// cache pollution from the machine's other tenants).
pub fn time_interleaved(
    impls: &mut [Timed<'_>],
    order: &[usize],
    passes: usize,
    scale: f64,
) -> Vec<Timings> {
    const CHUNK: usize = 256;
    let mut samples: Vec<Vec<u64>> = impls
        .iter()
        .map(|_| Vec::with_capacity(order.len() * passes))
        .collect();
    // Warm-up: one chunk each, untimed.
    for t in impls.iter_mut() {
        for &q in order.iter().take(CHUNK) {
            black_box((t.run)(q));
        }
    }
    // samples[k][pass * n + j] is the time of query order[j] in that pass.
    let n = order.len();
    for s in samples.iter_mut() {
        s.resize(n * passes, 0);
    }
    let chunks = n.div_ceil(CHUNK);
    let stride = (chunks / impls.len()).max(1);
    for pass in 0..passes {
        for round in 0..chunks {
            for (k, (t, s)) in impls.iter_mut().zip(samples.iter_mut()).enumerate() {
                let c = (round + k * stride) % chunks;
                for j in c * CHUNK..((c + 1) * CHUNK).min(n) {
                    let t0 = ticks();
                    let r = (t.run)(black_box(order[j]));
                    let t1 = ticks();
                    black_box(r);
                    s[pass * n + j] = t1 - t0;
                }
            }
        }
    }
    samples
        .into_iter()
        .map(|s| {
            let best = (0..n)
                .map(|j| {
                    (0..passes)
                        .map(|p| s[p * n + j])
                        .min()
                        .expect("passes >= 1")
                })
                .collect();
            Timings {
                raw: summarize(s, scale),
                filtered: summarize(best, scale),
            }
        })
        .collect()
}

/// Latency of one implementation: all samples, and each query's fastest pass.
#[derive(Clone, Copy, Debug)]
pub struct Timings {
    pub raw: Lat,
    pub filtered: Lat,
}

/// ckf-core + chaining: the caller computes dynamo's chained hashes from the local hashes (what
/// dynamo's query does inside) and queries ckf-core with them.
#[inline]
pub fn ours_chained_sum(
    ix: &GlobalCkfIndexer,
    local: &[dynamo_kv_router::protocols::LocalBlockHash],
) -> u32 {
    let chained = compute_seq_hash_for_block(local);
    ours_sum(ix, &chained)
}

/// What the writer thread reports.
pub struct WriterReport {
    pub ours_deltas: u64,
    pub dyn_deltas: u64,
    pub seconds: f64,
}

/// dynamo's lane 0 for the writer: its ingestor and stream (identity, lease, words).
pub type DynLane0 = (GlobalCkfLaneIngestor, DynIdentity, DynLease, Vec<u64>);

/// Applies deltas to lane 0 of BOTH consumers (of ckf-core's alone when `dynamo` is `None`),
/// `rate` deltas/s each, 8 bucket images per delta (rewrites of the current images, so answers
/// do not change; each store still moves the cache line to the writer's core). Paces itself in
/// 1 ms steps (sleeping between them) rather than spinning, to leave the shared machine's other
/// core alone when ahead.
pub fn spawn_writer(
    ours: Arc<GlobalCkfIndexer>,
    tag: StreamTag,
    mut dynamo: Option<DynLane0>,
    rate: f64,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(WriterReport, Option<DynLane0>)> {
    std::thread::spawn(move || {
        let n = ours.table().bucket_count() as u64;
        let mut rng = 0x5EEDu64;
        let (mut seq_ours, mut seq_dyn) = (0u64, 0u64);
        let start = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            let due = (start.elapsed().as_secs_f64() * rate) as u64;
            while seq_ours < due && !stop.load(Ordering::Relaxed) {
                rng = ckf_core::addressing::fmix64(rng.wrapping_add(0x9E37_79B9_7F4A_7C15));
                let first = rng % n;
                let images = (0..8u64)
                    .map(|k| {
                        let bucket = ((first + k * 977) % n) as u32;
                        BucketImage {
                            bucket,
                            image: ours.table().load(bucket as usize, 0),
                        }
                    })
                    .collect();
                let d = DcCkfDelta {
                    tag,
                    base_sequence: seq_ours,
                    sequence: seq_ours + 1,
                    images,
                    oldest_change_age_ms: 0,
                };
                let out = ours.ingest_now(&Frame::Delta(d));
                assert!(matches!(out, IngestOutcome::Applied { .. }), "{out:?}");
                seq_ours += 1;

                let Some((dyn_ing, identity, lease, words)) = dynamo.as_mut() else {
                    continue;
                };
                let dn = words.len() as u64;
                let first = (rng >> 17) % dn;
                let images = (0..8u64)
                    .map(|k| {
                        let bucket = ((first + k * 977) % dn) as usize;
                        GlobalCkfBucketImage::new(bucket, words[bucket])
                    })
                    .collect();
                let d = GlobalCkfDelta::new(*identity, *lease, seq_dyn, seq_dyn + 1, images);
                let out = dyn_ing.apply_delta(&d);
                assert!(
                    matches!(out, GlobalCkfIngestOutcome::DeltaApplied { .. }),
                    "{out:?}"
                );
                seq_dyn += 1;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        (
            WriterReport {
                ours_deltas: seq_ours,
                dyn_deltas: seq_dyn,
                seconds: start.elapsed().as_secs_f64(),
            },
            dynamo,
        )
    })
}
