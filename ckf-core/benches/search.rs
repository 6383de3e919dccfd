//! Prefix-search latency of `GlobalCkfIndexer::find_prefix_matches` (targets: the
//! query-latency rows of this crate's README), each figure next to an exact baseline measured in the same run on the
//! same queries: a `HashMap<u64, u16 lane bitmask>` index (the producer's map hasher,
//! `FoldHashBuilder`) answering the same prefix-depth question.
//!
//! Run: `cargo bench -p ckf-core --bench search` (add `-- quick` for a shorter run, `-- no-big`
//! to skip the >= 256 MiB tables, `-- trace PATH` to use another Mooncake-format trace,
//! `-- kernels` for the search-kernel comparison alone: portable, AVX2 and AVX-512 on the same
//! tables and queries, with ratios to AVX-512 measured in the same run; `-- cold` for tails
//! with a flushed LLC on 256 MiB and 1 GiB tables (Mooncake and short queries, flushed against
//! warm in the same run; add `kernel avx2` or `kernel portable` to force a kernel); `-- tokens` for
//! queries by token ids on a 256 MiB table: hashing the tokens and searching, against the
//! search alone; `-- lanes` for 64 lanes against 16 on tables of the same size (2 MiB and
//! 256 MiB, Mooncake and all-match queries, interleaved); `-- memory` for the
//! memory figures alone: bits per tracked block, and table sizing for any expected size against
//! the power-of-two sizing of format v1; `-- profile LANES LEN [BUCKETS] [kernel NAME]` for a
//! tight loop).
//!
//! The query trace is the public Mooncake FAST'25 conversation trace (Apache-2.0), which is not
//! part of this repository: the `CKF_TRACE` environment variable (or `-- trace PATH`, which
//! wins) names it; without it the trace rows are skipped.
//!
//! Tables are built through the real ingest path (lease + barrier snapshot). Lanes are filled to
//! ~95% slot load: the query blocks' fingerprints are placed in one of their candidate buckets and
//! the remaining slots hold random filler fingerprints, so the probes see a realistic full table.
//! Latency is measured per query with `rdtsc` (calibrated against `Instant`); the measurement
//! overhead (an empty timed region) is printed and not subtracted.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use ckf_core::addressing::{TableFormat, fmix64};
use ckf_core::dc::{DcCkfConfig, DcCkfState, MemberId};
use ckf_core::global::GlobalCkfIndexer;
use ckf_core::search::SearchKernel;

mod common;
mod search_lanes;
mod search_tables;

use common::latency::{Lat, ns_per_tick, summarize, ticks, time_each};
use common::trace;
use search_tables::{
    Rng, build_indexer, ckf_query, exact_index, exact_query, fill, spawn_writer, synthetic_queries,
    trace_indexer, trace_indexer_sized, verify,
};

// ------------------------------------------------------------------ workloads

struct Row {
    name: String,
    ckf: Lat,
    exact: Lat,
}

fn print_row(r: &Row) {
    println!(
        "{:<44} ckf p50 {:>8.0} ns p99 {:>8.0} ns mean {:>8.0} | exact p50 {:>8.0} p99 {:>8.0} | ratio p50 {:>5.2} p99 {:>5.2}",
        r.name,
        r.ckf.p50,
        r.ckf.p99,
        r.ckf.mean,
        r.exact.p50,
        r.exact.p99,
        r.ckf.p50 / r.exact.p50,
        r.ckf.p99 / r.exact.p99
    );
}

fn run_synthetic(
    big: bool,
    lanes: usize,
    lens: &[usize],
    samples: usize,
    scale: f64,
    writer: bool,
) -> Vec<Row> {
    // In-cache: 16 Ki buckets. Out-of-cache: >= 256 MiB of consumer table.
    let buckets: u64 = if big {
        (256u64 << 20) / 8 / lanes as u64
    } else {
        16 << 10
    };
    let ix = Arc::new(build_indexer(buckets, lanes));
    if big {
        println!(
            "    table {} MiB, huge pages: {}",
            ix.table().bytes() >> 20,
            ix.huge_pages()
        );
    }
    // Enough distinct queries to touch the whole table (big) or to fit it (small).
    let capacity = (buckets as f64 * 4.0 * 0.5) as usize;
    let mut all = Vec::new();
    for (i, &len) in lens.iter().enumerate() {
        let count = if big {
            (2_000_000 / lens.len() / len).max(500)
        } else {
            (capacity / lens.len() / len).clamp(4, 4000)
        };
        all.push(synthetic_queries(count, len, 1000 + i as u64));
    }
    let blocks: Vec<u64> = all.iter().flatten().flatten().copied().collect();
    let mut lane_blocks = vec![blocks; lanes];
    let tags = fill(&ix, &mut lane_blocks, 0.95, 5);
    let exact = exact_index(&lane_blocks);
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let w =
        writer.then(|| spawn_writer(ix.clone(), tags[0], 100_000.0, stop.clone(), count.clone()));
    let t0 = Instant::now();
    let mut rows = Vec::new();
    for (qs, &len) in all.iter().zip(lens) {
        let over = verify(&ix, &exact, qs);
        let ready = ix.ready_mask();
        let ckf = time_each(qs, samples, scale, |q| ckf_query(&ix, q));
        let ex = time_each(qs, samples, scale, |q| exact_query(&exact, ready, q));
        let name = format!(
            "{} {:>2} lanes {:>3} blocks{}{}",
            if big { "out-of-cache" } else { "in-cache" },
            lanes,
            len,
            if writer { " +writer" } else { "" },
            if over > 0 {
                format!(" ({over} FP)")
            } else {
                String::new()
            }
        );
        let r = Row {
            name,
            ckf,
            exact: ex,
        };
        print_row(&r);
        rows.push(r);
    }
    stop.store(true, Ordering::Relaxed);
    if let Some(w) = w {
        w.join().unwrap();
        let n = count.load(Ordering::Relaxed);
        println!(
            "    writer applied {n} deltas ({:.0}/s, 8 images each)",
            n as f64 / t0.elapsed().as_secs_f64()
        );
    }
    rows
}

/// Every request used as a query against [`trace_indexer`]'s table, next to the exact index.
fn run_trace(trace: &[Vec<u64>], big: bool, samples: usize, scale: f64, writer: bool) {
    let lanes = 16;
    let (ix, tags, exact, per_lane) = trace_indexer(trace, big);
    let over = verify(&ix, &exact, trace);
    let mean_depth: f64 = trace
        .iter()
        .map(|q| exact_query(&exact, 0xFFFF, q) as f64)
        .sum::<f64>()
        / trace.len() as f64
        / lanes as f64;
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let w =
        writer.then(|| spawn_writer(ix.clone(), tags[0], 100_000.0, stop.clone(), count.clone()));
    let ready = ix.ready_mask();
    let ckf = time_each(trace, samples, scale, |q| ckf_query(&ix, q));
    let ex = time_each(trace, samples, scale, |q| exact_query(&exact, ready, q));
    stop.store(true, Ordering::Relaxed);
    if let Some(w) = w {
        w.join().unwrap();
    }
    let name = format!(
        "mooncake {} 16 lanes{}",
        if big { "256 MiB" } else { "2 MiB" },
        if writer { " +writer" } else { "" }
    );
    print_row(&Row {
        name,
        ckf,
        exact: ex,
    });
    println!(
        "    {} queries, ~{per_lane} blocks/lane, mean depth/lane {mean_depth:.1}, {over} FP over-reports in 5000 queries",
        trace.len()
    );
}

// ------------------------------------------------------------------ cold LLC

/// Evicts from every cache level the table rows `q` can touch: both candidate rows of every
/// position, every 64-byte line of each (`clflush`), then a fence so the flushes complete before
/// the timed query. The TLB is not flushed (no user-mode way to); on a 1 GiB table most rows
/// miss it anyway.
#[cfg(target_arch = "x86_64")]
fn flush_query_rows(ix: &GlobalCkfIndexer, q: &[u64]) {
    use std::arch::x86_64::{_mm_clflush, _mm_mfence};
    let addressing = ix.addressing();
    for &h in q {
        let loc = addressing.locate(h);
        for (b, table) in [loc.bucket_a, loc.bucket_b]
            .into_iter()
            .flat_map(|b| ix.table().groups().iter().map(move |t| (b, t)))
        {
            let row = table.row(b as usize);
            let start = row.as_ptr() as usize & !63;
            let end = row.as_ptr() as usize + std::mem::size_of_val(row);
            for line in (start..end).step_by(64) {
                // SAFETY: `line` is inside (or the aligned start of) a live row of the table.
                unsafe { _mm_clflush(line.max(row.as_ptr() as usize) as *const u8) };
            }
        }
    }
    // SAFETY: a fence has no memory operands.
    unsafe { _mm_mfence() };
}

#[cfg(not(target_arch = "x86_64"))]
fn flush_query_rows(_ix: &GlobalCkfIndexer, _q: &[u64]) {
    panic!("the cold-LLC bench uses clflush (x86-64 only)");
}

/// `-- cold`: tails with a flushed LLC. Mooncake queries (and the same queries
/// cut to their first 4 blocks, a pool of short queries) on 16-lane tables of 256 MiB and 1 GiB.
/// Two interleaved series per row, 20 rounds of `samples / 20` queries each: **warm** (the
/// table as the previous queries left the caches: the usual big-table figure) and **flushed**
/// (every row the query can touch evicted from every cache level just before it is timed). The
/// ratio flushed / warm is from the same run.
fn run_cold(trace: &[Vec<u64>], samples: usize, scale: f64, kernel: Option<SearchKernel>) {
    const ROUNDS: usize = 20;
    let short: Vec<Vec<u64>> = trace.iter().map(|q| q[..q.len().min(4)].to_vec()).collect();
    for (name, bytes) in [("256 MiB", 256u64 << 20), ("1 GiB", 1u64 << 30)] {
        let (ix, _, _, _) = trace_indexer_sized(trace, bytes / 8 / 16, 16);
        if let Some(kernel) = kernel {
            ix.set_search_kernel(kernel).unwrap();
        }
        for (kind, queries) in [("mooncake", trace), ("mooncake first 4", &short[..])] {
            let mut warm = Vec::with_capacity(samples);
            let mut cold = Vec::with_capacity(samples);
            let per_round = samples / ROUNDS;
            let mut next = 0usize;
            for _ in 0..ROUNDS {
                for j in 0..per_round {
                    let q = &queries[(next + j) % queries.len()];
                    let t0 = ticks();
                    let r = ckf_query(&ix, black_box(q));
                    let t1 = ticks();
                    black_box(r);
                    warm.push(t1 - t0);
                }
                for j in 0..per_round {
                    let q = &queries[(next + per_round + j) % queries.len()];
                    flush_query_rows(&ix, q);
                    let t0 = ticks();
                    let r = ckf_query(&ix, black_box(q));
                    let t1 = ticks();
                    black_box(r);
                    cold.push(t1 - t0);
                }
                next += 2 * per_round;
            }
            let (w, c) = (summarize(warm, scale), summarize(cold, scale));
            println!(
                "{:<36} warm p50 {:>6.0} p99 {:>6.0} ns | flushed p50 {:>6.0} p99 {:>6.0} ns | flushed/warm p50 {:>5.2} p99 {:>5.2} (huge pages: {}, kernel {})",
                format!("{kind} {name} 16 lanes"),
                w.p50,
                w.p99,
                c.p50,
                c.p99,
                c.p50 / w.p50,
                c.p99 / w.p99,
                ix.huge_pages(),
                ix.search_kernel()
            );
        }
    }
}

// ------------------------------------------------------------------ tokens

/// `-- tokens`: a query by token ids (`FindMatchesByTokens`) on a 16-lane 256 MiB table: the
/// Mooncake requests as token ids (each trace id stands for a block of `block_size` pseudo-random
/// token ids derived from it, so equal prefixes are equal tokens), every request's sequence
/// hashes (`tokens::sequence_hashes`) stored as in [`trace_indexer`], the first 1,000 requests
/// as queries. Five series interleaved in 20 rounds, all samples kept:
/// * **search**: the hashes precomputed, the search alone;
/// * **hash, search**: `sequence_hashes`, then the search (how the indexer answered
///   `FindMatchesByTokens` before 2026-12-05);
/// * **lazy**: `find_prefix_matches_by_tokens` over `SequenceHashes` (how it answers now: a
///   request of more than 48 blocks of at least 512 tokens hashed as the search goes, a
///   shorter one hashed whole onto the stack, others hashed whole as before);
/// * the last two again on **diverging** queries: the same requests with the tokens of their
///   second half changed, so every lane misses at the half (a new request sharing a prefix);
///   the eager form hashes every block, the lazy one stops a step or two after the miss.
///
/// Ratios are from the same run. Per round, the search alone runs over a block of queries, then
/// every query of the block runs the four token series back to back in rotating orders (see
/// the loop).
fn run_tokens(trace_path: &str, samples: usize, scale: f64) {
    use ckf_core::tokens::{BlockSeed, SequenceHashes, sequence_hashes};
    const QUERIES: usize = 1_000;
    const ROUNDS: usize = 20;
    let Some(ids) = trace::load_ids(trace_path) else {
        println!("trace {trace_path:?} not readable (set CKF_TRACE): token figures skipped");
        return;
    };
    let seed = BlockSeed::DEFAULT;
    for block_size in [16usize, 128, 512] {
        let tokens_of = |request: &[u64]| -> Vec<u32> {
            request
                .iter()
                .flat_map(|&id| (0..block_size as u64).map(move |t| fmix64(id << 20 ^ t) as u32))
                .collect()
        };
        let mut trace = Vec::with_capacity(ids.len());
        let mut queries = Vec::with_capacity(QUERIES);
        for (i, request) in ids.iter().enumerate() {
            let tokens = tokens_of(request);
            trace.push(sequence_hashes(&tokens, block_size, seed, &[]).expect("block size > 0"));
            if i < QUERIES {
                queries.push(tokens);
            }
        }
        // Second half of each query's full blocks changed (no stored block has those tokens).
        let diverging: Vec<Vec<u32>> = queries
            .iter()
            .map(|tokens| {
                let mut t = tokens.clone();
                let half = tokens.len() / block_size / 2 * block_size;
                t[half..].iter_mut().for_each(|x| *x = !*x);
                t
            })
            .collect();
        let (ix, ..) = trace_indexer_sized(&trace, (256u64 << 20) / 8 / 16, 16);
        let lazy = |tokens: &[u32]| {
            let hashes = SequenceHashes::new(tokens, block_size, seed, Vec::new()).unwrap();
            let m = ix.find_prefix_matches_by_tokens(hashes);
            m.iter().map(|(_, d)| d).sum::<u32>()
        };
        let eager = |tokens: &[u32]| {
            let hashes = sequence_hashes(tokens, block_size, seed, &[]).unwrap();
            ckf_query(&ix, &hashes)
        };
        for k in 0..QUERIES {
            assert_eq!(lazy(&queries[k]), eager(&queries[k]), "query {k}");
            assert_eq!(
                lazy(&diverging[k]),
                eager(&diverging[k]),
                "diverging query {k}"
            );
        }
        let series: [&dyn Fn(usize) -> u32; 5] = [
            &|k| ckf_query(&ix, black_box(&trace[k])),
            &|k| eager(black_box(&queries[k])),
            &|k| lazy(black_box(&queries[k])),
            &|k| eager(black_box(&diverging[k])),
            &|k| lazy(black_box(&diverging[k])),
        ];
        let per_round = samples / ROUNDS / series.len();
        let mut times: [Vec<u64>; 5] = std::array::from_fn(|_| Vec::with_capacity(samples / 5));
        let mut sink = 0u32;
        // The four series on tokens take turns in these orders, query by query: each goes first
        // equally often, and within each compared pair (hash then search / lazy, on the same
        // tokens) each goes first half the time. The series run after another on the same
        // tokens finds them and the rows in the caches: with a fixed order, identical code
        // measured 1.25x faster in the second place.
        const ORDERS: [[usize; 4]; 4] = [[1, 2, 3, 4], [2, 1, 4, 3], [3, 4, 1, 2], [4, 3, 2, 1]];
        for round in 0..ROUNDS {
            let first = round * per_round;
            for j in 0..per_round {
                let k = (first + j) % QUERIES;
                let t0 = ticks();
                sink ^= series[0](k);
                times[0].push(ticks() - t0);
            }
            for j in 0..per_round {
                let k = (first + j) % QUERIES;
                for s in ORDERS[(round + j) % ORDERS.len()] {
                    let t0 = ticks();
                    sink ^= series[s](k);
                    times[s].push(ticks() - t0);
                }
            }
        }
        black_box(sink);
        let [alone, hashed, lazy_t, div_hashed, div_lazy] = times.map(|v| summarize(v, scale));
        let ns = |l: &Lat| format!("{:>6.0} / {:>6.0}", l.p50, l.p99);
        let ratio = |a: &Lat, b: &Lat| format!("{:.2} / {:.2}x", a.p50 / b.p50, a.p99 / b.p99);
        println!(
            "tokens, {block_size}-token blocks, 256 MiB 16 lanes (huge pages: {}), p50 / p99 ns:\n  \
             search {} | hash, search {} ({} search) | lazy {} ({} hash, search)\n  \
             diverging at half: hash, search {} | lazy {} ({})",
            ix.huge_pages(),
            ns(&alone),
            ns(&hashed),
            ratio(&hashed, &alone),
            ns(&lazy_t),
            ratio(&lazy_t, &hashed),
            ns(&div_hashed),
            ns(&div_lazy),
            ratio(&div_lazy, &div_hashed),
        );
    }
}

// ------------------------------------------------------------------ kernels

/// Every kernel this CPU runs on the same table and queries, in one run: the kernels take turns
/// in `ROUNDS` interleaved rounds (so load changes on the shared machine hit them alike), every
/// sample of every round is kept, and p50 / p99 are over all samples. Checks first that every
/// kernel gives the portable kernel's answer to every query. Prints each kernel's figures and
/// its ratio to the AVX-512 kernel (or, without AVX-512, to the best kernel present).
fn compare_kernels(
    name: &str,
    ix: &GlobalCkfIndexer,
    queries: &[Vec<u64>],
    samples: usize,
    scale: f64,
) {
    const ROUNDS: usize = 10;
    let kernels = SearchKernel::available();
    for q in queries {
        let want = ix.find_prefix_matches_portable(q);
        for &k in &kernels {
            assert_eq!(ix.find_prefix_matches_with(k, q).unwrap(), want, "{k}");
        }
    }
    let mut all: Vec<Vec<u64>> = vec![Vec::with_capacity(samples); kernels.len()];
    let per_round = samples / ROUNDS;
    let mut start = 0usize;
    for _ in 0..ROUNDS {
        for (i, &k) in kernels.iter().enumerate() {
            // The production path: the indexer's kernel, one relaxed load per query.
            ix.set_search_kernel(k).expect("kernel checked available");
            // Warm-up: the same queries of this round, untimed.
            for j in 0..per_round.min(1000) {
                black_box(ckf_query(ix, &queries[(start + j) % queries.len()]));
            }
            for j in 0..per_round {
                let q = &queries[(start + j) % queries.len()];
                let t0 = ticks();
                let r = ckf_query(ix, black_box(q));
                let t1 = ticks();
                black_box(r);
                all[i].push(t1 - t0);
            }
        }
        start += per_round;
    }
    ix.set_search_kernel(SearchKernel::Auto)
        .expect("auto always resolves");
    let lats: Vec<Lat> = all.into_iter().map(|v| summarize(v, scale)).collect();
    let base = &lats[0]; // `available()` is best first: AVX-512 where present.
    for (k, l) in kernels.iter().zip(&lats) {
        println!(
            "{name:<36} {:<9} p50 {:>7.0} ns p99 {:>7.0} ns mean {:>7.0} | /{} p50 {:>5.2} p99 {:>5.2}",
            k.name(),
            l.p50,
            l.p99,
            l.mean,
            kernels[0].name(),
            l.p50 / base.p50,
            l.p99 / base.p99
        );
    }
}

/// `-- kernels`: the kernel comparison alone (in-cache synthetic 16-lane queries without early
/// exit, Mooncake on 2 MiB and, unless `no-big`, on 256 MiB).
fn run_kernels(trace: Option<&[Vec<u64>]>, no_big: bool, samples: usize, scale: f64) {
    for len in [32usize, 128] {
        let ix = build_indexer(16 << 10, 16);
        let qs = synthetic_queries(400, len, 1000 + len as u64);
        let mut lane_blocks = vec![qs.iter().flatten().copied().collect::<Vec<u64>>(); 16];
        fill(&ix, &mut lane_blocks, 0.95, 5);
        compare_kernels(
            &format!("in-cache 2 MiB 16 lanes {len:>3} blocks"),
            &ix,
            &qs,
            samples,
            scale,
        );
    }
    let Some(trace) = trace else {
        println!("trace not readable: Mooncake kernel figures skipped");
        return;
    };
    for big in [false, true] {
        if big && no_big {
            continue;
        }
        let (ix, _, _, _) = trace_indexer(trace, big);
        let name = format!(
            "mooncake {} 16 lanes",
            if big { "256 MiB" } else { "2 MiB" }
        );
        compare_kernels(&name, &ix, trace, samples, scale);
    }
}

fn memory_figure() {
    // Fill a real producer table to 95% slot load and report consumer bits per tracked block.
    let format = TableFormat::new(16 << 10, 1).unwrap();
    let mut st = DcCkfState::new(DcCkfConfig::new(format)).unwrap();
    let target = (format.slot_count() as f64 * 0.95) as u64;
    let mut rng = Rng(17);
    while st.stats().resident_fingerprints < target {
        let batch: Vec<u64> = (0..64).map(|_| rng.next()).collect();
        st.store(MemberId::new(0, 0), &batch);
    }
    let s = st.stats();
    let bits = format.bucket_count as f64 * 64.0 / s.resident_fingerprints as f64;
    println!(
        "memory: consumer table {:.2} bits per tracked block per lane at {:.1}% slot load ({} omissions on the way; target <= 17)",
        bits,
        s.load_factor * 100.0,
        s.omissions_total
    );
    sizing_figure();
}

/// Bits per expected block per lane of a table sized for N expected blocks, for N swept
/// log-uniformly over 10^4..10^9: format v2 (`buckets_for_blocks`: any even count at the 92%
/// target load) against the baseline of format v1 (the next power of two of N / 3.6, 90% target
/// load), both computed in this run. Then real tables sized for N take N random blocks:
/// omissions and the load reached.
fn sizing_figure() {
    let v1_buckets = |n: u64| ((n as f64 / 3.6).ceil() as u64).max(2).next_power_of_two();
    let (mut v1_sum, mut v2_sum, mut v1_max, mut v2_max, mut count) = (0.0, 0.0, 0f64, 0f64, 0);
    let mut n = 10_000f64;
    while n < 1e9 {
        let blocks = n as u64;
        let v2 = ckf_core::addressing::buckets_for_blocks(blocks).unwrap() as f64 * 64.0;
        let v1 = v1_buckets(blocks) as f64 * 64.0;
        let (v1, v2) = (v1 / blocks as f64, v2 / blocks as f64);
        v1_sum += v1;
        v2_sum += v2;
        v1_max = v1_max.max(v1);
        v2_max = v2_max.max(v2);
        count += 1;
        n *= 1.0137;
    }
    let (v1_mean, v2_mean) = (v1_sum / f64::from(count), v2_sum / f64::from(count));
    println!(
        "sizing: bits per expected block per lane over {count} sizes 1e4..1e9 (log-uniform): \
         v2 (any even count) mean {v2_mean:.2} max {v2_max:.2}; v1 (power of two) mean {v1_mean:.2} \
         max {v1_max:.2}; v2/v1 mean {:.3} (target <= 17.5 for every size)",
        v2_mean / v1_mean
    );
    for expected in [100_003u64, 2_013_265, 5_000_011] {
        let format = TableFormat::for_expected_blocks(expected, 3).unwrap();
        let mut st = DcCkfState::new(DcCkfConfig::new(format)).unwrap();
        let mut rng = Rng(expected);
        let mut left = expected;
        while left > 0 {
            let batch: Vec<u64> = (0..left.min(64)).map(|_| rng.next()).collect();
            left -= batch.len() as u64;
            st.store(MemberId::new(0, 0), &batch);
        }
        let s = st.stats();
        println!(
            "sizing: {expected} expected blocks -> {} buckets (v1: {}), {} stored at {:.2}% slot \
             load, {} omissions, {:.2} bits per tracked block per lane (v1: {:.2})",
            format.bucket_count,
            v1_buckets(expected),
            s.resident_fingerprints,
            s.load_factor * 100.0,
            s.omissions_total,
            format.bucket_count as f64 * 64.0 / s.resident_fingerprints as f64,
            v1_buckets(expected) as f64 * 64.0 / expected as f64,
        );
    }
}

/// `kernel NAME` on the command line (`portable`, `avx2`, `avx512`, `neon`): the kernel to force.
fn kernel_arg(args: &[String]) -> Option<SearchKernel> {
    let k = args.iter().position(|a| a == "kernel")?;
    Some(
        args[k + 1]
            .parse()
            .expect("kernel NAME: portable, avx2, avx512 or neon"),
    )
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "quick");
    let no_big = args.iter().any(|a| a == "no-big");
    let trace_path = trace::path(&args);
    if let Some(i) = args.iter().position(|a| a == "profile") {
        // `profile LANES LEN`: a tight query loop for perf/callgrind (no timing).
        let lanes: usize = args[i + 1].parse().unwrap();
        let len: usize = args[i + 2].parse().unwrap();
        let buckets: u64 = args.get(i + 3).map_or(16 << 10, |b| b.parse().unwrap());
        let ix = build_indexer(buckets, lanes);
        if let Some(kernel) = kernel_arg(&args) {
            ix.set_search_kernel(kernel).unwrap();
        }
        println!(
            "huge pages: {}, kernel {}",
            ix.huge_pages(),
            ix.search_kernel()
        );
        let qs = synthetic_queries(if buckets > 1 << 20 { 20_000 } else { 200 }, len, 1);
        let mut lane_blocks = vec![qs.iter().flatten().copied().collect::<Vec<u64>>(); lanes];
        fill(&ix, &mut lane_blocks, 0.95, 5);
        // Minimum over batches of 200 queries: robust against other processes on the machine.
        let mut sum = 0u64;
        let mut best = f64::MAX;
        let rounds = 20_000_000 / len;
        for batch in 0..rounds / 200 {
            let t0 = Instant::now();
            for r in 0..200 {
                sum += u64::from(ckf_query(&ix, &qs[(batch * 200 + r) % qs.len()]));
            }
            best = best.min(t0.elapsed().as_nanos() as f64 / 200.0);
        }
        println!(
            "profile: {rounds} queries, best batch {best:.0} ns/query, {:.2} ns/block (sum {sum})",
            best / len as f64
        );
        return;
    }
    let samples = if quick { 20_000 } else { 200_000 };
    let scale = ns_per_tick();
    let overhead = time_each(&[vec![0u64]], 100_000, scale, |q| q.len() as u32);
    println!(
        "timer: {:.3} ns/tick, empty timed region p50 {:.0} ns",
        scale, overhead.p50
    );
    if args.iter().any(|a| a == "kernels") {
        let trace = trace::load(&trace_path);
        run_kernels(trace.as_deref(), no_big, samples, scale);
        return;
    }
    if args.iter().any(|a| a == "tokens") {
        run_tokens(&trace_path, samples, scale);
        return;
    }
    if args.iter().any(|a| a == "lanes") {
        let trace = trace::load(&trace_path);
        search_lanes::run_lanes(trace.as_deref(), no_big, samples, scale);
        return;
    }
    if args.iter().any(|a| a == "cold") {
        match trace::load(&trace_path) {
            Some(trace) => run_cold(&trace, samples, scale, kernel_arg(&args)),
            None => println!("trace {trace_path} not readable: cold figures skipped"),
        }
        return;
    }
    memory_figure();
    if args.iter().any(|a| a == "memory") {
        return;
    }
    let lens = [8usize, 32, 128, 512];
    for big in [false, true] {
        if big && no_big {
            continue;
        }
        for lanes in [1usize, 4, 16] {
            run_synthetic(big, lanes, &lens, samples, scale, false);
        }
        run_synthetic(big, 16, &lens, samples, scale, true);
    }
    match trace::load(&trace_path) {
        Some(trace) => {
            for big in [false, true] {
                if big && no_big {
                    continue;
                }
                run_trace(&trace, big, samples, scale, false);
                run_trace(&trace, big, samples, scale, true);
            }
        }
        None => println!("trace {trace_path} not readable: Mooncake figures skipped"),
    }
}
